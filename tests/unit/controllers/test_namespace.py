"""The namespace controller: the pure decisions (table tests) and the loop against the
real API pipeline in process (fleet.testing.apiserver runs it over `InProcessAPI.client()`):
content removal, status conditions, the finalize subresource, the namespace's own finalizers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio

from fleet.api import meta
from fleet.client import APIResource
from fleet.controllers.namespace import (
    CONDITION_TYPES,
    CONTENT_FAILURE,
    CONTENT_REMAINING,
    DISCOVERY_FAILURE,
    FINALIZERS_REMAINING,
    ContentTotals,
    NamespaceController,
    count_remaining,
    deletable,
    failure_conditions,
    needs_sync,
    plan,
    updated_conditions,
)
from fleet.testing.apiserver import open_api, run_namespace_controller

FG = "foregroundDeletion"


def test_failure_conditions_word_it_as_kubernetes():
    totals = ContentTotals(remaining=Counter({"pods.": 2, "jobs.batch": 1}),
                           finalizers=Counter({"example.com/x": 1, "b/y": 3}),
                           errors=["deleting pods. p: boom"])
    assert failure_conditions(totals) == {
        CONTENT_FAILURE: ("ContentDeletionFailed",
                          "Failed to delete all resource types, 1 remaining: deleting pods. p: boom"),
        CONTENT_REMAINING: ("SomeResourcesRemain",
                            "Some resources are remaining: jobs.batch has 1 resource instances, "
                            "pods. has 2 resource instances"),
        FINALIZERS_REMAINING: ("SomeFinalizersRemain",
                               "Some content in the namespace has finalizers remaining: b/y in 3 resource "
                               "instances, example.com/x in 1 resource instances"),
    }
    assert failure_conditions(ContentTotals()) == {}
    assert failure_conditions(ContentTotals(discovery_error="apps/v1: boom")) == {
        DISCOVERY_FAILURE: ("DiscoveryFailed", "Discovery failed for some groups, 1 failing: apps/v1: boom")}


def ns(*, deleting: bool = True, spec_fins: list[str] | None = None, md_fins: list[str] | None = None,
       conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": "n", "resourceVersion": "5"}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if md_fins:
        md["finalizers"] = md_fins
    out: dict[str, Any] = {"metadata": md, "spec": {"finalizers": ["kubernetes"] if spec_fins is None else spec_fins},
                           "status": {"phase": "Terminating" if deleting else "Active"}}
    if conditions is not None:
        out["status"]["conditions"] = conditions
    return out


@pytest.mark.parametrize(("namespace", "due"), [
    (None, True),  # vanished: its leftovers go
    (ns(deleting=False), False),
    (ns(), True),
    (ns(spec_fins=["example.com/ns"]), True),  # ours went; content is still emptied
    (ns(spec_fins=[], md_fins=[FG]), False),  # finalized: the collector's finalizer finishes it
    (ns(spec_fins=[]), True),  # nothing holds it: the finalize that removes it is due
])
def test_needs_sync(namespace, due):
    assert needs_sync(namespace) is due


def res(name: str, group: str = "", *, namespaced: bool = True, preferred: bool = True,
        verbs: tuple[str, ...] = ("list", "delete", "deletecollection")) -> APIResource:
    return APIResource(name=name, singular_name="", namespaced=namespaced, kind=name.title(), group=group,
                       version="v1", verbs=verbs, preferred=preferred)


def test_deletable_is_namespaced_preferred_list_and_deletecollection():
    served = [res("pods"), res("nodes", namespaced=False), res("jobs", "batch"),
              res("horizontalpodautoscalers", "autoscaling", preferred=False),
              res("bindings", verbs=("create",)), res("tokenreviews", verbs=("list",)), res("pods")]
    assert [(r.group, r.name) for r in deletable(served)] == [("", "pods"), ("batch", "jobs")]


def test_count_remaining_totals_items_and_their_finalizers():
    totals = ContentTotals()
    count_remaining(totals, "pods.", [{"metadata": {"name": "a"}},
                                      {"metadata": {"name": "b", "finalizers": ["x/y", "z/w"]}}])
    count_remaining(totals, "jobs.batch", [{"metadata": {"name": "c", "finalizers": ["x/y"]}}])
    assert totals.remaining == Counter({"pods.": 2, "jobs.batch": 1})
    assert totals.finalizers == Counter({"x/y": 2, "z/w": 1})


@pytest.mark.parametrize(("etype", "old", "new", "queued"), [
    ("ADDED", None, ns(deleting=False), []),
    ("ADDED", None, ns(), ["/n"]),  # left Terminating by a restart: resumed
    ("MODIFIED", ns(deleting=False), ns(), ["/n"]),
    ("MODIFIED", ns(), ns(spec_fins=[], md_fins=[FG]), ["/n"]),
    ("DELETED", ns(), None, ["/n"]),  # gone: its leftovers go too
])
async def test_namespace_events_queue_what_is_being_deleted(etype, old, new, queued):
    c = NamespaceController()
    c.on_namespace(etype, old, new)
    assert [await c.queue.get() for _ in range(len(c.queue))] == queued


LEFT = ContentTotals(remaining=Counter({"pods.": 1}))


@pytest.mark.parametrize(("namespace", "totals", "finalizers", "retry"), [
    # Content remains: conditions, look again, not finalized.
    (ns(), LEFT, None, 1.0),
    (ns(), ContentTotals(errors=["failed to delete pods.: boom"]), None, 1.0),
    (ns(), ContentTotals(discovery_error="boom"), None, 1.0),
    # Empty: our token goes, another's stays for its owner.
    (ns(), ContentTotals(), [], None),
    (ns(spec_fins=["kubernetes", "example.com/ns"]), ContentTotals(), ["example.com/ns"], None),
    (ns(spec_fins=["example.com/ns"]), ContentTotals(), None, None),
    # Metadata finalizers (a foreground namespace delete): the token goes all the same.
    (ns(md_fins=[FG]), ContentTotals(), [], None),
    # Nothing holds it at all: an empty finalize, which removes it.
    (ns(spec_fins=[]), ContentTotals(), [], None),
])
def test_plan_finalizes_only_an_empty_namespace(namespace, totals, finalizers, retry):
    p = plan(namespace, totals, "t1")
    assert (p.finalizers, p.retry) == (finalizers, retry)
    assert p.conditions is not None and len(p.conditions) == 5
    by_type = {c["type"]: c["status"] for c in p.conditions}
    assert by_type[CONTENT_REMAINING] == ("True" if totals.remaining else "False")


def test_plan_writes_conditions_only_when_they_change_and_retries_a_vanished_namespace():
    first = plan(ns(), LEFT, "t1")
    assert first.conditions is not None
    again = plan(ns(conditions=first.conditions), LEFT, "t2")
    assert again.conditions is None and again.retry == 1.0
    assert plan(None, LEFT, "t1") == plan(None, LEFT, "t1", retry_interval=1.0)
    assert plan(None, LEFT, "t1").retry == 1.0 and plan(None, LEFT, "t1").conditions is None
    assert plan(None, ContentTotals(), "t1").retry is None


def test_updated_conditions_add_all_five_then_move_time_only_on_flips():
    first = updated_conditions([{"type": "Other", "status": "True"}],
                               {CONTENT_REMAINING: ("SomeResourcesRemain", "m1")}, "t1")
    assert first is not None
    assert [c["type"] for c in first] == ["Other", *CONDITION_TYPES]
    by_type = {c["type"]: c for c in first}
    assert by_type[CONTENT_REMAINING] == {"type": CONTENT_REMAINING, "status": "True", "lastTransitionTime": "t1",
                                          "reason": "SomeResourcesRemain", "message": "m1"}
    assert by_type[FINALIZERS_REMAINING]["status"] == "False"
    assert by_type[FINALIZERS_REMAINING]["reason"] == "ContentHasNoFinalizers"
    # Same state: nothing to write.
    assert updated_conditions(first, {CONTENT_REMAINING: ("SomeResourcesRemain", "m1")}, "t2") is None
    # New message, same status: the transition time stays.
    second = updated_conditions(first, {CONTENT_REMAINING: ("SomeResourcesRemain", "m2")}, "t2")
    assert second is not None
    c = next(c for c in second if c["type"] == CONTENT_REMAINING)
    assert (c["message"], c["lastTransitionTime"]) == ("m2", "t1")
    # Flipped to False: new time, the "ok" wording.
    third = updated_conditions(second, {}, "t3")
    assert third is not None
    c = next(c for c in third if c["type"] == CONTENT_REMAINING)
    assert (c["status"], c["reason"], c["message"], c["lastTransitionTime"]) == (
        "False", "ContentRemoved", "All content successfully removed", "t3")


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def poll(fn: Any, timeout: float = 15.0) -> Any:
    with trio.fail_after(timeout):
        while True:
            out = await fn()
            if out:
                return out
            await trio.sleep(0.05)


async def test_deleting_a_namespace_empties_it_and_reports_progress(api):
    code, _ = await api.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": "doomed"}})
    assert code == 201
    base = "/api/v1/namespaces/doomed"
    for kind, plural, extra in (("ConfigMap", "configmaps", {"data": {"a": "b"}}),
                                ("Secret", "secrets", {"stringData": {"a": "b"}}),
                                ("ServiceAccount", "serviceaccounts", {})):
        code, out = await api.json("POST", f"{base}/{plural}", {"apiVersion": "v1", "kind": kind,
                                                                "metadata": {"name": "x"}, **extra})
        assert code == 201, out
    code, out = await api.json("POST", f"{base}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "running"},
        "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 60,
                 "containers": [{"name": "c", "image": "busybox"}]}})
    assert code == 201, out
    code, out = await api.json("POST", f"{base}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["example.com/hold"]}})
    assert code == 201, out

    code, ns = await api.json("DELETE", base)
    assert code == 200 and ns["status"]["phase"] == "Terminating"

    async def reported() -> dict[str, Any] | None:
        code, ns = await api.json("GET", base)
        conds = {c["type"]: c for c in ns["status"].get("conditions") or []}
        fin = conds.get(FINALIZERS_REMAINING)
        return conds if fin and fin["status"] == "True" else None

    conds = await poll(reported)
    assert conds[CONTENT_REMAINING]["message"] == (
        "Some resources are remaining: configmaps. has 1 resource instances, pods. has 1 resource instances")
    assert conds[FINALIZERS_REMAINING]["message"] == (
        "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances")
    assert conds[CONTENT_FAILURE]["status"] == "False"
    # What could go, went; the pod on a node terminates gracefully (the agent would stop it).
    for plural in ("secrets", "serviceaccounts"):
        assert (await api.json("GET", f"{base}/{plural}/x"))[0] == 404
    code, pod = await api.json("GET", f"{base}/pods/running")
    assert code == 200 and pod["metadata"]["deletionGracePeriodSeconds"] == 60
    # New content is refused meanwhile.
    code, _ = await api.json("POST", f"{base}/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                                            "metadata": {"name": "late"}})
    assert code == 403
    # The agent's final delete and the finalizer's owner finish the content; the namespace goes.
    assert (await api.json("DELETE", f"{base}/pods/running", query={"gracePeriodSeconds": "0"}))[0] == 200
    code, _ = await api.json("PATCH", f"{base}/configmaps/held", {"metadata": {"finalizers": None}},
                             content_type="application/merge-patch+json")
    assert code == 200

    async def gone() -> bool:
        return (await api.json("GET", base))[0] == 404
    await poll(gone)


async def test_another_spec_finalizer_keeps_the_namespace(api):
    code, _ = await api.json("POST", "/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kept"},
        "spec": {"finalizers": ["kubernetes", "example.com/ns"]}})
    assert code == 201
    assert (await api.json("DELETE", "/api/v1/namespaces/kept"))[0] == 200

    async def conditions_written() -> bool:
        code, ns = await api.json("GET", "/api/v1/namespaces/kept")
        return code == 200 and len(ns["status"].get("conditions") or []) == 5
    await poll(conditions_written)
    await trio.sleep(1.5)  # a pass or two later it is still there, waiting for example.com/ns
    code, ns = await api.json("GET", "/api/v1/namespaces/kept")
    assert code == 200 and ns["status"]["phase"] == "Terminating"


async def create_ns(api, name: str, **spec: Any) -> None:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    if spec:
        body["spec"] = spec
    code, out = await api.json("POST", "/api/v1/namespaces", body)
    assert code == 201, out


async def test_a_pending_foreground_deletion_of_content_is_overridden(api):
    await create_ns(api, "over")
    base = "/api/v1/namespaces/over/configmaps"
    code, out = await api.json("POST", base, {"apiVersion": "v1", "kind": "ConfigMap",
                                              "metadata": {"name": "fg", "finalizers": ["example.com/hold"]}})
    assert code == 201, out
    code, out = await api.json("DELETE", f"{base}/fg", {"propagationPolicy": "Foreground"})
    assert code == 200 and sorted(out["metadata"]["finalizers"]) == sorted(["example.com/hold", FG])
    assert (await api.json("DELETE", "/api/v1/namespaces/over"))[0] == 200

    async def overridden() -> bool:
        code, cm = await api.json("GET", f"{base}/fg")
        return code == 200 and cm["metadata"]["finalizers"] == ["example.com/hold"]
    await poll(overridden)
    code, _ = await api.json("PATCH", f"{base}/fg", {"metadata": {"finalizers": None}},
                             content_type="application/merge-patch+json")
    assert code == 200

    async def gone() -> bool:
        return (await api.json("GET", "/api/v1/namespaces/over"))[0] == 404
    await poll(gone)


async def test_a_namespace_left_terminating_is_resumed_at_start(tmp_path):
    async with open_api(tmp_path, namespace_controller=False) as api:
        await create_ns(api, "left")
        code, out = await api.json("POST", "/api/v1/namespaces/left/configmaps",
                                   {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
        assert code == 201, out
        assert (await api.json("DELETE", "/api/v1/namespaces/left"))[0] == 200
        await trio.sleep(0.3)  # nobody finalizes it meanwhile
        assert (await api.json("GET", "/api/v1/namespaces/left"))[0] == 200
        async with trio.open_nursery() as n:
            await n.start(run_namespace_controller, api)

            async def gone() -> bool:
                return (await api.json("GET", "/api/v1/namespaces/left"))[0] == 404
            await poll(gone)
            assert (await api.json("GET", "/api/v1/namespaces/left/configmaps/c"))[0] == 404
            n.cancel_scope.cancel()


async def test_leftovers_of_a_vanished_namespace_are_deleted(api):
    await create_ns(api, "stripped")
    base = "/api/v1/namespaces/stripped/configmaps"
    code, out = await api.json("POST", base, {"apiVersion": "v1", "kind": "ConfigMap",
                                              "metadata": {"name": "held", "finalizers": ["example.com/hold"]}})
    assert code == 201, out
    assert (await api.json("DELETE", "/api/v1/namespaces/stripped"))[0] == 200
    # Someone empties spec.finalizers by hand: the server removes the namespace at once.
    code, out = await api.json("PUT", "/api/v1/namespaces/stripped/finalize", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "stripped"}, "spec": {"finalizers": []}})
    assert code == 200, out
    assert (await api.json("GET", "/api/v1/namespaces/stripped"))[0] == 404
    # Something lands in it anyway (written straight to the store): it is deleted too.
    await api.store.create(meta.store_key("", "configmaps", "stripped", "late"), {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late", "namespace": "stripped"}})

    async def late_gone() -> bool:
        return (await api.json("GET", f"{base}/late"))[0] == 404
    await poll(late_gone)
    code, held = await api.json("GET", f"{base}/held")
    assert code == 200 and held["metadata"].get("deletionTimestamp")


async def test_a_failing_deletecollection_is_reported_and_retried(api):
    from fleet.api import errors

    await create_ns(api, "stuck")
    code, out = await api.json("POST", "/api/v1/namespaces/stuck/configmaps",
                               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    assert code == 201, out
    strategies = api.server.resources.delete_strategies

    async def refuse(info, route, old, opts, *, dry_run):  # type: ignore[no-untyped-def]
        raise errors.InternalError("storage says no")

    strategies[("", "configmaps")] = refuse
    assert (await api.json("DELETE", "/api/v1/namespaces/stuck"))[0] == 200

    async def failed() -> dict[str, Any] | None:
        code, ns = await api.json("GET", "/api/v1/namespaces/stuck")
        conds = {c["type"]: c for c in ns["status"].get("conditions") or []}
        c = conds.get(CONTENT_FAILURE)
        return conds if c and c["status"] == "True" else None
    conds = await poll(failed)
    assert conds[CONTENT_FAILURE]["reason"] == "ContentDeletionFailed"
    assert conds[CONTENT_FAILURE]["message"] == (
        "Failed to delete all resource types, 1 remaining: failed to delete configmaps.: storage says no")
    assert conds[CONTENT_REMAINING]["message"] == "Some resources are remaining: configmaps. has 1 resource instances"
    # The store recovers: the next pass empties and removes the namespace.
    del strategies[("", "configmaps")]

    async def gone() -> bool:
        return (await api.json("GET", "/api/v1/namespaces/stuck"))[0] == 404
    await poll(gone)
