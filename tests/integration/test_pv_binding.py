"""The storage controllers in a real `fleet server` (tests/conftest.py's `fleet_server`,
no agent): static binding, Retain → Released, a static Delete volume → Failed,
hand-off to a provisioner, the Events a claim gets when it cannot be served, the
default StorageClasses, the pvc-protection finalizer going once no pod uses the
claim, and the pv-protection finalizer holding a Bound volume until its claim goes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from fleet.api import pvmatch as pm
from tests.conftest import FleetServer

TIMEOUT = 30.0


def wait_for(what: str, fn: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class API:
    def __init__(self, srv: FleetServer) -> None:
        self.srv = srv

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.srv.client() as c:
            r = c.post(path, json=body)
        assert r.status_code == 201, (path, r.status_code, r.text)
        return r.json()

    def get(self, path: str) -> dict[str, Any] | None:
        with self.srv.client() as c:
            r = c.get(path)
        if r.status_code == 404:
            return None
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def delete(self, path: str) -> None:
        with self.srv.client() as c:
            r = c.delete(path)
        assert r.status_code in (200, 202), (path, r.status_code, r.text)

    def events(self, ns: str, name: str) -> list[tuple[str, str, str]]:
        out = self.get(f"/api/v1/namespaces/{ns}/events") or {}
        return [(e.get("type"), e.get("reason"), e.get("message")) for e in out.get("items") or []
                if (e.get("involvedObject") or {}).get("name") == name]


def pv_body(name: str, cls: str, *, size: str = "1Gi", policy: str = "Retain") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": policy, "storageClassName": cls,
                     "hostPath": {"path": f"/tmp/{name}"}}}


def pvc_body(name: str, cls: str, size: str = "500Mi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": cls,
                     "resources": {"requests": {"storage": size}}}}


@pytest.fixture
def api(fleet_server: FleetServer) -> API:
    return API(fleet_server)


def test_default_storage_classes_exist(api: API) -> None:
    lp = api.get("/apis/storage.k8s.io/v1/storageclasses/local-path")
    assert lp is not None and lp["provisioner"] == "hostpath.fleet.dev"
    assert (lp["metadata"].get("annotations") or {}).get(pm.DEFAULT_CLASS) == "true"
    fl = api.get("/apis/storage.k8s.io/v1/storageclasses/fleet-local")
    assert fl is not None and fl["provisioner"] == "local.fleet.dev"


def test_static_binding_then_retain_releases(api: API, namespace: str) -> None:
    cls = f"manual-{uuid.uuid4().hex[:6]}"
    pv_name = f"pv-{cls}"
    api.post("/api/v1/persistentvolumes", pv_body(pv_name, cls))
    api.post("/api/v1/persistentvolumes", pv_body(f"{pv_name}-big", cls, size="5Gi"))
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc_body("data", cls))
    claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data"

    claim = wait_for("the claim to bind",
                     lambda: (c := api.get(claim_path)) and c["status"].get("phase") == "Bound" and c)
    assert claim["spec"]["volumeName"] == pv_name  # the smallest that fits
    assert claim["status"]["capacity"] == {"storage": "1Gi"}
    assert claim["status"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["annotations"][pm.BIND_COMPLETED] == "yes"
    pv = wait_for("the volume to be Bound",
                  lambda: (v := api.get(f"/api/v1/persistentvolumes/{pv_name}"))
                  and v["status"].get("phase") == "Bound" and v)
    assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]

    api.delete(claim_path)
    wait_for("the claim to go", lambda: api.get(claim_path) is None)
    pv = wait_for("the volume to be Released",
                  lambda: (v := api.get(f"/api/v1/persistentvolumes/{pv_name}"))
                  and v["status"].get("phase") == "Released" and v)
    assert pv["spec"]["claimRef"]["name"] == "data"  # kept: Retain


def test_static_delete_volume_fails(api: API, namespace: str) -> None:
    cls = f"manual-{uuid.uuid4().hex[:6]}"
    pv_name = f"pv-{cls}"
    api.post("/api/v1/persistentvolumes", pv_body(pv_name, cls, policy="Delete"))
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc_body("data", cls))
    claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data"
    wait_for("the claim to bind", lambda: (c := api.get(claim_path)) and c["status"].get("phase") == "Bound")
    api.delete(claim_path)
    pv = wait_for("the volume to fail",
                  lambda: (v := api.get(f"/api/v1/persistentvolumes/{pv_name}"))
                  and v["status"].get("phase") == "Failed" and v)
    assert pv["status"]["message"] == "no deletable volume plugin matched"
    wait_for("the VolumeFailedDelete event", lambda: ("Warning", "VolumeFailedDelete",
                                                      "no deletable volume plugin matched")
             in api.events("default", pv_name))


def test_claims_that_cannot_be_served_say_why(api: API, namespace: str) -> None:
    ns = namespace
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    api.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", pvc_body("no-class-object", missing))
    api.post(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", pvc_body("no-class", ""))
    wait_for("ProvisioningFailed", lambda: ("Warning", "ProvisioningFailed",
                                            f'storageclass.storage.k8s.io "{missing}" not found')
             in api.events(ns, "no-class-object"))
    wait_for("FailedBinding", lambda: ("Normal", "FailedBinding",
                                       "no persistent volumes available for this claim and no storage class is set")
             in api.events(ns, "no-class"))
    for name in ("no-class-object", "no-class"):
        c = api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}")
        assert c is not None and c["status"]["phase"] == "Pending"


def test_claim_of_an_external_provisioner_is_handed_over(api: API, namespace: str) -> None:
    cls = f"ext-{uuid.uuid4().hex[:6]}"
    api.post("/apis/storage.k8s.io/v1/storageclasses",
             {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": cls},
              "provisioner": "example.com/nfs", "volumeBindingMode": "Immediate"})
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc_body("data", cls))
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data"
    claim = wait_for("the provisioner annotation",
                     lambda: (c := api.get(path)) and pm.STORAGE_PROVISIONER in (c["metadata"].get("annotations") or {})
                     and c)
    assert claim["metadata"]["annotations"][pm.BETA_STORAGE_PROVISIONER] == "example.com/nfs"
    wait_for("ExternalProvisioning", lambda: any(r == "ExternalProvisioning" and "'example.com/nfs'" in m
                                                 for _, r, m in api.events(namespace, "data")))


def test_wait_for_first_consumer_claim_waits(api: API, namespace: str) -> None:
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc_body("data", "local-path"))
    wait_for("WaitForFirstConsumer", lambda: ("Normal", "WaitForFirstConsumer",
                                              "waiting for first consumer to be created before binding")
             in api.events(namespace, "data"))
    c = api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data")
    assert c is not None and pm.STORAGE_PROVISIONER not in (c["metadata"].get("annotations") or {})


def test_pvc_protection_lets_an_unused_claim_go(api: API, namespace: str) -> None:
    body = pvc_body("guarded", "")
    body["metadata"]["finalizers"] = [pm.PVC_PROTECTION]
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", body)
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/guarded"
    api.delete(path)
    wait_for("the finalizer to be removed and the claim to go", lambda: api.get(path) is None)


def test_pv_protection_keeps_a_bound_volume_until_its_claim_goes(api: API, namespace: str) -> None:
    """kubernetes.io/pv-protection: a Bound volume being deleted stays (Terminating) while
    its claim holds it; once the claim is gone it is Released and the finalizer lets go."""
    cls = f"manual-{uuid.uuid4().hex[:6]}"
    pv_name = f"pv-{cls}"
    pv_path = f"/api/v1/persistentvolumes/{pv_name}"
    claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data"
    api.post("/api/v1/persistentvolumes", pv_body(pv_name, cls))
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc_body("data", cls))
    wait_for("the volume to be Bound",
             lambda: (v := api.get(pv_path)) and v["status"].get("phase") == "Bound")

    api.delete(pv_path)
    time.sleep(2)  # the pv-protection controller has had its chance to (wrongly) let go
    pv = api.get(pv_path)
    assert pv is not None and pv["metadata"].get("deletionTimestamp"), pv
    assert pm.PV_PROTECTION in pv["metadata"]["finalizers"], pv["metadata"]
    assert pv["status"]["phase"] == "Bound", pv["status"]
    claim = api.get(claim_path)
    assert claim is not None and claim["status"]["phase"] == "Bound", claim

    api.delete(claim_path)
    wait_for("the claim to go", lambda: api.get(claim_path) is None)
    wait_for("the volume to go once it is no longer Bound", lambda: api.get(pv_path) is None)


def test_claim_without_class_gets_the_default_class(api: API, namespace: str) -> None:
    body = pvc_body("data", "")
    del body["spec"]["storageClassName"]
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", body)
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/data"
    # The DefaultStorageClass admission plugin sets it at creation when present; the
    # PV controller's retroactive assignment otherwise.  Either way: local-path.
    wait_for("the default class", lambda: ((api.get(path) or {}).get("spec") or {}).get("storageClassName")
             == "local-path")


def test_ephemeral_volume_claim_follows_its_pod(api: API, namespace: str) -> None:
    pod = api.post(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                     "metadata": {"labels": {"app": "web"}},
                     "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none",
                              "resources": {"requests": {"storage": "1Gi"}}}}}}]}})
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/web-scratch"
    claim = wait_for("the ephemeral claim", lambda: api.get(path))
    [ref] = claim["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (
        "Pod", "web", pod["metadata"]["uid"], True, True)
    assert claim["metadata"]["labels"] == {"app": "web"}
    assert claim["spec"]["storageClassName"] == "none"
    # The pod goes (never scheduled: at once); the garbage collector takes its claim.
    api.delete(f"/api/v1/namespaces/{namespace}/pods/web")
    wait_for("the claim to be collected", lambda: api.get(path) is None)




def test_node_local_immediate_claim_gets_a_node(fleet_server_factory: Any) -> None:
    """A plugin's node-local driver (registered with --storage-plugin): the server has its
    CSIDriver, and an Immediate claim of its class is given the node with the most room."""
    from tests.integration.pvctl_driver import NAME

    srv = fleet_server_factory.start(extra_args=["--storage-plugin", "tests.integration.pvctl_driver"])
    api = API(srv)
    cd = wait_for("the plugin's CSIDriver", lambda: api.get(f"/apis/storage.k8s.io/v1/csidrivers/{NAME}"))
    assert cd["spec"]["storageCapacity"] is True and cd["spec"]["attachRequired"] is False
    api.post("/apis/storage.k8s.io/v1/storageclasses",
             {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fast"},
              "provisioner": NAME, "volumeBindingMode": "Immediate"})
    for node, room in (("small", "2Gi"), ("big", "50Gi"), ("none", None)):
        api.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        api.post("/apis/storage.k8s.io/v1/csinodes",
                 {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node},
                  "spec": {"drivers": [{"name": NAME, "nodeID": node,
                                        "topologyKeys": ["kubernetes.io/hostname"]}]}})
        if room:
            api.post("/apis/storage.k8s.io/v1/namespaces/kube-system/csistoragecapacities",
                     {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                      "metadata": {"name": f"cap-{node}"}, "storageClassName": "fast", "capacity": room,
                      "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": node}}})
    api.post("/api/v1/namespaces/default/persistentvolumeclaims", pvc_body("db", "fast", size="5Gi"))
    path = "/api/v1/namespaces/default/persistentvolumeclaims/db"
    claim = wait_for("a selected node", lambda: (c := api.get(path))
                     and pm.SELECTED_NODE in (c["metadata"].get("annotations") or {}) and c)
    assert claim["metadata"]["annotations"][pm.SELECTED_NODE] == "big"
    assert claim["metadata"]["annotations"][pm.STORAGE_PROVISIONER] == NAME
