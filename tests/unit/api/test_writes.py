"""fleet.api.writes: the metadata rules of create, update and delete, backend-free."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api import writes

NOW = "2026-12-01T00:00:00Z"
UID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def obj(**md: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", **md}, "data": {"k": "v"}}


@pytest.mark.parametrize(("given", "uid_kept"), [
    (obj(uid=UID), True),
    (obj(uid="not-a-uuid"), False),
    (obj(uid=UID.upper()), False),  # not canonical
    (obj(), False),
])
def test_create(given: dict[str, Any], uid_kept: bool) -> None:
    given["metadata"].update(deletionTimestamp="x", deletionGracePeriodSeconds=3, generation=9)
    out = writes.prepare_create(given, 12, NOW)
    md = out["metadata"]
    assert (md["uid"] == UID) is uid_kept and writes.is_uuid(md["uid"])
    assert (md["creationTimestamp"], md["generation"], md["resourceVersion"]) == (NOW, 1, "12")
    assert "deletionTimestamp" not in md and "deletionGracePeriodSeconds" not in md


def test_create_repairs_missing_metadata() -> None:
    out = writes.prepare_create({"kind": "X", "metadata": 5}, 1, NOW)
    assert out["metadata"]["generation"] == 1


STORED = obj(uid=UID, creationTimestamp="T0", generation=3, resourceVersion="10")


@pytest.mark.parametrize(("change", "generation", "removed"), [
    (lambda o: o["metadata"].update(labels={"x": "y"}), 3, False),       # metadata only
    (lambda o: o.update(status={"phase": "x"}), 3, False),               # status only
    (lambda o: o["data"].update(k="w"), 4, False),                       # spec-like change
    (lambda o: o["metadata"].update(uid="other", creationTimestamp="T9"), 3, False),  # kept
    (lambda o: o["metadata"].update(deletionTimestamp="T5"), 4, False),  # deletion starts
])
def test_update(change, generation: int, removed: bool) -> None:
    new = copy.deepcopy(STORED)
    change(new)
    assert writes.prepare_update(new, STORED, 11) is removed
    md = new["metadata"]
    assert (md["uid"], md["creationTimestamp"], md["generation"], md["resourceVersion"]) == (
        UID, "T0", generation, "11")


def test_update_never_resurrects_and_completes_on_the_last_finalizer() -> None:
    marked = obj(uid=UID, creationTimestamp="T0", generation=4, deletionTimestamp="T5",
                 deletionGracePeriodSeconds=0, finalizers=["a", "b"])
    new = copy.deepcopy(marked)
    del new["metadata"]["deletionTimestamp"]
    new["metadata"]["finalizers"] = ["a"]
    assert writes.prepare_update(new, marked, 20) is False
    assert new["metadata"]["deletionTimestamp"] == "T5"  # one-way
    last = copy.deepcopy(new)
    last["metadata"]["finalizers"] = []
    assert writes.prepare_update(last, new, 21) is True
    # A pod still in its grace period stays even without finalizers.
    grace = copy.deepcopy(marked)
    grace["metadata"]["deletionGracePeriodSeconds"] = 30
    gone = copy.deepcopy(grace)
    gone["metadata"]["finalizers"] = []
    assert writes.prepare_update(gone, grace, 22) is False


@pytest.mark.parametrize(("md", "write", "removed", "generation"), [
    ({}, True, True, 3),
    ({"finalizers": ["f"]}, True, False, 4),
    ({"finalizers": ["f"], "deletionTimestamp": "T1", "deletionGracePeriodSeconds": 30}, True, False, 3),
    ({"finalizers": ["f"], "deletionTimestamp": "T1", "deletionGracePeriodSeconds": 0}, False, False, 3),
])
def test_delete(md: dict[str, Any], write: bool, removed: bool, generation: int) -> None:
    new = copy.deepcopy(STORED)
    new["metadata"].update(md)
    step = writes.prepare_delete(new, 30, NOW)
    assert (step.write, step.removed) == (write, removed)
    out = new["metadata"]
    assert out["generation"] == generation
    if write:
        assert out["resourceVersion"] == "30"
    if write and not removed:
        assert out["deletionGracePeriodSeconds"] == 0 and out["deletionTimestamp"] in ("T1", NOW)
