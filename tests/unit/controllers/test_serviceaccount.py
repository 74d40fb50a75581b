"""The ServiceAccount controller's decision."""

from __future__ import annotations

import pytest

from fleet.controllers.serviceaccount import needs_default


def ns(phase: str = "Active", deleting: bool = False) -> dict:
    md = {"name": "x"}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "status": {"phase": phase}}


def sa(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "x"}}


@pytest.mark.parametrize(("namespace", "accounts", "want"), [
    (ns(), [], True),
    (ns(), [sa("builder")], True),
    (ns(), [sa("default")], False),
    (ns("Terminating"), [], False),
    (ns(deleting=True), [], False),
    (None, [], False),
])
def test_needs_default(namespace, accounts, want):
    assert needs_default(namespace, accounts) is want
