"""Namespace finalization: content removal, status conditions, the namespace's own finalizers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio

from fleet.server.nslifecycle import (
    CONDITION_TYPES,
    CONTENT_FAILURE,
    CONTENT_REMAINING,
    FINALIZERS_REMAINING,
    ContentTotals,
    failure_conditions,
    updated_conditions,
)
from fleet.testing.apiserver import open_api


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
