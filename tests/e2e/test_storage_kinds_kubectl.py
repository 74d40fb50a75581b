"""The storage kinds served like Kubernetes, seen through real kubectl: StorageClass,
PersistentVolume, PersistentVolumeClaim, CSIDriver, CSINode, CSIStorageCapacity,
VolumeAttachment — and the storage admission plugins.

One `fleet server --no-agent` is shared by the module (API objects only: nothing here
needs a node, a driver or the binding controllers, and nothing depends on whether
claims get bound — the classes name a provisioner nobody serves and the static volume
a class no claim asks for).  Cluster-scoped objects carry a per-test suffix.

* `kubectl get pv,pvc,sc`: kubectl's exact headers, cells where kube-apiserver puts
  them (empty cells included), `(default)` after the default class;
* a claim without a class gets the default one (DefaultStorageClass), claims and
  volumes get their protection finalizers (StorageObjectInUseProtection);
* `kubectl describe pv/pvc/sc` and `kubectl explain pv.spec`;
* a bound claim (bound by hand through `/status`, as the binder would): shrinking is
  422, growing under a class without `allowVolumeExpansion` is 403 with Kubernetes'
  words, and allowed once the class allows it;
* the fixed fields of a StorageClass, an invalid volume;
* the CSI kinds' tables and `kubectl api-resources`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer, run_kubectl
from tests.e2e.helpers import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=60)
    assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
    return out


def kubectl_fails(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=60)
    assert rc != 0, f"kubectl {' '.join(args)} unexpectedly succeeded\n{out}"
    return err


def apply(srv: FleetServer, obj: dict[str, Any], *ns: str) -> None:
    kubectl(srv, *(("-n", ns[0]) if ns else ()), "apply", "-f", "-", input=json.dumps(obj))


def columns(out: str) -> tuple[list[str], list[dict[str, str]]]:
    """kubectl's table as (headers, rows by header), cut at the header positions, so that
    empty cells stay empty instead of shifting the others (headers may contain one space)."""
    lines = out.rstrip("\n").splitlines()
    spans = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    headers = [h for _, h in spans]
    rows = []
    for line in lines[1:]:
        row = {}
        for i, (start, name) in enumerate(spans):
            end = spans[i + 1][0] if i + 1 < len(spans) else None
            row[name] = line[start:end].strip()
        rows.append(row)
    return headers, rows


def row_of(out: str, name: str) -> dict[str, str]:
    _, rows = columns(out)
    found = [r for r in rows if r["NAME"].split(" ")[0] == name]
    assert len(found) == 1, out
    return found[0]


@pytest.fixture
def uniq() -> str:
    return uuid.uuid4().hex[:6]


def storage_class(name: str, *, default: bool = False, expand: bool | None = None,
                  **fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
                           "provisioner": "example.com/nobody", **fields}
    if default:
        obj["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    if expand is not None:
        obj["allowVolumeExpansion"] = expand
    return obj


def volume(name: str, size: str, cls: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": cls,
                     "hostPath": {"path": f"/tmp/fleet-e2e-kinds/{name}"}, **spec}}


def claim(name: str, size: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec}}


def wait_for_default_class(srv: FleetServer, ns: str, cls: str) -> None:
    """Admission reads classes from a watch-fed cache: dry-run claims until it has the new default."""
    def dry_run_class() -> str:
        out = kubectl(srv, "-n", ns, "create", "--dry-run=server", "-o", "json", "-f", "-",
                      input=json.dumps(claim("probe", "1Gi")))
        return json.loads(out)["spec"].get("storageClassName", "")
    wait_until(lambda: dry_run_class() == cls, timeout=10, what="the default class in admission")


def test_get_describe_explain_pv_pvc_sc(fleet_server: FleetServer, namespace: str, uniq: str) -> None:
    srv, ns = fleet_server, namespace
    # Named to sort before any other default class created in the same second (kube's tie-break).
    cls, manual, pv = f"a-e2e-{uniq}", f"manual-{uniq}", f"e2e-pv-{uniq}"
    apply(srv, storage_class(cls, default=True, reclaimPolicy="Retain", volumeBindingMode="WaitForFirstConsumer",
                             parameters={"csi.storage.k8s.io/fstype": "xfs"}))
    apply(srv, volume(pv, "5Gi", manual))
    wait_for_default_class(srv, ns, cls)
    apply(srv, claim("data", "1Gi"), ns)

    headers, _ = columns(kubectl(srv, "get", "sc"))
    assert headers == ["NAME", "PROVISIONER", "RECLAIMPOLICY", "VOLUMEBINDINGMODE", "ALLOWVOLUMEEXPANSION", "AGE"]
    row = row_of(kubectl(srv, "get", "sc"), cls)
    assert row["NAME"] == f"{cls} (default)"
    assert (row["PROVISIONER"], row["RECLAIMPOLICY"], row["VOLUMEBINDINGMODE"], row["ALLOWVOLUMEEXPANSION"]) == (
        "example.com/nobody", "Retain", "WaitForFirstConsumer", "false")

    out = kubectl(srv, "get", "pv", pv)
    headers, rows = columns(out)
    assert headers == ["NAME", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "STATUS", "CLAIM", "STORAGECLASS",
                       "VOLUMEATTRIBUTESCLASS", "REASON", "AGE"]
    row = rows[0]
    # Pending until a PV controller looks at it, Available after; never bound (no claim asks for `manual`).
    assert row["STATUS"] in ("Pending", "Available"), out
    assert {k: row[k] for k in ("NAME", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "CLAIM", "STORAGECLASS",
                                "VOLUMEATTRIBUTESCLASS", "REASON")} == {
        "NAME": pv, "CAPACITY": "5Gi", "ACCESS MODES": "RWO", "RECLAIM POLICY": "Retain", "CLAIM": "",
        "STORAGECLASS": manual, "VOLUMEATTRIBUTESCLASS": "<unset>", "REASON": ""}
    wide, _ = columns(kubectl(srv, "get", "pv", pv, "-o", "wide"))
    assert wide[-1] == "VOLUMEMODE"

    out = kubectl(srv, "-n", ns, "get", "pvc", "data")
    headers, rows = columns(out)
    assert headers == ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS",
                       "VOLUMEATTRIBUTESCLASS", "AGE"]
    assert {k: rows[0][k] for k in headers[:-1]} == {
        "NAME": "data", "STATUS": "Pending", "VOLUME": "", "CAPACITY": "", "ACCESS MODES": "",
        "STORAGECLASS": cls, "VOLUMEATTRIBUTESCLASS": "<unset>"}

    # All three at once, as the issue asks.
    both = kubectl(srv, "-n", ns, "get", "pv,pvc,sc")
    for line in ("NAME ", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "PROVISIONER", "VOLUMEBINDINGMODE"):
        assert line in both, both
    for name in (f"persistentvolume/{pv}", "persistentvolumeclaim/data", f"storageclass.storage.k8s.io/{cls}"):
        assert name in both, both

    got = json.loads(kubectl(srv, "-n", ns, "get", "pvc", "data", "-o", "json"))
    assert got["spec"]["storageClassName"] == cls  # DefaultStorageClass
    assert got["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"]
    assert got["spec"]["volumeMode"] == "Filesystem"
    got = json.loads(kubectl(srv, "get", "pv", pv, "-o", "json"))
    assert "kubernetes.io/pv-protection" in got["metadata"]["finalizers"]
    assert got["spec"]["hostPath"]["type"] == "" and got["spec"]["volumeMode"] == "Filesystem"
    assert got["status"]["lastPhaseTransitionTime"]

    desc = kubectl(srv, "describe", "pv", pv)
    for pattern in (rf"Name:\s+{pv}", rf"StorageClass:\s+{manual}", r"Reclaim Policy:\s+Retain",
                    r"Access Modes:\s+RWO", r"VolumeMode:\s+Filesystem", r"Capacity:\s+5Gi",
                    r"Type:\s+HostPath", rf"Path:\s+/tmp/fleet-e2e-kinds/{pv}", r"kubernetes.io/pv-protection"):
        assert re.search(pattern, desc), (pattern, desc)
    desc = kubectl(srv, "-n", ns, "describe", "pvc", "data")
    for pattern in (r"Name:\s+data", rf"Namespace:\s+{ns}", rf"StorageClass:\s+{cls}", r"Status:\s+Pending",
                    r"kubernetes.io/pvc-protection", r"VolumeMode:\s+Filesystem", r"Used By:\s+<none>"):
        assert re.search(pattern, desc), (pattern, desc)
    desc = kubectl(srv, "describe", "sc", cls)
    for pattern in (rf"Name:\s+{cls}", r"IsDefaultClass:\s+Yes", r"Provisioner:\s+example.com/nobody",
                    r"Parameters:\s+csi.storage.k8s.io/fstype=xfs", r"ReclaimPolicy:\s+Retain",
                    r"VolumeBindingMode:\s+WaitForFirstConsumer"):
        assert re.search(pattern, desc), (pattern, desc)

    out = kubectl(srv, "explain", "pv.spec")
    assert "KIND:       PersistentVolume" in out and "FIELD: spec" in out, out
    for field in ("accessModes", "capacity", "claimRef", "csi", "hostPath", "nodeAffinity",
                  "persistentVolumeReclaimPolicy", "storageClassName"):
        assert field in out, (field, out)
    out = kubectl(srv, "explain", "storageclass.allowVolumeExpansion")
    assert "GROUP:      storage.k8s.io" in out, out

    kubectl(srv, "delete", "--wait=false", "pv", pv)
    kubectl(srv, "delete", "sc", cls)


def test_shrink_grow_and_fixed_class_fields(fleet_server: FleetServer, namespace: str, uniq: str) -> None:
    srv, ns = fleet_server, namespace
    cls, pv = f"fixed-{uniq}", f"e2e-bound-{uniq}"
    apply(srv, storage_class(cls, expand=False))
    # A volume and a claim bound to each other by hand — what the binder does — so the
    # test needs no controller, and one that runs finds a consistent pair.
    apply(srv, volume(pv, "2Gi", cls, claimRef={"namespace": ns, "name": "grow"}))
    apply(srv, claim("grow", "2Gi", storageClassName=cls, volumeName=pv), ns)
    kubectl(srv, "-n", ns, "patch", "pvc", "grow", "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"phase": "Bound", "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"]}}))
    row = row_of(kubectl(srv, "-n", ns, "get", "pvc"), "grow")
    assert (row["STATUS"], row["VOLUME"], row["CAPACITY"], row["ACCESS MODES"]) == ("Bound", pv, "2Gi", "RWO")

    def resize(size: str) -> list[str]:
        return ["-n", ns, "patch", "pvc", "grow", "--type=merge", "-p",
                json.dumps({"spec": {"resources": {"requests": {"storage": size}}}})]

    err = kubectl_fails(srv, *resize("1Gi"))
    assert 'PersistentVolumeClaim "grow" is invalid' in err, err
    assert "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity" in err, err
    err = kubectl_fails(srv, *resize("3Gi"))
    assert ('persistentvolumeclaims "grow" is forbidden: only dynamically provisioned pvc can be resized and the '
            'storageclass that provisions the pvc must support resize') in err, err
    # allowVolumeExpansion may change; the resize plugin reads classes from a watch-fed
    # cache, so retry the growth (a dry run first) until it has seen the change.
    kubectl(srv, "patch", "sc", cls, "--type=merge", "-p", '{"allowVolumeExpansion": true}')
    wait_until(lambda: run_kubectl(srv, *resize("3Gi"), "--dry-run=server")[0] == 0, timeout=10,
               what="the expandable class in admission")
    kubectl(srv, *resize("3Gi"))
    got = json.loads(kubectl(srv, "-n", ns, "get", "pvc", "grow", "-o", "json"))
    assert got["spec"]["resources"]["requests"]["storage"] == "3Gi"

    # What a class says about its volumes is fixed.
    for patch, message in (
            ({"reclaimPolicy": "Retain"}, "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden."),
            ({"parameters": {"type": "fast"}}, "parameters: Forbidden: updates to parameters are forbidden."),
            ({"provisioner": "example.com/other"}, "provisioner: Forbidden: updates to provisioner are forbidden."),
            ({"volumeBindingMode": "WaitForFirstConsumer"},
             'volumeBindingMode: Invalid value: "WaitForFirstConsumer": field is immutable')):
        err = kubectl_fails(srv, "patch", "sc", cls, "--type=merge", "-p", json.dumps(patch))
        assert f'The StorageClass "{cls}" is invalid' in err and message in err, err

    # An invalid volume: two sources, no capacity.
    bad = volume(f"bad-{uniq}", "1Gi", cls, nfs={"server": "nfs.example.com", "path": "/exports"})
    del bad["spec"]["capacity"]
    err = kubectl_fails(srv, "apply", "-f", "-", input=json.dumps(bad))
    assert f'PersistentVolume "bad-{uniq}" is invalid' in err, err
    assert "spec.capacity: Required value" in err and \
        "spec.nfs: Forbidden: may not specify more than 1 volume type" in err, err
    kubectl(srv, "delete", "--wait=false", "pv", pv)
    kubectl(srv, "delete", "sc", cls)


def test_csi_kinds_tables(fleet_server: FleetServer, namespace: str, uniq: str) -> None:
    srv, ns = fleet_server, namespace
    drv, node, va = f"csi-{uniq}.example.com", f"node-{uniq}", f"csi-{uniq}"
    apply(srv, {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": drv},
                "spec": {"attachRequired": False, "storageCapacity": True}})
    headers, rows = columns(kubectl(srv, "get", "csidriver", drv))
    assert headers == ["NAME", "ATTACHREQUIRED", "PODINFOONMOUNT", "STORAGECAPACITY", "TOKENREQUESTS",
                       "REQUIRESREPUBLISH", "MODES", "AGE"]
    assert [rows[0][h] for h in headers[:-1]] == [drv, "false", "false", "true", "<unset>", "false", "Persistent"]
    apply(srv, {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node},
                "spec": {"drivers": [{"name": drv, "nodeID": node, "topologyKeys": ["kubernetes.io/hostname"]}]}})
    headers, rows = columns(kubectl(srv, "get", "csinode", node))
    assert headers == ["NAME", "DRIVERS", "AGE"] and [rows[0]["NAME"], rows[0]["DRIVERS"]] == [node, "1"]
    apply(srv, {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": {"name": "cap"},
                "storageClassName": "fleet-local", "capacity": "10240Mi",
                "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": node}}}, ns)
    headers, rows = columns(kubectl(srv, "-n", ns, "get", "csistoragecapacities"))
    assert headers == ["NAME", "STORAGECLASSNAME", "CAPACITY"]
    assert rows == [{"NAME": "cap", "STORAGECLASSNAME": "fleet-local", "CAPACITY": "10Gi"}]
    # An inline volume's attachment: the attach/detach controller, if one runs, manages only
    # attachments of PersistentVolumes and would delete one no pod needs.
    apply(srv, {"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": va},
                "spec": {"attacher": drv, "nodeName": node, "source": {"inlineVolumeSpec": {
                    "accessModes": ["ReadWriteOnce"], "csi": {"driver": drv, "volumeHandle": "vol-1"}}}}})
    headers, rows = columns(kubectl(srv, "get", "volumeattachment", va))
    assert headers == ["NAME", "ATTACHER", "PV", "NODE", "ATTACHED", "AGE"]
    assert [rows[0][h] for h in headers[:-1]] == [va, drv, "", node, "false"]
    # The attacher reports through /status; the spec is fixed.
    kubectl(srv, "patch", "volumeattachment", va, "--subresource=status", "--type=merge", "-p",
            '{"status": {"attached": true}}')
    assert row_of(kubectl(srv, "get", "volumeattachment", va), va)["ATTACHED"] == "true"
    err = kubectl_fails(srv, "patch", "volumeattachment", va, "--type=merge", "-p", '{"spec": {"nodeName": "x"}}')
    assert f'The VolumeAttachment "{va}" is invalid' in err and "field is immutable" in err, err
    for kind, name in (("volumeattachment", va), ("csinode", node), ("csidriver", drv)):
        kubectl(srv, "delete", kind, name)


def test_api_resources(fleet_server: FleetServer) -> None:
    rows = {r[0]: r for r in (line.split() for line in kubectl(fleet_server, "api-resources").splitlines())}
    assert rows["persistentvolumes"] == ["persistentvolumes", "pv", "v1", "false", "PersistentVolume"]
    assert rows["persistentvolumeclaims"] == ["persistentvolumeclaims", "pvc", "v1", "true", "PersistentVolumeClaim"]
    assert rows["storageclasses"] == ["storageclasses", "sc", "storage.k8s.io/v1", "false", "StorageClass"]
    assert rows["volumeattachments"] == ["volumeattachments", "storage.k8s.io/v1", "false", "VolumeAttachment"]
    assert rows["csidrivers"] == ["csidrivers", "storage.k8s.io/v1", "false", "CSIDriver"]
    assert rows["csinodes"] == ["csinodes", "storage.k8s.io/v1", "false", "CSINode"]
    assert rows["csistoragecapacities"] == ["csistoragecapacities", "storage.k8s.io/v1", "true",
                                            "CSIStorageCapacity"]
