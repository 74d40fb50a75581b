"""Pod start latency (create → Running, image present) beside raw `runc run`, and agent RSS.

`python -m bench.pod_start [--pods 50] [--batch 10]`   (root; runc and busybox-static)

1. `fleet server` with its built-in agent (`--agent-driver oci --agent-network none`) in a
   temporary data dir; the busybox test image is imported with `kfleet image import`; then
   `--pods` pods (`sleep 3600`, imagePullPolicy Never) are created one after another, each
   once the previous one is running.  A watch on the namespace's pods records (time.time())
   when each pod's containerStatuses[0].state.running first arrives; latency is that
   arrival minus the time the create request was sent.  status...running.startedAt is
   recorded too.  Where the time goes comes from the container bundles' file times
   (config.json written after the overlay mount, shim.json before the shim is spawned,
   shim.pid, runtime.pid after `runc create`, handle.json once the shim reported ready).
2. Baseline in the same run: `runc run -d` of a bundle with the same busybox rootfs (a
   plain directory) and the same command, `--pods` times sequentially, each until
   `runc state` says running, then `runc delete -f`.
3. `fleet server --no-agent` plus a separate `fleet agent` process (oci, network none);
   `--pods` pods created in concurrent batches of `--batch` (their latencies are recorded
   as a second, loaded number); with all running, the agent's VmRSS and each shim's VmRSS.

Results: bench/results/pod_start.json.  Every wait is bounded; everything started is
stopped by pid and cleaned up (pods deleted, server SIGTERM, leftover runc containers
deleted, leftover mounts under the data dir unmounted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    REPO,
    free_port,
    log,
    read_kubeconfig,
    rss_kib,
    summarize_ms,
    sync_client,
    write_results,
)

IMAGE = "localhost/bench/busybox:1"
RSS_TARGET_MB = 80.0
P99_TARGET_S = 1.0
MEDIAN_RATIO_TARGET = 3.0
POD_TIMEOUT_S = 30.0
KFLEET = str(Path(PYTHON).with_name("kfleet"))


def runtime_bin() -> str:
    from fleet.runtime.oci import find_runtime

    rt = find_runtime()
    if rt is None:
        raise SystemExit("needs runc or crun")
    return rt


# --------------------------------------------------------------------------- processes


class Proc:
    """A child process with its output in a log file; stopped by pid."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.p.pid, sig)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=10)
        with contextlib.suppress(Exception):
            self._log.close()
        return self.p.returncode

    def tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""


def start_server(base: Path, *, agent: bool) -> tuple[Proc, Path, dict[str, Any]]:
    data = base / "data"
    data.mkdir(parents=True)
    argv = [
        PYTHON,
        "-m",
        "fleet.cli.main",
        "server",
        "--data-dir",
        str(data),
        "--port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
    ]
    if agent:
        argv += [
            "--agent-port",
            str(free_port()),
            "--agent-driver",
            "oci",
            "--agent-network",
            "none",
        ]
    else:
        argv += ["--no-agent"]
    proc = Proc(argv, base / "server.log")
    kubeconfig = data / "admin.kubeconfig"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"fleet server exited; log:\n{proc.tail()}")
        if kubeconfig.exists():
            with contextlib.suppress(Exception):
                info = read_kubeconfig(kubeconfig)
                with sync_client(info, timeout=2) as c:
                    if c.get("/readyz").status_code == 200:
                        return proc, kubeconfig, {"argv": argv[2:]}
        time.sleep(0.1)
    proc.stop()
    raise TimeoutError(f"fleet server not ready; log:\n{proc.tail()}")


def wait_node_ready(kubeconfig: Path, timeout: float = 60.0) -> str:
    info = read_kubeconfig(kubeconfig)
    deadline = time.monotonic() + timeout
    with sync_client(info) as c:
        while time.monotonic() < deadline:
            r = c.get("/api/v1/nodes")
            for n in r.json().get("items", []) if r.status_code == 200 else []:
                conds = {x["type"]: x["status"] for x in n.get("status", {}).get("conditions", [])}
                if conds.get("Ready") == "True":
                    return n["metadata"]["name"]
            time.sleep(0.2)
    raise TimeoutError("no Ready node")


def import_image(kubeconfig: Path, archive: Path) -> None:
    deadline = time.monotonic() + 60
    last = ""
    while time.monotonic() < deadline:  # the node's agent API may need a moment
        r = subprocess.run(
            [KFLEET, "--kubeconfig", str(kubeconfig), "image", "import", str(archive)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode == 0:
            return
        last = r.stdout + r.stderr
        time.sleep(0.5)
    raise RuntimeError(f"image import failed: {last}")


# --------------------------------------------------------------------------- pods


def pod_manifest(name: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }


class PodWatch:
    """A watch on one namespace's pods in a thread: first arrival of running / of nodeName."""

    def __init__(self, kubeconfig: Path, ns: str) -> None:
        self.info = read_kubeconfig(kubeconfig)
        self.ns = ns
        self.running: dict[str, float] = {}
        self.started_at: dict[str, str] = {}
        self.bound: dict[str, float] = {}
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self.t.start()
        if not self._ready.wait(15):
            raise TimeoutError("watch did not open")
        return self

    def _run(self) -> None:
        import httpx

        try:
            with (
                sync_client(self.info, timeout=httpx.Timeout(10, read=5)) as c,
                c.stream(
                    "GET",
                    f"/api/v1/namespaces/{self.ns}/pods",
                    params={"watch": "1", "timeoutSeconds": "900"},
                ) as r,
            ):
                self._ready.set()
                for line in self._lines(r):
                    now = time.time()
                    ev = json.loads(line)
                    pod = ev.get("object") or {}
                    name = pod.get("metadata", {}).get("name")
                    if not name:
                        continue
                    with self.cond:
                        if pod.get("spec", {}).get("nodeName") and name not in self.bound:
                            self.bound[name] = now
                        cs = (pod.get("status") or {}).get("containerStatuses") or []
                        run = cs[0].get("state", {}).get("running") if cs else None
                        if run is not None and name not in self.running:
                            self.running[name] = now
                            self.started_at[name] = run.get("startedAt", "")
                            self.cond.notify_all()
        except Exception as e:  # noqa: BLE001 - recorded, the waiter times out
            if not self._stop.is_set():
                self.errors.append(repr(e))
        finally:
            self._ready.set()

    def _lines(self, r: Any):
        import httpx

        it = r.iter_lines()
        while not self._stop.is_set():
            try:
                line = next(it)
            except StopIteration:
                return
            except httpx.ReadTimeout:
                if self._stop.is_set():
                    return
                raise
            if line.strip():
                yield line

    def wait_running(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.running for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.5))
        return True

    def stop(self) -> None:
        self._stop.set()
        self.t.join(timeout=10)


def create_pods(kubeconfig: Path, ns: str, n: int, batch: int, prefix: str) -> dict[str, Any]:
    """Create n pods in batches of `batch` (1: one at a time), each batch once the previous
    one is running; return per-pod timings."""
    from concurrent.futures import ThreadPoolExecutor

    info = read_kubeconfig(kubeconfig)
    with sync_client(info) as c:
        r = c.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        )
        if r.status_code not in (200, 201, 409):
            raise RuntimeError(f"namespace: {r.status_code} {r.text[:300]}")
    watch = PodWatch(kubeconfig, ns).start()
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    failures: list[str] = []
    clients = [sync_client(info) for _ in range(batch)]

    def one(arg: tuple[int, str]) -> None:
        i, name = arg
        c = clients[i]
        sent[name] = time.time()
        r = c.post(f"/api/v1/namespaces/{ns}/pods", json=pod_manifest(name, ns))
        acked[name] = time.time()
        if r.status_code != 201:
            failures.append(f"{name}: {r.status_code} {r.text[:200]}")

    names = [f"{prefix}-{i:03d}" for i in range(n)]
    t_start = time.monotonic()
    try:
        with ThreadPoolExecutor(batch) as ex:
            for k in range(0, n, batch):
                group = names[k : k + batch]
                list(ex.map(one, list(enumerate(group))))
                if not watch.wait_running(group, POD_TIMEOUT_S):
                    failures.append(f"batch at {group[0]} not running within {POD_TIMEOUT_S}s")
                    break
    finally:
        total_s = time.monotonic() - t_start
        watch.stop()
        for c in clients:
            c.close()
    per_pod = {}
    for name in names:
        if name not in sent:
            continue
        run = watch.running.get(name)
        per_pod[name] = {
            "sent": sent[name],
            "acked": acked.get(name),
            "bound": watch.bound.get(name),
            "running_event": run,
            "started_at": watch.started_at.get(name),
            "latency_s": None if run is None else run - sent[name],
        }
    lat = [p["latency_s"] for p in per_pod.values() if p["latency_s"] is not None]
    started = [_parse_ts(p["started_at"]) - p["sent"] for p in per_pod.values() if p["started_at"]]
    return {
        "pods": n,
        "batch": batch,
        "created": len(sent),
        "running": len(lat),
        "failures": failures,
        "watch_errors": watch.errors,
        "total_s": round(total_s, 3),
        "create_to_running_event": summarize_ms(lat),
        # startedAt is a metav1.Time: whole seconds, truncated, so this is coarse and
        # can be negative; the running event's arrival is the measured latency.
        "create_to_startedAt_second_resolution": summarize_ms(started),
        "create_request": summarize_ms(
            [p["acked"] - p["sent"] for p in per_pod.values() if p["acked"]]
        ),
        "create_to_bound_event": summarize_ms(
            [p["bound"] - p["sent"] for p in per_pod.values() if p["bound"]]
        ),
        "per_pod": per_pod,
    }


def _parse_ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def bundle_timeline(agent_dir: Path, per_pod: dict[str, Any]) -> dict[str, Any]:
    """Per container, the mtimes of the bundle's files against the pod's create time."""
    steps = {
        "config.json": "overlay mounted + config.json written",
        "shim.json": "shim config written (shim about to be spawned)",
        "shim.pid": "shim child running",
        "runtime.pid": "runc create done",
        "handle.json": "shim reported started; driver returned",
    }
    out: dict[str, list[float]] = {k: [] for k in steps}
    out["running_event"] = []
    for meta_path in (agent_dir / "runtime" / "containers").glob("*/meta.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            meta = json.loads(meta_path.read_text())
            pod = per_pod.get(meta["labels"].get("fleet.io/pod-name"))
            if not pod:
                continue
            for f in steps:
                p = meta_path.parent / f
                if p.exists():
                    out[f].append(p.stat().st_mtime - pod["sent"])
            if pod["running_event"]:
                out["running_event"].append(pod["running_event"] - pod["sent"])
    return {"steps": steps, "since_create": {k: summarize_ms(v) for k, v in out.items()}}


def delete_pods(kubeconfig: Path, ns: str, agent_dir: Path, timeout: float = 90.0) -> int:
    info = read_kubeconfig(kubeconfig)
    with sync_client(info) as c:
        r = c.get(f"/api/v1/namespaces/{ns}/pods")
        for p in r.json().get("items", []) if r.status_code == 200 else []:
            c.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
    containers = agent_dir / "runtime" / "containers"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and containers.is_dir() and any(containers.iterdir()):
        time.sleep(0.5)
    return len(list(containers.iterdir())) if containers.is_dir() else 0


def force_clean(agent_dir: Path, data_root: Path) -> None:
    rt = runtime_bin()
    containers = agent_dir / "runtime" / "containers"
    if containers.is_dir():
        for d in containers.iterdir():
            subprocess.run(
                [rt, "--root", str(agent_dir / "runtime" / "runc"), "delete", "-f", d.name],
                capture_output=True,
                check=False,
                timeout=30,
            )
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f]
    for m in sorted((m for m in mounts if m.startswith(str(data_root))), reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False, timeout=30)


# --------------------------------------------------------------------------- RSS


def pss_kib(pid: int) -> int:
    """Proportional set size: shared pages split among their sharers (/proc/PID/smaps_rollup)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def shim_rss(agent_dir: Path) -> dict[str, Any]:
    """Memory of every shim of this agent (found by the shim.pid files in the container
    directories: shims forked by the launcher server carry its command line) and of the
    containers' processes.  RSS counts pages shared with the launcher server and the
    other shims in full; PSS divides them among their sharers."""
    shims, shims_pss, payload = [], [], []
    containers = Path(agent_dir / "runtime" / "containers")
    for pidf in containers.glob("*/shim.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidf.read_text().split()[0])
            kib = rss_kib(pid)
            if kib:
                shims.append(kib)
                shims_pss.append(pss_kib(pid))
    for pidf in containers.glob("*/container.pid"):
        with contextlib.suppress(OSError, ValueError):
            kib = rss_kib(int(pidf.read_text().split()[0]))
            if kib:
                payload.append(kib)
    mb = lambda xs: sorted(round(x * 1024 / 1e6, 2) for x in xs)  # noqa: E731
    s, ps, p = mb(shims), mb(shims_pss), mb(payload)
    return {
        "shims": len(s),
        "shim_rss_mb_median": s[len(s) // 2] if s else None,
        "shim_rss_mb_max": max(s) if s else None,
        "shim_rss_mb_total": round(sum(s), 1),
        "shim_pss_mb_median": ps[len(ps) // 2] if ps else None,
        "shim_pss_mb_total": round(sum(ps), 1),
        "containers": len(p),
        "container_rss_mb_median": p[len(p) // 2] if p else None,
    }


# --------------------------------------------------------------------------- runc baseline


def runc_baseline(base: Path, image: Any, n: int) -> dict[str, Any]:
    rt = runtime_bin()
    bundle = base / "runc-bundle"
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    import io

    with tarfile.open(fileobj=io.BytesIO(image.layers[0].tar)) as tf:
        tf.extractall(rootfs)  # noqa: S202 - our own layer
    subprocess.run([rt, "spec"], cwd=bundle, capture_output=True, check=True, timeout=30)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["sleep", "3600"]
    spec["root"] = {"path": "rootfs", "readonly": False}
    (bundle / "config.json").write_text(json.dumps(spec))
    root = base / "runc-root"
    errf = base / "runc-run.err"
    lat, failures = [], []
    for i in range(n):
        cid = f"bench-{uuid.uuid4().hex[:8]}-{i}"
        t0 = time.perf_counter()
        try:
            # The detached container inherits runc's stdio: files, never pipes (a pipe
            # would stay open for as long as the container runs).
            with open(errf, "w+b") as err:
                r = subprocess.run(
                    [rt, "--root", str(root), "run", "-d", "--bundle", str(bundle), cid],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    timeout=30,
                    check=False,
                )
                if r.returncode != 0:
                    err.seek(0)
                    failures.append(err.read().decode(errors="replace")[-300:])
                    continue
            deadline = time.monotonic() + 10
            ok = False
            while time.monotonic() < deadline:
                st = subprocess.run(
                    [rt, "--root", str(root), "state", cid],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                if st.returncode == 0 and json.loads(st.stdout).get("status") == "running":
                    ok = True
                    break
                time.sleep(0.005)
            if ok:
                lat.append(time.perf_counter() - t0)
            else:
                failures.append(f"{cid} not running within 10s")
        finally:
            subprocess.run(
                [rt, "--root", str(root), "delete", "-f", cid],
                capture_output=True,
                timeout=30,
                check=False,
            )
    return {
        "runs": n,
        "ok": len(lat),
        "failures": failures[:5],
        "runtime": rt,
        "bundle": "busybox rootfs as a plain directory, `sleep 3600`, runc's default spec",
        "run_to_running": summarize_ms(lat),
    }


# --------------------------------------------------------------------------- main


def phase_builtin(base: Path, archive: Path, n: int) -> dict[str, Any]:
    d = base / "builtin"
    d.mkdir()
    srv, kubeconfig, meta = start_server(d, agent=True)
    agent_dir = d / "data" / "agent"
    try:
        node = wait_node_ready(kubeconfig)
        import_image(kubeconfig, archive)
        log(f"built-in agent: node {node} ready, image imported; creating {n} pods one at a time")
        res = create_pods(kubeconfig, "bench-start", n, 1, "seq")
        res["timeline"] = bundle_timeline(agent_dir, res["per_pod"])
        res["server_argv"] = meta["argv"]
        res["leftover_containers"] = delete_pods(kubeconfig, "bench-start", agent_dir)
    finally:
        srv.stop()
        force_clean(agent_dir, d)
    return res


def phase_agent(base: Path, archive: Path, n: int, batch: int) -> dict[str, Any]:
    d = base / "separate"
    d.mkdir()
    srv, kubeconfig, _ = start_server(d, agent=False)
    agent_dir = d / "agent"
    agent = Proc(
        [
            PYTHON,
            "-m",
            "fleet.cli.main",
            "agent",
            "--kubeconfig",
            str(kubeconfig),
            "--data-dir",
            str(agent_dir),
            "--node-name",
            "bench",
            "--port",
            str(free_port()),
            "--driver",
            "oci",
            "--network",
            "none",
            "--address",
            "127.0.0.1",
        ],
        d / "agent.log",
    )
    try:
        wait_node_ready(kubeconfig)
        import_image(kubeconfig, archive)
        time.sleep(2)
        idle_kib = rss_kib(agent.pid)
        log(
            f"separate agent (pid {agent.pid}) idle RSS {idle_kib} KiB; creating {n} pods, "
            f"batches of {batch}"
        )
        res = create_pods(kubeconfig, "bench-rss", n, batch, "rss")
        res.pop("per_pod")
        time.sleep(5)  # let status updates settle
        kib = rss_kib(agent.pid)
        res["agent_rss_mb_idle"] = None if idle_kib is None else round(idle_kib * 1024 / 1e6, 1)
        res["agent_rss_mb_with_pods"] = None if kib is None else round(kib * 1024 / 1e6, 1)
        res["shims"] = shim_rss(agent_dir)
        res["leftover_containers"] = delete_pods(kubeconfig, "bench-rss", agent_dir)
    finally:
        agent.stop(signal.SIGTERM)
        srv.stop()
        force_clean(agent_dir, d)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (runc)")
    from fleet.testing.oci_image import build_busybox_image, write_oci_archive

    base = Path(tempfile.mkdtemp(prefix="fleet-podbench-"))
    try:
        image = build_busybox_image()
        archive = write_oci_archive(image, base / "busybox.tar", IMAGE)
        t = time.monotonic()
        builtin = phase_builtin(base, archive, a.pods)
        log(
            f"fleet create->running: {builtin['create_to_running_event']} "
            f"({time.monotonic() - t:.1f}s)"
        )
        baseline = runc_baseline(base, image, a.pods)
        log(f"runc run->running: {baseline['run_to_running']}")
        sep = phase_agent(base, archive, a.pods, a.batch)
        log(f"agent RSS with pods: {sep['agent_rss_mb_with_pods']} MB; shims {sep['shims']}")
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    f50 = builtin["create_to_running_event"]["p50_ms"]
    f99 = builtin["create_to_running_event"]["p99_ms"]
    r50 = baseline["run_to_running"]["p50_ms"]
    ratio = round(f50 / r50, 2) if f50 and r50 else None
    summary = {
        "fleet_p50_ms": f50,
        "fleet_p99_ms": f99,
        "runc_p50_ms": r50,
        "runc_p99_ms": baseline["run_to_running"]["p99_ms"],
        "median_ratio": ratio,
        "median_ratio_target": MEDIAN_RATIO_TARGET,
        "median_ratio_met": ratio is not None and ratio <= MEDIAN_RATIO_TARGET,
        "p99_target_ms": P99_TARGET_S * 1000,
        "p99_met": f99 is not None and f99 <= P99_TARGET_S * 1000 and builtin["running"] == a.pods,
        "agent_rss_mb": sep["agent_rss_mb_with_pods"],
        "agent_rss_target_mb": RSS_TARGET_MB,
        "agent_rss_met": (sep["agent_rss_mb_with_pods"] or 1e9) <= RSS_TARGET_MB
        and sep["running"] == a.pods,
    }
    path = write_results(
        "pod_start",
        {
            "summary": summary,
            "fleet_builtin_sequential": builtin,
            "runc_baseline": baseline,
            "separate_agent": sep,
        },
    )
    log(f"summary: {summary}")
    log(f"wrote {path}")
    sys.exit(0)


if __name__ == "__main__":
    main()
