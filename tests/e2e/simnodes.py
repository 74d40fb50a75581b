"""Cluster helpers for the workload end-to-end tests (threads beside a real `fleet server`).

* `SimNodes(srv, count=3, prefix="sim")` — a `fleet.agent.simulate.Simulator` on
  its own Trio loop: hollow nodes whose pods go Running and Ready a moment after
  binding, since one machine cannot host several real nodes.  Several may run
  side by side (a second one is a set of nodes joining the cluster).  As in
  tests/integration/test_scheduling_sim.py.
* `PodWatch` — every pod watch event of a namespace, in the server's order, for
  assertions about ordering ("web-1 was created only after web-0 was Ready").
* `ClaimBinder` — plays the storage provisioner, binding new claims.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from typing import Any

import trio

from fleet.agent.simulate import Simulator, SimulatorConfig
from fleet.client import ClientConfig
from tests.conftest import FleetServer


class SimNodes:
    """`count` simulated nodes named `<prefix>-…`, alive between start() and stop()."""

    def __init__(self, srv: FleetServer, *, count: int, prefix: str, start_delay: float = 0.2,
                 **config: Any) -> None:
        self.cfg = SimulatorConfig(count=count, prefix=prefix, start_delay=start_delay,
                                   lease_interval=1.0, node_status_interval=10.0, **config)
        ca = srv._kubeconfig_cluster().get("certificate-authority-data")
        self.client_cfg = ClientConfig(server=srv.url, token=srv.token,
                                       ca_data=base64.b64decode(ca) if ca else None)
        self.sim: Simulator | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name=f"simulator-{prefix}")

    def _main(self) -> None:
        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as n:
                self.sim = await n.start(Simulator(self.cfg, self.client_cfg).run)
                self._ready.set()
                await self._stop.wait()
                n.cancel_scope.cancel()
        try:
            trio.run(main)
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()

    def start(self) -> SimNodes:
        self._thread.start()
        assert self._ready.wait(90), "the simulator did not start in 90 s"
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self.token is not None
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.call(self._stop.set)
        self._thread.join(30)

    @property
    def names(self) -> list[str]:
        from fleet.agent.simulate import node_names
        return node_names(self.cfg.prefix, self.cfg.count)


class PodWatch:
    """Every pod watch event of a namespace, in the order the server sent them (a thread).

    Order matters for the workload tests ("web-1 was created only after web-0 was
    Ready"), and one watch stream carries the store's order, which polling cannot
    see.  Started before the workload is created, so no event is missed."""

    def __init__(self, srv: FleetServer, namespace: str, selector: str | None = None) -> None:
        self.srv, self.namespace, self.selector = srv, namespace, selector
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name=f"podwatch-{namespace}")

    def start(self) -> PodWatch:
        self._thread.start()
        assert self._started.wait(30), "the pod watch did not start"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _main(self) -> None:
        import json

        import httpx

        rv: str | None = None
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        with self.srv.client(timeout=60.0) as c:
            while not self._stop.is_set():
                params = {"watch": "1", "timeoutSeconds": "3", "allowWatchBookmarks": "true"}
                if self.selector:
                    params["labelSelector"] = self.selector
                if rv is None:
                    # Start from "now": list once for the revision (the namespace is new and empty).
                    rv = c.get(path).json()["metadata"]["resourceVersion"]
                params["resourceVersion"] = rv
                self._started.set()
                try:
                    with c.stream("GET", path, params=params) as r:
                        for line in r.iter_lines():
                            if not line.strip():
                                continue
                            ev = json.loads(line)
                            obj = ev.get("object") or {}
                            if ev.get("type") == "ERROR":
                                raise AssertionError(f"pod watch failed: {obj}")
                            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                            if ev.get("type") != "BOOKMARK":
                                with self._lock:
                                    self.events.append((ev["type"], obj))
                            if self._stop.is_set():
                                return
                except httpx.TransportError:
                    continue

    def snapshot(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return list(self.events)

    def mark(self) -> int:
        """A position in the event list, to look only at what happens after it."""
        return len(self.snapshot())

    @staticmethod
    def ready(pod: dict[str, Any]) -> bool:
        st = pod.get("status") or {}
        return st.get("phase") == "Running" and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])

    def first_seen(self, since: int = 0) -> list[tuple[str, str]]:
        """(name, uid) of each pod in the order it first appeared."""
        seen: dict[str, str] = {}
        for _, pod in self.snapshot()[since:]:
            md = pod["metadata"]
            seen.setdefault(md["uid"], md["name"])
        return [(name, uid) for uid, name in seen.items()]

    def first_ready(self, since: int = 0) -> list[str]:
        """Pod names in the order each pod (by uid) first became Running and Ready."""
        done: dict[str, str] = {}
        for _, pod in self.snapshot()[since:]:
            if self.ready(pod):
                done.setdefault(pod["metadata"]["uid"], pod["metadata"]["name"])
        return list(done.values())

    def deletion_started(self, since: int = 0) -> list[str]:
        """Pod names in the order their deletion began (deletionTimestamp, or gone at once)."""
        out: dict[str, str] = {}
        for etype, pod in self.snapshot()[since:]:
            if etype == "DELETED" or pod["metadata"].get("deletionTimestamp"):
                out.setdefault(pod["metadata"]["uid"], pod["metadata"]["name"])
        return list(out.values())


class ClaimBinder:
    """Plays the storage provisioner for a namespace: binds every new PersistentVolumeClaim.

    Simulated nodes run no storage driver, and the scheduler — like kube-scheduler —
    will not place a pod whose claim is unbound.  The binder makes what a provisioner
    would: a PersistentVolume `pv-<claim uid>` of the claim's class and size (a
    hostPath nobody mounts), pre-bound to the claim through claimRef, so that the
    server's PV controller, when it runs, sees a consistent pair; and it does the
    binder's part itself too: fills `volumeName` (allowed once), marks the claim
    bind-completed and sets status Bound with the requested capacity."""

    def __init__(self, srv: FleetServer, namespace: str) -> None:
        self.srv, self.namespace = srv, namespace
        self.bound: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name=f"binder-{namespace}")

    def start(self) -> ClaimBinder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _main(self) -> None:
        base = f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims"
        merge = {"Content-Type": "application/merge-patch+json"}
        with self.srv.client(timeout=30.0) as c:
            while not self._stop.wait(0.2):
                try:
                    r = c.get(base)
                    if r.status_code != 200:
                        continue
                    for claim in r.json().get("items") or []:
                        md, spec = claim["metadata"], claim.get("spec") or {}
                        if md.get("deletionTimestamp") or (claim.get("status") or {}).get("phase") == "Bound":
                            continue
                        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
                        pv_name = spec.get("volumeName") or f"pv-{md['uid']}"
                        c.post("/api/v1/persistentvolumes", json={
                            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
                            "spec": {"capacity": {"storage": storage},
                                     "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                                     "storageClassName": spec.get("storageClassName") or "",
                                     "hostPath": {"path": f"/tmp/fleet-sim-volumes/{pv_name}"},
                                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                                  "namespace": self.namespace, "name": md["name"],
                                                  "uid": md["uid"]}}})  # 409 once it exists
                        if not spec.get("volumeName"):
                            c.patch(f"{base}/{md['name']}", headers=merge, json={
                                "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                                "spec": {"volumeName": pv_name}})
                        r2 = c.patch(f"{base}/{md['name']}/status", headers=merge, json={"status": {
                            "phase": "Bound", "capacity": {"storage": storage},
                            "accessModes": spec.get("accessModes") or []}})
                        if r2.status_code == 200:
                            self.bound.add(md["name"])
                except Exception:  # noqa: BLE001 - a busy server: try again on the next round
                    continue
