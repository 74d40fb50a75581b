"""The pure decisions of the agent's claimed-volume manager (fleet.agent.csiplan)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from fleet.agent import csiplan
from fleet.agent.csiplan import MountProblem, PodRecord, Published, Staged
from fleet.storage.driver import Capabilities, VolumeStats

POD = {"metadata": {"name": "web-0", "namespace": "ns", "uid": "pod-uid"}}
PVC_VOL = {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}
EPH_VOL = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}


def claim(phase: str = "Bound", volume: str = "pv-1", **md: Any) -> dict[str, Any]:
    return {"metadata": {"name": "data-web-0", "namespace": "ns", "uid": "claim-uid", **md},
            "spec": {"volumeName": volume}, "status": {"phase": phase}}


def pv(uid: str | None = "claim-uid", **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "csi": {"driver": "fake.test", "volumeHandle": "vol-1",
                                 "volumeAttributes": {"a": "b"}}, **spec}
    if uid is not None:
        s["claimRef"] = {"name": "data-web-0", "namespace": "ns", "uid": uid}
    return {"metadata": {"name": "pv-1"}, "spec": s}


def test_claim_names() -> None:
    assert csiplan.claim_name(POD, PVC_VOL) == "data-web-0"
    # Generic ephemeral volumes: <pod>-<volume>, as ephemeral.VolumeClaimName.
    assert csiplan.claim_name(POD, EPH_VOL) == "web-0-scratch"
    assert csiplan.is_claim_volume(PVC_VOL) and csiplan.is_claim_volume(EPH_VOL)
    assert not csiplan.is_claim_volume({"name": "x", "emptyDir": {}})


@pytest.mark.parametrize("obj,message", [
    (None, "error processing PVC ns/data-web-0: failed to fetch PVC from API server: not found"),
    (claim(deletionTimestamp="2026-01-01T00:00:00Z"),
     "error processing PVC ns/data-web-0: PVC is being deleted"),
    (claim(phase="Pending", volume=""), "error processing PVC ns/data-web-0: PVC is not bound"),
    (claim(volume=""), "error processing PVC ns/data-web-0: PVC has empty pvc.Spec.VolumeName"),
])
def test_claim_not_usable_kubelet_words(obj: Any, message: str) -> None:
    with pytest.raises(MountProblem) as e:
        csiplan.check_claim(POD, PVC_VOL, obj)
    assert e.value.message == message


def test_bound_claim_gives_its_volume() -> None:
    assert csiplan.check_claim(POD, PVC_VOL, claim()) == "pv-1"


def test_ephemeral_claim_must_be_owned_by_the_pod() -> None:
    c = claim()
    c["metadata"]["name"] = "web-0-scratch"
    with pytest.raises(MountProblem) as e:
        csiplan.check_claim(POD, EPH_VOL, c)
    assert e.value.message == ("PVC ns/web-0-scratch was not created for pod ns/web-0 "
                               "(pod is not owner)")
    c["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "web-0", "uid": "pod-uid",
                                         "controller": True}]
    assert csiplan.check_claim(POD, EPH_VOL, c) == "pv-1"


def test_volume_must_be_bound_to_the_claim() -> None:
    with pytest.raises(MountProblem, match="failed to fetch PV pv-1 from API server"):
        csiplan.check_volume(POD, PVC_VOL, claim(), None)
    with pytest.raises(MountProblem, match="nil pv.Spec.ClaimRef"):
        csiplan.check_volume(POD, PVC_VOL, claim(), pv(uid=None))
    with pytest.raises(MountProblem, match="pv.Spec.ClaimRef.UID other does not point to "
                                           "claim.UID claim-uid"):
        csiplan.check_volume(POD, PVC_VOL, claim(), pv(uid="other"))
    csiplan.check_volume(POD, PVC_VOL, claim(), pv())


def test_failed_mount_message() -> None:
    assert csiplan.failed_mount_message("data", "error processing PVC ns/c: PVC is not bound") == (
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], "
        "failed to process volumes=[data]: error processing PVC ns/c: PVC is not bound")


def test_volume_facts_and_read_only_rules() -> None:
    f = csiplan.volume_facts(PVC_VOL, pv())
    assert (f.driver, f.handle, f.pv, f.mode, f.read_only) == ("fake.test", "vol-1", "pv-1",
                                                                "Filesystem", False)
    assert f.attributes == {"a": "b"}
    ro_ref = {"name": "data", "persistentVolumeClaim": {"claimName": "c", "readOnly": True}}
    assert csiplan.volume_facts(ro_ref, pv()).read_only
    assert csiplan.volume_facts(PVC_VOL, pv(accessModes=["ReadOnlyMany"])).read_only
    assert not csiplan.volume_facts(PVC_VOL, pv(accessModes=["ReadOnlyMany",
                                                             "ReadWriteOnce"])).read_only
    assert csiplan.volume_facts(PVC_VOL, pv(volumeMode="Block")).mode == "Block"
    nfs = {"metadata": {"name": "old"}, "spec": {"nfs": {"server": "x"}}}
    with pytest.raises(MountProblem, match=r"only CSI volumes .* not \['nfs'\]"):
        csiplan.volume_facts(PVC_VOL, nfs)


def test_paths_and_names_as_kubernetes_lays_them_out(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"vol-1").hexdigest()
    assert csiplan.staging_path(tmp_path, "fake.test", "vol-1") == (
        tmp_path / "plugins" / "kubernetes.io" / "csi" / "fake.test" / digest / "globalmount")


def _pub(volume: str, handle: str) -> Published:
    return Published(volume=volume, driver="d", handle=handle, pv="pv", claim="c",
                     namespace="ns", mode="Filesystem", read_only=False, target="/t",
                     staging="/s", done=True)


def test_record_round_trip_and_reference_counts(tmp_path: Path) -> None:
    rec = PodRecord(uid="u1", volumes={"a": _pub("a", "h1")})
    csiplan.save_record(tmp_path / "u1", rec)
    back = csiplan.load_record(tmp_path / "u1")
    assert back == rec
    assert csiplan.load_record(tmp_path / "nope") is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / csiplan.RECORD_NAME).write_text("{not json")
    assert csiplan.load_record(tmp_path / "bad") is None
    other = PodRecord(uid="u2", volumes={"b": _pub("b", "h1"), "c": _pub("c", "h2")})
    use = csiplan.users([rec, other])
    assert use == {("d", "h1"): {"u1", "u2"}, ("d", "h2"): {"u2"}}
    staged = [Staged("d", "h1", Path("/1")), Staged("d", "h2", Path("/2")),
              Staged("d", "h3", Path("/3"))]
    assert csiplan.unused_stagings(staged, use) == [staged[2]]


def test_expansion_step_and_claim_status() -> None:
    c = claim()
    c["status"].update({"capacity": {"storage": "1Gi"},
                        "allocatedResourceStatuses": {"storage": "NodeResizePending"},
                        "conditions": [{"type": "FileSystemResizePending", "status": "True"},
                                       {"type": "Other", "status": "True"}]})
    volume = pv(capacity={"storage": "2Gi"})
    assert csiplan.expansion_step(claim(), volume) is None
    step = csiplan.expansion_step(c, volume)
    assert step is not None and step.capacity_bytes == 2 * 1024 ** 3 and step.capacity == "2Gi"
    status = csiplan.expanded_claim_status(c, step.capacity)
    assert status["capacity"] == {"storage": "2Gi"}
    assert status["conditions"] == [{"type": "Other", "status": "True"}]
    assert status["allocatedResourceStatuses"] is None
    assert status["phase"] == "Bound"


class _Drv:
    def __init__(self, keys: tuple[str, ...]) -> None:
        self.capabilities = Capabilities(topology_keys=keys)


def test_csinode_spec_and_nodeid_annotation() -> None:
    drivers = {"b.test": _Drv(("kubernetes.io/hostname",)), "a.test": _Drv(())}
    assert csiplan.csinode_drivers(drivers, "n1", {"a.test": 5}) == [
        {"name": "a.test", "nodeID": "n1", "topologyKeys": [], "allocatable": {"count": 5}},
        {"name": "b.test", "nodeID": "n1", "topologyKeys": ["kubernetes.io/hostname"]}]
    ann = csiplan.node_id_annotation(drivers, "n1", json.dumps({"other.csi": "x"}))
    assert json.loads(ann) == {"a.test": "n1", "b.test": "n1", "other.csi": "x"}
    assert json.loads(csiplan.node_id_annotation(["a"], "n", "garbage")) == {"a": "n"}


def test_stats_entry_and_metrics() -> None:
    st = VolumeStats(capacity_bytes=100, available_bytes=60, used_bytes=40, inodes=10,
                     inodes_free=7, inodes_used=3)
    entry = csiplan.summary_entry("data", st, "c1", "ns", "T")
    assert entry == {"time": "T", "availableBytes": 60, "capacityBytes": 100, "usedBytes": 40,
                     "name": "data", "inodesFree": 7, "inodes": 10, "inodesUsed": 3,
                     "pvcRef": {"name": "c1", "namespace": "ns"}}
    text = csiplan.metric_samples([("ns", "c1", st), ("ns", "c1", st),
                                   ("ns", "c2", VolumeStats(5, 4, 1))])
    assert 'kubelet_volume_stats_capacity_bytes{namespace="ns",persistentvolumeclaim="c1"} 100.0' \
        in text
    assert 'kubelet_volume_stats_inodes_used{namespace="ns",persistentvolumeclaim="c1"} 3.0' in text
    assert 'kubelet_volume_stats_used_bytes{namespace="ns",persistentvolumeclaim="c2"} 1.0' in text
    # A claim counts once however many pods use it; unknown inode counts are left out.
    assert text.count('capacity_bytes{namespace="ns",persistentvolumeclaim="c1"}') == 1
    assert 'inodes{namespace="ns",persistentvolumeclaim="c2"}' not in text
    assert "# TYPE kubelet_volume_stats_available_bytes gauge" in text
