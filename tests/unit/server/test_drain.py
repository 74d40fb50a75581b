"""Node maintenance: kubectl drain's pod filters (pure), and the server-side drain and
schedulable subresources through the in-process API with the drain runner."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from fleet.api import meta
from fleet.server import drain_plan
from fleet.server.drain_plan import DrainOptions, parse_options, plan_drain
from fleet.testing.apiserver import open_api

NODES = "/api/v1/nodes"
PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, *, owner: str | None = None, phase: str = "Running", emptydir: bool = False,
        mirror: bool = False, node: str = "n1", deleting: bool = False) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if owner:
        kind, _, oname = owner.partition("/")
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": oname, "uid": "x",
                                  "controller": True}]
    if mirror:
        md["annotations"] = {drain_plan.MIRROR_ANNOTATION: "hash"}
    if deleting:
        md["deletionTimestamp"] = "2020-01-01T00:00:00Z"
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
    if emptydir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec, "status": {"phase": phase}}


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


PODS_ON_NODE = [
    pod("web", owner="ReplicaSet/web"),
    pod("ds", owner="DaemonSet/agent"),
    pod("orphan-ds", owner="DaemonSet/gone"),
    pod("static", mirror=True),
    pod("cache", owner="ReplicaSet/cache", emptydir=True),
    pod("bare"),
    pod("done-bare", phase="Succeeded"),
    pod("done-ds", owner="DaemonSet/agent", phase="Failed"),
]


@pytest.mark.parametrize(("opts", "evict", "skipped", "errors"), [
    # Messages come in the order of the first pod (by namespace/name) that hits them.
    (DrainOptions(), None, None, [
        "cannot delete Pods that declare no controller (use --force to override): default/bare",
        "cannot delete Pods with local storage (use --delete-emptydir-data to override): default/cache",
        "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): default/ds",
        'cannot delete daemonsets.apps "gone" not found: default/orphan-ds']),
    (DrainOptions(ignoreDaemonSets=True, deleteEmptyDirData=True), None, None, [
        "cannot delete Pods that declare no controller (use --force to override): default/bare",
        'cannot delete daemonsets.apps "gone" not found: default/orphan-ds']),
    (DrainOptions(ignoreDaemonSets=True, deleteEmptyDirData=True, force=True),
     ["bare", "cache", "done-bare", "done-ds", "orphan-ds", "web"], ["default/ds", "default/static"], []),
])
def test_plan_follows_kubectl_filters(opts, evict, skipped, errors):
    plan = plan_drain(PODS_ON_NODE, opts, {"default/agent"})
    assert plan.error_messages() == errors
    if evict is not None:
        assert names(plan.evict) == evict
        assert plan.skipped == skipped
        assert plan.warning_messages() == [
            "deleting Pods that declare no controller: default/bare",
            "deleting Pods with local storage: default/cache",
            "ignoring DaemonSet-managed Pods: default/ds",
            'daemonsets.apps "gone" not found: default/orphan-ds']


def test_finished_pods_and_mirror_pods():
    plan = plan_drain([pod("m", mirror=True), pod("f", phase="Failed", emptydir=True)], DrainOptions(), set())
    assert plan.skipped == ["default/m"] and names(plan.evict) == ["f"] and not plan.errors


@pytest.mark.parametrize(("body", "fields"), [
    ({"force": "yes"}, ["force"]),
    ({"timeoutSeconds": -1}, ["timeoutSeconds"]),
    ({"gracePeriodSeconds": 1.5, "bogus": 1}, ["gracePeriodSeconds", "bogus"]),
])
def test_bad_options_are_422(body, fields):
    from fleet.api import errors

    with pytest.raises(errors.Invalid) as exc:
        parse_options(body)
    assert [c["field"] for c in exc.value.causes] == fields


def test_options_defaults_and_round_trip():
    assert parse_options({}) == DrainOptions()
    opts = parse_options({"ignoreDaemonSets": True, "gracePeriodSeconds": 5, "timeoutSeconds": 60})
    assert parse_options(opts.to_json()) == opts


# -- through the API, with the runner ------------------------------------------------------


def node(name: str = "n1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def api_pod(name: str, *, owner: str | None = "ReplicaSet/web", node_name: str = "n1",
            grace: int = 30, **spec: Any) -> dict[str, Any]:
    p = pod(name, owner=owner, node=node_name)
    del p["metadata"]["uid"], p["status"]
    p["spec"]["terminationGracePeriodSeconds"] = grace
    p["spec"].update(spec)
    return p


async def kubelet(api, stop: trio.Event) -> None:
    """What a node agent does for terminating pods: remove them for good."""
    while not stop.is_set():
        res = await api.store.list(meta.store_key("", "pods", None))
        for p in res.items:
            if p["metadata"].get("deletionTimestamp"):
                await api.json("DELETE", f"/api/v1/namespaces/{p['metadata']['namespace']}/pods/"
                               f"{p['metadata']['name']}", {"gracePeriodSeconds": 0})
        await trio.sleep(0.02)


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True, maintenance=True) as a:
        assert (await a.json("POST", NODES, node()))[0] == 201
        yield a


async def wait_phase(api, name: str = "n1", timeout: float = 5.0) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while True:
            code, doc = await api.json("GET", f"{NODES}/{name}/drain")
            assert code == 200, doc
            if doc["phase"] != "Running":
                return doc
            await trio.sleep(0.02)


async def test_drain_cordons_evicts_and_completes(api):
    for name in ("a", "b"):
        assert (await api.json("POST", PODS, api_pod(name)))[0] == 201
    await api.json("POST", PODS, api_pod("elsewhere", node_name="n2"))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(kubelet, api, stop)
        code, doc = await api.json("POST", f"{NODES}/n1/drain", {"ignoreDaemonSets": True})
        assert code == 202, doc
        assert (doc["kind"], doc["apiVersion"], doc["phase"]) == ("NodeDrain", "fleet.dev/v1", "Running")
        done = await wait_phase(api)
        stop.set()
    assert done["phase"] == "Complete", done
    assert done["evicted"] == ["default/a", "default/b"] and done["remaining"] == [] and done["completionTime"]
    _, n = await api.json("GET", f"{NODES}/n1")
    assert n["spec"]["unschedulable"] is True
    assert json.loads(n["metadata"]["annotations"][drain_plan.DRAIN_ANNOTATION])["phase"] == "Complete"
    assert (await api.json("GET", f"{PODS}/elsewhere"))[0] == 200


async def test_drain_refuses_like_kubectl_and_leaves_pods(api):
    await api.json("POST", PODS, api_pod("bare", owner=None))
    code, _ = await api.json("POST", f"{NODES}/n1/drain", {})
    assert code == 202
    done = await wait_phase(api)
    assert done["phase"] == "Failed"
    assert done["errors"] == ["cannot delete Pods that declare no controller (use --force to override): "
                              "default/bare"]
    assert (await api.json("GET", f"{PODS}/bare"))[0] == 200


async def test_drain_waits_for_terminating_pods_and_times_out(api):
    await api.json("POST", PODS, api_pod("slow"))
    code, _ = await api.json("POST", f"{NODES}/n1/drain", {"timeoutSeconds": 1})
    assert code == 202
    # No agent finishes the pod: it stays terminating until the drain gives up.
    with trio.fail_after(5):
        while True:
            _, doc = await api.json("GET", f"{NODES}/n1/drain")
            if doc["evicted"]:
                break
            await trio.sleep(0.02)
    assert doc["phase"] == "Running" and doc["remaining"] == ["default/slow"]
    done = await wait_phase(api)
    assert done["phase"] == "TimedOut" and "default/slow" in done["errors"][0]


async def test_grace_period_option_reaches_the_eviction(api):
    await api.json("POST", PODS, api_pod("quick"))
    await api.json("POST", f"{NODES}/n1/drain", {"gracePeriodSeconds": 0})
    done = await wait_phase(api)
    assert done["phase"] == "Complete" and done["evicted"] == ["default/quick"]


async def test_second_drain_while_running_is_409_and_uncordon_cancels(api):
    await api.json("POST", PODS, api_pod("slow"))
    assert (await api.json("POST", f"{NODES}/n1/drain", {}))[0] == 202
    code, body = await api.json("POST", f"{NODES}/n1/drain", {})
    assert (code, body["reason"]) == (409, "Conflict")
    code, n = await api.json("POST", f"{NODES}/n1/schedulable", {"schedulable": True})
    assert code == 200 and "unschedulable" not in n["spec"]
    done = await wait_phase(api)
    assert done["phase"] == "Failed" and done["errors"] == [drain_plan.CANCELLED]
    # Finished drains can be started again.
    assert (await api.json("POST", f"{NODES}/n1/drain", {"gracePeriodSeconds": 0}))[0] == 202
    assert (await wait_phase(api))["phase"] == "Complete"


async def test_uncordon_through_a_patch_cancels_too(api):
    await api.json("POST", PODS, api_pod("slow"))
    await api.json("POST", f"{NODES}/n1/drain", {})
    code, _ = await api.json("PATCH", f"{NODES}/n1", {"spec": {"unschedulable": None}},
                             content_type="application/strategic-merge-patch+json")
    assert code == 200
    assert (await wait_phase(api))["phase"] == "Failed"


async def test_schedulable(api):
    code, n = await api.json("POST", f"{NODES}/n1/schedulable", {"schedulable": False})
    assert code == 200 and n["spec"]["unschedulable"] is True
    rv = n["metadata"]["resourceVersion"]
    code, n = await api.json("POST", f"{NODES}/n1/schedulable", {"schedulable": False})
    assert n["metadata"]["resourceVersion"] == rv  # nothing to change, nothing written
    code, n = await api.json("POST", f"{NODES}/n1/schedulable", {"schedulable": True})
    assert code == 200 and "unschedulable" not in n["spec"]


@pytest.mark.parametrize(("method", "path", "body", "code", "reason"), [
    ("GET", f"{NODES}/n1/drain", None, 404, "NotFound"),
    ("GET", f"{NODES}/nope/drain", None, 404, "NotFound"),
    ("POST", f"{NODES}/nope/drain", {}, 404, "NotFound"),
    ("POST", f"{NODES}/nope/schedulable", {"schedulable": True}, 404, "NotFound"),
    ("POST", f"{NODES}/n1/schedulable", {}, 422, "Invalid"),
    ("POST", f"{NODES}/n1/schedulable", {"schedulable": "no"}, 422, "Invalid"),
    ("POST", f"{NODES}/n1/drain", {"force": 1}, 422, "Invalid"),
    ("PUT", f"{NODES}/n1/drain", {}, 405, "MethodNotAllowed"),
    ("GET", f"{NODES}/n1/schedulable", None, 405, "MethodNotAllowed"),
    ("POST", "/api/v1/namespaces/default/pods/p/drain", {}, 404, "NotFound"),
])
async def test_errors_are_status_objects(api, method, path, body, code, reason):
    got, status = await api.json(method, path, body)
    assert (got, status["kind"], status["reason"]) == (code, "Status", reason), status


async def test_running_drain_resumes_after_a_restart(tmp_path):
    """A drain recorded as Running in the Node is picked up by a fresh runner."""
    async with open_api(tmp_path) as a:
        await a.json("POST", NODES, node())
        await a.json("POST", PODS, api_pod("p", grace=0))
        # No runner here: the POST records the drain, nothing evicts.
        assert (await a.json("POST", f"{NODES}/n1/drain", {}))[0] == 202
        assert (await a.json("GET", f"{PODS}/p"))[0] == 200
    async with open_api(tmp_path, maintenance=True) as a:
        done = await wait_phase(a)
        assert done["phase"] == "Complete" and done["evicted"] == ["default/p"]
