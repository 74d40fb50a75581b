"""VolumeBinding through a real `fleet server`, on two simulated nodes.

One server and one in-process simulator (2 nodes) shared by the module; each test
works in its own namespace with its own StorageClass.  Everything goes through the
API: the server's scheduler places the pods and binds the volumes (pre-bind), its
PV controller completes the claims' binding.

- WaitForFirstConsumer with static local volumes pinned to one of the two nodes: the
  pod goes to that node, and the volume chosen names the claim (claimRef with its uid,
  bound-by-controller) before the pod is bound;
- a bound local volume pins every later pod of the claim to its node, and a pod that
  must run elsewhere stays Pending with kube-scheduler's "volume node affinity
  conflict" message.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import FleetServer, ServerFactory, _make_base
from .test_scheduling_sim import SimThread, events_for, ok, wait_for

HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[FleetServer, SimThread]]:
    base = _make_base("fleet-volbind-sim-")
    factory = ServerFactory(base)
    sim: SimThread | None = None
    try:
        srv = factory.start()
        sim = SimThread(srv, count=2, prefix="vb")
        sim.start()
        with srv.client() as c:
            wait_for("2 Ready simulated nodes", lambda: sum(
                1 for n in ok(c.get("/api/v1/nodes"))["items"]
                if any(x["type"] == "Ready" and x["status"] == "True"
                       for x in n["status"].get("conditions", []))) == 2, timeout=60)
        yield srv, sim
    finally:
        if sim is not None:
            sim.stop()
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


@pytest.fixture
def ns(cluster: tuple[FleetServer, SimThread]) -> Iterator[str]:
    srv, _ = cluster
    name = f"vb-{uuid.uuid4().hex[:6]}"
    with srv.client() as c:
        ok(c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": name}}), 201)
    yield name
    with srv.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


def local_volume(name: str, cls: str, node: str, size: str = "1Gi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": cls,
                     "volumeMode": "Filesystem", "local": {"path": f"/mnt/{name}"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": HOSTNAME, "operator": "In", "values": [node]}]}]}}}}


def claim(name: str, cls: str, size: str = "1Gi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": cls,
                     "resources": {"requests": {"storage": size}}}}


def claim_pod(name: str, claim_name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
                     **spec}}


@pytest.fixture
def static_class(cluster: tuple[FleetServer, SimThread], ns: str) -> Iterator[tuple[str, list[str]]]:
    """A WaitForFirstConsumer class without provisioner, and two local volumes of it on the
    second node; the volumes are removed afterwards."""
    srv, sim = cluster
    cls = f"static-{ns}"
    target = sim.names[1]
    pvs = [f"{ns}-pv-{i}" for i in range(2)]
    with srv.client() as c:
        ok(c.post("/apis/storage.k8s.io/v1/storageclasses", json={
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": cls},
            "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Retain"}), 201)
        for name in pvs:
            ok(c.post("/api/v1/persistentvolumes", json=local_volume(name, cls, target)), 201)
    yield cls, pvs
    with srv.client() as c:
        for name in pvs:
            c.delete(f"/api/v1/persistentvolumes/{name}")
        c.delete(f"/apis/storage.k8s.io/v1/storageclasses/{cls}")


def test_wait_for_first_consumer_follows_static_local_volumes(
        cluster: tuple[FleetServer, SimThread], ns: str, static_class: tuple[str, list[str]]) -> None:
    srv, sim = cluster
    cls, pvs = static_class
    target = sim.names[1]
    with srv.client() as c:
        created = ok(c.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", json=claim("data", cls)), 201)
        ok(c.post(f"/api/v1/namespaces/{ns}/pods", json=claim_pod("p0", "data")), 201)
        placed = wait_for("p0 bound", lambda: ok(c.get(f"/api/v1/namespaces/{ns}/pods/p0"))["spec"].get("nodeName"))
        assert placed == target
        chosen = [pv for pv in (ok(c.get(f"/api/v1/persistentvolumes/{n}")) for n in pvs)
                  if (pv["spec"].get("claimRef") or {}).get("uid") == created["metadata"]["uid"]]
        assert len(chosen) == 1, "exactly one volume names the claim"
        assert chosen[0]["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"] == "yes"
        bound = wait_for("claim Bound", lambda: (
            (got := ok(c.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data")))["status"].get("phase")
            == "Bound" and got))
        assert bound["spec"]["volumeName"] == chosen[0]["metadata"]["name"]


def test_a_bound_local_volume_pins_its_pods(
        cluster: tuple[FleetServer, SimThread], ns: str, static_class: tuple[str, list[str]]) -> None:
    srv, sim = cluster
    cls, _ = static_class
    other, target = sim.names
    with srv.client() as c:
        ok(c.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", json=claim("data", cls)), 201)
        ok(c.post(f"/api/v1/namespaces/{ns}/pods", json=claim_pod("first", "data")), 201)
        wait_for("claim Bound", lambda: ok(c.get(
            f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data"))["status"].get("phase") == "Bound")
        # Later pods of the claim: all on the volume's node (1 in 2**4 by chance otherwise).
        for i in range(4):
            ok(c.post(f"/api/v1/namespaces/{ns}/pods", json=claim_pod(f"later-{i}", "data")), 201)
        nodes = wait_for("4 later pods bound", lambda: (
            got if len(got := {p["metadata"]["name"]: p["spec"]["nodeName"]
                               for p in ok(c.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
                               if p["metadata"]["name"].startswith("later-") and p["spec"].get("nodeName")}) == 4
            else None))
        assert set(nodes.values()) == {target}
        # A pod that must run on the other node cannot have the volume.
        ok(c.post(f"/api/v1/namespaces/{ns}/pods",
                  json=claim_pod("elsewhere", "data", nodeSelector={HOSTNAME: other})), 201)
        events = wait_for("FailedScheduling", lambda: [
            e for e in events_for(c, ns, "elsewhere") if e["reason"] == "FailedScheduling"])
        message = events[-1]["message"]
        assert "1 node(s) had volume node affinity conflict" in message, message
        assert "1 node(s) didn't match Pod's node affinity/selector" in message, message
        assert not ok(c.get(f"/api/v1/namespaces/{ns}/pods/elsewhere"))["spec"].get("nodeName")
