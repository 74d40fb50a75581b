"""The node's claimed volumes (fleet.agent.csivolumes.NodeVolumes) with a fake API and the
tmpdir test driver: stage once per node, publish per pod, tear down by reference count,
survive a restart, expand, attach, CSINode, stats — and, as root, real bind mounts
through the pod's VolumeManager."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.agent import csiplan
from fleet.agent.csiplan import DriverFailure, MountProblem
from fleet.agent.csivolumes import NodeVolumes
from fleet.agent.volumes import VolumeError, VolumeManager, mounts_under
from fleet.api.pvmatch import attachment_name, unique_volume_name
from fleet.client import ApiException
from fleet.storage.driver import Capabilities, Code, DriverError
from tests.unit.agent import fakecsi
from tests.unit.agent.fakecsi import TmpDirDriver, is_mount, precondition

DRIVER = "tmpdir.test"


class FakeAPI:
    """get_object/create/replace/patch/delete over a dict, with a log of writes."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str, str | None, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str, Any]] = []

    def put(self, api_version: str, plural: str, obj: dict[str, Any]) -> None:
        md = obj["metadata"]
        self.objs[(api_version, plural, md.get("namespace"), md["name"])] = obj

    def obj(self, api_version: str, plural: str, name: str,
            namespace: str | None = None) -> dict[str, Any] | None:
        return self.objs.get((api_version, plural, namespace, name))

    async def get_object(self, api_version: str, plural: str, name: str,
                         namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        o = self.obj(api_version, plural, name, namespace)
        if o is None:
            raise ApiException({"code": 404, "reason": "NotFound",
                                "message": f'{plural} "{name}" not found'})
        return copy.deepcopy(o)

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        self.writes.append(("create", plural, body["metadata"]["name"], body))
        self.put(api_version, plural, copy.deepcopy(body))
        return body

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        self.writes.append(("replace", plural, name, body))
        self.put(api_version, plural, copy.deepcopy(body))
        return body

    async def patch(self, api_version: str, plural: str, name: str, patch: Any,
                    content_type: str = "", namespace: str | None = None,
                    subresource: str | None = None, **kw: Any) -> dict[str, Any]:
        self.writes.append(("patch", plural if not subresource else f"{plural}/{subresource}",
                            name, patch))
        o = self.obj(api_version, plural, name, namespace)
        assert o is not None
        for k, v in patch.items():
            if isinstance(v, dict) and isinstance(o.get(k), dict) and k == "metadata":
                for kk, vv in v.items():
                    o[k].setdefault(kk, {}).update(vv)
            else:
                o[k] = v
        return o

    async def delete(self, api_version: str, plural: str, name: str,
                     namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        self.writes.append(("delete", plural, name, None))
        self.objs.pop((api_version, plural, namespace, name), None)
        return {}


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    async def record(self, pod: Any, type_: str, reason: str, message: str,
                     field_path: str | None = None) -> None:
        self.seen.append((type_, reason, message))


def pod(name: str, uid: str, claim: str = "data", **vol: Any) -> dict[str, Any]:
    v = vol or {"persistentVolumeClaim": {"claimName": claim}}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"volumes": [{"name": "data", **v}],
                     "containers": [{"name": "c", "volumeMounts": [
                         {"name": "data", "mountPath": "/data"}]}]}}


def add_claim(api: FakeAPI, name: str = "data", *, bound: bool = True, handle: str = "vol-1",
              pv_name: str = "pv-1", mode: str = "Filesystem", **pv_spec: Any) -> None:
    api.put("v1", "persistentvolumeclaims", {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"volumeName": pv_name if bound else ""},
        "status": {"phase": "Bound" if bound else "Pending",
                   "capacity": {"storage": "1Gi"}}})
    api.put("v1", "persistentvolumes", {
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "volumeMode": mode,
                 "claimRef": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
                 "csi": {"driver": DRIVER, "volumeHandle": handle}, **pv_spec}})


@contextlib.contextmanager
def _environment(tmp_path: Path, bind: bool) -> Iterator[tuple[FakeAPI, TmpDirDriver, Events,
                                                               Path]]:
    api = FakeAPI()
    api.put("v1", "nodes", {"metadata": {"name": "n1", "uid": "node-uid"}})
    drv = TmpDirDriver(DRIVER, tmp_path / "backing", bind_mounts=bind)
    try:
        yield api, drv, Events(), tmp_path / "agent"
    finally:
        # Whatever a failed test left mounted under its own tmp dir goes (lazily).
        for m in mounts_under(tmp_path):
            fakecsi.umount_lazy(m)


@pytest.fixture(params=["symlink", "bind"])
def setup(request: pytest.FixtureRequest,
          tmp_path: Path) -> Iterator[tuple[FakeAPI, TmpDirDriver, Events, Path]]:
    """The fake API, the test driver (publishing by symlink, or — as root — by real
    bind mounts), an event sink and the agent's data dir."""
    if request.param == "bind" and os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    with _environment(tmp_path, request.param == "bind") as env:
        yield env


@pytest.fixture
def bind_setup(tmp_path: Path) -> Iterator[tuple[FakeAPI, TmpDirDriver, Events, Path]]:
    with _environment(tmp_path, True) as env:
        yield env


def manager(setup: tuple[FakeAPI, TmpDirDriver, Events, Path], **kw: Any) -> NodeVolumes:
    api, drv, events, data_dir = setup
    return NodeVolumes(api, data_dir, "n1", drivers={DRIVER: drv}, events=events, **kw)


def target(data_dir: Path, uid: str) -> Any:
    return lambda facts: data_dir / "pods" / uid / "volumes" / "data"


async def cleanup(nv: NodeVolumes, data_dir: Path) -> None:
    for uid in list(nv._records):
        await nv.unpublish_pod(uid, data_dir / "pods" / uid)
    await nv.sweep()
    assert not mounts_under(data_dir)


async def test_unbound_claim_is_a_mount_problem_then_publishes(setup: Any) -> None:
    api, drv, events, data_dir = setup
    nv = manager(setup)
    p = pod("p", "u1")
    with pytest.raises(MountProblem, match="PVC is not found|failed to fetch PVC"):
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))
    add_claim(api, bound=False)
    with pytest.raises(MountProblem) as e:
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))
    assert e.value.message == "error processing PVC ns/data: PVC is not bound"
    assert drv.calls == []
    add_claim(api)
    path, facts = await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                                   target(data_dir, "u1"))
    assert path == data_dir / "pods" / "u1" / "volumes" / "data"
    assert drv.calls == [("node_stage", "vol-1"), ("node_publish", "vol-1")]
    staging = csiplan.staging_path(data_dir, DRIVER, "vol-1")
    assert staging.is_dir()
    vol_data = json.loads((staging.parent / "vol_data.json").read_text())
    assert vol_data["driverName"] == DRIVER and vol_data["volumeHandle"] == "vol-1"
    (drv.backing("vol-1") / "hello").write_text("hi")
    assert (path / "hello").read_text() == "hi"
    rec = csiplan.load_record(data_dir / "pods" / "u1")
    assert rec is not None and rec.volumes["data"].done and rec.volumes["data"].pv == "pv-1"
    await cleanup(nv, data_dir)


async def test_staged_once_per_node_unstaged_after_last_pod(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    nv = manager(setup)
    for name, uid in (("a", "u1"), ("b", "u2")):
        p = pod(name, uid)
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / uid,
                         target(data_dir, uid))
    assert [c[0] for c in drv.calls] == ["node_stage", "node_publish", "node_publish"]
    drv.calls.clear()
    await nv.unpublish_pod("u1", data_dir / "pods" / "u1")
    assert drv.calls == [("node_unpublish", "vol-1")]
    assert not (data_dir / "pods" / "u1" / csiplan.RECORD_NAME).exists()
    assert not (data_dir / "pods" / "u1" / "volumes" / "data").exists()
    await nv.unpublish_pod("u2", data_dir / "pods" / "u2")
    assert drv.calls[1:] == [("node_unpublish", "vol-1"), ("node_unstage", "vol-1")]
    staging = csiplan.staging_path(data_dir, DRIVER, "vol-1")
    assert not staging.parent.exists()
    # A second teardown of the same pod is a no-op.
    await nv.unpublish_pod("u2", data_dir / "pods" / "u2")
    assert len(drv.calls) == 3
    assert not mounts_under(data_dir)


async def test_restart_adopts_live_pods_and_tears_down_the_rest(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    add_claim(api, "other", handle="vol-2", pv_name="pv-2")
    first = manager(setup)
    live, dead = pod("live", "u1"), pod("dead", "u2", claim="other")
    for p, uid in ((live, "u1"), (dead, "u2")):
        await first.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / uid,
                            target(data_dir, uid))
    # A staging nobody's record mentions (a crash between stage and the first record).
    orphan = csiplan.staging_path(data_dir, DRIVER, "vol-3")
    await drv.node_stage("vol-3", orphan, {}, "Filesystem", {})
    orphan.parent.joinpath("vol_data.json").write_text(
        json.dumps({"driverName": DRIVER, "volumeHandle": "vol-3"}))
    drv.calls.clear()

    # "Restart": a new manager over the same data dir; pod u2 was deleted meanwhile.
    second = manager(setup)
    problems = await second.recover({"u1"})
    assert problems == []
    assert sorted(drv.calls) == sorted([("node_unpublish", "vol-2"), ("node_unstage", "vol-2"),
                                        ("node_unstage", "vol-3")])
    drv.calls.clear()
    # The live pod's set-up finds its record and its mount: nothing is called again.
    path, _ = await second.publish(live, live["spec"]["volumes"][0], data_dir / "pods" / "u1",
                                   target(data_dir, "u1"))
    assert drv.calls == []
    (drv.backing("vol-1") / "f").write_text("kept")
    assert (path / "f").read_text() == "kept"
    # ... and tears down correctly later.
    await second.unpublish_pod("u1", data_dir / "pods" / "u1")
    assert drv.calls == [("node_unpublish", "vol-1"), ("node_unstage", "vol-1")]
    assert not mounts_under(data_dir)


async def test_after_a_reboot_the_recorded_volume_is_staged_and_published_again(
        setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    p = pod("p", "u1")
    first = manager(setup)
    path, _ = await first.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                                  target(data_dir, "u1"))
    (drv.backing("vol-1") / "f").write_text("data")
    # A reboot (or `fleet killall`): every mount under the data dir is gone.
    for m in mounts_under(data_dir):
        fakecsi.umount(m)
    if path.is_symlink():
        path.unlink()
    drv.calls.clear()
    second = manager(setup)
    await second.recover({"u1"})
    assert drv.calls == []  # the pod is live: nothing torn down
    path, _ = await second.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                                   target(data_dir, "u1"))
    assert drv.calls == [("node_stage", "vol-1"), ("node_publish", "vol-1")]
    assert (path / "f").read_text() == "data"
    await cleanup(second, data_dir)


async def test_record_written_before_publish_so_a_failed_publish_is_torn_down(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    nv = manager(setup)
    p = pod("p", "u1")
    drv.fail["node_publish"] = DriverError(Code.INTERNAL, "boom")
    with pytest.raises(DriverFailure) as e:
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))
    assert e.value.message == ('MountVolume.SetUp failed for volume "pv-1" : rpc error: '
                               "code = Internal desc = boom")
    rec = csiplan.load_record(data_dir / "pods" / "u1")
    assert rec is not None and not rec.volumes["data"].done
    # A restarted agent with the pod gone unpublishes (idempotent) and unstages.
    drv.calls.clear()
    again = manager(setup)
    await again.recover(set())
    assert drv.calls == [("node_unpublish", "vol-1"), ("node_unstage", "vol-1")]


async def test_unknown_driver_and_unsupported_mode(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    api.obj("v1", "persistentvolumes", "pv-1")["spec"]["csi"]["driver"] = "nope.test"
    nv = manager(setup)
    p = pod("p", "u1")
    with pytest.raises(MountProblem, match="driver name nope.test not found in the list of "
                                           "registered CSI drivers"):
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))
    api.obj("v1", "persistentvolumes", "pv-1")["spec"]["csi"]["driver"] = DRIVER
    api.obj("v1", "persistentvolumes", "pv-1")["spec"]["volumeMode"] = "Block"
    drv.capabilities = Capabilities()
    with pytest.raises(MountProblem, match="volume mode Block is not supported"):
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))


async def test_attach_required_waits_for_the_volume_attachment(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    drv.capabilities = Capabilities(attach_required=True)
    nv = manager(setup, attach_timeout=5)
    p = pod("p", "u1")
    va_name = attachment_name("vol-1", DRIVER, "n1")

    async def attacher() -> None:
        # The attach/detach controller's attachment appears late; the attacher then
        # marks it attached.
        await trio.sleep(0.3)
        await api.create("storage.k8s.io/v1", "volumeattachments", {
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": va_name},
            "spec": {"attacher": DRIVER, "nodeName": "n1",
                     "source": {"persistentVolumeName": "pv-1"}}})
        await trio.sleep(0.2)
        api.obj("storage.k8s.io/v1", "volumeattachments", va_name)["status"] = {
            "attached": True, "attachmentMetadata": {"lun": "3"}}

    async with trio.open_nursery() as n:
        n.start_soon(attacher)
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))
    assert drv.publish_context == [{"lun": "3"}]
    assert ("Normal", "SuccessfulAttachVolume",
            'AttachVolume.Attach succeeded for volume "pv-1" ') in events.seen
    assert nv.volumes_in_use() == [unique_volume_name(DRIVER, "vol-1")]
    await nv.unpublish_pod("u1", data_dir / "pods" / "u1")
    # Detaching is the attach/detach controller's (once volumesInUse drops it).
    assert nv.volumes_in_use() == []


async def test_attach_error_and_timeout(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    drv.capabilities = Capabilities(attach_required=True)
    nv = manager(setup, attach_timeout=0.3)
    p = pod("p", "u1")
    with pytest.raises(MountProblem, match=f"timed out waiting for external-attacher of {DRIVER} "
                                           "CSI driver to attach volume vol-1"):
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))
    va_name = attachment_name("vol-1", DRIVER, "n1")
    await api.create("storage.k8s.io/v1", "volumeattachments", {
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": va_name},
        "spec": {"attacher": DRIVER, "nodeName": "n1", "source": {"persistentVolumeName": "pv-1"}},
        "status": {"attached": False, "attachError": {"message": "disk busy"}}})
    with pytest.raises(MountProblem, match='AttachVolume.Attach failed for volume "pv-1" : '
                                           "disk busy"):
        await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1",
                         target(data_dir, "u1"))
    assert drv.calls == []


def _resize_pending(api: FakeAPI) -> None:
    c = api.obj("v1", "persistentvolumeclaims", "data", "ns")
    c["status"]["conditions"] = [{"type": "FileSystemResizePending", "status": "True"}]
    api.obj("v1", "persistentvolumes", "pv-1")["spec"]["capacity"] = {"storage": "2Gi"}


async def test_node_expansion_updates_the_claim(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    nv = manager(setup)
    p = pod("p", "u1")
    await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1", target(data_dir, "u1"))
    drv.calls.clear()
    await nv.expand_once()
    assert drv.calls == []  # nothing pending
    _resize_pending(api)
    await nv.expand_once()
    assert drv.calls == [("node_expand", "vol-1")]
    c = api.obj("v1", "persistentvolumeclaims", "data", "ns")
    assert c["status"]["capacity"] == {"storage": "2Gi"}
    assert not c["status"]["conditions"]
    assert any(e[1] == "FileSystemResizeSuccessful" for e in events.seen)
    await cleanup(nv, data_dir)


async def test_expansion_refused_while_mounted_waits_for_the_next_stage(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    nv = manager(setup)
    p = pod("p", "u1")
    vol = p["spec"]["volumes"][0]
    await nv.publish(p, vol, data_dir / "pods" / "u1", target(data_dir, "u1"))
    _resize_pending(api)
    drv.fail["node_expand"] = precondition()
    await nv.expand_once()
    await nv.expand_once()  # not retried while the volume stays staged
    assert [c for c in drv.calls if c[0] == "node_expand"] == [("node_expand", "vol-1")]
    c = api.obj("v1", "persistentvolumeclaims", "data", "ns")
    assert c["status"]["conditions"][0]["type"] == "FileSystemResizePending"
    assert c["status"]["capacity"] == {"storage": "1Gi"}
    # The pod restarts: unstaged, staged again (the driver grows it offline there) ...
    await nv.unpublish_pod("u1", data_dir / "pods" / "u1")
    await nv.publish(p, vol, data_dir / "pods" / "u1", target(data_dir, "u1"))
    await nv.expand_once()
    # ... and the retried node_expand completes the claim.
    assert [c for c in drv.calls if c[0] == "node_expand"] == [("node_expand", "vol-1")] * 2
    c = api.obj("v1", "persistentvolumeclaims", "data", "ns")
    assert c["status"]["capacity"] == {"storage": "2Gi"} and not c["status"]["conditions"]
    await cleanup(nv, data_dir)


async def test_csinode_and_node_annotation(setup: Any) -> None:
    api, drv, events, data_dir = setup
    nv = manager(setup)
    await nv.sync_csinode()
    csinode = api.obj("storage.k8s.io/v1", "csinodes", "n1")
    assert csinode["spec"]["drivers"] == [{"name": DRIVER, "nodeID": "n1",
                                           "topologyKeys": ["kubernetes.io/hostname"]}]
    assert csinode["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
    node = api.obj("v1", "nodes", "n1")
    assert json.loads(node["metadata"]["annotations"][csiplan.NODE_ID_ANNOTATION]) == {
        DRIVER: "n1"}
    n_writes = len(api.writes)
    await nv.sync_csinode()
    assert len(api.writes) == n_writes  # unchanged: nothing written
    nv.drivers["second.test"] = TmpDirDriver("second.test", data_dir, caps=Capabilities())
    await nv.sync_csinode()
    names = [d["name"] for d in api.obj("storage.k8s.io/v1", "csinodes", "n1")["spec"]["drivers"]]
    assert names == ["second.test", DRIVER]
    # Simulated nodes get none.
    api2 = FakeAPI()
    api2.put("v1", "nodes", {"metadata": {"name": "n1", "uid": "x"}})
    sim = NodeVolumes(api2, data_dir, "n1", drivers={DRIVER: drv}, simulated=True)
    await sim.sync_csinode()
    assert api2.writes == []


async def test_stats_summary_entries_and_metrics(setup: Any) -> None:
    api, drv, events, data_dir = setup
    add_claim(api)
    nv = manager(setup)
    p = pod("p", "u1")
    await nv.publish(p, p["spec"]["volumes"][0], data_dir / "pods" / "u1", target(data_dir, "u1"))
    (drv.backing("vol-1") / "f").write_bytes(b"x" * 100)
    entries = await nv.summary_entries("u1")
    assert len(entries) == 1
    e = entries[0]
    assert (e["name"], e["usedBytes"], e["capacityBytes"], e["pvcRef"]) == (
        "data", 100, 1 << 30, {"name": "data", "namespace": "ns"})
    assert await nv.summary_entries("other") == []
    text = await nv.metrics_text()
    assert 'kubelet_volume_stats_used_bytes{namespace="ns",persistentvolumeclaim="data"} 100.0' \
        in text
    # Measured at most every STATS_MAX_AGE seconds.
    calls = [c for c in drv.calls if c[0] == "node_volume_stats"]
    assert len(calls) == 1
    await cleanup(nv, data_dir)


# -- through the pod's VolumeManager ---------------------------------------------------------

async def _no_objects(kind: str, namespace: str, name: str) -> None:
    return None


async def test_volume_manager_failed_mount_read_only_and_block(setup: Any) -> None:
    api, drv, events, data_dir = setup
    nv = manager(setup)
    p = pod("p", "u1")
    vm = VolumeManager(data_dir / "pods" / "u1", _no_objects, csi=nv)
    with pytest.raises(VolumeError) as e:
        await vm.setup(p)
    assert e.value.reason == "FailedMount"
    assert e.value.message.startswith("Unable to attach or mount volumes: unmounted "
                                      "volumes=[data], unattached volumes=[], failed to process "
                                      "volumes=[data]: error processing PVC ns/data: ")
    add_claim(api)
    drv.fail["node_stage"] = DriverError(Code.UNAVAILABLE, "backend down")
    with pytest.raises(VolumeError) as e:
        await vm.setup(p)
    assert (e.value.reason, e.value.message) == (
        "FailedMount", 'MountVolume.MountDevice failed for volume "pv-1" : rpc error: '
        "code = Unavailable desc = backend down")
    # Nobody wants it (the pod could be deleted now): the half-made staging goes.
    assert await nv.sweep() == []
    assert drv.calls[-1] == ("node_unstage", "vol-1")
    assert not csiplan.staging_path(data_dir, DRIVER, "vol-1").parent.exists()
    p["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
    paths = await vm.setup(p)
    assert paths["data"] == data_dir / "pods" / "u1" / "volumes" / "data"
    [m] = vm.mounts_for(p["spec"]["containers"][0])
    assert m.read_only and m.container_path == "/data"
    # subPath keeps working inside a claimed volume (read-only: it must exist already).
    (drv.backing("vol-1") / "d" / "e").mkdir(parents=True)
    sub = {"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": "d/e"}]}
    [m] = vm.mounts_for(sub)
    assert m.host_path == Path(os.path.realpath(paths["data"] / "d" / "e"))
    assert m.host_path.is_dir() and m.read_only
    await vm.teardown()
    assert not (data_dir / "pods" / "u1").exists()
    assert ("node_unstage", "vol-1") in drv.calls

    # Block: the container gets the device at its devicePath, not a mount.
    add_claim(api, "raw", handle="vol-b", pv_name="pv-b", mode="Block")
    bp = pod("b", "u2", claim="raw")
    bp["spec"]["containers"][0] = {"name": "c", "volumeDevices": [
        {"name": "data", "devicePath": "/dev/xvda"}]}
    vm2 = VolumeManager(data_dir / "pods" / "u2", _no_objects, csi=nv)
    paths = await vm2.setup(bp)
    assert paths["data"] == data_dir / "pods" / "u2" / "volumeDevices" / "data"
    assert vm2.mounts_for(bp["spec"]["containers"][0]) == []
    [dev] = vm2.devices_for(bp["spec"]["containers"][0])
    null = os.stat("/dev/null")
    assert (dev.container_path, dev.kind, dev.major, dev.minor) == (
        "/dev/xvda", "c", os.major(null.st_rdev), os.minor(null.st_rdev))
    with pytest.raises(VolumeError, match="not a block volume"):
        vm2.devices_for({"name": "c", "volumeDevices": [{"name": "nope", "devicePath": "/d"}]})
    await vm2.teardown()
    assert not (data_dir / "pods" / "u2").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (real bind mounts)")
async def test_real_bind_mounts_read_only_and_teardown(bind_setup: Any) -> None:
    setup = bind_setup
    api, drv, events, data_dir = setup
    add_claim(api)
    nv = manager(setup)
    p = pod("p", "u1")
    p["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
    vm = VolumeManager(data_dir / "pods" / "u1", _no_objects, csi=nv)
    try:
        (drv.backing("vol-1")).mkdir(parents=True)
        (drv.backing("vol-1") / "file").write_text("from the volume")
        paths = await vm.setup(p)
        target_dir = paths["data"]
        staging = csiplan.staging_path(data_dir, DRIVER, "vol-1")
        assert is_mount(target_dir) and is_mount(staging)
        assert (target_dir / "file").read_text() == "from the volume"
        with pytest.raises(OSError):
            (target_dir / "new").write_text("no")  # published read-only
        # A restarted agent keeps the mount ...
        nv2 = manager(setup)
        await nv2.recover({"u1"})
        vm2 = VolumeManager(data_dir / "pods" / "u1", _no_objects, csi=nv2)
        n_calls = len(drv.calls)
        await vm2.setup(p)
        assert len(drv.calls) == n_calls and is_mount(target_dir)
        # ... and tears it down: unpublish, unstage, the pod dir goes, the data stays.
        await vm2.teardown()
        assert not mounts_under(data_dir)
        assert not (data_dir / "pods" / "u1").exists()
        assert (drv.backing("vol-1") / "file").read_text() == "from the volume"
    finally:
        for m in mounts_under(data_dir):
            fakecsi.umount_lazy(m)
