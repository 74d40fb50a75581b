"""Scheduler throughput and latency on simulated nodes, end to end through the API.

`python -m bench.scheduler [--nodes 100 1000 5000] [--pods 10000] [--modes plain spread]`

For each node count a fresh `fleet server --no-agent --no-scheduler` is started and
`fleet agent --simulate N` registers N hollow nodes (3 zones) against it.  Then:

1. **Idle cost of the nodes**: over `--idle` seconds (default 20) with every Lease
   renewed each 10 s, the server's CPU% and RSS (and the simulator's), reported per
   1,000 nodes.
2. For each mode (a fresh namespace each):
   - `plain`: pods requesting 10m cpu / 16Mi (10,000 fit even on 100 nodes of 110 pods);
   - `spread`: the same with a zone topology spread constraint (maxSkew 1,
     DoNotSchedule) and a preferred pod anti-affinity per hostname — the two
     plugins that look at other pods;

   **Backlog throughput**: `--pods` pods are created first (not measured) with no
   scheduler running, then `fleet scheduler` (the same scheduler the server runs
   in-process, as its own process like kube-scheduler) is started; a pod watch
   stamps when each pod is first seen bound.  Throughput = pods / (last bind − the
   scheduler's start), and also over the middle 80% of binds (without the start-up
   list and the tail).  Meanwhile a probe PATCHes a ConfigMap every 100 ms: the
   API's mutating p99 under that load (Kubernetes' SLO: ≤ 1 s).
   **Paced latency**: with the scheduler still running, `--paced` more pods are
   created at `--rate` per second; per pod, create acknowledged → bound seen on
   the watch, p50/p99.
   The simulator's start delay is a day, so pods stay bound-but-Pending: the node
   agents' status writes are not part of the scheduler's numbers.

Results: bench/results/scheduler.json (nothing asserted).  Everything started is
stopped by pid; temporary directories are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    REPO,
    FleetServer,
    ServerInfo,
    auth_headers,
    cpu_s,
    log,
    machine_info,
    percentile,
    rss_kib,
    summarize_ms,
    sync_client,
    write_results,
)

PYTHON = sys.executable
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"


def pod_body(name: str, mode: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
        "terminationGracePeriodSeconds": 0,
    }
    if mode == "spread":
        spec["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "bench"}}}]
        spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"app": "bench"}}, "topologyKey": HOSTNAME}}]}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "bench"}}, "spec": spec}


class BindWatch:
    """A thread following the namespace's pods: when each was first seen bound."""

    def __init__(self, info: ServerInfo, ns: str) -> None:
        self.info, self.ns = info, ns
        self.bound: dict[str, float] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._t.start()
        self._ready.wait(30)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                with httpx.Client(base_url=self.info.base_url, headers=auth_headers(self.info.token),
                                  verify=self.info.verify(), timeout=httpx.Timeout(30, read=None)) as c:
                    if rv is None:
                        listed = c.get(f"/api/v1/namespaces/{self.ns}/pods").json()
                        rv = listed["metadata"]["resourceVersion"]
                        for p in listed["items"]:
                            self._see(p)
                    self._ready.set()
                    with c.stream("GET", f"/api/v1/namespaces/{self.ns}/pods",
                                  params={"watch": "1", "resourceVersion": rv,
                                          "allowWatchBookmarks": "true"}) as r:
                        for line in r.iter_lines():
                            if self._stop.is_set():
                                return
                            if not line:
                                continue
                            ev = json.loads(line)
                            obj = ev.get("object") or {}
                            if ev.get("type") == "ERROR":
                                rv = None  # 410 Expired: re-list (the list catches up)
                                break
                            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                            if ev.get("type") in ("ADDED", "MODIFIED"):
                                self._see(obj)
            except Exception as e:  # noqa: BLE001 - reconnect, but remember it
                self.errors.append(repr(e))
                self._ready.set()
                time.sleep(0.5)

    def _see(self, p: dict[str, Any]) -> None:
        name = p["metadata"]["name"]
        if p["spec"].get("nodeName") and name not in self.bound:
            self.bound[name] = time.time()


class Probe:
    """PATCH one ConfigMap every `period` s; the latencies."""

    def __init__(self, info: ServerInfo, ns: str, period: float = 0.1) -> None:
        self.info, self.ns, self.period = info, ns, period
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        with sync_client(self.info) as c:
            c.post(f"/api/v1/namespaces/{self.ns}/configmaps", json={
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"},
                "data": {"n": "0"}})
        self._t.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._t.join(10)
        return {"requests": len(self.latencies), "failures": self.failures,
                **summarize_ms(self.latencies)}

    def _run(self) -> None:
        n = 0
        with sync_client(self.info) as c:
            while not self._stop.wait(self.period):
                n += 1
                t0 = time.perf_counter()
                r = c.patch(f"/api/v1/namespaces/{self.ns}/configmaps/probe",
                            json={"data": {"n": str(n)}},
                            headers={"Content-Type": "application/merge-patch+json"})
                if r.status_code == 200:
                    self.latencies.append(time.perf_counter() - t0)
                else:
                    self.failures += 1


def create_pods(info: ServerInfo, ns: str, names: list[str], mode: str,
                concurrency: int = 16) -> None:
    def one(chunk: list[str]) -> None:
        with sync_client(info) as c:
            for n in chunk:
                r = c.post(f"/api/v1/namespaces/{ns}/pods", json=pod_body(n, mode))
                if r.status_code not in (200, 201):
                    raise RuntimeError(f"create {n}: {r.status_code} {r.text[:300]}")

    chunks = [names[i::concurrency] for i in range(concurrency)]
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, [c for c in chunks if c]))


def ensure_namespace(info: ServerInfo, ns: str) -> None:
    with sync_client(info) as c:
        r = c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ns}})
        if r.status_code not in (200, 201, 409):
            raise RuntimeError(f"namespace {ns}: {r.status_code} {r.text[:200]}")


def spawn(argv: list[str], logfile: Path) -> subprocess.Popen[bytes]:
    f = open(logfile, "ab")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def stop(p: subprocess.Popen[bytes] | None) -> None:
    if p is None or p.poll() is not None:
        return
    os.kill(p.pid, signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)


def count_ready_nodes(info: ServerInfo) -> int:
    with sync_client(info, timeout=60) as c:
        items = c.get("/api/v1/nodes").json().get("items") or []
    return sum(1 for n in items if any(x.get("type") == "Ready" and x.get("status") == "True"
                                      for x in (n.get("status") or {}).get("conditions") or []))


def sample(pids: dict[str, int], seconds: float) -> dict[str, Any]:
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    t0 = time.monotonic()
    rss: dict[str, list[int]] = {k: [] for k in pids}
    while time.monotonic() - t0 < seconds:
        for k, p in pids.items():
            v = rss_kib(p)
            if v:
                rss[k].append(v)
        time.sleep(1)
    dt = time.monotonic() - t0
    out = {}
    for k, p in pids.items():
        c1, c0 = cpu_s(p), cpu0[k]
        out[k] = {"cpu_percent": round(100 * (c1 - c0) / dt, 1) if c1 is not None and c0 is not None else None,
                  "rss_mb": round(max(rss[k]) * 1024 / 1e6, 1) if rss[k] else None}
    return out


def run_mode(srv: FleetServer, nodes: int, mode: str, a: argparse.Namespace,
             tmp: Path) -> dict[str, Any]:
    info = srv.info
    assert info is not None
    ns = f"bench-{mode}"
    ensure_namespace(info, ns)
    names = [f"p-{i:05d}" for i in range(a.pods)]
    t0 = time.monotonic()
    create_pods(info, ns, names, mode)
    created_s = time.monotonic() - t0
    log(f"  {nodes} nodes / {mode}: {a.pods} pods created in {created_s:.1f}s; starting the scheduler")
    watch = BindWatch(info, ns)
    watch.start()
    probe = Probe(info, ns)
    probe.start()
    kubeconfig = srv.data_dir / "data" / "admin.kubeconfig"
    sched_t0 = time.time()
    sched = spawn([PYTHON, "-m", "fleet.cli.main", "scheduler", "--kubeconfig", str(kubeconfig),
                   "--log-level", "WARNING"], tmp / f"scheduler-{nodes}-{mode}.log")
    result: dict[str, Any] = {"pods": a.pods, "create_s": round(created_s, 1)}
    try:
        deadline = time.monotonic() + a.timeout
        while len(watch.bound) < a.pods and time.monotonic() < deadline:
            if sched.poll() is not None:
                raise RuntimeError(f"the scheduler exited with {sched.returncode}")
            time.sleep(0.2)
        times = sorted(t - sched_t0 for n, t in watch.bound.items() if n in set(names))
        result["bound"] = len(times)
        result["api_mutating_probe"] = probe.stop()
        if times:
            total = times[-1]
            result["backlog_s"] = round(total, 2)
            result["pods_per_s"] = round(len(times) / total, 1)
            lo, hi = times[len(times) // 10], times[(len(times) * 9) // 10 - 1]
            if hi > lo:
                result["pods_per_s_middle_80pct"] = round(0.8 * len(times) / (hi - lo), 1)
            result["first_bind_after_s"] = round(times[0], 2)
        log(f"  backlog: {result.get('bound')} bound in {result.get('backlog_s')}s = "
            f"{result.get('pods_per_s')} pods/s (middle 80%: {result.get('pods_per_s_middle_80pct')}); "
            f"API PATCH p99 {result['api_mutating_probe'].get('p99_ms')} ms")

        # Paced: create `paced` more at `rate`/s with the scheduler running.
        paced = [f"q-{i:05d}" for i in range(a.paced)]
        acked: dict[str, float] = {}
        with sync_client(info) as c:
            start = time.monotonic()
            for i, n in enumerate(paced):
                due = start + i / a.rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                r = c.post(f"/api/v1/namespaces/{ns}/pods", json=pod_body(n, mode))
                if r.status_code in (200, 201):
                    acked[n] = time.time()
        deadline = time.monotonic() + 60
        while any(n not in watch.bound for n in acked) and time.monotonic() < deadline:
            time.sleep(0.1)
        lat = [watch.bound[n] - acked[n] for n in acked if n in watch.bound]
        result["paced"] = {"rate_per_s": a.rate, "pods": len(paced), "bound": len(lat),
                           "create_ack_to_bound": summarize_ms(lat)}
        log(f"  paced {a.rate}/s: create->bound p50 {result['paced']['create_ack_to_bound'].get('p50_ms')} ms, "
            f"p99 {result['paced']['create_ack_to_bound'].get('p99_ms')} ms")
        result["watch_errors"] = watch.errors[:5]
    finally:
        watch.stop()
        stop(sched)
    return result


def pure_framework(nodes: int, mode: str, pods: int) -> dict[str, Any]:
    """The baseline measured in the same run: the same scheduling decisions with no API —
    `Framework.schedule` over a Snapshot of the same simulated nodes, each pod assumed
    onto its node as the loop does.  End-to-end ÷ this = what the I/O costs."""
    from fleet.agent.simulate import SimulatorConfig, make_nodes, node_object
    from fleet.scheduler.run import SchedulerConfig, default_framework
    from fleet.scheduler.snapshot import Snapshot

    cfg = SimulatorConfig(count=nodes, prefix="sim")
    snap = Snapshot.build([node_object(cfg, n, boot_id="x", now="2026-01-01T00:00:00Z")
                           for n in make_nodes(cfg)])
    fw = default_framework(SchedulerConfig())
    t0 = time.process_time()
    for i in range(pods):
        body = pod_body(f"p-{i:05d}", mode)
        body["metadata"].update(namespace="bench", uid=f"u{i}")
        result = fw.schedule(body, snap)
        snap.set_pod({**body, "spec": {**body["spec"], "nodeName": result.node}})
    cpu = time.process_time() - t0
    return {"pods": pods, "cpu_s": round(cpu, 2), "pods_per_cpu_s": round(pods / cpu, 1),
            "cycle_ms": round(1000 * cpu / pods, 3)}


def run_nodes(nodes: int, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Each mode on a fresh server and simulator: the previous mode's 10,000 pods would
    otherwise still occupy the nodes."""
    out: dict[str, Any] = {"nodes": nodes}
    for i, mode in enumerate(a.modes):
        out.update(run_cluster(nodes, [mode], a, tmp, measure_idle=(i == 0)))
    return out


def run_cluster(nodes: int, modes: list[str], a: argparse.Namespace, tmp: Path, *,
                measure_idle: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # History for watches to resume from: 10,000 creates + 10,000 binds + events would
    # overrun the default 10,000 revisions while the benchmark's own watch reconnects.
    with FleetServer(extra_args=["--no-scheduler", "--retention", "200000"]) as srv:
        info = srv.info
        assert info is not None
        kubeconfig = srv.data_dir / "data" / "admin.kubeconfig"
        t0 = time.monotonic()
        sim = spawn([PYTHON, "-m", "fleet.cli.main", "agent", "--kubeconfig", str(kubeconfig),
                     "--simulate", str(nodes), "--node-name", "sim",
                     "--simulate-start-delay", "86400", "--log-level", "WARNING"],
                    tmp / f"sim-{nodes}.log")
        try:
            deadline = time.monotonic() + max(120, nodes / 10)
            ready = 0
            while time.monotonic() < deadline:
                if sim.poll() is not None:
                    raise RuntimeError(f"the simulator exited with {sim.returncode}")
                ready = count_ready_nodes(info)
                if ready >= nodes:
                    break
                time.sleep(2)
            registration_s = round(time.monotonic() - t0, 1)
            log(f"{nodes} simulated nodes Ready in {registration_s}s")
            if measure_idle:
                out["registration_s"] = registration_s
                out["ready_nodes"] = ready
                idle = sample({"server": srv.pid, "simulator": sim.pid}, a.idle)
                out["idle"] = idle
                if idle["server"]["cpu_percent"] is not None:
                    out["server_cpu_percent_per_1000_nodes"] = round(
                        idle["server"]["cpu_percent"] * 1000 / nodes, 1)
                log(f"  idle with leases every 10 s: server {idle['server']}, simulator {idle['simulator']}")
            for mode in modes:
                out[mode] = run_mode(srv, nodes, mode, a, tmp)
                base = pure_framework(nodes, mode, a.pods)
                out[mode]["pure_framework"] = base
                if out[mode].get("pods_per_s"):
                    out[mode]["ratio_end_to_end_vs_pure"] = round(
                        out[mode]["pods_per_s"] / base["pods_per_cpu_s"], 3)
                log(f"  pure framework, same decisions, no API: {base['pods_per_cpu_s']} pods per CPU-second "
                    f"({base['cycle_ms']} ms per cycle)")
                out[mode]["server_rss_mb_after"] = round((rss_kib(srv.pid) or 0) * 1024 / 1e6, 1)
        finally:
            stop(sim)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--modes", nargs="+", default=["plain", "spread"], choices=["plain", "spread"])
    ap.add_argument("--paced", type=int, default=500)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-schedbench-"))
    results: dict[str, Any] = {"benchmark": "scheduler", "machine": machine_info(),
                               "args": vars(a), "runs": []}
    try:
        for n in a.nodes:
            try:
                results["runs"].append(run_nodes(n, a, tmp))
            except Exception as e:  # noqa: BLE001 - record and go on with the next size
                log(f"!! {n} nodes failed: {e!r}")
                results["runs"].append({"nodes": n, "error": repr(e)})
            write_results("scheduler", results)
    finally:
        for f in tmp.glob("*.log"):
            text = f.read_text(errors="replace")
            if "Traceback" in text:
                results.setdefault("logs_with_tracebacks", {})[f.name] = text[-3000:]
        write_results("scheduler", results)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote bench/results/scheduler.json ({percentile([1.0], 50) and 'ok'})")


if __name__ == "__main__":
    main()
