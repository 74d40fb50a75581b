"""Claim provision + bind + mount latency (a pod with a new local-path claim, create → Running)
beside a plain `mkdir` + bind mount, measured in the same run.

`python -m bench.bench_storage [--claims 50] [--no-doc] [--baseline-only]`   (root; runc, busybox-static)

1. `fleet server` with its built-in agent (`--agent-driver oci --agent-network none`) in a
   temporary data dir; the busybox test image is imported with `kfleet image import`.
   Then `--claims` rounds, one after another, each once the previous one's pods run:
   - a PersistentVolumeClaim of 1Mi with no class (the default, `local-path`:
     hostpath.fleet.dev, WaitForFirstConsumer) and a pod mounting it at /data are
     created back to back; the latency is the arrival (on a watch) of the pod's first
     running container status minus the time the claim's create request was sent —
     provisioning, binding, the node's stage + publish and the container start.  When
     the claim turns Bound (a watch on claims) is recorded too;
   - a pod without any volume, the same container: the pod-start floor the claim path
     builds on (alternating with the claim pods, so load drifts hit both alike).
2. Baseline, in the same run, `--claims` times: `mkdir` of a fresh volume directory and
   of a target directory, then mount(2) with MS_BIND of one on the other — the least a
   directory volume costs on a node.  Informational: the same with the `mount --bind`
   command (fork + exec of util-linux mount), as a driver shelling out would pay.  Each
   bind is unmounted and the directories removed outside the timing.

Results: bench/results/storage.json and the "Storage" section of docs/benchmarks.md
(p50/p99 of each path).  Every wait is bounded; everything started is stopped by pid
and cleaned up (pods and claims deleted, server SIGTERM, leftover mounts under the
temporary directory unmounted).  `--baseline-only` runs step 2 alone (no server).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    log,
    machine_info,
    read_kubeconfig,
    replace_doc_section,
    summarize_ms,
    sync_client,
    write_results,
)
from bench.pod_start import (
    IMAGE,
    force_clean,
    import_image,
    pod_manifest,
    start_server,
    wait_node_ready,
)

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- storage:begin -->", "<!-- storage:end -->"
NS = "bench-storage"
CLAIM_SIZE = "1Mi"
POD_TIMEOUT_S = 60.0

_MS_BIND = 4096
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


# --------------------------------------------------------------------------- baseline


def _bind(src: Path, dst: Path) -> None:
    if _libc.mount(os.fsencode(src), os.fsencode(dst), None, _MS_BIND, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bind mount {src} on {dst}: {os.strerror(e)}")


def _umount(path: Path) -> None:
    if _libc.umount2(os.fsencode(path), 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"umount {path}: {os.strerror(e)}")


def baseline(base: Path, n: int) -> dict[str, Any]:
    """`n` times mkdir + mkdir + bind (mount(2)), and `n` times with `mount --bind`."""
    root = base / "baseline"
    root.mkdir(parents=True)
    mount_cmd = shutil.which("mount") or "/bin/mount"
    syscall, command = [], []
    for i in range(n):
        for kind, out in (("syscall", syscall), ("command", command)):
            src, dst = root / f"vol-{kind}-{i}", root / f"target-{kind}-{i}"
            t0 = time.perf_counter()
            src.mkdir()
            dst.mkdir()
            if kind == "syscall":
                _bind(src, dst)
            else:
                subprocess.run([mount_cmd, "--bind", str(src), str(dst)], check=True,
                               capture_output=True, timeout=30)
            out.append(time.perf_counter() - t0)
            _umount(dst)
            dst.rmdir()
            src.rmdir()
    return {"runs": n, "mkdir_bind_syscall": summarize_ms(syscall),
            "mkdir_bind_command": summarize_ms(command), "mount_command": mount_cmd}


# --------------------------------------------------------------------------- fleet


class FirstSeen:
    """A watch on one collection in a thread: when each object first satisfied `pred`
    (time.time() of the event's arrival)."""

    def __init__(self, kubeconfig: Path, path: str, pred: Any) -> None:
        self.info = read_kubeconfig(kubeconfig)
        self.path, self.pred = path, pred
        self.seen: dict[str, float] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FirstSeen:
        self._t.start()
        if not self._ready.wait(15):
            raise TimeoutError(f"watch on {self.path} did not open")
        return self

    def _run(self) -> None:
        import httpx

        try:
            with sync_client(self.info, timeout=httpx.Timeout(10, read=2)) as c, \
                    c.stream("GET", self.path, params={"watch": "1", "timeoutSeconds": "1800"}) as r:
                self._ready.set()
                it = r.iter_lines()
                while not self._stop.is_set():
                    try:
                        line = next(it)
                    except StopIteration:
                        return
                    except httpx.ReadTimeout:
                        continue
                    if not line.strip():
                        continue
                    now = time.time()
                    obj = json.loads(line).get("object") or {}
                    name = (obj.get("metadata") or {}).get("name")
                    if name and name not in self.seen and self.pred(obj):
                        self.seen[name] = now
        except Exception as e:  # noqa: BLE001 - recorded; the waiter times out
            if not self._stop.is_set():
                self.errors.append(repr(e))
        finally:
            self._ready.set()

    def wait(self, name: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while name not in self.seen:
            if time.monotonic() > deadline or not self._t.is_alive():
                return False
            time.sleep(0.002)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=10)


def _running(pod: dict[str, Any]) -> bool:
    cs = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(cs) and cs[0].get("state", {}).get("running") is not None


def _bound(claim: dict[str, Any]) -> bool:
    return (claim.get("status") or {}).get("phase") == "Bound"


def _pod(name: str, claim: str | None) -> dict[str, Any]:
    pod = pod_manifest(name, NS)
    if claim:
        pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return pod


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": CLAIM_SIZE}}}}


def measure_fleet(base: Path, n: int) -> dict[str, Any]:
    from fleet.testing.oci_image import build_busybox_image, write_oci_archive

    archive = write_oci_archive(build_busybox_image(), base / "busybox.tar", IMAGE)
    d = base / "fleet"
    d.mkdir()
    srv, kubeconfig, meta = start_server(d, agent=True)
    info = read_kubeconfig(kubeconfig)
    pods_w = claims_w = None
    failures: list[str] = []
    claim_lat, bound_lat, plain_lat = [], [], []
    try:
        node = wait_node_ready(kubeconfig)
        import_image(kubeconfig, archive)
        with sync_client(info) as c:
            r = c.post("/api/v1/namespaces",
                       json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            if r.status_code not in (200, 201, 409):
                raise RuntimeError(f"namespace: {r.status_code} {r.text[:300]}")
            sc = c.get("/apis/storage.k8s.io/v1/storageclasses/local-path")
            if sc.status_code != 200:
                raise RuntimeError(f"no default class local-path: {sc.status_code} {sc.text[:300]}")
        pods_w = FirstSeen(kubeconfig, f"/api/v1/namespaces/{NS}/pods", _running).start()
        claims_w = FirstSeen(kubeconfig, f"/api/v1/namespaces/{NS}/persistentvolumeclaims",
                             _bound).start()
        log(f"node {node} ready, image imported; {n} rounds of claim+pod and plain pod")
        with sync_client(info) as c:
            for i in range(n):
                cname, pname, plain = f"data-{i:03d}", f"vol-{i:03d}", f"plain-{i:03d}"
                sent = time.time()
                r1 = c.post(f"/api/v1/namespaces/{NS}/persistentvolumeclaims", json=_claim(cname))
                r2 = c.post(f"/api/v1/namespaces/{NS}/pods", json=_pod(pname, cname))
                if r1.status_code != 201 or r2.status_code != 201:
                    failures.append(f"{i}: {r1.status_code} {r1.text[:200]} / {r2.status_code} {r2.text[:200]}")
                    break
                if not pods_w.wait(pname, POD_TIMEOUT_S):
                    failures.append(f"{pname} not running within {POD_TIMEOUT_S}s")
                    break
                claim_lat.append(pods_w.seen[pname] - sent)
                if claims_w.wait(cname, 5):
                    bound_lat.append(claims_w.seen[cname] - sent)
                sent = time.time()
                r = c.post(f"/api/v1/namespaces/{NS}/pods", json=_pod(plain, None))
                if r.status_code != 201 or not pods_w.wait(plain, POD_TIMEOUT_S):
                    failures.append(f"{plain}: {r.status_code} {r.text[:200]} or not running")
                    break
                plain_lat.append(pods_w.seen[plain] - sent)
        return {"rounds": n, "completed": len(claim_lat), "failures": failures,
                "watch_errors": pods_w.errors + claims_w.errors, "server_argv": meta["argv"],
                "claim_create_to_pod_running": summarize_ms(claim_lat),
                "claim_create_to_bound": summarize_ms(bound_lat),
                "plain_pod_create_to_running": summarize_ms(plain_lat)}
    finally:
        for w in (pods_w, claims_w):
            if w is not None:
                w.stop()
        with contextlib.suppress(Exception), sync_client(info) as c:
            for kind in ("pods", "persistentvolumeclaims"):
                for o in c.get(f"/api/v1/namespaces/{NS}/{kind}").json().get("items", []):
                    c.delete(f"/api/v1/namespaces/{NS}/{kind}/{o['metadata']['name']}")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (
                    c.get(f"/api/v1/namespaces/{NS}/pods").json().get("items")
                    or c.get("/api/v1/persistentvolumes").json().get("items")):
                time.sleep(0.5)
        srv.stop()
        force_clean(d / "data" / "agent", base)


# --------------------------------------------------------------------------- report


def render_doc(res: dict[str, Any]) -> str:
    m, f, b = res["machine"], res["fleet"], res["baseline"]

    def row(label: str, s: dict[str, Any]) -> str:
        return f"| {label} | {s['p50_ms']} ms | {s['p99_ms']} ms | {s['n']} |"

    claim, plain = f["claim_create_to_pod_running"], f["plain_pod_create_to_running"]
    extra = (round(claim["p50_ms"] - plain["p50_ms"], 1)
             if claim["p50_ms"] is not None and plain["p50_ms"] is not None else None)
    return "\n".join([
        BEGIN,
        "",
        f"Measured {m['date']} on {m['cpu']}, {m['nproc']} CPU, Python {m['python']}, "
        f"load {m['loadavg_1m_at_record']:.1f}.",
        "Generated by `python -m bench.bench_storage`: `fleet server` with its built-in agent (runc), "
        f"{f['rounds']} rounds one after another, each a {CLAIM_SIZE} claim of the default class "
        "`local-path` (hostpath.fleet.dev, WaitForFirstConsumer) and a busybox pod mounting it "
        "created back to back, then a pod without volume; times from the claim's (pod's) create "
        "request to the pod's running status arriving on a watch.  The baseline is measured in the "
        "same run on the same machine.",
        "",
        "| path | p50 | p99 | n |",
        "|---|---|---|---|",
        row("claim + pod: provision, bind, stage + publish, container start → Running", claim),
        row("claim create → claim Bound (informational)", f["claim_create_to_bound"]),
        row("pod without volume → Running (same run)", plain),
        row("baseline: `mkdir` + `mkdir` + bind mount (mount(2))", b["mkdir_bind_syscall"]),
        row("baseline: `mkdir` + `mkdir` + `mount --bind` (fork + exec)", b["mkdir_bind_command"]),
        "",
        f"What the claim adds to a pod start (p50 difference): {extra} ms, against "
        f"{b['mkdir_bind_syscall']['p50_ms']} ms for the bare directory and bind mount."
        + (f"  Failures: {f['failures']}." if f["failures"] else ""),
        "",
        END,
    ])


def update_doc(res: dict[str, Any]) -> None:
    replace_doc_section(DOC, render_doc(res), BEGIN, END, "Storage")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--claims", type=int, default=50)
    ap.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")
    ap.add_argument("--baseline-only", action="store_true",
                    help="measure the mkdir + bind baseline alone (no server) and print it")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_storage: needs root (bind mounts, runc)")
    base = Path(tempfile.mkdtemp(prefix="fleet-bench-storage-"))
    try:
        b = baseline(base, args.claims)
        log(f"baseline mkdir+bind (mount(2)): {b['mkdir_bind_syscall']}; "
            f"with `mount --bind`: {b['mkdir_bind_command']}")
        if args.baseline_only:
            return
        f = measure_fleet(base, args.claims)
        log(f"claim + pod → Running: {f['claim_create_to_pod_running']}; "
            f"plain pod: {f['plain_pod_create_to_running']}; failures {f['failures']}")
    finally:
        for mp in _mounts_under(base):
            subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    res = {"baseline": b, "fleet": f, "machine": machine_info()}
    path = write_results("storage", res)
    log(f"wrote {path}")
    if not args.no_doc:
        update_doc(res)


def _mounts_under(base: Path) -> list[str]:
    from fleet.agent.volumes import mounts_under

    return [str(p) for p in mounts_under(base)]


if __name__ == "__main__":
    main()
