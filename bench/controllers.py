"""Workload controllers at scale, on simulated nodes: scale-to-Ready time, reconcile
throughput and work-queue latency, beside the scheduler's raw throughput.

`python -m bench.controllers [--quick] [--pods 10000] [--skip-scheduler]`

Each part starts its own `fleet server --no-agent` (controllers and scheduler
in-process, as users run it) and `fleet agent --simulate N` with a small start delay
(pods Running and Ready `--start-delay` s after binding):

1. **Scale to Ready**: a Deployment at 0 replicas, then `kubectl scale
   --replicas=100` — the time from starting kubectl until the Deployment reports 100
   replicas created and 100 ready (its status, polled every 50 ms); the same with a
   second Deployment and 1,000.  Everything is on the path: kubectl, the scale
   subresource, the Deployment controller, the ReplicaSet controller's slow-start
   batches (500 a pass at most), the scheduler, the simulated kubelets' status
   writes, and the ReplicaSet and Deployment status updates.
2. **10,000 pods**: 100 Deployments of 100 replicas created at once.  Reported: time
   until all pods exist and until all are ready, pods/s, and per controller
   (from the server's own work-queue metrics, `fleet.controllers.runtime.queue_stats`):
   reconciles, reconciles/s, retries, queue latency (add → picked up) p50/p99/max and
   reconcile duration p50/p99.  Then, with the 10,000 pods Ready, every Deployment is
   scaled up by `--steady-extra` at once and the same is measured in a fresh window.
   The server is started through a small stub that writes those metrics to a file
   every second and clears the latency samples on request (the server has no endpoint
   for them).
3. **Scheduler** (`bench.scheduler.run_nodes`, small scale): backlog throughput of the
   standalone scheduler on the same machine in the same run, for comparison.

Results: bench/results/controllers.json (nothing asserted).  Everything started is
stopped by pid; temporary directories are removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import scheduler as sched_bench
from bench.common import PYTHON, ServerInfo, log, rss_kib, sync_client, write_results
from bench.sim_nodes import VariantServer

APPS = "/apis/apps/v1"

# `fleet server` with a task beside the controller manager that writes the work
# queues' metrics to a file once a second.
_STATS_STUB = """
import json, os, sys, trio
import fleet.server.run as run_mod
from fleet.controllers import runtime
PATH = {path!r}
_orig = run_mod.default_manager

async def _dump():
    while True:
        if os.path.exists(PATH + ".reset"):
            # The bench starts a new measuring window: drop the samples so far.
            for q in list(runtime._QUEUES):
                q.metrics.queue_latency.clear()
                q.metrics.work_duration.clear()
            os.unlink(PATH + ".reset")
        tmp = PATH + ".tmp"
        with open(tmp, "w") as f:
            json.dump(runtime.queue_stats(), f)
        os.replace(tmp, PATH)
        await trio.sleep(1.0)

def _patched(*args, **kw):
    m = _orig(*args, **kw)
    inner = m.run
    async def run(config, *, task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as n:
            n.start_soon(_dump)
            await n.start(inner, config)
            task_status.started()
    m.run = run
    return m

run_mod.default_manager = _patched
from fleet.cli.main import main
sys.argv[0] = "fleet"
main()
"""


class StatsServer(VariantServer):
    """A bench server whose work-queue metrics land in `stats_path`."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.stats_path = self.data_dir / "queue-stats.json"
        self.stub = _STATS_STUB.format(path=str(self.stats_path))

    def reset_window(self) -> None:
        """Ask the stub to drop the latency samples so far; returns once it has."""
        trigger = self.stats_path.with_name(self.stats_path.name + ".reset")
        trigger.touch()
        deadline = time.monotonic() + 30
        while trigger.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.2)  # and a fresh dump after it

    def queue_stats(self) -> dict[str, Any]:
        try:
            return json.loads(self.stats_path.read_text())
        except (OSError, ValueError):
            return {}


def deployment(name: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                           "terminationGracePeriodSeconds": 0}}}}


def start_sim(srv: StatsServer, nodes: int, start_delay: float, tmp: Path) -> subprocess.Popen[bytes]:
    info = srv.info
    assert info is not None
    kubeconfig = srv.data_dir / "data" / "admin.kubeconfig"
    sim = sched_bench.spawn([PYTHON, "-m", "fleet.cli.main", "agent", "--kubeconfig", str(kubeconfig),
                             "--simulate", str(nodes), "--node-name", "sim",
                             "--simulate-start-delay", str(start_delay),
                             "--log-level", "WARNING"], tmp / f"sim-{nodes}.log")
    deadline = time.monotonic() + max(120, nodes / 10)
    while time.monotonic() < deadline:
        if sim.poll() is not None:
            raise RuntimeError(f"the simulator exited with {sim.returncode}")
        if sched_bench.count_ready_nodes(info) >= nodes:
            return sim
        time.sleep(1)
    raise TimeoutError(f"{nodes} simulated nodes not Ready")


def deployment_status(info: ServerInfo, ns: str, name: str) -> dict[str, Any]:
    with sync_client(info) as c:
        r = c.get(f"{APPS}/namespaces/{ns}/deployments/{name}")
    return (r.json().get("status") or {}) if r.status_code == 200 else {}


def measure_scale(srv: StatsServer, ns: str, name: str, replicas: int, timeout: float) -> dict[str, Any]:
    """`kubectl scale` from 0 to `replicas`; when status says created, then ready."""
    info = srv.info
    assert info is not None
    kubeconfig = srv.data_dir / "data" / "admin.kubeconfig"
    with sync_client(info) as c:
        r = c.post(f"{APPS}/namespaces/{ns}/deployments", json=deployment(name, 0))
        assert r.status_code == 201, r.text
    time.sleep(1.0)  # the (empty) ReplicaSet exists and the controllers are idle again
    t0 = time.monotonic()
    p = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "-n", ns, "scale",
                        f"deployment/{name}", f"--replicas={replicas}"],
                       capture_output=True, text=True, timeout=60)
    kubectl_s = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"kubectl scale: {p.stderr}")
    created = ready = None
    deadline = t0 + timeout
    with sync_client(info) as c:
        while time.monotonic() < deadline:
            r = c.get(f"{APPS}/namespaces/{ns}/deployments/{name}")
            st = (r.json().get("status") or {}) if r.status_code == 200 else {}
            now = time.monotonic()
            if created is None and st.get("replicas", 0) >= replicas:
                created = now - t0
            if st.get("readyReplicas", 0) >= replicas and st.get("availableReplicas", 0) >= replicas:
                ready = now - t0
                break
            time.sleep(0.05)
    out = {"replicas": replicas, "kubectl_s": round(kubectl_s, 2),
           "all_created_s": None if created is None else round(created, 2),
           "all_ready_s": None if ready is None else round(ready, 2)}
    log(f"  scale 0 -> {replicas}: created {out['all_created_s']} s, ready {out['all_ready_s']} s "
        f"(kubectl itself {out['kubectl_s']} s)")
    return out


def part_scale(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": a.scale_nodes, "start_delay_s": a.start_delay}
    with StatsServer(extra_args=["--retention", "200000"]) as srv:
        sim = start_sim(srv, a.scale_nodes, a.start_delay, tmp)
        try:
            assert srv.info is not None
            sched_bench.ensure_namespace(srv.info, "bench")
            out["runs"] = [measure_scale(srv, "bench", f"s{n}", n, a.timeout) for n in a.scale]
            out["queues"] = srv.queue_stats()
            out["server_rss_mb_after"] = round((rss_kib(srv.pid) or 0) * 1024 / 1e6, 1)
        finally:
            sched_bench.stop(sim)
    return out


def part_throughput(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    per = 100
    count = max(1, a.pods // per)
    total = count * per
    out: dict[str, Any] = {"pods": total, "deployments": count, "nodes": a.nodes,
                           "start_delay_s": a.start_delay}
    with StatsServer(extra_args=["--retention", "400000"]) as srv:
        sim = start_sim(srv, a.nodes, a.start_delay, tmp)
        info = srv.info
        assert info is not None
        try:
            sched_bench.ensure_namespace(info, "load")
            before = srv.queue_stats()

            def create(i: int) -> None:
                with sync_client(info) as c:
                    r = c.post(f"{APPS}/namespaces/load/deployments", json=deployment(f"d{i:03d}", per))
                    if r.status_code != 201:
                        raise RuntimeError(f"create d{i:03d}: {r.status_code} {r.text[:200]}")

            t0 = time.monotonic()
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(create, range(count)))
            out["deployments_created_s"] = round(time.monotonic() - t0, 2)
            created = ready = None
            deadline = t0 + a.timeout
            last_log = 0.0
            with sync_client(info, timeout=60) as c:
                while time.monotonic() < deadline:
                    items = c.get(f"{APPS}/namespaces/load/deployments").json().get("items") or []
                    n_created = sum((d.get("status") or {}).get("replicas", 0) for d in items)
                    n_ready = sum((d.get("status") or {}).get("readyReplicas", 0) for d in items)
                    now = time.monotonic()
                    if created is None and n_created >= total:
                        created = now - t0
                    if n_ready >= total:
                        ready = now - t0
                        break
                    if now - last_log > 15:
                        log(f"  {now - t0:.0f}s: {n_created} created, {n_ready} ready")
                        last_log = now
                    time.sleep(0.5)
            time.sleep(2.5)  # let the last status passes finish and the stats file refresh
            after = srv.queue_stats()
            out["all_created_s"] = None if created is None else round(created, 1)
            out["all_ready_s"] = None if ready is None else round(ready, 1)
            if created:
                out["pods_created_per_s"] = round(total / created, 1)
            if ready:
                out["pods_ready_per_s"] = round(total / ready, 1)
            queues = summarize_queues(before, after, ready or (time.monotonic() - t0))
            out["queues"] = queues
            out["server_rss_mb_after"] = round((rss_kib(srv.pid) or 0) * 1024 / 1e6, 1)
            log(f"  {total} pods: created {out['all_created_s']} s, ready {out['all_ready_s']} s; "
                + "; ".join(f"{k}: {v['reconciles_per_s']} reconciles/s, queue p99 "
                            f"{v['queue_latency_ms']['p99']} ms" for k, v in queues.items()))
            if ready:
                out["steady"] = steady_scale(srv, count, per, a.steady_extra, a.timeout)
        finally:
            sched_bench.stop(sim)
    return out


def summarize_queues(before: dict[str, Any], after: dict[str, Any], span: float) -> dict[str, Any]:
    """Per controller: reconciles (and per second over `span`), adds, retries, and the
    latency percentiles of the samples in the window."""
    queues = {}
    for name in ("deployment", "replicaset"):
        q, q0 = after.get(name) or {}, before.get(name) or {}
        if not q:
            continue
        processed = q.get("processed", 0) - q0.get("processed", 0)
        queues[name] = {
            "reconciles": processed,
            "reconciles_per_s": round(processed / span, 1) if span > 0 else None,
            "adds": q.get("adds", 0) - q0.get("adds", 0),
            "retries": q.get("retries", 0) - q0.get("retries", 0),
            "queue_latency_ms": {k: None if v is None else round(v * 1000, 1)
                                 for k, v in (q.get("queue_latency_s") or {}).items()},
            "reconcile_ms": {k: None if v is None else round(v * 1000, 1)
                             for k, v in (q.get("work_duration_s") or {}).items()},
        }
    return queues


def steady_scale(srv: StatsServer, count: int, per: int, extra: int, timeout: float) -> dict[str, Any]:
    """With every pod Ready, scale each Deployment up by `extra` at once: the controllers'
    throughput and queue latency in a fresh window, 10,000 pods in the caches."""
    info = srv.info
    assert info is not None
    srv.reset_window()
    before = srv.queue_stats()
    want = count * (per + extra)

    def scale(i: int) -> None:
        with sync_client(info) as c:
            r = c.patch(f"{APPS}/namespaces/load/deployments/d{i:03d}/scale",
                        json={"spec": {"replicas": per + extra}},
                        headers={"Content-Type": "application/merge-patch+json"})
            if r.status_code != 200:
                raise RuntimeError(f"scale d{i:03d}: {r.status_code} {r.text[:200]}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(scale, range(count)))
    ready = None
    with sync_client(info, timeout=60) as c:
        while time.monotonic() < t0 + timeout:
            items = c.get(f"{APPS}/namespaces/load/deployments").json().get("items") or []
            if sum((d.get("status") or {}).get("readyReplicas", 0) for d in items) >= want:
                ready = time.monotonic() - t0
                break
            time.sleep(0.2)
    time.sleep(2.5)
    span = ready or (time.monotonic() - t0)
    out = {"deployments_scaled": count, "pods_added": count * extra,
           "all_ready_s": None if ready is None else round(ready, 1),
           "pods_per_s": round(count * extra / span, 1),
           "queues": summarize_queues(before, srv.queue_stats(), span)}
    log(f"  +{count * extra} pods with {count * per} running: ready in {out['all_ready_s']} s; "
        + "; ".join(f"{k}: {v['reconciles_per_s']} reconciles/s, queue p50 "
                    f"{v['queue_latency_ms']['p50']} / p99 {v['queue_latency_ms']['p99']} ms, "
                    f"reconcile p99 {v['reconcile_ms']['p99']} ms"
                    for k, v in out["queues"].items()))
    return out


def part_scheduler(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    ns = argparse.Namespace(modes=["plain"], pods=a.sched_pods, paced=0, rate=50.0, idle=3.0,
                            timeout=a.timeout)
    run = sched_bench.run_nodes(a.sched_nodes, ns, tmp)
    plain = run.get("plain") or {}
    return {"nodes": a.sched_nodes, "pods": a.sched_pods,
            "pods_per_s": plain.get("pods_per_s"),
            "pods_per_s_middle_80pct": plain.get("pods_per_s_middle_80pct"),
            "backlog_s": plain.get("backlog_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 and 300 replicas, 2,000 pods")
    ap.add_argument("--scale", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--scale-nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--start-delay", type=float, default=0.05)
    ap.add_argument("--steady-extra", type=int, default=5,
                    help="pods added to each Deployment once the 10,000 are Ready")
    ap.add_argument("--sched-nodes", type=int, default=100)
    ap.add_argument("--sched-pods", type=int, default=2000)
    ap.add_argument("--skip-scheduler", action="store_true")
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args()
    if a.quick:
        a.scale, a.pods, a.nodes, a.sched_pods = [100, 300], 2000, 50, 500
    if shutil.which("kubectl") is None:
        raise SystemExit("bench.controllers needs kubectl")
    tmp = Path(tempfile.mkdtemp(prefix="fleet-ctlbench-"))
    results: dict[str, Any] = {"args": vars(a)}
    try:
        log(f"scale to Ready on {a.scale_nodes} simulated nodes")
        results["scale"] = part_scale(a, tmp)
        write_results("controllers", results)
        log(f"{a.pods} pods from {a.pods // 100} Deployments on {a.nodes} simulated nodes")
        results["throughput"] = part_throughput(a, tmp)
        write_results("controllers", results)
        if not a.skip_scheduler:
            log(f"scheduler backlog: {a.sched_pods} pods on {a.sched_nodes} nodes")
            results["scheduler"] = part_scheduler(a, tmp)
    finally:
        for f in tmp.glob("*.log"):
            text = f.read_text(errors="replace")
            if "Traceback" in text:
                results.setdefault("logs_with_tracebacks", {})[f.name] = text[-3000:]
        path = write_results("controllers", results)
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
