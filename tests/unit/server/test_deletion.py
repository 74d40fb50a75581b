"""Delete semantics: propagation policy → GC finalizers, graceful pods, DeleteOptions.

The pure rules (`gc_finalizers`, `plan_delete`) are table-tested; the REST
behaviour through the in-process API pipeline.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import trio

from fleet.api.registry import default_registry
from fleet.server.deletion import (
    FOREGROUND_FINALIZER,
    JOB_ORPHAN_WARNING,
    ORPHAN_FINALIZER,
    default_policy,
    gc_finalizers,
    plan_delete,
)
from fleet.testing.apiserver import open_api

REG = default_registry()
CONFIGMAP = REG.get("", "v1", "configmaps")
POD = REG.get("", "v1", "pods")
JOB = REG.get("batch", "v1", "jobs")
EVENT = REG.get("", "v1", "events")
RS = REG.get("apps", "v1", "replicasets")
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
FG, OR = FOREGROUND_FINALIZER, ORPHAN_FINALIZER


def test_default_policies():
    assert default_policy(CONFIGMAP) == "Background"
    assert default_policy(RS) == "Background"  # apps/v1: cascading by default
    assert default_policy(JOB) == "Orphan"  # batch/v1 keeps its pods, for compatibility
    assert default_policy(EVENT) is None  # Events take no part in garbage collection
    assert default_policy(REG.get("events.k8s.io", "v1", "events")) is None


@pytest.mark.parametrize(("info", "fins", "opts", "want"), [
    (CONFIGMAP, [], {}, []),
    (CONFIGMAP, [], {"propagationPolicy": "Background"}, []),
    (CONFIGMAP, [], {"propagationPolicy": "Foreground"}, [FG]),
    (CONFIGMAP, [], {"propagationPolicy": "Orphan"}, [OR]),
    # The legacy option wins over everything and excludes Foreground.
    (CONFIGMAP, [], {"orphanDependents": True}, [OR]),
    (CONFIGMAP, [FG], {"orphanDependents": False}, []),
    # Other finalizers are kept, in their order; ours go last.
    (CONFIGMAP, ["a/x", "b/y"], {"propagationPolicy": "Foreground"}, ["a/x", "b/y", FG]),
    # A GC finalizer already there is the policy when the request names none...
    (CONFIGMAP, [FG], {}, [FG]),
    (CONFIGMAP, [OR, "a/x"], {}, [OR, "a/x"]),
    # ...and is replaced when it names another.
    (CONFIGMAP, [FG], {"propagationPolicy": "Orphan"}, [OR]),
    (CONFIGMAP, [OR, "a/x"], {"propagationPolicy": "Foreground"}, ["a/x", FG]),
    (CONFIGMAP, [OR], {"propagationPolicy": "Background"}, []),
    # The kind's default only applies when nothing else says.
    (JOB, [], {}, [OR]),
    (JOB, [], {"propagationPolicy": "Background"}, []),
    (JOB, [FG], {}, [FG]),
    # Events: never touched.
    (EVENT, [], {"propagationPolicy": "Foreground"}, []),
    (EVENT, [FG], {"propagationPolicy": "Background"}, [FG]),
])
def test_gc_finalizers(info, fins, opts, want):
    assert gc_finalizers(info, fins, opts) == want


def test_gc_finalizers_returns_the_same_list_when_unchanged():
    fins = [FG, "a/x"]
    assert gc_finalizers(CONFIGMAP, fins, {}) is fins
    assert gc_finalizers(CONFIGMAP, ["a/x", FG], {"propagationPolicy": "Foreground"}) == ["a/x", FG]


def cm(fins: list[str] = (), deleting: bool = False, grace: int | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": "x", "namespace": "ns", "uid": "u", "resourceVersion": "5"}
    if fins:
        md["finalizers"] = list(fins)
    if deleting:
        md["deletionTimestamp"] = "2025-12-31T00:00:00Z"
        md["deletionGracePeriodSeconds"] = 0 if grace is None else grace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md}


def pod(node: str = "n1", deleting: bool = False, grace: int = 30, fins: list[str] = ()) -> dict[str, Any]:
    p = cm(fins, deleting, grace)
    p["kind"] = "Pod"
    p["spec"] = {"nodeName": node} if node else {}
    return p


def summary(step: Any) -> tuple[Any, ...]:
    """(finalizers written or None, deletionTimestamp written, grace written, update_removes, then_delete)."""
    if step.update is None:
        return (None, None, None, step.update_removes, step.then_delete)
    md = step.update["metadata"]
    return (md.get("finalizers", []), md.get("deletionTimestamp"), md.get("deletionGracePeriodSeconds"),
            step.update_removes, step.then_delete)


NOW_S = "2026-01-01T00:00:00Z"
OLD_S = "2025-12-31T00:00:00Z"


@pytest.mark.parametrize(("info", "obj", "opts", "want"), [
    # No finalizers, Background: the store removes it.
    (CONFIGMAP, cm(), {}, (None, None, None, False, True)),
    # Foreground: one write marks it and adds the finalizer.
    (CONFIGMAP, cm(), {"propagationPolicy": "Foreground"}, ([FG], NOW_S, 0, False, False)),
    (CONFIGMAP, cm(["a/x"]), {"propagationPolicy": "Orphan"}, (["a/x", OR], NOW_S, 0, False, False)),
    # Someone else's finalizer only: marked for deletion, in one write.
    (CONFIGMAP, cm(["a/x"]), {}, (["a/x"], NOW_S, 0, False, False)),
    # Already marked, nothing new: no write at all.
    (CONFIGMAP, cm([FG], deleting=True), {}, (None, None, None, False, False)),
    (CONFIGMAP, cm(["a/x"], deleting=True), {"propagationPolicy": "Background"}, (None, None, None, False, False)),
    # Already marked, the policy changes: the finalizers are rewritten, the timestamp kept.
    (CONFIGMAP, cm([FG], deleting=True), {"propagationPolicy": "Orphan"}, ([OR], OLD_S, 0, False, False)),
    # ...and dropping the last (GC) finalizer completes the deletion in that write.
    (CONFIGMAP, cm([FG], deleting=True), {"propagationPolicy": "Background"}, ([], OLD_S, 0, True, False)),
    (CONFIGMAP, cm([OR]), {"propagationPolicy": "Background"}, ([], NOW_S, 0, True, False)),
    # A pod on a node: graceful; its finalizers follow the policy in the same write.
    (POD, pod(), {}, ([], "2026-01-01T00:00:30Z", 30, False, False)),
    (POD, pod(), {"propagationPolicy": "Foreground", "gracePeriodSeconds": 5},
     ([FG], "2026-01-01T00:00:05Z", 5, False, False)),
    # A pod in its grace period: a repeated DELETE changes nothing, not even finalizers.
    (POD, pod(deleting=True), {"propagationPolicy": "Foreground"}, (None, None, None, False, False)),
    # ...except a period of 0 (the agent's final delete): the store removes it or, with
    # finalizers left, brings the grace period down to 0.
    (POD, pod(deleting=True), {"gracePeriodSeconds": 0}, (None, None, None, False, True)),
    (POD, pod(deleting=True, fins=[FG]), {"gracePeriodSeconds": 0}, (None, None, None, False, True)),
    # An unscheduled pod goes at once.
    (POD, pod(node=""), {}, (None, None, None, False, True)),
])
def test_plan_delete(info, obj, opts, want):
    assert summary(plan_delete(info, obj, opts, now=NOW)) == want


def test_plan_delete_marks_only_when_starting_the_deletion():
    def mark(o: dict[str, Any]) -> None:
        o["metadata"].setdefault("labels", {})["marked"] = "yes"

    step = plan_delete(CONFIGMAP, cm(), {}, now=NOW, mark=mark)
    assert step.update is not None and step.update["metadata"]["labels"] == {"marked": "yes"} and step.then_delete
    step = plan_delete(POD, pod(), {}, now=NOW, mark=mark)
    assert step.update is not None and step.update["metadata"]["labels"] == {"marked": "yes"}
    assert plan_delete(CONFIGMAP, cm(["a/x"], deleting=True), {}, now=NOW, mark=mark).update is None


# ---------------------------------------------------------------------------------------
# Through the API


CM = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def make(api, name: str, fins: list[str] = ()) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if fins:
        md["finalizers"] = list(fins)
    code, out = await api.json("POST", CM, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md})
    assert code == 201, out
    return out


async def test_foreground_delete_keeps_the_object_with_the_finalizer(api):
    await make(api, "a")
    code, body = await api.json("DELETE", f"{CM}/a", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                      "propagationPolicy": "Foreground"})
    assert code == 200
    assert body["metadata"]["finalizers"] == [FG] and body["metadata"]["deletionTimestamp"]
    code, got = await api.json("GET", f"{CM}/a")
    assert code == 200 and got["metadata"]["finalizers"] == [FG]
    # Deleting again with Background drops the GC finalizer: gone at once.
    code, _ = await api.json("DELETE", f"{CM}/a", query={"propagationPolicy": "Background"})
    assert code == 200
    assert (await api.json("GET", f"{CM}/a"))[0] == 404


async def test_orphan_dependents_legacy_option_and_its_202(api):
    await make(api, "a")
    code, body = await api.json("DELETE", f"{CM}/a", query={"orphanDependents": "true"})
    assert code == 200 and body["metadata"]["finalizers"] == [OR]
    await make(api, "b", ["example.com/hold"])
    # orphanDependents=false on an object that stays: the one case kube-apiserver answers 202.
    code, body = await api.json("DELETE", f"{CM}/b", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                      "orphanDependents": False})
    assert code == 202 and body["metadata"]["finalizers"] == ["example.com/hold"]


async def test_delete_options_refused_as_kube_apiserver_does(api):
    await make(api, "a")
    code, body = await api.json("DELETE", f"{CM}/a", {"propagationPolicy": "Foreground", "orphanDependents": True})
    assert code == 422 and body["reason"] == "Invalid"
    assert "orphanDependents and deletionPropagation cannot be both set" in body["message"]
    assert body["details"]["kind"] == "DeleteOptions" and body["details"]["group"] == "meta.k8s.io"
    code, body = await api.json("DELETE", f"{CM}/a", query={"propagationPolicy": "Sideways"})
    assert code == 422 and 'Unsupported value: "Sideways"' in body["message"]
    code, body = await api.json("DELETE", f"{CM}/a", {"orphanDependents": "yes"})
    assert code == 400
    assert (await api.json("GET", f"{CM}/a"))[0] == 200


async def test_dry_run_shows_the_marked_object_and_changes_nothing(api):
    await make(api, "a")
    code, body = await api.json("DELETE", f"{CM}/a", {"propagationPolicy": "Foreground"},
                                query={"dryRun": "All"})
    assert code == 200 and body["metadata"]["finalizers"] == [FG]
    code, got = await api.json("GET", f"{CM}/a")
    assert code == 200 and "deletionTimestamp" not in got["metadata"]


async def test_job_deleted_without_policy_orphans_and_warns(api):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox"}]}}}}
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    code, out = await api.json("POST", jobs, job)
    assert code == 201, out
    resp = await api.call("DELETE", f"{jobs}/j")
    assert resp.status == 200
    assert JOB_ORPHAN_WARNING in resp.headers.get("Warning", "")
    code, got = await api.json("GET", f"{jobs}/j")
    assert code == 200 and got["metadata"]["finalizers"] == [OR]  # the collector finishes it
    # kubectl names a policy (Background by default): no warning, no finalizer.
    job["metadata"]["name"] = "k"
    await api.json("POST", jobs, job)
    resp = await api.call("DELETE", f"{jobs}/k", query={"propagationPolicy": "Background"})
    assert resp.status == 200 and "Warning" not in resp.headers
    assert (await api.json("GET", f"{jobs}/k"))[0] == 404


async def test_graceful_pod_gets_the_foreground_finalizer_with_its_grace(api):
    pods = "/api/v1/namespaces/default/pods"
    code, out = await api.json("POST", pods, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}})
    assert code == 201, out
    code, body = await api.json("DELETE", f"{pods}/p", {"propagationPolicy": "Foreground", "gracePeriodSeconds": 7})
    assert code == 200
    md = body["metadata"]
    assert md["finalizers"] == [FG] and md["deletionGracePeriodSeconds"] == 7
    # The agent's final delete (grace 0) leaves it to the collector's finalizer.
    code, body = await api.json("DELETE", f"{pods}/p", query={"gracePeriodSeconds": "0"})
    assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 0
    assert (await api.json("GET", f"{pods}/p"))[0] == 200


async def test_namespace_delete_takes_gc_finalizers_and_answers_200(api):
    code, _ = await api.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": "fg"}})
    assert code == 201
    code, body = await api.json("DELETE", "/api/v1/namespaces/fg", {"propagationPolicy": "Foreground"})
    assert code == 200
    assert body["status"]["phase"] == "Terminating" and body["metadata"]["finalizers"] == [FG]
    # Emptied, the namespace controller clears its own token and leaves the
    # namespace to the collector's finalizer.
    with trio.fail_after(10):
        while True:
            code, ns = await api.json("GET", "/api/v1/namespaces/fg")
            assert code == 200
            if ns["spec"].get("finalizers") == []:
                break
            await trio.sleep(0.05)
    assert ns["metadata"]["finalizers"] == [FG]
    code, body = await api.json("PATCH", "/api/v1/namespaces/fg", {"metadata": {"finalizers": None}},
                                content_type="application/merge-patch+json")
    assert code == 200
    assert (await api.json("GET", "/api/v1/namespaces/fg"))[0] == 404


async def test_delete_collection_applies_the_options_to_every_item(api):
    await make(api, "a")
    await make(api, "b")
    code, body = await api.json("DELETE", CM, {"kind": "DeleteOptions", "apiVersion": "v1",
                                              "propagationPolicy": "Orphan"})
    assert code == 200
    assert sorted(i["metadata"]["name"] for i in body["items"]) == ["a", "b"]
    assert all(i["metadata"]["finalizers"] == [OR] for i in body["items"])
