"""The garbage collector's pure parts: the decisions and the ownership graph."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.controllers.garbagecollector_graph import (
    BACKGROUND,
    DANGLING,
    FOREGROUND,
    FOREGROUND_FINALIZER,
    NOTHING,
    ORPHAN,
    ORPHAN_FINALIZER,
    SOLID,
    WAITING,
    Action,
    Graph,
    Node,
    plan_dependent,
    plan_foreground,
)

# ---------------------------------------------------------------------------------------
# plan_dependent: what to do with a dependent, given the live state of its owners


@pytest.mark.parametrize(("states", "fins", "has_deps", "dep_deleting", "want"), [
    # Every owner alive: nothing to do.
    ([("a", SOLID)], [], False, False, NOTHING),
    ([("a", SOLID), ("b", SOLID)], [], True, False, NOTHING),
    # Its only owner is gone: Background delete.
    ([("a", DANGLING)], [], False, False, Action("delete", policy=BACKGROUND)),
    # All owners gone, even with dependents of its own: Background (they follow later).
    ([("a", DANGLING), ("b", DANGLING)], [], True, False, Action("delete", policy=BACKGROUND)),
    # One live owner keeps it; the dangling reference is dropped.
    ([("a", SOLID), ("b", DANGLING)], [], False, False, Action("remove-refs", ("b",))),
    # A foreground owner does not wait for an object someone else still owns.
    ([("a", WAITING), ("b", SOLID)], [], True, False, Action("remove-refs", ("a",))),
    ([("a", WAITING), ("b", SOLID), ("c", DANGLING)], [], False, False, Action("remove-refs", ("a", "c"))),
    # A foreground owner waits: a leaf goes with Background...
    ([("a", WAITING)], [], False, False, Action("delete", policy=BACKGROUND)),
    # ...one with dependents goes in the foreground, so the wait runs down the chain...
    ([("a", WAITING)], [], True, False, Action("delete", policy=FOREGROUND)),
    ([("a", WAITING), ("b", DANGLING)], [], True, False, Action("delete", policy=FOREGROUND)),
    # ...unblocking its own references first when one of its dependents waits too (a cycle).
    ([("a", WAITING)], [], True, True, Action("delete", policy=FOREGROUND, unblock=True)),
    # A GC finalizer the object already carries is its chosen policy.
    ([("a", DANGLING)], [ORPHAN_FINALIZER], True, False, Action("delete", policy=ORPHAN)),
    ([("a", DANGLING)], [FOREGROUND_FINALIZER], False, False, Action("delete", policy=FOREGROUND)),
    ([("a", DANGLING)], ["example.com/x"], False, False, Action("delete", policy=BACKGROUND)),
    # No owner references at all: nothing.
    ([], [], False, False, NOTHING),
])
def test_plan_dependent(states, fins, has_deps, dep_deleting, want):
    assert plan_dependent(states, fins, has_dependents=has_deps,
                          dependent_deleting_dependents=dep_deleting) == want


# ---------------------------------------------------------------------------------------
# plan_foreground: may a foreground owner finish?


def dep(uid: str, owner: str = "o", block: bool = True, deleting_dependents: bool = False) -> Node:
    n = Node(uid, "v1", "ConfigMap", "ns", uid, observed=True)
    n.owners = ((owner, block),)
    n.deleting_dependents = deleting_dependents
    return n


@pytest.mark.parametrize(("deps", "done", "push"), [
    ([], True, []),
    # Dependents without blockOwnerDeletion do not hold the owner.
    ([dep("a", block=False), dep("b", block=False)], True, []),
    ([dep("a"), dep("b", block=False)], False, ["a"]),
    ([dep("a"), dep("b")], False, ["a", "b"]),
    # A blocker that waits on its own dependents is not pushed again (it is on its way).
    ([dep("a", deleting_dependents=True), dep("b")], False, ["b"]),
    ([dep("a", deleting_dependents=True)], False, []),
    # Blocking another owner does not count.
    ([dep("a", owner="other")], True, []),
])
def test_plan_foreground(deps, done, push):
    assert plan_foreground("o", deps) == (done, push)


# ---------------------------------------------------------------------------------------
# The graph


def obj(uid: str, name: str | None = None, *, owners: list[tuple[str, bool]] = (), namespace: str = "ns",
        kind: str = "ConfigMap", api_version: str = "v1", deleting: bool = False,
        finalizers: list[str] = ()) -> dict[str, Any]:
    md: dict[str, Any] = {"uid": uid, "name": name or uid}
    if namespace:
        md["namespace"] = namespace
    if owners:
        md["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": f"name-{u}", "uid": u,
                                  **({"blockOwnerDeletion": True} if block else {})} for u, block in owners]
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if finalizers:
        md["finalizers"] = list(finalizers)
    return {"apiVersion": api_version, "kind": kind, "metadata": md}


class Recorder:
    def __init__(self) -> None:
        self.deletes: list[str] = []
        self.orphans: list[str] = []

    def graph(self) -> Graph:
        return Graph(self.deletes.append, self.orphans.append)

    def take(self) -> tuple[list[str], list[str]]:
        out = (sorted(set(self.deletes)), sorted(set(self.orphans)))
        self.deletes.clear()
        self.orphans.clear()
        return out


def test_objects_outside_ownership_are_not_kept():
    r = Recorder()
    g = r.graph()
    g.observe(obj("x"))
    g.observe(obj("y", deleting=True, finalizers=["example.com/x"]))
    assert g.nodes == {}
    assert r.take() == ([], [])


def test_a_dependent_creates_a_virtual_owner_to_verify():
    r = Recorder()
    g = r.graph()
    g.observe(obj("d", owners=[("o", True)]))
    assert set(g.nodes) == {"d", "o"}
    owner = g.nodes["o"]
    assert not owner.observed and owner.name == "name-o" and owner.namespace == "ns"
    assert owner.dependents == {"d"} and g.nodes["d"].owners == (("o", True),)
    assert r.take() == (["o"], [])  # the virtual owner gets a live GET
    # Seen through its own watch: observed, no GET needed any more.
    g.observe(obj("o", "name-o"))
    assert g.nodes["o"].observed
    assert r.take() == ([], [])


def test_owner_deleted_queues_its_dependents_and_forgets_itself():
    r = Recorder()
    g = r.graph()
    g.observe(obj("o"))
    g.observe(obj("d1", owners=[("o", True)]))
    g.observe(obj("d2", owners=[("o", False)]))
    r.take()
    g.remove("o")
    assert "o" not in g.nodes and g.was_deleted("o")
    assert r.take() == (["d1", "d2"], [])
    # The dependents still name it, so a later look finds it dangling.
    assert g.nodes["d1"].owners == (("o", True),)


def test_dependent_deleted_unlinks_and_prunes_a_leafless_owner():
    r = Recorder()
    g = r.graph()
    g.observe(obj("d", owners=[("o", True)]))
    g.observe(obj("o"))
    g.remove("d")
    assert g.nodes == {}


def test_foreground_transition_queues_dependents_and_owner():
    r = Recorder()
    g = r.graph()
    g.observe(obj("d1", owners=[("o", True)]))
    g.observe(obj("d2", owners=[("o", False)]))
    g.observe(obj("o"))
    r.take()
    g.observe(obj("o", deleting=True, finalizers=[FOREGROUND_FINALIZER]))
    assert g.nodes["o"].deleting_dependents
    assert r.take() == (["d1", "d2", "o"], [])
    # The same state again is no transition.
    g.observe(obj("o", deleting=True, finalizers=[FOREGROUND_FINALIZER]))
    assert r.take() == ([], [])
    # A blocking dependent leaving wakes the owner up.
    g.remove("d1")
    assert r.take() == (["o"], [])


def test_foreground_owner_without_dependents_is_kept_and_queued():
    r = Recorder()
    g = r.graph()
    g.observe(obj("o", deleting=True, finalizers=[FOREGROUND_FINALIZER]))
    assert "o" in g.nodes
    assert r.take() == (["o"], [])


def test_dependent_arriving_for_a_foreground_owner_is_queued():
    r = Recorder()
    g = r.graph()
    g.observe(obj("o", deleting=True, finalizers=[FOREGROUND_FINALIZER]))
    r.take()
    g.observe(obj("late", owners=[("o", True)]))
    assert r.take() == (["late"], [])


def test_unblocking_or_dropping_a_reference_wakes_a_foreground_owner():
    r = Recorder()
    g = r.graph()
    g.observe(obj("o", deleting=True, finalizers=[FOREGROUND_FINALIZER]))
    g.observe(obj("d", owners=[("o", True)]))
    r.take()
    g.observe(obj("d", owners=[("o", False)]))
    assert r.take() == (["o"], [])
    g.observe(obj("d", owners=[("o", True)]))
    r.take()
    g.observe(obj("d"))  # reference removed
    assert r.take() == (["o"], [])
    assert g.nodes["o"].dependents == set()


def test_orphan_transition_queues_the_owner_for_orphaning():
    r = Recorder()
    g = r.graph()
    g.observe(obj("d", owners=[("o", True)]))
    g.observe(obj("o", deleting=True, finalizers=[ORPHAN_FINALIZER]))
    assert r.take() == (["o"], ["o"])  # "o" was queued once as a virtual owner, then to orphan
    # Switching the deletion from orphan to foreground (a second DELETE) is a new transition.
    g.observe(obj("o", deleting=True, finalizers=[FOREGROUND_FINALIZER]))
    assert r.take() == (["d", "o"], [])


def test_relist_removes_what_the_list_no_longer_has():
    r = Recorder()
    g = r.graph()
    g.observe(obj("a", owners=[("o", True)]))
    g.observe(obj("b", owners=[("o", True)], kind="Secret"))
    r.take()
    g.relisted("", "ConfigMap", seen={"o"})
    assert "a" not in g.nodes and "b" in g.nodes
    # The virtual owner "o" is left for its GET; "a" is gone.
    assert set(g.nodes) == {"b", "o"}


def test_confirm_does_not_resurrect_an_owner_deleted_meanwhile():
    r = Recorder()
    g = r.graph()
    g.observe(obj("d", owners=[("o", True)]))
    g.remove("o")  # DELETED event while its GET was in flight
    g.observe(obj("d2", owners=[("o", True)]))  # a new virtual node for the same uid
    g.confirm("o", obj("o", "name-o"))  # the stale GET answer
    assert not g.nodes["o"].observed


def test_owner_strings_are_shared():
    g = Recorder().graph()
    for i in range(3):
        g.observe(obj(f"d{i}", owners=[("o", True)]))
    g.observe(obj("o"))
    owner_uid = g.nodes["o"].uid
    assert all(g.nodes[f"d{i}"].owners[0][0] is owner_uid for i in range(3))
    assert g.stats() == {"nodes": 4, "virtual": 0, "edges": 3}
