"""Claimed volumes end to end: an in-process `fleet server` and an in-process agent
(process driver, no pod network) with a tmpdir storage driver registered by the test.

The test plays the PV controller (it binds the claim itself), so it needs nothing
but the API kinds: a pod whose claim is Pending waits with FailedMount events; once
the claim is bound to a PV of the test driver, the volume is staged and published
into the pod's directory (real bind mounts as root, symlinks otherwise), the agent
writes the CSINode object and serves the volume's stats; a restarted agent keeps the
mount (no driver call at all) and, when the pod is deleted, unpublishes and unstages.
As root with runc, the same with the oci driver: the container reads its claim (and a
subPath of it) and gets a raw block volume at its devicePath.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet.agent import csiplan, inventory
from fleet.agent.config import AgentConfig
from fleet.agent.run import run as run_agent
from fleet.agent.volumes import mounts_under
from fleet.client import MERGE_PATCH, ApiException, Client, ClientConfig
from fleet.network.cluster_dns import ClusterDNSConfig
from fleet.network.ingress import IngressConfig
from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.runtime.oci import find_runtime
from fleet.server import run as server_run
from fleet.storage import registry as storage_registry
from fleet.testing.oci_image import (
    OciImage,
    Platform,
    build_busybox_image,
    build_layer,
    busybox_problem,
    write_oci_archive,
)
from tests.unit.agent import fakecsi

DRIVER = "tmpdir.fleet-test"
IMAGE = "localhost/fleet-test/agentvol:1"


def _import_tiny_image(data_dir: Path, work: Path) -> None:
    """An image for the process driver (which ignores layers): one small layer."""
    plat = Platform.host()
    image = OciImage(layers=[build_layer({"etc/hello": "x"})],
                     config={"architecture": plat.architecture, "os": plat.os,
                             "config": {"Cmd": ["sleep", "600"]}}, platform=plat)
    archive = write_oci_archive(image, work / "tiny.tar", IMAGE)
    import_archive_sync(ImageStore(data_dir / "images"), archive, IMAGE)

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def driver_root(tmp_path: Path) -> Iterator[dict[str, fakecsi.TmpDirDriver]]:
    made = fakecsi.register(DRIVER, tmp_path / "backing", bind_mounts=os.geteuid() == 0)
    try:
        yield made
    finally:
        storage_registry.unregister(DRIVER)
        data = tmp_path / "agent"
        if data.exists():
            # Whatever the agent left (a failed test): containers, then mounts.
            inventory.collect_garbage(data, set())
        for m in mounts_under(tmp_path):
            fakecsi.umount_lazy(m)


async def _wait(pred: Any, what: str, timeout: float = 30.0) -> Any:
    with trio.move_on_after(timeout):
        while True:
            got = await pred()
            if got:
                return got
            await trio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def running(tmp_path: Path, runtime: str) -> AsyncIterator[tuple[Any, ...]]:
    """An in-process server (no scheduler; the garbage collector, and the publisher of
    `kube-root-ca.crt` that pods' kube-api-access volumes read) and the
    config and starter of an agent with runtime driver `runtime`, its image imported;
    yields (nursery, server info, agent config, agent starter, API client)."""
    scfg = server_run.ServerConfig(
        data_dir=tmp_path / "server", port=_free_port(), metrics_port=_free_port(),
        agent=False, scheduler=False, controllers=["garbagecollector", "root-ca-cert-publisher"],
        dns=ClusterDNSConfig(bind=""), ingress=IngressConfig(enabled=False))
    async with trio.open_nursery() as n:
        info = await n.start(server_run.run, scfg)
        client_cfg = ClientConfig(server=info.url, token=info.token, ca_data=info.ca_pem)
        acfg = AgentConfig(server_url=info.url, token=info.token, ca_data=info.ca_pem,
                           data_dir=tmp_path / "agent",
                           node_name=f"vol-node-{uuid.uuid4().hex[:6]}", port=_free_port(),
                           address="127.0.0.1", driver=runtime, network_driver=None,
                           service_proxy=False)

        async def agent(task_status: trio.TaskStatus[Any]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await run_agent(acfg)

        if runtime == "oci":
            archive = write_oci_archive(build_busybox_image(), tmp_path / "busybox.tar", IMAGE)
            import_archive_sync(ImageStore(acfg.data_dir / "images"), archive, IMAGE)
        else:
            _import_tiny_image(acfg.data_dir, tmp_path)
        async with Client(client_cfg) as api:
            yield n, info, acfg, agent, api
        n.cancel_scope.cancel()


async def _bound_claim(api: Client, ns: str, name: str, pv: str, handle: str,
                       mode: str = "Filesystem") -> None:
    """A claim and a PV of the test driver bound to each other (the binder's result)."""
    claim = await api.create("v1", "persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeMode": mode,
                 "resources": {"requests": {"storage": "1Gi"}}}}, ns)
    await api.create("v1", "persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "volumeMode": mode,
                 "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns,
                              "name": name, "uid": claim["metadata"]["uid"]},
                 "csi": {"driver": DRIVER, "volumeHandle": handle}}})
    await api.patch("v1", "persistentvolumeclaims", name, {"spec": {"volumeName": pv}},
                    MERGE_PATCH, ns)
    await api.patch("v1", "persistentvolumeclaims", name,
                    {"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                "capacity": {"storage": "1Gi"}}},
                    MERGE_PATCH, ns, subresource="status")


async def test_pod_with_a_claim_gets_its_volume_keeps_it_across_restart_and_tears_down(
        tmp_path: Path, driver_root: dict[str, fakecsi.TmpDirDriver]) -> None:
    ns = "default"
    async with running(tmp_path, "process") as (n, info, acfg, agent, api):
        node = acfg.node_name
        agent_scope = await n.start(agent)
        await _wait(lambda: _exists(api, "v1", "nodes", node), "the node")
        # The CSINode lists the test driver; the Node carries its node id.
        csinode = await _wait(lambda: _get(api, "storage.k8s.io/v1", "csinodes", node),
                              "the CSINode")
        assert {"name": DRIVER, "nodeID": node,
                "topologyKeys": ["kubernetes.io/hostname"]} in csinode["spec"]["drivers"]
        nd = await api.get_object("v1", "nodes", node)
        assert json.loads(nd["metadata"]["annotations"][csiplan.NODE_ID_ANNOTATION])[
            DRIVER] == node

        await api.create("v1", "persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}}}, ns)
        await api.create("v1", "pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db"},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "volumes": [{"name": "data",
                                  "persistentVolumeClaim": {"claimName": "data"}}],
                     "containers": [{"name": "c", "image": IMAGE,
                                     "imagePullPolicy": "Never", "command": ["sleep", "600"],
                                     "volumeMounts": [{"name": "data",
                                                       "mountPath": "/data"}]}]}}, ns)
        # Unbound: FailedMount, in the kubelet's words, and no container yet.
        ev = await _wait(lambda: _event(api, ns, "FailedMount"), "a FailedMount event")
        assert ev["message"] == (
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached "
            "volumes=[], failed to process volumes=[data]: error processing PVC "
            "default/data: PVC is not bound")
        pod = await api.get_object("v1", "pods", "db", ns)
        assert pod["status"].get("phase") == "Pending"
        uid = pod["metadata"]["uid"]

        # Bind it, as the PV controller would.
        claim = await api.get_object("v1", "persistentvolumeclaims", "data", ns)
        (tmp_path / "backing" / "vol-1").mkdir(parents=True)
        (tmp_path / "backing" / "vol-1" / "hello").write_text("hello from the volume")
        await api.create("v1", "persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns,
                                  "name": "data", "uid": claim["metadata"]["uid"]},
                     "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}}})
        await api.patch("v1", "persistentvolumeclaims", "data",
                        {"spec": {"volumeName": "pv-1"}}, MERGE_PATCH, ns)
        await api.patch("v1", "persistentvolumeclaims", "data",
                        {"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                    "capacity": {"storage": "1Gi"}}},
                        MERGE_PATCH, ns, subresource="status")

        await _wait(lambda: _phase(api, ns, "db", "Running"), "the pod Running", 60)
        target = tmp_path / "agent" / "pods" / uid / "volumes" / "data"
        assert (target / "hello").read_text() == "hello from the volume"
        first = driver_root[node]
        assert [c[0] for c in first.calls if c[0] != "node_volume_stats"] == [
            "node_stage", "node_publish"]
        staging = csiplan.staging_path(tmp_path / "agent", DRIVER, "vol-1")
        if os.geteuid() == 0:
            assert fakecsi.is_mount(target) and fakecsi.is_mount(staging)
        # The agent API: /stats/summary volume entries, kubelet_volume_stats_* metrics.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{acfg.port}",
                                     headers={"Authorization": f"Bearer {info.token}"}) as h:
            doc = (await h.get("/stats/summary")).json()
            [entry] = [p for p in doc["pods"] if p["podRef"]["name"] == "db"]
            [vol] = entry["volume"]
            assert vol["name"] == "data" and vol["pvcRef"] == {"name": "data",
                                                                "namespace": ns}
            assert vol["usedBytes"] == len("hello from the volume")
            text = (await h.get("/metrics")).text
            assert (f'kubelet_volume_stats_used_bytes{{namespace="{ns}",'
                    f'persistentvolumeclaim="data"}} 21.0') in text
        if shutil.which("kubectl"):
            # What `kubectl describe pod` shows: the claim from the spec, our events.
            res = await trio.run_process(
                ["kubectl", "--kubeconfig", str(info.kubeconfig), "describe", "pod", "db",
                 "-n", ns], capture_stdout=True, capture_stderr=True, check=False)
            out = res.stdout.decode()
            assert res.returncode == 0, res.stderr.decode()
            assert "PersistentVolumeClaim (a reference to a PersistentVolumeClaim" in out
            assert re.search(r"ClaimName:\s+data\n", out), out
            assert "FailedMount" in out and "PVC is not bound" in out

        # Restart the agent: the mount stays, no driver call is made again.
        agent_scope.cancel()
        await trio.sleep(0.2)
        agent_scope = await n.start(agent)
        second = await _wait(lambda: _new_driver(driver_root, node, first), "a new agent")
        await trio.sleep(2)
        await _wait(lambda: _phase(api, ns, "db", "Running"), "the pod still Running")
        assert [c for c in second.calls if c[0] != "node_volume_stats"] == []
        assert (target / "hello").read_text() == "hello from the volume"

        # Delete the pod: unpublished, unstaged, the data kept, the pod gone.
        await api.delete("v1", "pods", "db", ns)
        await _wait(lambda: _gone(api, "v1", "pods", "db", ns), "the pod gone", 60)
        assert [c[0] for c in second.calls if c[0] != "node_volume_stats"] == [
            "node_unpublish", "node_unstage"]
        assert not mounts_under(tmp_path / "agent")
        assert not staging.parent.exists()
        assert (tmp_path / "backing" / "vol-1" / "hello").exists()
        agent_scope.cancel()


async def _get(api: Client, api_version: str, plural: str, name: str,
               namespace: str | None = None) -> dict[str, Any] | None:
    try:
        return await api.get_object(api_version, plural, name, namespace)
    except (ApiException, httpx.TransportError):
        return None


async def _exists(api: Client, api_version: str, plural: str, name: str) -> bool:
    return await _get(api, api_version, plural, name) is not None


async def _gone(api: Client, api_version: str, plural: str, name: str, ns: str) -> bool:
    try:
        await api.get_object(api_version, plural, name, ns)
    except ApiException as e:
        return e.code == 404
    return False


async def _phase(api: Client, ns: str, name: str, phase: str) -> bool:
    pod = await _get(api, "v1", "pods", name, ns)
    return bool(pod and (pod.get("status") or {}).get("phase") == phase)


async def _event(api: Client, ns: str, reason: str) -> dict[str, Any] | None:
    events = await api.list("v1", "events", ns)
    return next((e for e in events.get("items") or [] if e.get("reason") == reason), None)


async def _new_driver(made: dict[str, fakecsi.TmpDirDriver], node: str,
                      old: fakecsi.TmpDirDriver) -> fakecsi.TmpDirDriver | None:
    d = made.get(node)
    return d if d is not None and d is not old else None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runc, bind mounts)")
@pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun")
@pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static")
async def test_oci_container_sees_its_claim_and_its_block_device(
        tmp_path: Path, driver_root: dict[str, fakecsi.TmpDirDriver]) -> None:
    ns = "default"
    (tmp_path / "backing" / "vol-1").mkdir(parents=True)
    (tmp_path / "backing" / "vol-1" / "hello").write_text("hello from the volume")
    async with running(tmp_path, "oci") as (n, info, acfg, agent, api):
        agent_scope = await n.start(agent)
        await _wait(lambda: _exists(api, "v1", "nodes", acfg.node_name), "the node")
        await _bound_claim(api, ns, "data", "pv-1", "vol-1")
        # A raw block volume: the test driver publishes the node's /dev/null as its device.
        await _bound_claim(api, ns, "raw", "pv-b", "vol-b", mode="Block")
        await api.create("v1", "pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db"},
            "spec": {"nodeName": acfg.node_name, "terminationGracePeriodSeconds": 1,
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                                 {"name": "raw", "persistentVolumeClaim": {"claimName": "raw"}}],
                     "containers": [{
                         "name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                         "command": ["sh", "-c", "cat /data/hello > /data/sub/seen; "
                                     "ls -l /dev/xvda > /data/sub/dev; sleep 600"],
                         "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                          {"name": "data", "mountPath": "/data/sub",
                                           "subPath": "out"}],
                         "volumeDevices": [{"name": "raw", "devicePath": "/dev/xvda"}]}]}}, ns)
        await _wait(lambda: _phase(api, ns, "db", "Running"), "the pod Running", 60)
        out = tmp_path / "backing" / "vol-1" / "out"

        async def written() -> bool:
            return (out / "dev").exists() and (out / "dev").stat().st_size > 0

        await _wait(written, "the container's output in the volume")
        assert (out / "seen").read_text() == "hello from the volume"
        dev = (out / "dev").read_text()
        null = os.stat("/dev/null")
        assert dev.startswith("c"), dev
        assert re.search(rf"{os.major(null.st_rdev)},\s+{os.minor(null.st_rdev)}\s", dev), dev

        await api.delete("v1", "pods", "db", ns)
        await _wait(lambda: _gone(api, "v1", "pods", "db", ns), "the pod gone", 60)
        calls = [c for c in driver_root[acfg.node_name].calls if c[0] != "node_volume_stats"]
        assert sorted(calls) == sorted([("node_stage", "vol-1"), ("node_publish", "vol-1"),
                                        ("node_stage", "vol-b"), ("node_publish", "vol-b"),
                                        ("node_unpublish", "vol-1"), ("node_unstage", "vol-1"),
                                        ("node_unpublish", "vol-b"), ("node_unstage", "vol-b")])
        assert not mounts_under(tmp_path / "agent")
        agent_scope.cancel()
