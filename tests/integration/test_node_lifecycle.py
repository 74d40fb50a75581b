"""Node lifecycle against a real `fleet server --no-agent --node-monitor-grace-period 3`.

The test plays two kubelets itself: it registers two Nodes with Ready=True,
creates their Leases in kube-node-lease and renews them from a thread, and
binds pods to them through `pods/binding` (the pods name a scheduler that does
not exist, so the real scheduler leaves them alone).  Then one node stops
renewing, and everything is checked over plain HTTP:

- the node's conditions go Unknown (NodeStatusUnknown) and it gets the
  `node.kubernetes.io/unreachable` NoExecute (with timeAdded) and NoSchedule taints;
- a pod that does not tolerate the taint is evicted (deleted) promptly, one
  tolerating it for 2 s about 2 s later, one tolerating it forever stays (and
  is marked Ready=False), a pod on the healthy node is untouched;
- the node renewing again loses the NoExecute taint, posting Ready loses the rest;
- deleting the node has its remaining pods garbage-collected.

The DefaultTolerationSeconds admission plugin (300 s tolerations for pods that
have none) may or may not be there: the pod meant to go at once says so
itself (`tolerationSeconds: 0`), and the pod without tolerations is checked
against whatever tolerations the server stored for it.

The measured time from the node's last heartbeat to its pods' eviction is
printed (run with `-s` to see it).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from fleet.api.tolerations import toleration_matches

from ..conftest import FleetServer, ServerFactory

GRACE = 5.0  # generous: under load a slow renewal of the healthy node must not look like a zone outage
UNREACHABLE = "node.kubernetes.io/unreachable"
MERGE = {"Content-Type": "application/merge-patch+json"}
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ok(r: httpx.Response, *codes: int) -> dict[str, Any]:
    assert r.status_code in (codes or (200, 201)), (r.status_code, r.text)
    return r.json()


def wait_for(what: str, pred: Callable[[], Any], timeout: float = 20.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def conditions(ready: str = "True") -> list[dict[str, Any]]:
    t = now_rfc3339()
    out = [{"type": c, "status": "False", "reason": f"KubeletHasNo{c}", "message": "fine",
            "lastHeartbeatTime": t, "lastTransitionTime": t}
           for c in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    out.append({"type": "Ready", "status": ready, "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": t, "lastTransitionTime": t})
    return out


class Kubelets:
    """Lease heartbeats for some nodes, every 0.5 s, from a thread."""

    def __init__(self, srv: FleetServer) -> None:
        self.srv = srv
        self.renewing: set[str] = set()
        self.last_renew: dict[str, float] = {}  # node -> time.time() of the last renewal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def register(self, c: httpx.Client, name: str) -> None:
        ok(c.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}), 201)
        ok(c.patch(f"/api/v1/nodes/{name}/status", json={"status": {"conditions": conditions()}},
                   headers=MERGE))
        stamp = now_micro()
        ok(c.post(LEASES, json={"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                "metadata": {"name": name, "namespace": "kube-node-lease"},
                                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                                         "acquireTime": stamp, "renewTime": stamp}}), 201)
        self.last_renew[name] = time.time()
        self.renewing.add(name)

    def post_ready(self, c: httpx.Client, name: str) -> None:
        ok(c.patch(f"/api/v1/nodes/{name}/status", json={"status": {"conditions": conditions()}},
                   headers=MERGE))

    def _run(self) -> None:
        with self.srv.client() as c:
            while not self._stop.wait(0.5):
                for name in sorted(self.renewing):
                    r = c.patch(f"{LEASES}/{name}", json={"spec": {"renewTime": now_micro()}}, headers=MERGE)
                    if r.status_code == 200:
                        self.last_renew[name] = time.time()

    def __enter__(self) -> Kubelets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def pod_body(name: str, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "nobody",  # the real scheduler leaves it to us
                            "containers": [{"name": "c", "image": "busybox"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def unreachable_toleration(seconds: int | None) -> dict[str, Any]:
    t: dict[str, Any] = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}
    if seconds is not None:
        t["tolerationSeconds"] = seconds
    return t


def expected_delay(pod: dict[str, Any]) -> float | None:
    """When the unreachable NoExecute taint evicts this pod: 0 at once, None never."""
    taint = {"key": UNREACHABLE, "effect": "NoExecute"}
    used = next((t for t in pod["spec"].get("tolerations") or [] if toleration_matches(t, taint)), None)
    if used is None:
        return 0.0
    secs = used.get("tolerationSeconds")
    return None if secs is None else max(float(secs), 0.0)


@pytest.fixture
def server(fleet_server_factory: ServerFactory) -> Iterator[FleetServer]:
    srv = fleet_server_factory.new(extra_args=["--node-monitor-grace-period", str(GRACE),
                                               "--node-monitor-period", "1"])
    srv.start()
    yield srv


def test_dead_node_is_tainted_and_its_pods_evicted(server: FleetServer) -> None:
    ns = f"lifecycle-{uuid.uuid4().hex[:6]}"
    alive, dying = "lc-alive", "lc-dying"
    with server.client() as c, Kubelets(server) as kubelets:
        ok(c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": ns}}), 201)
        kubelets.register(c, alive)
        kubelets.register(c, dying)

        pods = {
            "untolerated": pod_body("untolerated"),
            "zero": pod_body("zero", [unreachable_toleration(0)]),
            "two": pod_body("two", [unreachable_toleration(2)]),
            "forever": pod_body("forever", [unreachable_toleration(None)]),
            "healthy": pod_body("healthy"),
        }
        stored: dict[str, dict[str, Any]] = {}
        for name, body in pods.items():
            stored[name] = ok(c.post(f"/api/v1/namespaces/{ns}/pods", json=body), 201)
            node = alive if name == "healthy" else dying
            ok(c.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", json={
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}), 201)
            # What the node's agent would report: running and ready.
            ok(c.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", headers=MERGE, json={
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()}]}}))
        untolerated_delay = expected_delay(stored["untolerated"])
        assert expected_delay(stored["zero"]) == 0.0 and expected_delay(stored["two"]) == 2.0
        assert expected_delay(stored["forever"]) is None

        # Both nodes alive for more than a grace period: nothing happens.
        time.sleep(GRACE + 1)
        for name in (alive, dying):
            node = ok(c.get(f"/api/v1/nodes/{name}"))
            assert not (node["spec"].get("taints") or []), node["spec"]
        assert not ok(c.get(f"/api/v1/namespaces/{ns}/pods/zero"))["metadata"].get("deletionTimestamp")

        # The dying node's kubelet stops.
        kubelets.renewing.discard(dying)
        time.sleep(0.6)  # let an in-flight renewal land
        last_beat = kubelets.last_renew[dying]

        def gone_or_terminating(name: str) -> float | None:
            r = c.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            if r.status_code == 404 or r.json()["metadata"].get("deletionTimestamp"):
                return time.time()
            return None

        node = wait_for("the node to go Unknown", lambda: (
            (n := ok(c.get(f"/api/v1/nodes/{dying}")))
            and any(cd["type"] == "Ready" and cd["status"] == "Unknown" for cd in n["status"]["conditions"])
            and n))
        unknown_at = time.time()
        evicted_zero = wait_for("the pod without toleration time to be evicted",
                                lambda: gone_or_terminating("zero"), timeout=60)
        node = ok(c.get(f"/api/v1/nodes/{dying}"))
        by_type = {cd["type"]: cd for cd in node["status"]["conditions"]}
        assert {cd["status"] for cd in by_type.values()} == {"Unknown"}
        assert by_type["Ready"]["reason"] == "NodeStatusUnknown"
        assert by_type["Ready"]["message"] == "Kubelet stopped posting node status."
        taints = {(t["key"], t["effect"]): t for t in node["spec"].get("taints") or []}
        assert (UNREACHABLE, "NoSchedule") in taints
        assert taints[(UNREACHABLE, "NoExecute")].get("timeAdded")

        evicted_two = wait_for("the 2 s pod to be evicted", lambda: gone_or_terminating("two"),
                               timeout=60)
        if untolerated_delay is not None and untolerated_delay <= 5:
            evicted_untolerated = wait_for("the pod without tolerations to be evicted",
                                           lambda: gone_or_terminating("untolerated"))
            assert evicted_untolerated - unknown_at >= untolerated_delay - 0.5
        time.sleep(2)
        if untolerated_delay is None or untolerated_delay > 5:
            assert not gone_or_terminating("untolerated")  # DefaultTolerationSeconds gave it time
        assert not gone_or_terminating("forever")
        assert not gone_or_terminating("healthy")
        forever = ok(c.get(f"/api/v1/namespaces/{ns}/pods/forever"))
        assert {cd["type"]: cd["status"] for cd in forever["status"]["conditions"]}["Ready"] == "False"
        healthy_node = ok(c.get(f"/api/v1/nodes/{alive}"))
        assert not healthy_node["spec"].get("taints")

        events = ok(c.get(f"/api/v1/namespaces/{ns}/events"))["items"]
        assert any(e["reason"] == "TaintManagerEviction" and e["involvedObject"]["name"] == "zero"
                   and e["message"] == f"Marking for deletion Pod {ns}/zero" for e in events), events

        print(f"\nnode lifecycle (grace {GRACE}s): last heartbeat -> Unknown {unknown_at - last_beat:.2f}s, "
              f"-> pod evicted (tolerationSeconds 0) {evicted_zero - last_beat:.2f}s, "
              f"-> pod evicted (tolerationSeconds 2) {evicted_two - last_beat:.2f}s")
        # Lower bounds only: not before the grace period / the toleration ran out.  How
        # much later depends on the machine's load (measured, printed above, not asserted).
        assert GRACE - 0.1 <= evicted_zero - last_beat
        # (Observed times can only be late: compare each with the last heartbeat.)
        assert GRACE + 1.8 <= evicted_two - last_beat

        # The node renews again: the NoExecute taint goes at once; Ready (and the
        # NoSchedule taint) follow when its status says so.
        kubelets.renewing.add(dying)
        back = time.time()
        wait_for("the NoExecute taint to go", lambda: not any(
            t["effect"] == "NoExecute" for t in ok(c.get(f"/api/v1/nodes/{dying}"))["spec"].get("taints") or []),
            timeout=30)
        print(f"node lifecycle: lease renewed -> NoExecute taint removed {time.time() - back:.2f}s")
        kubelets.post_ready(c, dying)
        wait_for("all taints to go", lambda: not ok(c.get(f"/api/v1/nodes/{dying}"))["spec"].get("taints"),
                 timeout=30)
        time.sleep(1)
        assert not gone_or_terminating("forever")

        # The node is deleted for good: its pods go too (pod GC after the quarantine).
        kubelets.renewing.discard(dying)
        ok(c.delete(f"/api/v1/nodes/{dying}"))
        for name in ("forever", "zero", "two"):
            wait_for(f"pod {name} to be collected",
                     lambda name=name: c.get(f"/api/v1/namespaces/{ns}/pods/{name}").status_code == 404,
                     timeout=GRACE + 60)
        assert ok(c.get(f"/api/v1/namespaces/{ns}/pods/healthy"))["spec"]["nodeName"] == alive
