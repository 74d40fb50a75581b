"""Dynamic provisioning end to end with the in-tree hostpath driver, in one process.

A real `fleet server` (scheduler, every controller) and a real agent (process
runtime, no pod network) in this test's nursery.  A pod asks for a claim of the
default class `local-path` (hostpath.fleet.dev, WaitForFirstConsumer): the scheduler
picks the node and sets the claim's selected node, the PV controller hands the claim
to the driver, the agent's provisioner (fleet.storage.provisioner) makes the
directory and the PV pinned to the node, the PV controller binds, the agent mounts
it and the pod runs.  Deleting the pod and the claim (reclaim policy Delete) removes
the PV and the directory.  Growing a `fleet-local` (ext4 loop image) claim grows the
image and the PV at once; the claim waits in FileSystemResizePending until a new pod
stages the volume and the agent grows the filesystem.

Needs the storage kinds and controllers (merged beside the provisioner) and root
(the hostpath driver bind-mounts); skipped otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.agent import inventory
from fleet.agent.config import AgentConfig
from fleet.agent.run import run as run_agent
from fleet.agent.volumes import mounts_under
from fleet.client import MERGE_PATCH, ApiException, Client, ClientConfig
from fleet.network.cluster_dns import ClusterDNSConfig
from fleet.network.ingress import IngressConfig
from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.server import run as server_run
from fleet.testing.oci_image import OciImage, Platform, build_layer, write_oci_archive
from tests.conftest import free_port
from tests.integration.waiting import eventually
from tests.unit.agent.fakecsi import umount_lazy

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the hostpath driver bind-mounts: needs root"),
]

IMAGE = "localhost/fleet-test/prov:1"
NS = "default"




async def get(api: Client, plural: str, name: str, ns: str | None = None) -> dict[str, Any] | None:
    try:
        return await api.get_object("v1", plural, name, ns)
    except ApiException as e:
        if e.code == 404:
            return None
        raise


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Client, str, Path]]:
    """An in-process server (scheduler, every controller) and agent (process runtime, no
    pod network); yields (API client, node name, agent data dir)."""
    plat = Platform.host()
    image = OciImage(layers=[build_layer({"etc/hello": "x"})],
                     config={"architecture": plat.architecture, "os": plat.os,
                             "config": {"Cmd": ["sleep", "600"]}}, platform=plat)
    scfg = server_run.ServerConfig(data_dir=tmp_path / "server", port=free_port(),
                                   metrics_port=free_port(), agent=False, sync="NORMAL",
                                   dns=ClusterDNSConfig(bind=""), ingress=IngressConfig(enabled=False))
    node = f"prov-node-{uuid.uuid4().hex[:6]}"
    agent_dir = tmp_path / "agent"
    try:
        async with trio.open_nursery() as n:
            info = await n.start(server_run.run, scfg)
            acfg = AgentConfig(server_url=info.url, token=info.token, ca_data=info.ca_pem,
                               data_dir=agent_dir, node_name=node, port=free_port(),
                               address="127.0.0.1", driver="process", network_driver=None,
                               service_proxy=False)
            import_archive_sync(ImageStore(agent_dir / "images"),
                                write_oci_archive(image, tmp_path / "tiny.tar", IMAGE), IMAGE)
            n.start_soon(run_agent, acfg)
            async with Client(ClientConfig(server=info.url, token=info.token, ca_data=info.ca_pem)) as api:
                await eventually(lambda: get(api, "nodes", node), "the node")
                yield api, node, agent_dir
            n.cancel_scope.cancel()
    finally:
        if agent_dir.exists():
            inventory.collect_garbage(agent_dir, set())
        for m in sorted(mounts_under(tmp_path), key=lambda p: len(str(p)), reverse=True):
            umount_lazy(m)
        for dev in _loop_devices_under(tmp_path):
            subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)


def _loop_devices_under(root: Path) -> list[str]:
    out = subprocess.run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], capture_output=True,
                         text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if len(line.split()) > 1 and line.split()[1].startswith(str(root))]


async def make_claim_and_pod(api: Client, cls: str | None, size: str, pod: str = "db") -> None:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if cls:
        spec["storageClassName"] = cls
    with contextlib.suppress(ApiException):
        await api.create("v1", "persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"}, "spec": spec}, NS)
    await api.create("v1", "pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
        "spec": {"terminationGracePeriodSeconds": 1,
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                 "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                                 "command": ["sleep", "600"],
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}}, NS)


async def test_claim_is_provisioned_on_the_pods_node_and_deleted_with_it(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (api, node, agent_dir):
        await make_claim_and_pod(api, None, "64Mi")
        claim = await eventually(lambda: _bound(api), "the claim Bound")
        assert claim["spec"]["storageClassName"] == "local-path"  # the default class
        assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
        pv_name = claim["spec"]["volumeName"]
        assert pv_name == f"pvc-{claim['metadata']['uid']}"
        pv = await get(api, "persistentvolumes", pv_name)
        assert pv is not None and pv["spec"]["csi"]["driver"] == "hostpath.fleet.dev"
        assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]
        events = (await api.list("v1", "events", NS)).get("items") or []
        reasons = [e["reason"] for e in events if e["involvedObject"].get("name") == "data"]
        assert "Provisioning" in reasons and "ProvisioningSucceeded" in reasons, reasons
        await eventually(lambda: _running(api, "db"), "the pod Running")
        store = agent_dir / "storage" / "hostpath.fleet.dev"
        before = {p.name for p in store.rglob("*")}
        assert any(pv["spec"]["csi"]["volumeHandle"] in name for name in before), before

        await api.delete("v1", "pods", "db", NS)
        await eventually(lambda: _gone(api, "pods", "db", NS), "the pod gone", timeout=90)
        await api.delete("v1", "persistentvolumeclaims", "data", NS)
        await eventually(lambda: _gone(api, "persistentvolumes", pv_name), "the PV deleted", timeout=90)
        after = {p.name for p in store.rglob("*")}
        assert not any(pv["spec"]["csi"]["volumeHandle"] in name for name in after), after


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None or shutil.which("losetup") is None,
                    reason="the local driver needs mkfs.ext4 and losetup")
async def test_growing_an_ext4_claim_finishes_at_the_next_pod_start(tmp_path: Path) -> None:
    """fleet-local (ext4, loop image): the resizer grows the image and the PV, ext4 cannot
    grow while mounted here, so the claim waits in FileSystemResizePending until a new pod
    stages the volume — Kubernetes' offline expansion path."""
    async with cluster(tmp_path) as (api, node, agent_dir):
        await make_claim_and_pod(api, "fleet-local", "32Mi")
        claim = await eventually(lambda: _bound(api), "the claim Bound")
        pv_name = claim["spec"]["volumeName"]
        await eventually(lambda: _running(api, "db"), "the pod Running")
        await api.patch("v1", "persistentvolumeclaims", "data",
                        {"spec": {"resources": {"requests": {"storage": "64Mi"}}}}, MERGE_PATCH, NS)
        await eventually(lambda: _pv_capacity(api, pv_name, "64Mi"), "the PV grown")
        pending = await eventually(lambda: _condition(api, "FileSystemResizePending"),
                                   "FileSystemResizePending")
        assert pending["status"]["capacity"]["storage"] == "32Mi"
        events = (await api.list("v1", "events", NS)).get("items") or []
        reasons = [e["reason"] for e in events if e["involvedObject"].get("name") == "data"]
        assert "Resizing" in reasons and "FileSystemResizeRequired" in reasons, reasons
        # A new pod: the volume is staged again and grown; the claim shows the new size.
        await api.delete("v1", "pods", "db", NS)
        await eventually(lambda: _gone(api, "pods", "db", NS), "the pod gone", timeout=90)
        await make_claim_and_pod(api, "fleet-local", "64Mi", pod="db2")
        await eventually(lambda: _running(api, "db2"), "the new pod Running")
        await eventually(lambda: _claim_capacity(api, "64Mi"), "the claim's capacity 64Mi", timeout=90)


async def _bound(api: Client) -> dict[str, Any] | None:
    c = await get(api, "persistentvolumeclaims", "data", NS)
    return c if c is not None and (c.get("status") or {}).get("phase") == "Bound" else None


async def _running(api: Client, name: str) -> bool:
    p = await get(api, "pods", name, NS)
    return p is not None and (p.get("status") or {}).get("phase") == "Running"


async def _gone(api: Client, plural: str, name: str, ns: str | None = None) -> bool:
    return await get(api, plural, name, ns) is None


async def _pv_capacity(api: Client, name: str, size: str) -> bool:
    pv = await get(api, "persistentvolumes", name)
    return pv is not None and pv["spec"]["capacity"]["storage"] == size


async def _condition(api: Client, ctype: str) -> dict[str, Any] | None:
    c = await get(api, "persistentvolumeclaims", "data", NS)
    conds = ((c or {}).get("status") or {}).get("conditions") or []
    return c if any(x.get("type") == ctype and x.get("status") == "True" for x in conds) else None


async def _claim_capacity(api: Client, size: str) -> bool:
    c = await get(api, "persistentvolumeclaims", "data", NS)
    return c is not None and ((c.get("status") or {}).get("capacity") or {}).get("storage") == size
