"""Helpers of tests/e2e/test_storage.py: claims, classes and pods with volumes on a
`MultiNodeCluster`, bounded waits, kubectl table/describe parsing, and what a node's
volumes leave on the machine (directories, mounts, loop devices)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.agent import volumes as agent_volumes
from fleet.api.quantity import parse_quantity
from tests.e2e.helpers import wait_until
from tests.e2e.multinode import IMAGE, MultiNodeCluster, Node

STORAGE_API = "/apis/storage.k8s.io/v1"
POD_TIMEOUT = 90.0   # create → Ready, provisioning included, on a shared 2-core machine
KEEP_RUNNING = "trap 'exit 0' TERM; while true; do sleep 1; done"


def loops_backed_under(base: Path) -> list[str]:
    """Loop devices whose backing file lies under `base`."""
    out = []
    for bf in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            backing = bf.read_text().strip()
        except OSError:
            continue
        if backing.startswith(str(base).rstrip("/") + "/"):
            out.append(f"/dev/{bf.parent.parent.name} ({backing})")
    return out


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below `base`, deepest first."""
    return [str(p) for p in agent_volumes.mounts_under(base)]


def items(cluster: MultiNodeCluster, path: str) -> list[dict[str, Any]]:
    code, body = cluster.get(path)
    assert code == 200, (path, code, body)
    return body.get("items") or []


def get(cluster: MultiNodeCluster, path: str) -> dict[str, Any] | None:
    code, body = cluster.get(path)
    if code == 404:
        return None
    assert code == 200, (path, code, body)
    return body


def claim_path(ns: str, name: str = "") -> str:
    p = f"/api/v1/namespaces/{ns}/persistentvolumeclaims"
    return f"{p}/{name}" if name else p


def pv_path(name: str = "") -> str:
    return f"/api/v1/persistentvolumes/{name}" if name else "/api/v1/persistentvolumes"


def sc_path(name: str = "") -> str:
    return f"{STORAGE_API}/storageclasses/{name}" if name else f"{STORAGE_API}/storageclasses"


def claim(name: str, size: str, storage_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": spec}


def storage_class(name: str, provisioner: str, *, reclaim: str = "Delete",
                  binding: str = "WaitForFirstConsumer", expand: bool = True,
                  parameters: dict[str, str] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                           "metadata": {"name": name}, "provisioner": provisioner,
                           "reclaimPolicy": reclaim, "volumeBindingMode": binding,
                           "allowVolumeExpansion": expand}
    if parameters:
        obj["parameters"] = parameters
    return obj


def pod_with_claim(name: str, claim_name: str, script: str, *,
                   node: Node | None = None) -> dict[str, Any]:
    """A busybox pod mounting `claim_name` at /data and running `script` (then sleeping).
    `node` pins it with a nodeSelector — never nodeName, which would bypass the scheduler
    and so WaitForFirstConsumer binding."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", f"{script}\n{KEEP_RUNNING}"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(cluster: MultiNodeCluster, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    return cluster.post(path, obj)


def delete(cluster: MultiNodeCluster, path: str) -> None:
    with cluster.client() as c:
        r = c.delete(path)
    assert r.status_code in (200, 202, 404), (path, r.status_code, r.text)


def wait_gone(cluster: MultiNodeCluster, path: str, timeout: float = 60.0) -> None:
    wait_until(lambda: get(cluster, path) is None, timeout=timeout, interval=0.3,
               what=f"{path} gone")


def pod_ready(cluster: MultiNodeCluster, ns: str, name: str, *,
              not_uid: str | None = None) -> dict[str, Any] | None:
    p = get(cluster, f"/api/v1/namespaces/{ns}/pods/{name}")
    if p is None or p["metadata"].get("deletionTimestamp") or p["metadata"]["uid"] == not_uid:
        return None
    conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
    return p if conds.get("Ready") == "True" else None


def wait_ready(cluster: MultiNodeCluster, ns: str, name: str, *, not_uid: str | None = None,
               timeout: float = POD_TIMEOUT) -> dict[str, Any]:
    """The pod `name` once Ready (a new one when `not_uid` names the old one)."""
    deadline = time.monotonic() + timeout
    while True:
        p = pod_ready(cluster, ns, name, not_uid=not_uid)
        if p is not None:
            return p
        if time.monotonic() > deadline:
            now = get(cluster, f"/api/v1/namespaces/{ns}/pods/{name}")
            raise AssertionError(
                f"pod {ns}/{name} not Ready after {timeout}s: {json.dumps((now or {}).get('status'))}\n"
                f"events: {[(e['reason'], e['message']) for e in events(cluster, ns)]}\n"
                + "\n".join(f"----- {n.name} -----\n{n.output(4000)}" for n in cluster.nodes))
        time.sleep(0.3)


def events(cluster: MultiNodeCluster, ns: str, kind: str | None = None,
           name: str | None = None) -> list[dict[str, Any]]:
    out = []
    for e in items(cluster, f"/api/v1/namespaces/{ns}/events"):
        inv = e.get("involvedObject") or {}
        if (kind is None or inv.get("kind") == kind) and (name is None or inv.get("name") == name):
            out.append(e)
    return out


def wait_event(cluster: MultiNodeCluster, ns: str, kind: str, name: str, reason: str,
               match: Callable[[str], bool] = lambda m: True, timeout: float = 60.0) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for e in events(cluster, ns, kind, name):
            if e.get("reason") == reason and match(e.get("message") or ""):
                return e
        return None
    try:
        return wait_until(find, timeout=timeout, interval=0.5, what=f"{reason} on {kind} {name}")
    except AssertionError as e:
        seen = [(x.get("reason"), x.get("message")) for x in events(cluster, ns, kind, name)]
        raise AssertionError(f"{e}\nevents of {kind} {ns}/{name}: {seen}") from None


def wait_bound(cluster: MultiNodeCluster, ns: str, name: str,
               timeout: float = POD_TIMEOUT) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        c = get(cluster, claim_path(ns, name))
        return c if c and (c.get("status") or {}).get("phase") == "Bound" else None
    return wait_until(bound, timeout=timeout, interval=0.3, what=f"claim {ns}/{name} Bound")


def sh_in(cluster: MultiNodeCluster, ns: str, pod: str, script: str, timeout: float = 60.0,
          check: bool = True) -> str:
    """Run `script` with sh in the pod (kubectl exec); its stdout (stderr joined when not
    checked)."""
    rc, out, err = cluster.kubectl("-n", ns, "exec", pod, "--", "sh", "-c", script, timeout=timeout)
    if check:
        assert rc == 0, f"exec in {ns}/{pod} failed ({rc}): {script}\n{out}\n{err}"
        return out
    return out + err


def df_kib(cluster: MultiNodeCluster, ns: str, pod: str, path: str = "/data") -> int:
    """The size (1K-blocks) `df` shows for the file system at `path` in the pod (a
    volume of its own device: busybox df finds the mount by device)."""
    out = sh_in(cluster, ns, pod, f"df -k {path}")
    # busybox df wraps the line after a long device name: read the fields from the end
    # (1K-blocks, Used, Available, Use%, Mounted on).
    fields = out.split("\n", 1)[1].split()
    assert len(fields) >= 6 and fields[-2].endswith("%"), out
    return int(fields[-5])


def fstype_in(cluster: MultiNodeCluster, ns: str, pod: str, path: str = "/data") -> str:
    return sh_in(cluster, ns, pod, f"awk '$2 == \"{path}\" {{print $3}}' /proc/mounts").strip()


def volume_dirs(node: Node, driver: str, marker: str) -> list[Path]:
    """Directories under the node's `<data dir>/storage/<driver>` holding a file named
    `marker` (the volume a pod wrote it to); mount points are not entered."""
    root = node.data_dir / "storage" / driver
    mounts = set(mounts_under(root))
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if os.path.realpath(os.path.join(dirpath, d)) not in mounts]
        if marker in filenames:
            found.append(Path(dirpath))
    return found


def bytes_of(q: Any) -> int:
    return int(parse_quantity(q))


def pv_of(cluster: MultiNodeCluster, ns: str, claim_name: str) -> dict[str, Any]:
    c = get(cluster, claim_path(ns, claim_name))
    assert c is not None and c["spec"].get("volumeName"), c
    pv = get(cluster, pv_path(c["spec"]["volumeName"]))
    assert pv is not None, c["spec"]["volumeName"]
    return pv


def merge_patch(cluster: MultiNodeCluster, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    with cluster.client() as c:
        r = c.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text




def table(out: str, header: list[str]) -> list[dict[str, str]]:
    """The rows of the table in `out` whose header is exactly `header` (kubectl pads
    columns with at least 3 spaces; cells are cut at the header's column starts)."""
    lines = out.splitlines()
    pattern = re.compile(r" {3,}".join(re.escape(h) for h in header) + r" *")
    i = next((n for n, line in enumerate(lines) if pattern.fullmatch(line)), None)
    if i is None:
        raise AssertionError(f"no table with columns {header} in:\n{out}")
    starts, pos = [], 0
    for h in header:
        pos = lines[i].index(h, pos)
        starts.append(pos)
        pos += len(h)
    rows = []
    for line in lines[i + 1:]:
        if not line.strip() or line.startswith("NAME "):
            break
        cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], len(line) + 1], strict=True)]
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def describe_fields(out: str) -> list[tuple[str, str]]:
    """The top-level `Key:  value` lines of a kubectl describe output, in order."""
    fields = []
    for line in out.splitlines():
        m = re.match(r"^([A-Z][A-Za-z ]*):(?:\s+(.*))?$", line)
        if m:
            fields.append((m.group(1), (m.group(2) or "").strip()))
    return fields


def volume_stats(metrics: str, ns: str, claim_name: str) -> dict[str, float]:
    """The kubelet_volume_stats_* samples of one claim in a Prometheus text page, by the
    metric's suffix (`used_bytes`, `capacity_bytes`, ...)."""
    out = {}
    for line in metrics.splitlines():
        m = re.match(r"^kubelet_volume_stats_(\w+)\{([^}]*)\}\s+(\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        if labels.get("namespace") == ns and labels.get("persistentvolumeclaim") == claim_name:
            out[m.group(1)] = float(m.group(3))
    return out
