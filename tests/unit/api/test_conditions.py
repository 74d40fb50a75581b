"""The one status-conditions helper: reads tolerate any stored shape; setting follows
meta.SetStatusCondition (the transition time moves only with the status)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api.conditions import (
    condition_status,
    find,
    get_condition,
    is_pod_ready,
    is_true,
    pod_ready_condition,
    set_status_condition,
)

READY = {"type": "Ready", "status": "True"}


@pytest.mark.parametrize("conditions, expected", [
    ([READY], READY),
    ([{"type": "Other", "status": "True"}, READY], READY),
    ([], None),
    (None, None),
    ("Ready", None),                      # not a list
    ({"type": "Ready"}, None),            # a map, not a list
    ([5, "x", None, READY], READY),       # junk entries are skipped, not raised on
    ([{"type": "Ready", "status": "False"}, READY], {"type": "Ready", "status": "False"}),  # first wins
])
def test_find(conditions: Any, expected: Any) -> None:
    assert find(conditions, "Ready") == expected


@pytest.mark.parametrize("obj, ready", [
    ({"status": {"conditions": [READY]}}, True),
    ({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False),
    ({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}, False),
    ({"status": {"conditions": [{"type": "Ready"}]}}, False),
    ({"status": {}}, False),
    ({"status": None}, False),
    ({"status": "broken"}, False),
    ({}, False),
])
def test_readiness(obj: dict[str, Any], ready: bool) -> None:
    assert is_pod_ready(obj) is ready
    assert is_true(obj, "Ready") is ready
    assert (pod_ready_condition(obj) is not None) == bool(get_condition(obj, "Ready"))


def test_condition_status() -> None:
    assert condition_status([READY], "Ready") == "True"
    assert condition_status([READY], "Initialized") is None
    assert condition_status([{"type": "Ready", "status": 1}], "Ready") is None


def test_set_adds_a_new_condition_with_now() -> None:
    out = set_status_condition([], "Available", "True", "R", "m", "t1", observed_generation=3)
    assert out == [{"type": "Available", "status": "True", "observedGeneration": 3,
                    "lastTransitionTime": "t1", "reason": "R", "message": "m"}]


def test_set_keeps_transition_time_while_the_status_holds() -> None:
    conds = set_status_condition([], "Available", "True", "A", "a", "t1")
    conds = set_status_condition(conds, "Available", "True", "B", "b", "t2")
    assert conds == [{"type": "Available", "status": "True", "lastTransitionTime": "t1",
                      "reason": "B", "message": "b"}]
    conds = set_status_condition(conds, "Available", "False", "C", "c", "t3")
    assert conds[0]["lastTransitionTime"] == "t3" and conds[0]["status"] == "False"


def test_set_does_not_modify_its_input_and_drops_junk() -> None:
    original = [{"type": "A", "status": "True", "lastTransitionTime": "t0"}, "junk"]
    out = set_status_condition(original, "A", "False", "r", "m", "t1")
    assert original[0]["status"] == "True"
    assert out == [{"type": "A", "status": "False", "lastTransitionTime": "t1",
                    "reason": "r", "message": "m"}]
    assert set_status_condition("not a list", "A", "True", "r", "m", "t") == [
        {"type": "A", "status": "True", "lastTransitionTime": "t", "reason": "r", "message": "m"}]


def test_set_keeps_other_conditions_in_order() -> None:
    conds = [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]
    out = set_status_condition(conds, "A", "True", "r", "m", "t")
    assert [c["type"] for c in out] == ["A", "B"]
    out = set_status_condition(conds, "C", "True", "r", "m", "t")
    assert [c["type"] for c in out] == ["A", "B", "C"]
