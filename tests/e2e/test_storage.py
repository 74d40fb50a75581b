"""Storage end to end (issue 13): claims, volumes and classes on two real nodes.

One cluster for the module (tests/e2e/multinode.py): `fleet server --no-agent` and two
machines in network namespaces, each running a real `fleet agent` (runc, busybox) —
both started with `--storage-plugin tests.e2e.storage_plugin_tmpdir`, a third-party
driver that lives outside `fleet/`.  The agents share the host's mount namespace, so
the test reads the volumes' directories on the "nodes" directly
(`<agent data dir>/storage/<driver name>/...`).  Each test works in its own namespace;
the classes it creates are named after it and deleted at its end.

* A StatefulSet of 3 with a volumeClaimTemplate and no class (the default class
  `local-path` is filled in): each pod writes a file named after its ordinal and logs
  its uid; after every pod is deleted the new pods read their own files back (and only
  theirs); after both agents restart the running pods still read and write them, and
  pods deleted after the restart come back with their data again.
* persistentVolumeClaimRetentionPolicy Delete/Delete: scaling down and deleting the set
  remove the claims, volumes and directories; a generic ephemeral volume's claim is owned
  by its pod and goes with it; one claim mounted whole, by subPath, subPathExpr, readOnly.
* Reclaim: Delete removes the volume's directory on its node once the claim is gone
  (a claim deleted while its pod runs stays Terminating and usable until the pod goes —
  pvc-protection; also when the claim's class was deleted meanwhile); a class with
  reclaimPolicy Retain keeps the directory and the PV goes Released.
* WaitForFirstConsumer on two nodes: the claim waits (Event WaitForFirstConsumer), the
  volume is made on the node the scheduler picked for the pod (selected-node
  annotation, PV nodeAffinity, the directory on that node only), and a pod that must
  run elsewhere is refused with kube-scheduler's "volume node affinity conflict".
* Expansion on `local.fleet.dev` (a loop-mounted image per volume): xfs grows while
  the pod runs and `df` in the pod shows it; ext4 is grown offline — the claim says
  FileSystemResizePending and the new size shows once the pod is recreated.
* A capacity limit: `dd` in a pod stops with ENOSPC at about the claim's size.
* The third-party driver provisions, stages, publishes, unpublishes, unstages and
  deletes through the same interface (its call journal), and shows in CSIDriver/CSINode.
* kubectl: `get pv,pvc,sc` headers and cells as Kubernetes prints them, `describe pvc`
  with Kubernetes' fields and the provisioning Events.
* Bad input: a claim naming a missing class stays Pending with a ProvisioningFailed
  Event naming it; a claim larger than any node can give stays Pending and its pod
  unschedulable with "did not have enough free storage"; shrinking a claim is a 422.
* The quick start's storage example, packaging/examples/counter.yaml, applied with kubectl.

Needs root, runc, busybox-static, kubectl, ip/nsenter/nft (the multi-node fixture);
the `local.fleet.dev` tests also mkfs.ext4 / mkfs.xfs / xfs_growfs and losetup.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.api.pvmatch import SELECTED_NODE, volume_node_name
from tests.conftest import REPO_ROOT
from tests.e2e.helpers import wait_until
from tests.e2e.multinode import IMAGE, MultiNodeCluster, Node, multinode_cluster, problem
from tests.e2e.storagekit import (
    KEEP_RUNNING,
    STORAGE_API,
    bytes_of,
    claim,
    claim_path,
    create,
    delete,
    describe_fields,
    df_kib,
    fstype_in,
    get,
    items,
    loops_backed_under,
    merge_patch,
    mounts_under,
    pod_with_claim,
    pv_of,
    pv_path,
    sc_path,
    sh_in,
    storage_class,
    table,
    volume_dirs,
    volume_stats,
    wait_bound,
    wait_event,
    wait_gone,
    wait_ready,
)

pytestmark = [pytest.mark.e2e]

# The third-party driver (tests/e2e/storage_plugin_tmpdir.py), known here by its name as
# any cluster user knows a driver.  The module is imported only by the `plugin` fixture
# (and by the server and agents): importing it registers the driver in this process too.
PLUGIN_MODULE = "tests.e2e.storage_plugin_tmpdir"
PLUGIN_DRIVER = "tmpdir.e2e.fleet.test"
PLUGIN_VOLUME_PREFIX = "tmpdir-"
PLUGIN_JOURNAL = "calls.log"
HOSTPATH = "hostpath.fleet.dev"
LOCAL = "local.fleet.dev"
DEFAULT_CLASS = "local-path"      # hostpath.fleet.dev, the default class
LOCAL_CLASS = "fleet-local"       # local.fleet.dev (ext4 unless the class says xfs)
FSTYPE_PARAM = "csi.storage.k8s.io/fstype"
MiB = 1024 * 1024
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _missing(*tools: str) -> list[str]:
    return [t for t in tools if shutil.which(t, path=SBIN_PATH) is None]


needs_ext4 = pytest.mark.skipif(bool(_missing("mkfs.ext4", "resize2fs", "losetup")),
                                reason="local.fleet.dev needs mkfs.ext4, resize2fs and losetup")
needs_xfs = pytest.mark.skipif(bool(_missing("mkfs.xfs", "xfs_growfs", "losetup")),
                               reason="xfs volumes need mkfs.xfs, xfs_growfs and losetup (xfsprogs)")


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster() -> Iterator[MultiNodeCluster]:
    """Two machines whose agents (and the server) load the third-party driver."""
    why = problem()
    if why:
        pytest.skip(f"multi-node cluster: {why}")
    base = Path(tempfile.mkdtemp(prefix="fleet-st-"))
    left: list[str] = []
    try:
        with multinode_cluster(base / "c", nodes=2,
                               agent_args=["--storage-plugin", PLUGIN_MODULE],
                               server_args=["--storage-plugin", PLUGIN_MODULE]) as c:
            yield c
    finally:
        # After the agents stopped and `fleet killall` ran: nothing of the volumes may
        # stay mounted or attached.  Whatever is left is removed, then reported.
        for mp in mounts_under(base):
            left.append(f"mount {mp}")
            subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)
        for loop in loops_backed_under(base):
            left.append(f"loop device {loop}")
            subprocess.run(["losetup", "-d", loop.split()[0]], capture_output=True, timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    assert not left, f"volumes left on the machine after the cluster stopped: {left}"


@pytest.fixture
def ns(cluster: MultiNodeCluster) -> Iterator[str]:
    """A namespace for one test; its workloads, pods and claims are deleted afterwards."""
    name = cluster.create_namespace(f"st-{uuid.uuid4().hex[:6]}")
    try:
        yield name
    finally:
        with cluster.client(timeout=30) as c:
            base = f"/apis/apps/v1/namespaces/{name}/statefulsets"
            for s in c.get(base).json().get("items", []):
                c.delete(f"{base}/{s['metadata']['name']}")
            pods = f"/api/v1/namespaces/{name}/pods"
            for p in c.get(pods).json().get("items", []):
                c.delete(f"{pods}/{p['metadata']['name']}")
        wait_until(lambda: not items(cluster, f"/api/v1/namespaces/{name}/pods"), timeout=60,
                   interval=0.3, what=f"the pods of {name} gone")
        with cluster.client(timeout=30) as c:
            claims = f"/api/v1/namespaces/{name}/persistentvolumeclaims"
            for p in c.get(claims).json().get("items", []):
                c.delete(f"{claims}/{p['metadata']['name']}")


# ----------------------------------------------------------------------------- the plugin itself


@pytest.fixture
def plugin() -> Iterator[Any]:
    """The plugin module, its driver registered in this process for the test only."""
    import importlib

    from fleet.storage import registry

    mod = importlib.import_module(PLUGIN_MODULE)
    mod.register_driver()
    assert (mod.DRIVER_NAME, mod.VOLUME_PREFIX, mod.JOURNAL) == (
        PLUGIN_DRIVER, PLUGIN_VOLUME_PREFIX, PLUGIN_JOURNAL)
    try:
        yield mod
    finally:
        registry.unregister(PLUGIN_DRIVER)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bind mounts)")
async def test_tmpdir_plugin_implements_the_driver_protocol(plugin: Any, tmp_path: Path) -> None:
    """The test driver on its own: registered by import, a Driver by the protocol, and
    its calls make, mount, unmount and remove a directory (so a failure of the e2e test
    below is Fleet's, not the plugin's)."""
    from fleet.storage import registry
    from fleet.storage.driver import CreateVolumeRequest, Driver, DriverEnv, DriverError

    assert registry.known(plugin.DRIVER_NAME)
    env = DriverEnv(data_dir=tmp_path / "storage" / plugin.DRIVER_NAME, node_name="n1",
                    node_labels={"kubernetes.io/hostname": "n1"})
    drv = registry.create(plugin.DRIVER_NAME, env)
    assert isinstance(drv, Driver) and drv.capabilities.node_local
    vol = await drv.create_volume(CreateVolumeRequest(name="pvc-1", capacity_bytes=MiB, node="n1",
                                                      claim_namespace="a", claim_name="b"))
    assert vol.volume_id == plugin.VOLUME_PREFIX + "pvc-1"
    assert vol.accessible_topology == {"kubernetes.io/hostname": "n1"}
    stage, target = tmp_path / "globalmount", tmp_path / "pod" / "volumes" / "data"
    try:
        await drv.node_stage(vol.volume_id, stage, vol.context, "Filesystem", {})
        await drv.node_stage(vol.volume_id, stage, vol.context, "Filesystem", {})  # idempotent
        await drv.node_publish(vol.volume_id, stage, target, read_only=False,
                               volume_mode="Filesystem", context=vol.context)
        assert plugin.is_mounted(stage) and plugin.is_mounted(target)
        (target / "hello").write_text("hi")
        assert (env.data_dir / "volumes" / vol.volume_id / "hello").read_text() == "hi"
        stats = await drv.node_volume_stats(vol.volume_id, target)
        assert stats.used_bytes > 0 and stats.capacity_bytes > 0
        ro = tmp_path / "pod2" / "ro"
        await drv.node_publish(vol.volume_id, stage, ro, read_only=True,
                               volume_mode="Filesystem", context=vol.context)
        with pytest.raises(OSError):
            (ro / "nope").write_text("x")
        await drv.node_unpublish(vol.volume_id, ro)
        await drv.node_unpublish(vol.volume_id, target)
        await drv.node_unstage(vol.volume_id, stage)
        assert not plugin.is_mounted(target) and not target.exists() and not stage.exists()
    finally:
        for p in (tmp_path / "pod2" / "ro", target, stage):
            if plugin.is_mounted(p):
                subprocess.run(["umount", "-l", str(p)], capture_output=True, timeout=30)
    await drv.delete_volume(vol.volume_id, vol.context)
    await drv.delete_volume(vol.volume_id, vol.context)  # idempotent
    assert not (env.data_dir / "volumes" / vol.volume_id).exists()
    journal = (env.data_dir / plugin.JOURNAL).read_text().split("\n")
    assert [line.split()[0] for line in journal if line][:3] == ["create_volume", "node_stage", "node_stage"]
    with pytest.raises(DriverError):
        await drv.node_stage("../etc", stage, {}, "Filesystem", {})


# ----------------------------------------------------------------------------- StatefulSet


STS_SCRIPT = ('ord="${POD_NAME##*-}"\n'
              '[ -f "/data/$ord" ] || echo "$POD_NAME" > "/data/$ord"\n'
              'echo "$POD_UID" >> /data/starts')


def _statefulset(name: str, replicas: int) -> dict[str, Any]:
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
        "spec": {
            "replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "terminationGracePeriodSeconds": 2,
                "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                "env": env,
                                "command": ["sh", "-c", f"{STS_SCRIPT}\n{KEEP_RUNNING}"],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            # No storageClassName: the default class is filled in at admission.
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}}],
        }}


def _check_sts_files(cluster: MultiNodeCluster, ns: str, uids: dict[str, list[str]]) -> None:
    """Each pod sees its own ordinal's file (and no other's) and the uids of every pod
    that ran with its volume, in order."""
    for pod, history in uids.items():
        ordinal = pod.rsplit("-", 1)[1]
        out = sh_in(cluster, ns, pod, f"ls /data; echo ---; cat /data/{ordinal}; echo ---; cat /data/starts")
        listing, content, starts = (part.split() for part in out.split("---\n"))
        assert sorted(f for f in listing if not f.startswith("after-restart")) == sorted([ordinal, "starts"]), out
        assert content == [pod], out
        assert starts == history, (pod, out)


def test_statefulset_pods_get_their_own_volumes_back(cluster: MultiNodeCluster, ns: str) -> None:
    create(cluster, f"/api/v1/namespaces/{ns}/services",
           {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"},
                     "ports": [{"name": "web", "port": 80}]}})
    create(cluster, f"/apis/apps/v1/namespaces/{ns}/statefulsets", _statefulset("web", 3))
    pods = [f"web-{i}" for i in range(3)]
    uids = {p: [wait_ready(cluster, ns, p)["metadata"]["uid"]] for p in pods}
    nodes = {}
    for p in pods:
        c = wait_bound(cluster, ns, f"data-{p}")
        assert c["spec"]["storageClassName"] == DEFAULT_CLASS, c
        pv = pv_of(cluster, ns, f"data-{p}")
        assert pv["spec"]["csi"]["driver"] == HOSTPATH, pv
        node = get(cluster, f"/api/v1/namespaces/{ns}/pods/{p}")["spec"]["nodeName"]
        assert volume_node_name(pv) == node, (p, node, pv["spec"].get("nodeAffinity"))
        nodes[p] = node
    _check_sts_files(cluster, ns, uids)

    # Every pod deleted: the set makes new ones, on the nodes their volumes are on.
    for p in pods:
        delete(cluster, f"/api/v1/namespaces/{ns}/pods/{p}")
    for p in pods:
        new = wait_ready(cluster, ns, p, not_uid=uids[p][-1])
        assert new["spec"]["nodeName"] == nodes[p], (p, new["spec"]["nodeName"], nodes[p])
        uids[p].append(new["metadata"]["uid"])
    _check_sts_files(cluster, ns, uids)

    # Both agents restart; the pods keep running with their volumes mounted.
    for i, node in enumerate(cluster.nodes):
        if node.name in nodes.values():
            cluster.restart_node(i)
    for p in pods:
        assert wait_ready(cluster, ns, p)["metadata"]["uid"] == uids[p][-1], p
    _check_sts_files(cluster, ns, uids)
    for p in pods:  # what a pod writes now still lands in its volume on the node
        ordinal = p.rsplit("-", 1)[1]
        sh_in(cluster, ns, p, f"echo {p} > /data/after-restart-{ordinal}")
        dirs = volume_dirs(cluster.node(nodes[p]), HOSTPATH, f"after-restart-{ordinal}")
        assert len(dirs) == 1 and (dirs[0] / ordinal).read_text().strip() == p, (p, dirs)

    # And pods deleted after the restart come back with their data once more (the
    # restarted agents unmount what the previous ones mounted).
    for p in pods:
        delete(cluster, f"/api/v1/namespaces/{ns}/pods/{p}")
    for p in pods:
        uids[p].append(wait_ready(cluster, ns, p, not_uid=uids[p][-1])["metadata"]["uid"])
    _check_sts_files(cluster, ns, uids)
    for p in pods:
        ordinal = p.rsplit("-", 1)[1]
        assert sh_in(cluster, ns, p, f"cat /data/after-restart-{ordinal}").strip() == p


def test_statefulset_claim_retention_delete(cluster: MultiNodeCluster, ns: str) -> None:
    """persistentVolumeClaimRetentionPolicy Delete/Delete with real volumes: scaling down
    removes the scaled-away ordinal's claim, volume and directory; deleting the set
    removes the rest."""
    sts = _statefulset("tidy", 2)
    sts["spec"]["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Delete",
                                                           "whenScaled": "Delete"}
    create(cluster, f"/apis/apps/v1/namespaces/{ns}/statefulsets", sts)
    found: dict[str, tuple[str, Path]] = {}
    for i in range(2):
        pod = wait_ready(cluster, ns, f"tidy-{i}")
        node = cluster.node(pod["spec"]["nodeName"])
        dirs = volume_dirs(node, HOSTPATH, "starts")
        mine = [d for d in dirs if (d / str(i)).is_file()
                and (d / str(i)).read_text().strip() == f"tidy-{i}"]
        assert len(mine) == 1, (i, dirs)
        found[f"data-tidy-{i}"] = (pv_of(cluster, ns, f"data-tidy-{i}")["metadata"]["name"], mine[0])
    code, body = merge_patch(cluster, f"/apis/apps/v1/namespaces/{ns}/statefulsets/tidy",
                             {"spec": {"replicas": 1}})
    assert code == 200, body
    pv1, dir1 = found["data-tidy-1"]
    wait_gone(cluster, claim_path(ns, "data-tidy-1"), timeout=90)
    wait_gone(cluster, pv_path(pv1))
    wait_until(lambda: not dir1.exists(), timeout=30, what=f"{dir1} removed")
    assert get(cluster, claim_path(ns, "data-tidy-0")) is not None
    delete(cluster, f"/apis/apps/v1/namespaces/{ns}/statefulsets/tidy")
    pv0, dir0 = found["data-tidy-0"]
    wait_gone(cluster, claim_path(ns, "data-tidy-0"), timeout=90)
    wait_gone(cluster, pv_path(pv0))
    wait_until(lambda: not dir0.exists(), timeout=30, what=f"{dir0} removed")


def test_generic_ephemeral_volume(cluster: MultiNodeCluster, ns: str) -> None:
    """ephemeral.volumeClaimTemplate: a claim `<pod>-<volume>` owned by the pod, a real
    volume while it runs, gone (claim, PV, directory) with the pod."""
    pod = pod_with_claim("eph", "unused", f"echo eph > /data/eph-{ns}")
    pod["spec"]["volumes"] = [{"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Mi"}}}}}}]
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod)
    p = wait_ready(cluster, ns, "eph")
    c = wait_bound(cluster, ns, "eph-data")
    owners = c["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owners] == \
        [("Pod", "eph", p["metadata"]["uid"], True)], owners
    assert c["spec"]["storageClassName"] == DEFAULT_CLASS, c
    pv = pv_of(cluster, ns, "eph-data")["metadata"]["name"]
    dirs = volume_dirs(cluster.node(p["spec"]["nodeName"]), HOSTPATH, f"eph-{ns}")
    assert len(dirs) == 1, dirs
    delete(cluster, f"/api/v1/namespaces/{ns}/pods/eph")
    wait_gone(cluster, claim_path(ns, "eph-data"), timeout=90)
    wait_gone(cluster, pv_path(pv))
    wait_until(lambda: not dirs[0].exists(), timeout=30, what=f"{dirs[0]} removed")


def test_sub_path_and_read_only_mounts(cluster: MultiNodeCluster, ns: str) -> None:
    """One claim mounted four ways in a container: whole, `subPath`, `subPathExpr` (from
    the pod's name) and `readOnly`."""
    create(cluster, claim_path(ns), claim("multi", "8Mi"))
    pod = pod_with_claim("multi", "multi", "true")
    ctr = pod["spec"]["containers"][0]
    ctr["env"] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    ctr["volumeMounts"] += [{"name": "data", "mountPath": "/sub", "subPath": "sub"},
                            {"name": "data", "mountPath": "/mine", "subPathExpr": "$(POD_NAME)"},
                            {"name": "data", "mountPath": "/ro", "readOnly": True}]
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod)
    wait_ready(cluster, ns, "multi")
    out = sh_in(cluster, ns, "multi",
                "echo s > /sub/f; echo m > /mine/f; cat /data/sub/f /data/multi/f /ro/sub/f; "
                "echo x > /ro/nope && echo WROTE || echo REFUSED", check=False)
    assert out.split()[:3] == ["s", "m", "s"], out
    assert "REFUSED" in out and "WROTE" not in out, out


# ----------------------------------------------------------------------------- reclaim


def _provision_and_mark(cluster: MultiNodeCluster, ns: str, name: str, cls: str | None,
                        marker: str) -> tuple[dict[str, Any], Node, Path]:
    """A claim `name` of class `cls` and a pod `name` writing `marker` into it; returns
    the bound PV, the pod's node and the volume's directory on that node."""
    create(cluster, claim_path(ns), claim(name, "8Mi", cls))
    create(cluster, f"/api/v1/namespaces/{ns}/pods",
           pod_with_claim(name, name, f"echo {marker} > /data/{marker}"))
    node = cluster.node(wait_ready(cluster, ns, name)["spec"]["nodeName"])
    pv = pv_of(cluster, ns, name)
    dirs = volume_dirs(node, HOSTPATH, marker)
    assert len(dirs) == 1, (marker, dirs)
    return pv, node, dirs[0]


def _release(cluster: MultiNodeCluster, ns: str, name: str) -> None:
    """Delete the pod, then the claim; wait until the claim is gone (its
    pvc-protection finalizer goes once no pod uses it)."""
    delete(cluster, f"/api/v1/namespaces/{ns}/pods/{name}")
    wait_gone(cluster, f"/api/v1/namespaces/{ns}/pods/{name}")
    delete(cluster, claim_path(ns, name))
    wait_gone(cluster, claim_path(ns, name))


def test_reclaim_delete_removes_the_directory(cluster: MultiNodeCluster, ns: str) -> None:
    """Delete reclaim, and pvc-protection on the way: a claim deleted while its pod runs
    stays (Terminating) and usable until the pod is gone."""
    pv, node, vol = _provision_and_mark(cluster, ns, "scratch", None, f"marker-{ns}")
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete", pv
    assert pv["spec"]["storageClassName"] == DEFAULT_CLASS, pv
    assert "kubernetes.io/pv-protection" in pv["metadata"].get("finalizers", []), pv["metadata"]
    delete(cluster, claim_path(ns, "scratch"))
    time.sleep(2)
    c = get(cluster, claim_path(ns, "scratch"))
    assert c is not None and c["metadata"].get("deletionTimestamp"), c
    assert c["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"], c["metadata"]
    rc, out, err = cluster.kubectl("get", "pvc", "scratch", "-n", ns, "--no-headers")
    assert rc == 0 and out.split()[1] == "Terminating", (out, err)
    assert sh_in(cluster, ns, "scratch", "echo still > /data/still; cat /data/still").strip() == "still"
    assert get(cluster, pv_path(pv["metadata"]["name"])) is not None
    delete(cluster, f"/api/v1/namespaces/{ns}/pods/scratch")
    wait_gone(cluster, f"/api/v1/namespaces/{ns}/pods/scratch")
    wait_gone(cluster, claim_path(ns, "scratch"))
    wait_gone(cluster, pv_path(pv["metadata"]["name"]))
    wait_until(lambda: not vol.exists(), timeout=30, what=f"{vol} removed on {node.name}")


def test_reclaim_delete_after_the_class_was_deleted(cluster: MultiNodeCluster, ns: str) -> None:
    """Deleting a class in use orphans nothing: the volume still goes with its claim."""
    cls = f"gone-{ns}"
    create(cluster, sc_path(), storage_class(cls, HOSTPATH))
    try:
        pv, node, vol = _provision_and_mark(cluster, ns, "orphan", cls, f"marker-{ns}")
    finally:
        delete(cluster, sc_path(cls))
    wait_gone(cluster, sc_path(cls))
    _release(cluster, ns, "orphan")
    wait_gone(cluster, pv_path(pv["metadata"]["name"]))
    wait_until(lambda: not vol.exists(), timeout=30, what=f"{vol} removed on {node.name}")


def test_reclaim_retain_keeps_the_directory(cluster: MultiNodeCluster, ns: str) -> None:
    cls = f"retain-{ns}"
    create(cluster, sc_path(), storage_class(cls, HOSTPATH, reclaim="Retain"))
    pv_name = ""
    try:
        marker = f"marker-{ns}"
        pv, node, vol = _provision_and_mark(cluster, ns, "keep", cls, marker)
        pv_name = pv["metadata"]["name"]
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain", pv
        _release(cluster, ns, "keep")

        def released() -> dict[str, Any] | None:
            p = get(cluster, pv_path(pv_name))
            return p if p and (p.get("status") or {}).get("phase") == "Released" else None
        pv = wait_until(released, timeout=30, what=f"PV {pv_name} Released")
        assert pv["spec"]["claimRef"]["name"] == "keep", pv
        time.sleep(2)  # nothing removes it a moment later either
        assert get(cluster, pv_path(pv_name)) is not None
        assert (vol / marker).read_text().strip() == marker, vol
        rc, out, err = cluster.kubectl("get", "pv", pv_name, "--no-headers")
        assert rc == 0 and " Retain " in out and " Released " in out, (out, err)
    finally:
        if pv_name:
            delete(cluster, pv_path(pv_name))
        delete(cluster, sc_path(cls))


# ----------------------------------------------------------------------------- topology


def test_wait_for_first_consumer_places_pod_and_volume_together(cluster: MultiNodeCluster,
                                                                  ns: str) -> None:
    first, second = cluster.nodes[0], cluster.nodes[1]
    create(cluster, claim_path(ns), claim("late", "8Mi"))
    wait_event(cluster, ns, "PersistentVolumeClaim", "late", "WaitForFirstConsumer",
               lambda m: m.startswith("waiting for first consumer"))
    c = get(cluster, claim_path(ns, "late"))
    assert c["status"]["phase"] == "Pending" and not c["spec"].get("volumeName"), c
    assert not [p for p in items(cluster, pv_path())
                if (p["spec"].get("claimRef") or {}).get("namespace") == ns], "provisioned early"

    # The pod may only run on the second node: the volume is made there.
    marker = f"marker-{ns}"
    create(cluster, f"/api/v1/namespaces/{ns}/pods",
           pod_with_claim("consumer", "late", f"echo hi > /data/{marker}", node=second))
    assert wait_ready(cluster, ns, "consumer")["spec"]["nodeName"] == second.name
    c = wait_bound(cluster, ns, "late")
    assert c["metadata"]["annotations"][SELECTED_NODE] == second.name, c["metadata"]
    pv = pv_of(cluster, ns, "late")
    assert volume_node_name(pv) == second.name, pv["spec"].get("nodeAffinity")
    assert len(volume_dirs(second, HOSTPATH, marker)) == 1
    assert volume_dirs(first, HOSTPATH, marker) == []

    # An unconstrained pod: wherever the scheduler puts it, its volume is there too.
    create(cluster, claim_path(ns), claim("free", "8Mi"))
    create(cluster, f"/api/v1/namespaces/{ns}/pods",
           pod_with_claim("free", "free", f"echo hi > /data/free-{marker}"))
    node = cluster.node(wait_ready(cluster, ns, "free")["spec"]["nodeName"])
    assert volume_node_name(pv_of(cluster, ns, "free")) == node.name
    assert len(volume_dirs(node, HOSTPATH, f"free-{marker}")) == 1

    # A bound local volume pins its pods: one that must run on the first node cannot.
    delete(cluster, f"/api/v1/namespaces/{ns}/pods/consumer")
    wait_gone(cluster, f"/api/v1/namespaces/{ns}/pods/consumer")
    create(cluster, f"/api/v1/namespaces/{ns}/pods",
           pod_with_claim("elsewhere", "late", "true", node=first))
    wait_event(cluster, ns, "Pod", "elsewhere", "FailedScheduling",
               lambda m: "volume node affinity conflict" in m)
    p = get(cluster, f"/api/v1/namespaces/{ns}/pods/elsewhere")
    assert not p["spec"].get("nodeName"), p["spec"]
    # ... and one free to go anywhere follows its volume, and finds the data.
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("follower", "late", "true"))
    assert wait_ready(cluster, ns, "follower")["spec"]["nodeName"] == second.name
    assert sh_in(cluster, ns, "follower", f"cat /data/{marker}").strip() == "hi"


# ----------------------------------------------------------------------------- local.fleet.dev


@needs_xfs
def test_expansion_online_xfs(cluster: MultiNodeCluster, ns: str) -> None:
    cls = f"xfs-{ns}"
    create(cluster, sc_path(), storage_class(cls, LOCAL, parameters={FSTYPE_PARAM: "xfs"}))
    try:
        # 300Mi: the smallest xfs file system mkfs.xfs makes.
        create(cluster, claim_path(ns), claim("grow", "300Mi", cls))
        create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("grow", "grow", "true"))
        wait_ready(cluster, ns, "grow")
        pv = pv_of(cluster, ns, "grow")
        assert pv["spec"]["csi"]["driver"] == LOCAL and pv["spec"]["csi"].get("fsType") == "xfs", pv
        assert fstype_in(cluster, ns, "grow") == "xfs"
        before = df_kib(cluster, ns, "grow")
        assert before <= 300 * 1024, before
        rc, out, err = cluster.kubectl("-n", ns, "patch", "pvc", "grow", "--type", "merge", "-p",
                                       '{"spec":{"resources":{"requests":{"storage":"600Mi"}}}}')
        assert rc == 0, (out, err)

        def grown() -> dict[str, Any] | None:
            c = get(cluster, claim_path(ns, "grow"))
            cap = ((c or {}).get("status") or {}).get("capacity", {}).get("storage")
            return c if cap and bytes_of(cap) >= 600 * MiB else None
        c = wait_until(grown, timeout=60, interval=0.5, what="the claim's capacity 600Mi")
        assert not [x for x in c["status"].get("conditions") or []
                    if x["type"] in ("Resizing", "FileSystemResizePending")], c["status"]
        assert bytes_of(pv_of(cluster, ns, "grow")["spec"]["capacity"]["storage"]) >= 600 * MiB
        # Same pod, no restart: df shows the 300Mi more.
        def df_grown() -> int | None:
            n = df_kib(cluster, ns, "grow")
            return n if n >= before + 0.9 * 300 * 1024 else None
        after = wait_until(df_grown, timeout=30, interval=1, what="df showing the new size")
        assert after <= 600 * 1024, (before, after)
        assert get(cluster, f"/api/v1/namespaces/{ns}/pods/grow")["status"]["containerStatuses"][0][
            "restartCount"] == 0
    finally:
        _cleanup_class_claims(cluster, ns, cls)


def _cleanup_class_claims(cluster: MultiNodeCluster, ns: str, cls: str) -> None:
    """Pods, then claims (their volumes are deleted: image files and loop devices gone),
    then the class."""
    with cluster.client() as c:
        for p in c.get(f"/api/v1/namespaces/{ns}/pods").json().get("items", []):
            c.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
    wait_until(lambda: not items(cluster, f"/api/v1/namespaces/{ns}/pods"), timeout=60,
               interval=0.3, what="pods gone")
    for cl in items(cluster, claim_path(ns)):
        delete(cluster, claim_path(ns, cl["metadata"]["name"]))
    delete(cluster, sc_path(cls))


@needs_ext4
def test_expansion_offline_ext4(cluster: MultiNodeCluster, ns: str) -> None:
    create(cluster, claim_path(ns), claim("grow", "64Mi", LOCAL_CLASS))
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("grow", "grow", "true"))
    wait_ready(cluster, ns, "grow")
    assert fstype_in(cluster, ns, "grow") == "ext4"
    before = df_kib(cluster, ns, "grow")
    assert before <= 64 * 1024, before
    rc, out, err = cluster.kubectl("-n", ns, "patch", "pvc", "grow", "--type", "merge", "-p",
                                   '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}')
    assert rc == 0, (out, err)

    # The controller side grows the volume; the file system waits for the pod to go
    # (ext4 is not grown while mounted here): Kubernetes' FileSystemResizePending.
    def pending() -> dict[str, Any] | None:
        c = get(cluster, claim_path(ns, "grow"))
        conds = {x["type"] for x in (c or {}).get("status", {}).get("conditions") or []}
        return c if "FileSystemResizePending" in conds else None
    c = wait_until(pending, timeout=60, interval=0.5, what="FileSystemResizePending on the claim")
    assert bytes_of(c["status"]["capacity"]["storage"]) < 128 * MiB, c["status"]
    assert bytes_of(pv_of(cluster, ns, "grow")["spec"]["capacity"]["storage"]) >= 128 * MiB

    delete(cluster, f"/api/v1/namespaces/{ns}/pods/grow")
    wait_gone(cluster, f"/api/v1/namespaces/{ns}/pods/grow")
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("grow", "grow", "true"))
    wait_ready(cluster, ns, "grow")
    after = df_kib(cluster, ns, "grow")
    assert before + 0.9 * 64 * 1024 <= after <= 128 * 1024, (before, after)

    def done() -> dict[str, Any] | None:
        c = get(cluster, claim_path(ns, "grow"))
        st = (c or {}).get("status") or {}
        conds = {x["type"] for x in st.get("conditions") or []}
        ok = bytes_of(st.get("capacity", {}).get("storage", "0")) >= 128 * MiB and \
            "FileSystemResizePending" not in conds
        return c if ok else None
    wait_until(done, timeout=30, interval=0.5, what="the claim's capacity 128Mi, nothing pending")


@needs_ext4
def test_capacity_limit_stops_a_writer(cluster: MultiNodeCluster, ns: str) -> None:
    size = 128 * MiB
    create(cluster, claim_path(ns), claim("full", "128Mi", LOCAL_CLASS))
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("full", "full", "true"))
    wait_ready(cluster, ns, "full")
    out = sh_in(cluster, ns, "full",
                "dd if=/dev/zero of=/data/fill bs=1048576 count=1024; echo rc=$?; sync; "
                "stat -c size=%s /data/fill", check=False, timeout=120)
    assert "No space left on device" in out, out
    assert re.search(r"^rc=[1-9]", out, re.M), out
    written = int(re.search(r"^size=(\d+)", out, re.M).group(1))
    # The file system's own overhead (journal, inode tables) comes out of the claim.
    assert 0.8 * size <= written <= size, (written, size, out)

    # The node reports it as the kubelet does: kubelet_volume_stats_* on its /metrics.
    node = get(cluster, f"/api/v1/namespaces/{ns}/pods/full")["spec"]["nodeName"]

    def stats() -> dict[str, float] | None:
        rc, text, err = cluster.kubectl("get", "--raw", f"/api/v1/nodes/{node}/proxy/metrics")
        assert rc == 0, err
        got = volume_stats(text, ns, "full")
        return got if got.get("used_bytes", 0) >= 0.95 * written else None
    got = wait_until(stats, timeout=40, interval=2, what="kubelet_volume_stats_used_bytes of the claim")
    assert 0.8 * size <= got["capacity_bytes"] <= size, got
    assert got["available_bytes"] < 0.05 * size, got


# ----------------------------------------------------------------------------- third-party driver


def test_third_party_driver_provisions_and_mounts(cluster: MultiNodeCluster, ns: str) -> None:
    drv = get(cluster, f"{STORAGE_API}/csidrivers/{PLUGIN_DRIVER}")
    assert drv is not None, "no CSIDriver for the plugin's driver"
    assert drv["spec"].get("attachRequired") is False and drv["spec"].get("storageCapacity") is False, drv
    for node in cluster.nodes:
        csinode = get(cluster, f"{STORAGE_API}/csinodes/{node.name}")
        assert csinode is not None, node.name
        names = {d["name"] for d in csinode["spec"].get("drivers") or []}
        assert {PLUGIN_DRIVER, HOSTPATH, LOCAL} <= names, (node.name, names)

    cls = f"tmpdir-{ns}"
    create(cluster, sc_path(), storage_class(cls, PLUGIN_DRIVER, expand=False))
    try:
        marker = f"marker-{ns}"
        create(cluster, claim_path(ns), claim("third", "4Mi", cls))
        create(cluster, f"/api/v1/namespaces/{ns}/pods",
               pod_with_claim("third", "third", f"echo {marker} > /data/{marker}"))
        node = cluster.node(wait_ready(cluster, ns, "third")["spec"]["nodeName"])
        pv = pv_of(cluster, ns, "third")
        vid = pv["spec"]["csi"]["volumeHandle"]
        assert pv["spec"]["csi"]["driver"] == PLUGIN_DRIVER, pv
        assert vid == PLUGIN_VOLUME_PREFIX + pv["metadata"]["name"], pv
        assert pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == PLUGIN_DRIVER
        assert volume_node_name(pv) == node.name
        driver_dir = node.data_dir / "storage" / PLUGIN_DRIVER
        vol = driver_dir / "volumes" / vid
        assert (vol / marker).read_text().strip() == marker
        assert sh_in(cluster, ns, "third", "echo from-pod > /data/back; cat /data/" + marker).strip() == marker
        assert (vol / "back").read_text().strip() == "from-pod"

        def calls() -> list[str]:
            try:
                lines = (driver_dir / PLUGIN_JOURNAL).read_text().splitlines()
            except FileNotFoundError:
                return []
            return [ln.split()[0] for ln in lines if ln.endswith(" " + vid)]
        seen = calls()
        assert "create_volume" in seen and "node_stage" in seen and "node_publish" in seen, seen
        assert seen.index("create_volume") < seen.index("node_stage") < seen.index("node_publish"), seen

        delete(cluster, f"/api/v1/namespaces/{ns}/pods/third")
        wait_gone(cluster, f"/api/v1/namespaces/{ns}/pods/third")
        wait_until(lambda: "node_unstage" in calls(), timeout=30, what="node_unstage called")
        assert calls().index("node_unpublish") < calls().index("node_unstage"), calls()
        delete(cluster, claim_path(ns, "third"))
        wait_gone(cluster, pv_path(pv["metadata"]["name"]))
        assert "delete_volume" in calls() and not vol.exists(), calls()
    finally:
        delete(cluster, sc_path(cls))


# ----------------------------------------------------------------------------- kubectl


PV_HEADER = ["NAME", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "STATUS", "CLAIM", "STORAGECLASS",
             "VOLUMEATTRIBUTESCLASS", "REASON", "AGE"]
PVC_HEADER = ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS",
              "VOLUMEATTRIBUTESCLASS", "AGE"]
SC_HEADER = ["NAME", "PROVISIONER", "RECLAIMPOLICY", "VOLUMEBINDINGMODE", "ALLOWVOLUMEEXPANSION", "AGE"]


def test_kubectl_get_and_describe(cluster: MultiNodeCluster, ns: str) -> None:
    create(cluster, claim_path(ns), claim("shown", "16Mi"))
    wait_event(cluster, ns, "PersistentVolumeClaim", "shown", "WaitForFirstConsumer")
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("shown-user", "shown", "true"))
    node = wait_ready(cluster, ns, "shown-user")["spec"]["nodeName"]
    wait_bound(cluster, ns, "shown")
    pv = pv_of(cluster, ns, "shown")["metadata"]["name"]
    wait_event(cluster, ns, "PersistentVolumeClaim", "shown", "ProvisioningSucceeded",
               lambda m: m == f"Successfully provisioned volume {pv}")
    wait_event(cluster, ns, "PersistentVolumeClaim", "shown", "Provisioning")

    rc, out, err = cluster.kubectl("get", "pv,pvc,sc", "-n", ns)
    assert rc == 0, err
    pvs = {r["NAME"]: r for r in table(out, PV_HEADER)}
    assert pvs[f"persistentvolume/{pv}"] | {"AGE": ""} == {
        "NAME": f"persistentvolume/{pv}", "CAPACITY": "16Mi", "ACCESS MODES": "RWO",
        "RECLAIM POLICY": "Delete", "STATUS": "Bound", "CLAIM": f"{ns}/shown",
        "STORAGECLASS": DEFAULT_CLASS, "VOLUMEATTRIBUTESCLASS": "<unset>", "REASON": "", "AGE": ""}, out
    pvcs = {r["NAME"]: r for r in table(out, PVC_HEADER)}
    assert pvcs["persistentvolumeclaim/shown"] | {"AGE": ""} == {
        "NAME": "persistentvolumeclaim/shown", "STATUS": "Bound", "VOLUME": pv, "CAPACITY": "16Mi",
        "ACCESS MODES": "RWO", "STORAGECLASS": DEFAULT_CLASS, "VOLUMEATTRIBUTESCLASS": "<unset>",
        "AGE": ""}, out
    scs = {r["NAME"]: r for r in table(out, SC_HEADER)}
    assert scs[f"storageclass.storage.k8s.io/{DEFAULT_CLASS} (default)"] | {"AGE": ""} == {
        "NAME": f"storageclass.storage.k8s.io/{DEFAULT_CLASS} (default)", "PROVISIONER": HOSTPATH,
        "RECLAIMPOLICY": "Delete", "VOLUMEBINDINGMODE": "WaitForFirstConsumer",
        "ALLOWVOLUMEEXPANSION": "true", "AGE": ""}, out
    assert scs[f"storageclass.storage.k8s.io/{LOCAL_CLASS}"] | {"AGE": ""} == {
        "NAME": f"storageclass.storage.k8s.io/{LOCAL_CLASS}", "PROVISIONER": LOCAL,
        "RECLAIMPOLICY": "Delete", "VOLUMEBINDINGMODE": "WaitForFirstConsumer",
        "ALLOWVOLUMEEXPANSION": "true", "AGE": ""}, out
    rc, out, err = cluster.kubectl("get", "pvc", "-n", ns, "-o", "wide")
    assert rc == 0, err
    assert table(out, [*PVC_HEADER, "VOLUMEMODE"])[0]["VOLUMEMODE"] == "Filesystem", out

    rc, out, err = cluster.kubectl("describe", "pvc", "shown", "-n", ns)
    assert rc == 0, err
    fields = describe_fields(out)
    assert [k for k, _ in fields] == [
        "Name", "Namespace", "StorageClass", "Status", "Volume", "Labels", "Annotations",
        "Finalizers", "Capacity", "Access Modes", "VolumeMode", "Used By", "Events"], out
    values = dict(fields)
    assert values["Name"] == "shown" and values["Namespace"] == ns, out
    assert values["StorageClass"] == DEFAULT_CLASS and values["Status"] == "Bound", out
    assert values["Volume"] == pv and values["Labels"] == "<none>", out
    assert values["Finalizers"] == "[kubernetes.io/pvc-protection]", out
    assert values["Capacity"] == "16Mi" and values["Access Modes"] == "RWO", out
    assert values["VolumeMode"] == "Filesystem" and values["Used By"] == "shown-user", out
    annotations = out.split("Annotations:", 1)[1].split("Finalizers:", 1)[0]
    for ann in ("pv.kubernetes.io/bind-completed: yes", f"{SELECTED_NODE}: {node}",
                f"volume.kubernetes.io/storage-provisioner: {HOSTPATH}"):
        assert ann in annotations, (ann, out)
    ev = out.split("\nEvents:", 1)[1]
    for reason in ("WaitForFirstConsumer", "Provisioning", "ProvisioningSucceeded"):
        assert re.search(rf"^\s+Normal\s+{reason}\s", ev, re.M), (reason, out)
    assert f"Successfully provisioned volume {pv}" in ev, out

    rc, out, err = cluster.kubectl("describe", "pv", pv)
    assert rc == 0, err
    assert re.search(rf"^\s+Driver:\s+{re.escape(HOSTPATH)}$", out, re.M), out
    assert re.search(rf"kubernetes.io/hostname in \[{re.escape(node)}\]", out), out


# ----------------------------------------------------------------------------- bad input


def test_claim_of_a_missing_class_stays_pending(cluster: MultiNodeCluster, ns: str) -> None:
    create(cluster, claim_path(ns), claim("lost", "1Mi", "no-such-class"))
    wait_event(cluster, ns, "PersistentVolumeClaim", "lost", "ProvisioningFailed",
               lambda m: '"no-such-class"' in m and "not found" in m)
    c = get(cluster, claim_path(ns, "lost"))
    assert c["status"]["phase"] == "Pending" and not c["spec"].get("volumeName"), c
    rc, out, err = cluster.kubectl("describe", "pvc", "lost", "-n", ns)
    assert rc == 0 and re.search(r"Warning\s+ProvisioningFailed", out), (out, err)


@needs_ext4
def test_claim_larger_than_any_node_stays_pending(cluster: MultiNodeCluster, ns: str) -> None:
    create(cluster, claim_path(ns), claim("huge", "100Ti", LOCAL_CLASS))
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("huge", "huge", "true"))
    wait_event(cluster, ns, "Pod", "huge", "FailedScheduling",
               lambda m: "did not have enough free storage" in m, timeout=90)
    p = get(cluster, f"/api/v1/namespaces/{ns}/pods/huge")
    assert p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName"), p
    c = get(cluster, claim_path(ns, "huge"))
    assert c["status"]["phase"] == "Pending" and not c["spec"].get("volumeName"), c
    # Nothing half made: no volume for the claim anywhere.
    assert not [v for v in items(cluster, pv_path())
                if (v["spec"].get("claimRef") or {}).get("uid") == c["metadata"]["uid"]]


def test_shrinking_a_claim_is_refused(cluster: MultiNodeCluster, ns: str) -> None:
    create(cluster, claim_path(ns), claim("fixed", "16Mi"))
    create(cluster, f"/api/v1/namespaces/{ns}/pods", pod_with_claim("fixed", "fixed", "true"))
    wait_ready(cluster, ns, "fixed")
    wait_bound(cluster, ns, "fixed")
    rc, out, err = cluster.kubectl("-n", ns, "patch", "pvc", "fixed", "--type", "merge", "-p",
                                   '{"spec":{"resources":{"requests":{"storage":"8Mi"}}}}')
    assert rc != 0, out
    assert "is invalid" in err and "spec.resources.requests.storage: Forbidden" in err, err
    code, body = merge_patch(cluster, claim_path(ns, "fixed"),
                             {"spec": {"resources": {"requests": {"storage": "8Mi"}}}})
    assert code == 422 and body["reason"] == "Invalid", (code, body)
    assert any(c.get("field") == "spec.resources.requests.storage"
               for c in body["details"].get("causes") or []), body
    c = get(cluster, claim_path(ns, "fixed"))
    assert c["spec"]["resources"]["requests"]["storage"] == "16Mi", c["spec"]


# ----------------------------------------------------------------------------- the README's example


def test_readme_counter_example(cluster: MultiNodeCluster, ns: str) -> None:
    """packaging/examples/counter.yaml (the quick start's storage example, its image
    swapped for the test image): the claim from its template gets the default class, and
    the start log outlives the pod."""
    docs = list(yaml.safe_load_all((REPO_ROOT / "packaging" / "examples" / "counter.yaml").read_text()))
    for d in docs:
        for c in (d["spec"].get("template") or {}).get("spec", {}).get("containers", []):
            assert c["image"] == "busybox:fleet", c
            c["image"] = IMAGE
    rc, out, err = cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    assert rc == 0 and "statefulset.apps/counter created" in out, (out, err)
    first = wait_ready(cluster, ns, "counter-0")["metadata"]["uid"]
    c = wait_bound(cluster, ns, "data-counter-0")
    assert c["spec"]["storageClassName"] == DEFAULT_CLASS, c
    rc, out, err = cluster.kubectl("get", "pvc", "-n", ns, "data-counter-0", "--no-headers")
    assert rc == 0 and out.split()[1] == "Bound", (out, err)
    assert len(sh_in(cluster, ns, "counter-0", "cat /data/starts").splitlines()) == 1
    rc, out, err = cluster.kubectl("delete", "pod", "-n", ns, "counter-0", timeout=90)
    assert rc == 0, err
    wait_ready(cluster, ns, "counter-0", not_uid=first)
    assert len(sh_in(cluster, ns, "counter-0", "cat /data/starts").splitlines()) == 2
    served = sh_in(cluster, ns, "counter-0", "wget -qO- localhost:8080/starts")
    assert len(served.splitlines()) == 2, served
