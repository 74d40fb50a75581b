"""Node lifecycle: the pure decisions table-driven, then the loops under Trio's MockClock.

The loop tests run `NodeLifecycleController` against `FakeCluster`, an
in-memory `ClusterAPI` that applies writes the way the API server does
(resourceVersion preconditions, merge patches, graceful pod deletion) and
delivers the resulting watch events to the controller's handlers a little
later, as informers would.  Time is virtual: 40 s of grace period cost nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from fleet.client import ApiException
from fleet.controllers.nodelifecycle.common import (
    EVICT_NOW,
    STATE_FULL,
    STATE_INITIAL,
    STATE_NORMAL,
    STATE_PARTIAL,
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    NodeLifecycleConfig,
    parse_time,
    rfc3339,
    zone_key,
)
from fleet.controllers.nodelifecycle.controller import (
    NodeLifecycleController,
)
from fleet.controllers.nodelifecycle.eviction import (
    eviction_deadline,
    pod_not_ready_patch,
)
from fleet.controllers.nodelifecycle.health import (
    NodeHealth,
    observe_lease,
    observe_node,
    plan_node,
    unknown_conditions,
)
from fleet.controllers.nodelifecycle.taints import (
    condition_taint_keys,
    plan_taints,
    with_no_execute,
)
from fleet.controllers.nodelifecycle.zones import (
    TokenBucket,
    compute_zone_state,
    plan_disruption,
)

EPOCH = 1_700_000_000.0  # the fake wall clock: EPOCH + trio time
STAMP = "2023-11-14T22:13:20Z"  # rfc3339(EPOCH)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# ---------------------------------------------------------------------------
# object factories
# ---------------------------------------------------------------------------

def cond(ctype: str, status: str, hb: str = "2023-11-14T22:00:00Z", **kw: Any) -> dict[str, Any]:
    return {"type": ctype, "status": status, "lastHeartbeatTime": hb,
            "lastTransitionTime": "2023-11-14T21:00:00Z", "reason": "KubeletReady", "message": "ok", **kw}


def node(name: str = "n1", ready: str | None = "True", *, taints: list[dict[str, Any]] | None = None,
         labels: dict[str, str] | None = None, hb: str = "2023-11-14T22:00:00Z",
         pressure: dict[str, str] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    conds = []
    if ready is not None:
        for ctype in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            conds.append(cond(ctype, (pressure or {}).get(ctype, "False"), hb))
        conds.append(cond("Ready", ready, hb))
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": dict(labels or {}),
                         "creationTimestamp": "2023-11-14T20:00:00Z", "resourceVersion": "1"},
            "spec": spec, "status": {"conditions": conds}}


def taint(key: str, effect: str = "NoExecute", value: str | None = None,
          added: str | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"key": key, "effect": effect}
    if value is not None:
        t["value"] = value
    if added is not None:
        t["timeAdded"] = added
    return t


def tol(key: str | None = None, seconds: int | None = None, *, op: str = "Exists",
        effect: str | None = "NoExecute", value: str | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"operator": op}
    if key is not None:
        t["key"] = key
    if effect is not None:
        t["effect"] = effect
    if value is not None:
        t["value"] = value
    if seconds is not None:
        t["tolerationSeconds"] = seconds
    return t


def pod(name: str, node_name: str = "n1", *, ns: str = "default",
        tolerations: list[dict[str, Any]] | None = None, ready: str | None = "True",
        grace: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node_name, "containers": [{"name": "c", "image": "x"}]}
    if tolerations:
        spec["tolerations"] = tolerations
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    status: dict[str, Any] = {"phase": "Running", "conditions": []}
    if ready is not None:
        status["conditions"].append({"type": "Ready", "status": ready,
                                     "lastTransitionTime": "2023-11-14T21:00:00Z"})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "resourceVersion": "1"},
            "spec": spec, "status": status}


CFG = NodeLifecycleConfig()


# ---------------------------------------------------------------------------
# pure decisions
# ---------------------------------------------------------------------------

def test_time_round_trip():
    assert rfc3339(EPOCH) == STAMP
    assert parse_time(STAMP) == EPOCH
    assert parse_time("2023-11-14T22:13:20.250000Z") == EPOCH + 0.25
    assert parse_time("garbage") is None
    assert parse_time(None) is None


def test_observe_node_counts_heartbeat_changes_not_our_clock():
    n = node(hb="2023-11-14T22:00:00Z")
    h = observe_node(None, n, 5.0, renew="r1")
    assert h == NodeHealth(probe=5.0, heartbeat="2023-11-14T22:00:00Z", renew="r1")
    # The same heartbeat again (our own status write, a re-list): not a sign of life.
    assert observe_node(h, n, 9.0).probe == 5.0
    # A new heartbeat — even one "older" than the last, if the node's clock stepped back.
    assert observe_node(h, node(hb="2023-11-14T21:00:00Z"), 9.0).probe == 9.0
    # A node without Ready has no heartbeat to see.
    assert observe_node(h, node(ready=None), 9.0).probe == 5.0


def test_observe_lease():
    h = NodeHealth(probe=1.0, renew="a")
    assert observe_lease(h, "a", 7.0).probe == 1.0
    assert observe_lease(h, "b", 7.0) == NodeHealth(probe=7.0, renew="b")
    assert observe_lease(h, None, 7.0).probe == 1.0


@pytest.mark.parametrize(("ready", "probe", "now", "stale", "target", "after"), [
    ("True", 0.0, 39.9, False, None, "True"),
    ("True", 0.0, 40.0, True, TAINT_UNREACHABLE, "Unknown"),
    ("False", 0.0, 10.0, False, TAINT_NOT_READY, "False"),
    ("False", 0.0, 50.0, True, TAINT_UNREACHABLE, "Unknown"),
    ("Unknown", 0.0, 10.0, False, None, "Unknown"),  # renewing again: no NoExecute taint
    # Never posted Ready: the startup grace period (60 s) applies.
    (None, 0.0, 50.0, False, None, None),
    (None, 0.0, 60.0, True, TAINT_UNREACHABLE, "Unknown"),
])
def test_plan_node(ready, probe, now, stale, target, after):
    plan = plan_node(node(ready=ready), NodeHealth(probe=probe), now, STAMP, CFG)
    assert (plan.stale, plan.no_execute, plan.ready) == (stale, target, after)
    assert (plan.conditions is not None) == stale


def test_plan_node_in_full_disruption_wants_no_no_execute_taint():
    plan = plan_node(node(), NodeHealth(probe=0.0), 100.0, STAMP, CFG, all_disrupted=True)
    assert plan.stale and plan.conditions is not None and plan.no_execute is None


def test_unknown_conditions_uses_kubernetes_reasons():
    conds = unknown_conditions(node(), STAMP)
    assert conds is not None
    by_type = {c["type"]: c for c in conds}
    assert set(by_type) == {"Ready", "MemoryPressure", "DiskPressure", "PIDPressure"}
    for c in by_type.values():
        assert c["status"] == "Unknown"
        assert c["reason"] == "NodeStatusUnknown"
        assert c["message"] == "Kubelet stopped posting node status."
        assert c["lastTransitionTime"] == STAMP
        assert c["lastHeartbeatTime"] == "2023-11-14T22:00:00Z"  # kept: it is the node's
    # Already Unknown: nothing to write.
    n = node()
    n["status"]["conditions"] = conds
    assert unknown_conditions(n, STAMP) is None
    # Never posted: NodeStatusNeverUpdated, heartbeat = creation.
    never = {c["type"]: c for c in unknown_conditions(node(ready=None), STAMP) or []}
    assert never["Ready"]["reason"] == "NodeStatusNeverUpdated"
    assert never["Ready"]["message"] == "Kubelet never posted node status."
    assert never["Ready"]["lastHeartbeatTime"] == "2023-11-14T20:00:00Z"


@pytest.mark.parametrize(("n", "keys"), [
    (node(), []),
    (node(ready="False"), [TAINT_NOT_READY]),
    (node(ready="Unknown"), [TAINT_UNREACHABLE]),
    (node(pressure={"MemoryPressure": "True", "DiskPressure": "True"}),
     ["node.kubernetes.io/memory-pressure", "node.kubernetes.io/disk-pressure"]),
    (node(pressure={"PIDPressure": "True"}), ["node.kubernetes.io/pid-pressure"]),
    (node(unschedulable=True), ["node.kubernetes.io/unschedulable"]),
])
def test_condition_taint_keys(n, keys):
    assert condition_taint_keys(n) == keys


UNREACH_NS = taint(TAINT_UNREACHABLE, "NoSchedule")
NOTREADY_NS = taint(TAINT_NOT_READY, "NoSchedule")
OLD = "2023-11-14T21:00:00Z"
USER = taint("dedicated", "NoSchedule", "gpu")


@pytest.mark.parametrize(("ready", "taints", "target", "reset", "want", "queue"), [
    # Healthy, nothing to do.
    ("True", [USER], None, False, None, False),
    # Unknown: the NoSchedule taint at once, the NoExecute one through the queue.
    ("Unknown", [USER], TAINT_UNREACHABLE, False, [USER, UNREACH_NS], True),
    # Already tainted: keep it (and its timeAdded).
    ("Unknown", [UNREACH_NS, taint(TAINT_UNREACHABLE, added=OLD)], TAINT_UNREACHABLE, False, None, False),
    # unreachable -> not-ready is a swap: at once, with a fresh timeAdded.
    ("False", [UNREACH_NS, taint(TAINT_UNREACHABLE, added=OLD)], TAINT_NOT_READY, False,
     [NOTREADY_NS, taint(TAINT_NOT_READY, added=STAMP)], False),
    # Back to Ready: all of ours go, the user's stays.
    ("True", [USER, UNREACH_NS, taint(TAINT_UNREACHABLE, added=OLD)], None, False, [USER], False),
    # Start-up reset: leftovers from before a restart are dropped, re-added through the queue.
    ("False", [NOTREADY_NS, taint(TAINT_NOT_READY, added=OLD)], TAINT_NOT_READY, True, [NOTREADY_NS], True),
    # Someone else's NoExecute taint is never ours to touch.
    ("True", [taint("maintenance")], None, True, None, False),
])
def test_plan_taints(ready, taints, target, reset, want, queue):
    plan = plan_taints(node(ready=ready, taints=copy.deepcopy(taints)), target, STAMP, reset=reset)
    assert plan.taints == want
    assert plan.queue_no_execute is queue


def test_with_no_execute():
    n = node(taints=[USER, taint(TAINT_NOT_READY, added=OLD)])
    assert with_no_execute(n, TAINT_UNREACHABLE, STAMP) == [USER, taint(TAINT_UNREACHABLE, added=STAMP)]
    assert with_no_execute(n, TAINT_NOT_READY, STAMP) is None


def since_table(t: dict[str, Any]) -> float:
    return {"a": 1000.0, "b": 2000.0}.get(t["key"], 0.0)


@pytest.mark.parametrize(("tolerations", "taints", "want"), [
    # Not tolerated: at once.
    ([], [taint("a")], EVICT_NOW),
    ([tol("b")], [taint("a")], EVICT_NOW),
    ([tol("a", op="Equal", value="x")], [taint("a", value="y")], EVICT_NOW),
    # NoSchedule taints never evict.
    ([], [taint("a", "NoSchedule")], None),
    # Tolerated forever.
    ([tol("a")], [taint("a")], None),
    ([tol()], [taint("a"), taint("b")], None),  # Exists with no key tolerates everything
    ([tol("a", effect=None)], [taint("a")], None),  # no effect: every effect
    # Finite: counted from the taint's time.
    ([tol("a", 300)], [taint("a")], 1300.0),
    ([tol("a", 0)], [taint("a")], 1000.0),  # <= 0: at once (its time is in the past)
    ([tol("a", -5)], [taint("a")], 1000.0),
    # Several taints: the earliest deadline wins; an untolerated one beats all.
    ([tol("a", 300), tol("b", 10)], [taint("a"), taint("b")], 1300.0),
    ([tol("a", 3000), tol("b", 10)], [taint("a"), taint("b")], 2010.0),
    ([tol("a", 300)], [taint("a"), taint("b")], EVICT_NOW),
    ([tol("a"), tol("b", 10)], [taint("a"), taint("b")], 2010.0),
    # The *first* matching toleration is the one used (k8s GetMatchingTolerations).
    ([tol(), tol("a", 10)], [taint("a")], None),
    ([tol("a", 10), tol()], [taint("a")], 1010.0),
])
def test_eviction_deadline(tolerations, taints, want):
    assert eviction_deadline(tolerations, taints, since_table) == want


@pytest.mark.parametrize(("statuses", "want"), [
    ([], (0, STATE_NORMAL)),
    (["True", "True"], (0, STATE_NORMAL)),
    (["Unknown"], (1, STATE_FULL)),
    ([None, "False"], (2, STATE_FULL)),
    (["True", "Unknown", "Unknown"], (2, STATE_NORMAL)),  # more than two needed
    (["True", "Unknown", "Unknown", "Unknown"], (3, STATE_PARTIAL)),
    (["True", "True", "Unknown", "Unknown", "Unknown"], (3, STATE_PARTIAL)),  # 60% >= 55%
    (["True", "True", "True", "Unknown", "Unknown", "Unknown"], (3, STATE_NORMAL)),  # 50%
])
def test_compute_zone_state(statuses, want):
    assert compute_zone_state(statuses, 0.55) == want


def test_plan_disruption():
    cfg = NodeLifecycleConfig(eviction_rate=0.1, secondary_eviction_rate=0.01, large_cluster_size_threshold=4)
    # A first healthy zone: normal rate.
    p = plan_disruption({"z": ["True"]}, {}, cfg)
    assert (p.states, p.rates, p.all_disrupted, p.entered, p.exited) == ({"z": STATE_NORMAL}, {"z": 0.1},
                                                                        False, False, False)
    # One zone fully down, another fine: the down zone keeps the normal rate.
    p = plan_disruption({"a": ["Unknown"], "b": ["True"]}, {"a": STATE_NORMAL, "b": STATE_NORMAL}, cfg)
    assert p.states == {"a": STATE_FULL, "b": STATE_NORMAL} and p.rates == {"a": 0.1, "b": 0.1}
    # Partial disruption: small zone stops, large zone slows down.
    small = ["True", "Unknown", "Unknown", "Unknown"]
    large = ["True"] * 2 + ["Unknown"] * 3
    p = plan_disruption({"s": small, "l": large}, {}, cfg)
    assert p.states == {"s": STATE_PARTIAL, "l": STATE_PARTIAL}
    assert p.rates == {"s": 0.0, "l": 0.01}
    # Everything down: enter full disruption (all rates 0) ...
    p = plan_disruption({"a": ["Unknown"], "b": [None]}, {"a": STATE_NORMAL, "b": STATE_NORMAL}, cfg)
    assert (p.all_disrupted, p.entered, p.exited) == (True, True, False)
    assert p.rates == {"a": 0.0, "b": 0.0}
    # ... stay there ...
    p = plan_disruption({"a": ["Unknown"], "b": [None]}, p.states, cfg)
    assert (p.all_disrupted, p.entered, p.exited) == (True, False, False)
    # ... and leave when a node is Ready again.
    p = plan_disruption({"a": ["True"], "b": [None]}, p.states, cfg)
    assert (p.all_disrupted, p.entered, p.exited) == (False, False, True)
    assert p.states == {"a": STATE_NORMAL, "b": STATE_FULL}
    # A new zone starts Initial, so a first node coming up NotReady enters the mode.
    p = plan_disruption({"z": [None]}, {}, cfg)
    assert p.entered and p.states == {"z": STATE_FULL}
    # No node counts at all: no disruption.
    p = plan_disruption({}, {"z": STATE_FULL}, cfg)
    assert (p.states, p.all_disrupted, p.entered, p.exited) == ({}, False, False, False)
    assert STATE_INITIAL == "Initial"


def test_token_bucket():
    b = TokenBucket(0.1, now=0.0)
    assert b.try_take(0.0)  # starts full (burst 1)
    assert not b.try_take(5.0)
    assert b.next_time(5.0) == pytest.approx(10.0)
    assert b.try_take(10.0)
    b.set_rate(0.0, 10.0)
    assert not b.try_take(1000.0) and b.next_time(1000.0) is None
    b.set_rate(0.1, 1000.0)  # re-enabled: a fresh, full bucket (k8s SwapLimiter)
    assert b.try_take(1000.0)
    assert not b.try_take(1001.0)


@pytest.mark.parametrize(("ready", "patched"), [("True", True), ("False", False), (None, False)])
def test_pod_not_ready_patch(ready, patched):
    p = pod_not_ready_patch(pod("p", ready=ready), STAMP)
    assert (p is not None) == patched
    if p:
        assert p == {"metadata": {"resourceVersion": "1"}, "status": {"conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": STAMP}]}}


def test_zone_key():
    assert zone_key(node()) == ""
    assert zone_key(node(labels={"topology.kubernetes.io/zone": "z1"})) == ":\x00:z1"
    assert zone_key(node(labels={"topology.kubernetes.io/region": "r", "topology.kubernetes.io/zone": "z"})) \
        == "r:\x00:z"


# ---------------------------------------------------------------------------
# the fake cluster
# ---------------------------------------------------------------------------

def api_error(code: int, reason: str) -> ApiException:
    return ApiException({"kind": "Status", "code": code, "reason": reason, "message": reason}, code)


class FakeCluster:
    """An in-memory API: the writes the controller makes, and watch events after `latency`."""

    def __init__(self, latency: float = 0.01) -> None:
        self.latency = latency
        self.rv = 100
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.deleted: dict[str, tuple[float, int]] = {}  # pod key -> (trio time, grace)
        self.before_status_write: Callable[[str], None] | None = None
        self.ctl: NodeLifecycleController | None = None
        self._send, self._recv = trio.open_memory_channel[tuple[float, str, str, Any, Any]](10000)

    # -- watch delivery ------------------------------------------------------------
    def _emit(self, kind: str, etype: str, old: Any, new: Any) -> None:
        self._send.send_nowait((trio.current_time() + self.latency, kind, etype,
                                copy.deepcopy(old), copy.deepcopy(new)))

    async def deliver(self, ctl: NodeLifecycleController) -> None:
        self.ctl = ctl
        async for at, kind, etype, old, new in self._recv:
            await trio.sleep_until(at)
            getattr(ctl, f"on_{kind}")(etype, old, new)

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    # -- the test's side: nodes and kubelets ----------------------------------------
    def wall(self) -> float:
        return EPOCH + trio.current_time()

    def add_node(self, name: str, *, ready: str | None = "True", labels: dict[str, str] | None = None,
                 taints: list[dict[str, Any]] | None = None) -> None:
        n = self._bump(node(name, ready, labels=labels, taints=taints, hb=rfc3339(self.wall())))
        self.nodes[name] = n
        self._emit("node", "ADDED", None, n)
        self.renew(name)

    def renew(self, name: str) -> None:
        """The Lease heartbeat (microsecond renewTime, so every renewal differs)."""
        old = self.leases.get(name)
        stamp = trio.current_time() + EPOCH
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": name, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": name, "renewTime": f"{stamp:.6f}"}}
        self._bump(lease)
        self.leases[name] = lease
        self._emit("lease", "MODIFIED" if old else "ADDED", old, lease)

    def post_status(self, name: str, ready: str = "True") -> None:
        """What the agent's status loop does: all four conditions, fresh heartbeat."""
        old = self.nodes[name]
        new = copy.deepcopy(old)
        fresh = node(name, ready, hb=rfc3339(self.wall()))
        new["status"]["conditions"] = fresh["status"]["conditions"]
        self._bump(new)
        self.nodes[name] = new
        self._emit("node", "MODIFIED", old, new)

    def set_taints(self, name: str, taints: list[dict[str, Any]]) -> None:
        old = self.nodes[name]
        new = copy.deepcopy(old)
        new["spec"]["taints"] = taints
        self._bump(new)
        self.nodes[name] = new
        self._emit("node", "MODIFIED", old, new)

    def delete_node(self, name: str) -> None:
        old = self.nodes.pop(name)
        self._emit("node", "DELETED", old, None)

    def add_pod(self, p: dict[str, Any]) -> None:
        self._bump(p)
        self.pods[f"{p['metadata']['namespace']}/{p['metadata']['name']}"] = p
        self._emit("pod", "ADDED", None, p)

    def pod(self, key: str) -> dict[str, Any] | None:
        return self.pods.get(key)

    def taints(self, name: str) -> list[dict[str, Any]]:
        return list(self.nodes[name]["spec"].get("taints") or [])

    def taint_keys(self, name: str) -> set[tuple[str, str]]:
        return {(t["key"], t["effect"]) for t in self.taints(name)}

    def ready(self, name: str) -> str | None:
        return next((c["status"] for c in self.nodes[name]["status"]["conditions"] if c["type"] == "Ready"),
                    None)

    def event_reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.events if e["involvedObject"]["name"] == name]

    # -- ClusterAPI --------------------------------------------------------------------
    async def get_node(self, name: str) -> dict[str, Any] | None:
        await trio.sleep(0)
        n = self.nodes.get(name)
        return copy.deepcopy(n) if n else None

    async def patch_node(self, name: str, patch: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        await trio.sleep(0)
        if status and self.before_status_write is not None:
            self.before_status_write(name)  # the agent writes between our read and our write
        old = self.nodes.get(name)
        if old is None:
            raise api_error(404, "NotFound")
        want = (patch.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != old["metadata"]["resourceVersion"]:
            raise api_error(409, "Conflict")
        new = copy.deepcopy(old)
        if status:
            new["status"].update(copy.deepcopy(patch["status"]))
        else:
            taints = (patch.get("spec") or {}).get("taints")
            if taints is None:
                new["spec"].pop("taints", None)
            else:
                new["spec"]["taints"] = copy.deepcopy(taints)
        self._bump(new)
        self.nodes[name] = new
        self._emit("node", "MODIFIED", old, new)
        return copy.deepcopy(new)

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(0)
        key = f"{namespace}/{name}"
        old = self.pods.get(key)
        if old is None:
            raise api_error(404, "NotFound")
        want = (patch.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != old["metadata"]["resourceVersion"]:
            raise api_error(409, "Conflict")
        new = copy.deepcopy(old)
        st = patch.get("status") or {}
        for c in st.get("conditions") or []:  # strategic merge by type
            mine = next((x for x in new["status"]["conditions"] if x["type"] == c["type"]), None)
            if mine is None:
                new["status"]["conditions"].append(dict(c))
            else:
                mine.update(c)
        if "phase" in st:
            new["status"]["phase"] = st["phase"]
        self._bump(new)
        self.pods[key] = new
        self._emit("pod", "MODIFIED", old, new)
        return copy.deepcopy(new)

    async def delete_pod(self, namespace: str, name: str, uid: str | None, *,
                         grace_period: int | None = None) -> None:
        await trio.sleep(0)
        key = f"{namespace}/{name}"
        old = self.pods.get(key)
        if old is None:
            raise api_error(404, "NotFound")
        if uid and old["metadata"]["uid"] != uid:
            raise api_error(409, "Conflict")
        grace = grace_period if grace_period is not None else old["spec"].get(
            "terminationGracePeriodSeconds", 30)
        self.deleted.setdefault(key, (trio.current_time(), grace))
        if grace == 0:
            del self.pods[key]
            self._emit("pod", "DELETED", old, None)
            return
        if old["metadata"].get("deletionTimestamp"):
            return
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = rfc3339(self.wall() + grace)
        self._bump(new)
        self.pods[key] = new
        self._emit("pod", "MODIFIED", old, new)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        await trio.sleep(0)
        self.events.append(event)


async def start(nursery: trio.Nursery, fake: FakeCluster, **cfg: Any) -> NodeLifecycleController:
    ctl = NodeLifecycleController(fake, NodeLifecycleConfig(**cfg), wall=fake.wall)
    nursery.start_soon(fake.deliver, ctl)
    await trio.sleep(0.1)  # the informers' initial lists
    await nursery.start(ctl.run_loops)
    return ctl


async def heartbeats(fake: FakeCluster, name: str, every: float = 10.0, until: float = float("inf"),
                     status_every: float = 20.0) -> None:
    """A live agent: Lease every `every` s, node status every `status_every` s."""
    last_status = trio.current_time()
    while trio.current_time() < until:
        await trio.sleep(every)
        if trio.current_time() >= until:
            return
        fake.renew(name)
        if trio.current_time() - last_status >= status_every and name in fake.nodes:
            fake.post_status(name)
            last_status = trio.current_time()


async def wait_for(pred: Callable[[], Any], timeout: float = 600.0, step: float = 0.05) -> float:
    """Virtual seconds until `pred()` holds."""
    t0 = trio.current_time()
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(step)
    return trio.current_time() - t0


# ---------------------------------------------------------------------------
# the loops
# ---------------------------------------------------------------------------

async def test_silent_node_goes_unknown_tainted_and_pods_evicted(autojump_clock):
    fake = FakeCluster()
    fake.add_node("a")
    fake.add_node("b")
    fake.add_pod(pod("none", "b"))
    fake.add_pod(pod("two", "b", tolerations=[tol(TAINT_UNREACHABLE, 2)]))
    fake.add_pod(pod("forever", "b", tolerations=[tol(TAINT_UNREACHABLE)]))
    fake.add_pod(pod("long", "b", tolerations=[tol(TAINT_UNREACHABLE, 300)]))
    fake.add_pod(pod("healthy", "a"))
    async with trio.open_nursery() as n:
        ctl = await start(n, fake)
        n.start_soon(heartbeats, fake, "a")
        n.start_soon(heartbeats, fake, "b", 10.0, 25.0)  # last heartbeat at t=20
        last_beat = 20.0

        await wait_for(lambda: fake.ready("b") == "Unknown")
        went_unknown = trio.current_time()
        assert last_beat + 40 <= went_unknown < last_beat + 40.5
        conds = {c["type"]: c for c in fake.nodes["b"]["status"]["conditions"]}
        assert {c["status"] for c in conds.values()} == {"Unknown"}
        assert conds["Ready"]["reason"] == "NodeStatusUnknown"
        assert conds["Ready"]["message"] == "Kubelet stopped posting node status."

        await wait_for(lambda: "default/none" in fake.deleted)
        assert fake.deleted["default/none"][0] - last_beat < 40.5
        noexec = [t for t in fake.taints("b") if t["effect"] == "NoExecute"]
        assert [t["key"] for t in noexec] == [TAINT_UNREACHABLE]
        assert parse_time(noexec[0]["timeAdded"]) is not None
        assert (TAINT_UNREACHABLE, "NoSchedule") in fake.taint_keys("b")
        assert fake.pod("default/none")["metadata"].get("deletionTimestamp")  # graceful, as k8s
        assert "TaintManagerEviction" in fake.event_reasons("none")
        assert any(e["message"] == "Marking for deletion Pod default/none" for e in fake.events)

        await wait_for(lambda: "default/two" in fake.deleted)
        assert 40 + 2 <= fake.deleted["default/two"][0] - last_beat < 40 + 2.5
        # Pods still on the node are NotReady (endpoints drop them).
        assert fake.pod("default/forever")["status"]["conditions"][0]["status"] == "False"
        assert "NodeNotReady" in fake.event_reasons("forever")
        assert fake.event_reasons("b").count("NodeNotReady") == 1

        # Nothing else moves for a long while: infinite toleration, 300 s not up yet.
        await trio.sleep(100)
        assert "default/forever" not in fake.deleted and "default/long" not in fake.deleted
        assert "default/healthy" not in fake.deleted and fake.ready("a") == "True"
        assert "default/long" in ctl.evictions

        # The node renews its Lease again: the NoExecute taint goes at once, the
        # pending eviction is cancelled; Ready (and the NoSchedule taint) wait for its status.
        fake.renew("b")
        await wait_for(lambda: TAINT_UNREACHABLE not in {t["key"] for t in fake.taints("b")
                                                         if t["effect"] == "NoExecute"}, timeout=1.0)
        await wait_for(lambda: "default/long" not in ctl.evictions, timeout=1.0)
        assert "TaintManagerEviction" in fake.event_reasons("long")
        assert any(e["message"] == "Cancelling deletion of Pod default/long" for e in fake.events)
        assert (TAINT_UNREACHABLE, "NoSchedule") in fake.taint_keys("b")
        fake.post_status("b")
        await wait_for(lambda: not fake.taints("b"), timeout=1.0)
        n.start_soon(heartbeats, fake, "b")
        await trio.sleep(400)
        assert "default/long" not in fake.deleted and fake.ready("b") == "True"
        assert ctl.stats.marked_unknown == 1
        n.cancel_scope.cancel()


async def test_not_ready_node_gets_not_ready_taints_then_recovers(autojump_clock):
    fake = FakeCluster()
    fake.add_node("a")
    fake.add_node("b")
    fake.add_pod(pod("none", "b", grace=0))
    fake.add_pod(pod("tolerant", "b", tolerations=[tol(TAINT_NOT_READY, 60)]))
    async with trio.open_nursery() as n:
        await start(n, fake)
        n.start_soon(heartbeats, fake, "a")
        n.start_soon(heartbeats, fake, "b")
        await trio.sleep(5)
        fake.post_status("b", "False")  # the agent says its runtime is down
        t0 = trio.current_time()
        await wait_for(lambda: "default/none" in fake.deleted, timeout=2.0)
        assert fake.pod("default/none") is None  # grace 0: gone at once
        assert fake.taint_keys("b") == {(TAINT_NOT_READY, "NoSchedule"), (TAINT_NOT_READY, "NoExecute")}
        # The agent is alive: it owns its pods' readiness; we do not touch it.
        assert fake.pod("default/tolerant")["status"]["conditions"][0]["status"] == "True"
        await trio.sleep(30)
        fake.post_status("b", "True")
        await wait_for(lambda: not fake.taints("b"), timeout=1.0)
        await trio.sleep(100)
        assert "default/tolerant" not in fake.deleted
        assert trio.current_time() - t0 > 60
        n.cancel_scope.cancel()


async def test_unreachable_node_reporting_not_ready_swaps_taint_at_once(autojump_clock):
    fake = FakeCluster()
    for name in ("a", "b"):
        fake.add_node(name)
    async with trio.open_nursery() as n:
        await start(n, fake)
        n.start_soon(heartbeats, fake, "a")
        await wait_for(lambda: (TAINT_UNREACHABLE, "NoExecute") in fake.taint_keys("b"))
        fake.renew("b")
        fake.post_status("b", "False")
        await wait_for(lambda: (TAINT_NOT_READY, "NoExecute") in fake.taint_keys("b"), timeout=0.5)
        assert (TAINT_UNREACHABLE, "NoExecute") not in fake.taint_keys("b")
        n.cancel_scope.cancel()


async def test_restart_gives_nodes_a_grace_period_and_resets_old_taints(autojump_clock):
    """Leases left stale while the server was down are not held against anyone, and
    NoExecute taints from before the restart do not evict anything by themselves."""
    fake = FakeCluster()
    old_taints = [taint(TAINT_UNREACHABLE, "NoSchedule"), taint(TAINT_UNREACHABLE, added="2023-11-14T10:00:00Z")]
    fake.add_node("a")
    fake.add_node("b", taints=old_taints)
    fake.add_pod(pod("p", "b", tolerations=[tol(TAINT_UNREACHABLE, 5)]))
    async with trio.open_nursery() as n:
        await start(n, fake)
        n.start_soon(heartbeats, fake, "a")
        await trio.sleep(1)
        assert (TAINT_UNREACHABLE, "NoExecute") not in fake.taint_keys("b")
        assert "default/p" not in fake.deleted
        # b's agent really is gone: judged after one grace period, evicted 5 s later.
        await wait_for(lambda: "default/p" in fake.deleted)
        assert 40 + 5 <= trio.current_time() < 40 + 5 + 1
        n.cancel_scope.cancel()


async def test_a_heartbeat_racing_our_status_write_wins(autojump_clock):
    fake = FakeCluster()
    fake.add_node("a")
    fake.add_node("b")
    raced: list[str] = []

    def agent_writes_first(name: str) -> None:
        if name == "b" and not raced:
            raced.append(name)
            fake.renew("b")
            fake.post_status("b")

    fake.before_status_write = agent_writes_first
    async with trio.open_nursery() as n:
        ctl = await start(n, fake)
        n.start_soon(heartbeats, fake, "a")
        await trio.sleep(40.5)
        assert raced == ["b"]
        assert fake.ready("b") == "True" and not fake.taints("b")
        assert ctl.stats.marked_unknown == 0
        n.cancel_scope.cancel()


async def test_every_node_silent_is_full_disruption_no_evictions(autojump_clock):
    fake = FakeCluster()
    for name in ("a", "b", "c"):
        fake.add_node(name)
        fake.add_pod(pod(f"p-{name}", name))
    async with trio.open_nursery() as n:
        ctl = await start(n, fake)
        await wait_for(lambda: all(fake.ready(x) == "Unknown" for x in "abc"))
        await trio.sleep(120)
        assert ctl.all_disrupted
        assert not fake.deleted
        for name in "abc":
            assert fake.taint_keys(name) == {(TAINT_UNREACHABLE, "NoSchedule")}
            # Still marked NotReady: nobody can reach these pods.
            assert fake.pod(f"default/p-{name}")["status"]["conditions"][0]["status"] == "False"
        # a comes back: the mode ends, b and c get a fresh grace period, then go.
        fake.renew("a")
        fake.post_status("a")
        n.start_soon(heartbeats, fake, "a")
        back = trio.current_time()
        await wait_for(lambda: not ctl.all_disrupted, timeout=1.0)
        await trio.sleep(30)
        assert not fake.deleted
        await wait_for(lambda: "default/p-b" in fake.deleted and "default/p-c" in fake.deleted)
        first, second = sorted(fake.deleted[k][0] for k in ("default/p-b", "default/p-c"))
        assert back + 40 <= first < back + 41
        assert second - first == pytest.approx(10.0, abs=0.5)  # --node-eviction-rate 0.1
        n.cancel_scope.cancel()


async def test_partial_disruption_of_a_small_zone_stops_tainting(autojump_clock):
    fake = FakeCluster()
    zone = {"topology.kubernetes.io/zone": "z1"}
    for i in range(4):
        fake.add_node(f"z1-{i}", labels=zone)
        fake.add_pod(pod(f"p{i}", f"z1-{i}"))
    fake.add_node("z2-0", labels={"topology.kubernetes.io/zone": "z2"})
    async with trio.open_nursery() as n:
        ctl = await start(n, fake)
        n.start_soon(heartbeats, fake, "z1-0")
        n.start_soon(heartbeats, fake, "z2-0")
        await wait_for(lambda: all(fake.ready(f"z1-{i}") == "Unknown" for i in (1, 2, 3)))
        await trio.sleep(300)
        assert ctl.zone_states[":\x00:z1"] == STATE_PARTIAL
        assert not fake.deleted
        assert all((TAINT_UNREACHABLE, "NoExecute") not in fake.taint_keys(f"z1-{i}") for i in range(4))
        n.cancel_scope.cancel()


async def test_partial_disruption_of_a_large_zone_slows_tainting(autojump_clock):
    fake = FakeCluster()
    for i in range(6):
        fake.add_node(f"n{i}")
    async with trio.open_nursery() as n:
        ctl = await start(n, fake, large_cluster_size_threshold=5, secondary_eviction_rate=0.01)
        for i in range(2):
            n.start_soon(heartbeats, fake, f"n{i}")
        await wait_for(lambda: ctl.stats.tainted >= 1)
        t1 = trio.current_time()
        await wait_for(lambda: ctl.stats.tainted >= 2)
        assert trio.current_time() - t1 == pytest.approx(100.0, abs=0.5)
        assert ctl.zone_states[""] == STATE_PARTIAL
        n.cancel_scope.cancel()


async def test_user_no_execute_taint_and_its_removal(autojump_clock):
    fake = FakeCluster()
    fake.add_node("a")
    fake.add_pod(pod("short", "a", tolerations=[tol("maintenance", 30)]))
    fake.add_pod(pod("cancelled", "a", tolerations=[tol("maintenance", 60)]))
    fake.add_pod(pod("untolerated", "a"))
    async with trio.open_nursery() as n:
        await start(n, fake)
        n.start_soon(heartbeats, fake, "a")
        await trio.sleep(1)
        t0 = trio.current_time()
        fake.set_taints("a", [taint("maintenance", added=rfc3339(fake.wall()))])
        await wait_for(lambda: "default/untolerated" in fake.deleted, timeout=1.0)
        await wait_for(lambda: "default/short" in fake.deleted)
        assert fake.deleted["default/short"][0] - t0 == pytest.approx(30.0, abs=1.0)
        fake.set_taints("a", [])
        await trio.sleep(100)
        assert "default/cancelled" not in fake.deleted
        assert any(e["message"] == "Cancelling deletion of Pod default/cancelled" for e in fake.events)
        n.cancel_scope.cancel()


async def test_pods_of_a_missing_node_are_collected_after_the_quarantine(autojump_clock):
    fake = FakeCluster()
    fake.add_node("a")
    fake.add_node("gone")
    fake.add_pod(pod("ghost", "nowhere"))
    fake.add_pod(pod("orphan", "gone"))
    async with trio.open_nursery() as n:
        await start(n, fake, orphan_quarantine=20)
        n.start_soon(heartbeats, fake, "a")
        n.start_soon(heartbeats, fake, "gone")
        await wait_for(lambda: "default/ghost" in fake.deleted)
        assert 20 <= trio.current_time() < 21
        assert fake.deleted["default/ghost"][1] == 0  # forced: no node will ever confirm
        assert fake.pod("default/ghost") is None
        await trio.sleep(5)
        fake.delete_node("gone")
        t0 = trio.current_time()
        await wait_for(lambda: "default/orphan" in fake.deleted)
        assert 20 <= trio.current_time() - t0 < 21
        n.cancel_scope.cancel()


async def test_orphan_check_asks_the_api_before_deleting(autojump_clock):
    """A node the informer has not shown yet must not cost its pods their lives."""
    fake = FakeCluster()
    fake.add_node("a")
    fake.add_pod(pod("early", "late-node"))
    async with trio.open_nursery() as n:
        ctl = await start(n, fake, orphan_quarantine=5)
        n.start_soon(heartbeats, fake, "a")
        # The node exists in the API but its watch event is (very) late.
        fake.nodes["late-node"] = fake._bump(node("late-node", hb=rfc3339(fake.wall())))
        await trio.sleep(10)
        assert "default/early" not in fake.deleted
        assert "late-node" in ctl.nodes
        n.cancel_scope.cancel()


async def test_registering_node_uses_startup_grace_and_does_not_disrupt(autojump_clock):
    fake = FakeCluster()
    fake.add_node("a", ready=None)  # created, status not posted yet (as the agent does)
    async with trio.open_nursery() as n:
        ctl = await start(n, fake)
        n.start_soon(heartbeats, fake, "a", 10.0, 1.0)  # no renewals either
        await trio.sleep(1)
        assert not ctl.all_disrupted and ctl.zone_states == {}
        await trio.sleep(55)
        assert fake.ready("a") is None
        await wait_for(lambda: fake.ready("a") == "Unknown")
        assert 60 <= trio.current_time() < 61
        ready = next(c for c in fake.nodes["a"]["status"]["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "NodeStatusNeverUpdated"
        n.cancel_scope.cancel()


async def test_a_quiet_healthy_cluster_costs_one_pass_per_monitor_period(autojump_clock):
    fake = FakeCluster()
    for i in range(20):
        fake.add_node(f"n{i}")
        fake.add_pod(pod(f"p{i}", f"n{i}"))
    async with trio.open_nursery() as n:
        ctl = await start(n, fake)
        for i in range(20):
            n.start_soon(heartbeats, fake, f"n{i}")
        passes = 0
        real_pass = ctl.monitor_pass

        async def counting_pass() -> float:
            nonlocal passes
            passes += 1
            return await real_pass()

        ctl.monitor_pass = counting_pass  # type: ignore[method-assign]
        await trio.sleep(100)
        assert passes <= 100 / 5 + 2
        assert not fake.deleted and all(not fake.taints(f"n{i}") for i in range(20))
        n.cancel_scope.cancel()
