"""Fixtures of the end-to-end tests that need more than tests/conftest.py's server.

`multinode` (module scope) is a two-machine cluster shared by a module's tests: each
test works in its own namespace (`cluster.create_namespace()`).  `multinode_factory`
builds clusters with other shapes (`nodes=3`, `segments=[0, 0, 1]`, extra agent or
server flags) that are torn down after the test.  See tests/e2e/multinode.py.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.multinode import MultiNodeCluster, multinode_cluster, problem


def _skip_unless_possible() -> None:
    why = problem()
    if why:
        pytest.skip(f"multi-node cluster: {why}")


@pytest.fixture(scope="module")
def multinode() -> Iterator[MultiNodeCluster]:
    """Two machines (one L2 segment), each with a `fleet agent`, and a server."""
    _skip_unless_possible()
    with tempfile.TemporaryDirectory(prefix="fleet-mn-") as base, \
            multinode_cluster(Path(base), nodes=2) as cluster:
        yield cluster


@pytest.fixture
def multinode_factory(tmp_path: Path) -> Iterator[Callable[..., MultiNodeCluster]]:
    """`multinode_factory(nodes=3, segments=[0, 0, 1], agent_args=[...])` -> a started cluster."""
    _skip_unless_possible()
    with ExitStack() as stack:
        n = 0

        def make(**kw: Any) -> MultiNodeCluster:
            nonlocal n
            n += 1
            base = tmp_path / f"mn{n}"
            base.mkdir()
            return stack.enter_context(multinode_cluster(base, **kw))

        yield make
