"""VolumeBinding's binding cycle: the API writes of pre-bind, the bounded wait, and the
scheduler loop around it (a failed pre-bind retries the pod with a FailedScheduling event).

A fake API client plays the server and the informers: a write bumps the object's
resourceVersion and is delivered to the scheduler's snapshot at once, and a
`controller` callback plays the PV controller / provisioner reacting to it.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from fleet.client import ApiException
from fleet.scheduler.framework import BindHandle, Framework
from fleet.scheduler.plugins import default_plugins
from fleet.scheduler.run import Scheduler, SchedulerConfig
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import HOSTNAME, node
from tests.unit.scheduler.volumes import (
    LOCAL_DRIVER,
    capacity,
    claim,
    claim_pod,
    csidriver,
    csinode,
    storage_class,
    volume,
)

BOUND_BY = "pv.kubernetes.io/bound-by-controller"
SELECTED = "volume.kubernetes.io/selected-node"


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class FakeApi:
    """replace() of PVs and claims, and pod bindings; each write is applied to the
    snapshot like an informer event, then `controller(kind, obj)` may react."""

    def __init__(self, snap: Snapshot, controller: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.snap = snap
        self.controller = controller
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.bound: dict[str, str] = {}
        self.conflict_on: set[str] = set()
        self.rv = 100

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        out = copy.deepcopy(obj)
        out["metadata"]["resourceVersion"] = str(self.rv)
        return out

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if name in self.conflict_on:
            raise ApiException({"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
                                "message": f'Operation cannot be fulfilled on {plural} "{name}": '
                                           "the object has been modified; please apply your changes "
                                           "to the latest version and try again"}, 409)
        out = self._bump(body)
        self.writes.append((plural, out))
        if plural == "persistentvolumes":
            self.snap.set_pv(out)
        else:
            self.snap.set_pvc(out)
        if self.controller is not None:
            self.controller(plural, out)
        return out

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str | None = None,
                     *, name: str | None = None, subresource: str | None = None, **kw: Any) -> dict[str, Any]:
        if subresource == "binding":
            self.bound[f"{namespace}/{name}"] = body["target"]["name"]
        return body

    async def patch(self, *args: Any, **kw: Any) -> dict[str, Any]:
        return {}

    def bind_claim(self, namespace: str, name: str, volume_name: str) -> None:
        """What the PV controller does once a volume names the claim."""
        c = copy.deepcopy(self.snap.pvc(namespace, name))
        assert c is not None
        c["spec"]["volumeName"] = volume_name
        c["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] = "yes"
        c["status"]["phase"] = "Bound"
        self.snap.set_pvc(self._bump(c))


def cluster(claims: list[dict[str, Any]], pvs: list[dict[str, Any]]) -> Snapshot:
    return Snapshot.build([node("n1"), node("n2")], pvcs=claims, pvs=pvs,
                          storage_classes=[storage_class("wffc"),
                                           storage_class("static", provisioner="kubernetes.io/no-provisioner")],
                          csinodes=[csinode("n1", LOCAL_DRIVER), csinode("n2", LOCAL_DRIVER)],
                          csidrivers=[csidriver()], capacities=[capacity("n1", "10Gi"), capacity("n2", "10Gi")])


def schedule_and_reserve(snap: Snapshot, p: dict[str, Any]) -> tuple[Framework, Any, str]:
    fw = Framework(default_plugins(), rng=random.Random(0))
    r = fw.schedule(p, snap)
    assert r.state is not None and fw.reserve(r.state, p, r.node).ok
    return fw, r.state, r.node


async def test_static_volume_is_bound_to_the_claim_then_waited_for(autojump_clock: trio.testing.MockClock) -> None:
    data = claim("data", cls="static")
    snap = cluster([data], [volume("pv-a", node="n2", cls="static")])
    api = FakeApi(snap)
    p = claim_pod("data")
    fw, state, chosen = schedule_and_reserve(snap, p)
    assert chosen == "n2"

    async def pv_controller() -> None:
        await trio.sleep(3)
        api.bind_claim("default", "data", "pv-a")

    async with trio.open_nursery() as n:
        n.start_soon(pv_controller)
        start = trio.current_time()
        st = await fw.pre_bind(state, p, chosen, BindHandle(api, snap, timeout=60, poll_interval=0.5))
        waited = trio.current_time() - start
    assert st.ok, st
    assert 3 <= waited < 4  # returned as soon as the claim was bound
    [(plural, pv)] = api.writes
    assert plural == "persistentvolumes" and pv["metadata"]["name"] == "pv-a"
    assert pv["spec"]["claimRef"] == {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                                      "name": "data", "uid": "uid-data", "resourceVersion": "10"}
    assert pv["metadata"]["annotations"][BOUND_BY] == "yes"


async def test_claim_to_provision_gets_the_selected_node(autojump_clock: trio.testing.MockClock) -> None:
    snap = cluster([claim("data")], [])
    provisioned: list[str] = []

    def provisioner(plural: str, obj: dict[str, Any]) -> None:
        # The provisioner makes pvc-<uid> on the selected node and the PV controller binds it.
        if plural == "persistentvolumeclaims" and obj["metadata"]["annotations"].get(SELECTED):
            provisioned.append(obj["metadata"]["annotations"][SELECTED])
            snap.set_pv(volume("pvc-uid-data", node=obj["metadata"]["annotations"][SELECTED],
                               claim_ref={"namespace": "default", "name": "data", "uid": "uid-data"}))
            api.bind_claim("default", "data", "pvc-uid-data")

    api = FakeApi(snap, provisioner)
    p = claim_pod("data", nodeSelector={HOSTNAME: "n1"})
    fw, state, chosen = schedule_and_reserve(snap, p)
    st = await fw.pre_bind(state, p, chosen, BindHandle(api, snap, timeout=60))
    assert st.ok, st
    assert provisioned == ["n1"]
    [(plural, written)] = api.writes
    assert plural == "persistentvolumeclaims" and written["metadata"]["annotations"][SELECTED] == "n1"


def _drop_selected_node(api: FakeApi, snap: Snapshot) -> Callable[[str, dict[str, Any]], None]:
    def provisioner(plural: str, obj: dict[str, Any]) -> None:
        # RESOURCE_EXHAUSTED on a WaitForFirstConsumer claim: the provisioner removes selected-node.
        c = copy.deepcopy(obj)
        del c["metadata"]["annotations"][SELECTED]
        snap.set_pvc(api._bump(c))
    return provisioner


@pytest.mark.parametrize(("case", "want"), [
    ("provisioning failed", 'running PreBind plugin "VolumeBinding": binding volumes: provisioning failed for PVC "data"'),
    ("timeout", 'running PreBind plugin "VolumeBinding": binding volumes: timed out waiting for the condition'),
    ("conflict", 'running PreBind plugin "VolumeBinding": Operation cannot be fulfilled on persistentvolumeclaims '
                 '"data": the object has been modified; please apply your changes to the latest version and try again'),
    ("pod deleted", 'running PreBind plugin "VolumeBinding": binding volumes: pod does not exist any more'),
])
async def test_pre_bind_failures(case: str, want: str, autojump_clock: trio.testing.MockClock) -> None:
    snap = cluster([claim("data")], [])
    api = FakeApi(snap)
    if case == "provisioning failed":
        api.controller = _drop_selected_node(api, snap)
    if case == "conflict":
        api.conflict_on.add("data")
    p = claim_pod("data")
    fw, state, chosen = schedule_and_reserve(snap, p)
    start = trio.current_time()
    st = await fw.pre_bind(state, p, chosen, BindHandle(api, snap, timeout=30, poll_interval=1,
                                                        pod_exists=lambda: case != "pod deleted"))
    assert not st.ok and st.reasons == (want,)
    assert (trio.current_time() - start) == (30 if case == "timeout" else 0)


async def test_claim_ref_reset_fails_the_binding(autojump_clock: trio.testing.MockClock) -> None:
    snap = cluster([claim("data", cls="static")], [volume("pv-a", node="n2", cls="static")])

    def pv_controller(plural: str, obj: dict[str, Any]) -> None:
        reset = copy.deepcopy(obj)
        del reset["spec"]["claimRef"]
        snap.set_pv(api._bump(reset))

    api = FakeApi(snap, pv_controller)
    p = claim_pod("data")
    fw, state, chosen = schedule_and_reserve(snap, p)
    st = await fw.pre_bind(state, p, chosen, BindHandle(api, snap, timeout=30))
    assert st.reasons == ('running PreBind plugin "VolumeBinding": binding volumes: ClaimRef got reset for pv "pv-a"',)


async def test_an_informer_copy_older_than_our_write_is_waited_for(autojump_clock: trio.testing.MockClock) -> None:
    # The write is acknowledged but the informer has not delivered it: no "reset" verdict
    # is drawn from the stale copy without claimRef.
    snap = cluster([claim("data", cls="static")], [volume("pv-a", node="n2", cls="static")])
    stale = copy.deepcopy(snap.pv("pv-a"))
    api = FakeApi(snap)
    p = claim_pod("data")
    fw, state, chosen = schedule_and_reserve(snap, p)

    async def late_informer() -> None:
        await trio.sleep(0)
        written = snap.pv("pv-a")
        assert stale is not None and written is not None
        snap.set_pv(stale)  # the informer is behind
        await trio.sleep(2)
        snap.set_pv(written)
        api.bind_claim("default", "data", "pv-a")

    async with trio.open_nursery() as n:
        n.start_soon(late_informer)
        st = await fw.pre_bind(state, p, chosen, BindHandle(api, snap, timeout=30))
    assert st.ok, st


async def test_everything_bound_needs_no_writes(autojump_clock: trio.testing.MockClock) -> None:
    data = claim("data", volume="pv-a", bound=True)
    snap = cluster([data], [volume("pv-a", node="n2", claim_ref={"namespace": "default", "name": "data",
                                                                 "uid": "uid-data"})])
    api = FakeApi(snap)
    p = claim_pod("data")
    fw, state, chosen = schedule_and_reserve(snap, p)
    assert chosen == "n2"
    assert (await fw.pre_bind(state, p, chosen, BindHandle(api, snap, timeout=30))).ok
    assert api.writes == []


# -- the scheduler loop ---------------------------------------------------------------

def _scheduler(snap_claims: list[dict[str, Any]], pvs: list[dict[str, Any]],
               controller: Callable[[FakeApi, Snapshot], Callable[[str, dict[str, Any]], None]] | None = None,
               ) -> tuple[Scheduler, FakeApi]:
    sched = Scheduler(None, SchedulerConfig(initial_backoff=1.0, max_backoff=4.0,  # type: ignore[arg-type]
                                            volume_bind_timeout=20.0))
    src = cluster(snap_claims, pvs)
    for n in src.nodes():
        sched.on_node("ADDED", None, n.node)
    sched.snapshot.pvcs_synced = sched.snapshot.pvs_synced = True
    for sc in src.storage_classes().values():
        sched.on_storage_class("ADDED", None, sc)
    for c in snap_claims:
        sched.on_pvc("ADDED", None, c)
    for pv in pvs:
        sched.on_pv("ADDED", None, pv)
    for name in ("n1", "n2"):
        sched.on_csinode("ADDED", None, csinode(name, LOCAL_DRIVER))
        sched.on_capacity("ADDED", None, capacity(name, "10Gi"))
    sched.on_csidriver("ADDED", None, csidriver())
    api = FakeApi(sched.snapshot)
    if controller is not None:
        api.controller = controller(api, sched.snapshot)
    sched.client = api  # type: ignore[assignment]
    return sched, api


async def _run(sched: Scheduler, seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        async def loop() -> None:
            while True:
                await sched.schedule_one(nursery)
        nursery.start_soon(loop)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_scheduler_binds_volumes_before_the_pod(autojump_clock: trio.testing.MockClock) -> None:
    def pv_controller(api: FakeApi, snap: Snapshot) -> Callable[[str, dict[str, Any]], None]:
        def react(plural: str, obj: dict[str, Any]) -> None:
            if plural == "persistentvolumes":
                ref = obj["spec"]["claimRef"]
                api.bind_claim(ref["namespace"], ref["name"], obj["metadata"]["name"])
        return react

    sched, api = _scheduler([claim("data", cls="static")], [volume("pv-a", node="n2", cls="static")],
                            pv_controller)
    sched.on_pod("ADDED", None, claim_pod("data"))
    await _run(sched, 5)
    assert api.bound == {"default/p": "n2"}
    assert [(plural, o["metadata"]["name"]) for plural, o in api.writes] == [("persistentvolumes", "pv-a")]
    assert sched.snapshot.promised_pvs() == set()  # the promise ended with the binding


async def test_scheduler_retries_a_pod_whose_provisioning_failed(autojump_clock: trio.testing.MockClock) -> None:
    failures = {"count": 0}

    def flaky(api: FakeApi, snap: Snapshot) -> Callable[[str, dict[str, Any]], None]:
        drop = _drop_selected_node(api, snap)

        def react(plural: str, obj: dict[str, Any]) -> None:
            node_name = obj["metadata"]["annotations"].get(SELECTED)
            if plural != "persistentvolumeclaims" or not node_name:
                return
            if failures["count"] == 0:  # the first attempt runs out of space
                failures["count"] += 1
                drop(plural, obj)
                return
            snap.set_pv(volume("pvc-uid-data", node=node_name,
                               claim_ref={"namespace": "default", "name": "data", "uid": "uid-data"}))
            api.bind_claim("default", "data", "pvc-uid-data")
        return react

    sched, api = _scheduler([claim("data")], [], flaky)
    recorded: list[tuple[str, str, str]] = []
    sched.events.record = lambda obj, etype, reason, message, *a, **k: recorded.append(  # type: ignore[method-assign]
        (etype, reason, message))
    sched.on_pod("ADDED", None, claim_pod("data"))
    await _run(sched, 10)
    assert failures["count"] == 1
    assert ("Warning", "FailedScheduling",
            'running PreBind plugin "VolumeBinding": binding volumes: provisioning failed for PVC "data"') in recorded
    assert "default/p" in api.bound  # bound on the retry
    assert [o["metadata"]["annotations"].get(SELECTED) for plural, o in api.writes].count(None) == 0
    assert ("Normal", "Scheduled", f"Successfully assigned default/p to {api.bound['default/p']}") in recorded


async def test_storage_informers_only_for_served_kinds() -> None:
    from fleet.client.discovery import APIResource
    from fleet.scheduler.run import STORAGE_RESOURCES

    class Discovery:
        def __init__(self, resources: list[APIResource] | None) -> None:
            self.resources = resources

        async def discover(self) -> list[APIResource]:
            if self.resources is None:
                raise httpx.ConnectError("down")
            return self.resources

    served = [APIResource("persistentvolumes", "persistentvolume", False, "PersistentVolume", "", "v1"),
              APIResource("csinodes", "csinode", False, "CSINode", "storage.k8s.io", "v1"),
              APIResource("csinodes", "csinode", False, "CSINode", "storage.k8s.io", "v1beta1"),
              APIResource("pods", "pod", True, "Pod", "", "v1")]
    sched = Scheduler(Discovery(served), SchedulerConfig())  # type: ignore[arg-type]
    assert [(v, p) for v, p, _ in await sched._served(STORAGE_RESOURCES)] == [
        ("v1", "persistentvolumes"), ("storage.k8s.io/v1", "csinodes")]
    sched.client = Discovery(None)  # type: ignore[assignment]
    assert await sched._served(STORAGE_RESOURCES) == []  # claims only, as without the kinds
    # Every handler named there exists.
    assert all(callable(getattr(sched, handler)) for _, _, handler in STORAGE_RESOURCES)
