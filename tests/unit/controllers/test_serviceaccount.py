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


@pytest.mark.parametrize(("spec", "want"), [
    (None, None),
    (["*"], None),
    (["*", "-garbagecollector"], "all but garbagecollector"),
    (["-garbagecollector"], "all but garbagecollector"),
    (["serviceaccount", "job"], ["serviceaccount", "job"]),
])
def test_controller_selection(spec, want):
    from fleet.controllers.manager import default_controllers, select

    every = [c.name for c in default_controllers()]
    got = [c.name for c in select(default_controllers(), spec)]
    if want is None:
        assert got == every
    elif want == "all but garbagecollector":
        assert got == [n for n in every if n != "garbagecollector"]
    else:
        assert sorted(got) == sorted(want)


def test_unknown_controller_is_refused():
    from fleet.controllers.manager import default_controllers, select

    with pytest.raises(ValueError, match="unknown controller 'nope'"):
        select(default_controllers(), ["*", "-nope"])


def test_optional_controller_is_known_and_selectable():
    """`-storage-provisioner` is valid whether or not this server runs one; when it
    does (a central storage driver), `--controllers` leaves it out or keeps it."""
    from fleet.controllers.manager import default_controllers, default_manager, select

    names = [c.name for c in select(default_controllers(), ["*", "-storage-provisioner"])]
    assert "storage-provisioner" not in names and "persistentvolume-binder" in names

    class Provisioner:
        name = "storage-provisioner"

    extra = [Provisioner()]
    assert "storage-provisioner" in [c.name for c in default_manager(None, extra=extra).controllers]
    assert "storage-provisioner" not in [
        c.name for c in default_manager(["-storage-provisioner"], extra=extra).controllers]
