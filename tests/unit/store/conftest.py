"""Fixtures for the store tests: a fresh SQLite store per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet.store import SqliteStore, open_store


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "fleet.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteStore]:
    # NORMAL keeps the suite fast; durability under FULL has its own test.
    async with open_store(db_path, sync="NORMAL", compact_interval=0) as s:
        yield s
