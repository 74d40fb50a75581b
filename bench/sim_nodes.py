"""What simulated nodes cost: registration time, and server/simulator CPU and RSS at rest.

For each node count (default 1,000 and 5,000) a fresh `fleet server --no-agent`
is started and `fleet agent --simulate N` runs as its own process against it
(`fleet.agent.simulate`).  Measured:

- registration: from launching the simulator to its "registered" line (every
  Node created with its status, every Lease created), cross-checked with the
  API's node count;
- steady state: over `--sample` seconds (default 60) with Leases renewed every
  `--lease-interval` seconds (default 10) and node status every 60 s, the
  server's and the simulator's CPU% (from /proc/<pid>/stat) and RSS (VmRSS,
  sampled each second), the renewals per second the simulator achieved, and the
  worst time since a node's last renewal at the end (from the simulator's
  control endpoint: it must stay well under the 40 s Lease duration);
- how often node IPAM logged that it ran out of pod CIDRs (the default cluster
  CIDR holds 256 nodes).

Each count runs against the server as it is ("full") and, with `--variants
full,no-node-lifecycle`, against a server whose node lifecycle controller is
switched off (its `setup` and `run` replaced by no-ops before `fleet server` starts), to
tell the cost of the heartbeat writes themselves from the cost of the
controller that reads them.

Nothing here asserts a target; the numbers go to `bench/results/sim_nodes.json`.

    python -m bench.sim_nodes [--nodes 1000 5000] [--sample 60] [--lease-interval 10]
                              [--variants full,no-node-lifecycle]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from bench.common import REPO, FleetServer, auth_headers, cpu_s, rss_kib, write_results

PYTHON = sys.executable
REGISTERED = re.compile(r"Simulating (\d+) nodes .* registered in ([\d.]+)s")
CONTROL = re.compile(r"Simulator control endpoint on (http://\S+)")


class Sampler:
    """CPU seconds at both ends of a window and VmRSS each second, for several processes."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.rss: dict[str, list[int]] = {k: [] for k in pids}
        self.cpu0: dict[str, float | None] = {}
        self.cpu1: dict[str, float | None] = {}
        self.t0 = self.t1 = 0.0

    def run(self, seconds: float) -> None:
        self.t0 = time.monotonic()
        self.cpu0 = {k: cpu_s(p) for k, p in self.pids.items()}
        while time.monotonic() - self.t0 < seconds:
            for k, p in self.pids.items():
                r = rss_kib(p)
                if r is not None:
                    self.rss[k].append(r)
            time.sleep(1.0)
        self.t1 = time.monotonic()
        self.cpu1 = {k: cpu_s(p) for k, p in self.pids.items()}

    def summary(self, key: str) -> dict[str, Any]:
        c0, c1 = self.cpu0.get(key), self.cpu1.get(key)
        rss = self.rss[key]
        wall = self.t1 - self.t0
        return {
            "cpu_percent": None if c0 is None or c1 is None else round((c1 - c0) / wall * 100, 1),
            "rss_mb_mean": round(sum(rss) / len(rss) * 1024 / 1e6, 1) if rss else None,
            "rss_mb_max": round(max(rss) * 1024 / 1e6, 1) if rss else None,
            "window_s": round(wall, 1),
        }


# `fleet server` with the node lifecycle controller (a controller of the manager)
# replaced by a no-op: no handlers on the informers, a run that only waits.
_NO_NODE_LIFECYCLE = """
import math, sys, trio
import fleet.controllers.nodelifecycle as m
def _no_setup(self, ctx):
    pass
async def _off(self, ctx):
    await trio.sleep(math.inf)
m.NodeLifecycle.setup = _no_setup
m.NodeLifecycle.run = _off
from fleet.cli.main import main
sys.argv[0] = "fleet"
main()
"""


class VariantServer(FleetServer):
    """A bench server started through `python -c <stub>` instead of `python -m fleet.cli.main`."""

    stub: str | None = None

    def start(self) -> FleetServer:
        if self.stub is None:
            return super().start()
        import bench.common as common

        real = common.subprocess.Popen

        def popen(cmd: list[str], *args: Any, **kw: Any) -> subprocess.Popen[bytes]:
            if cmd[1:3] == ["-m", "fleet.cli.main"]:
                cmd = [cmd[0], "-c", self.stub or "", *cmd[3:]]
            return real(cmd, *args, **kw)

        common.subprocess.Popen = popen  # type: ignore[assignment]
        try:
            return super().start()
        finally:
            common.subprocess.Popen = real  # type: ignore[assignment]


_BUCKET = re.compile(r'fleet_apiserver_request_duration_seconds_(bucket|sum|count)\{([^}]*)\} (\S+)')


def _latency_metrics(metrics_url: str) -> dict[tuple[str, str], dict[str, float]]:
    """(resource, verb) -> {"sum": s, "count": n, "le=<bound>": cumulative count} for 200s."""
    text = httpx.get(metrics_url, timeout=30).text
    out: dict[tuple[str, str], dict[str, float]] = {}
    for kind, labels, value in _BUCKET.findall(text):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if lab.get("code") != "200":
            continue
        key = (lab.get("resource", ""), lab.get("verb", ""))
        name = f"le={lab['le']}" if kind == "bucket" else kind
        out.setdefault(key, {})[name] = float(value)
    return out


def _latency_between(before: dict[tuple[str, str], dict[str, float]],
                     after: dict[tuple[str, str], dict[str, float]],
                     key: tuple[str, str]) -> dict[str, Any]:
    """Mean and bucket-bound p50/p99 (ms) of the requests made between two scrapes."""
    a, b = after.get(key, {}), before.get(key, {})
    n = a.get("count", 0) - b.get("count", 0)
    if n <= 0:
        return {"n": 0}
    out: dict[str, Any] = {"n": int(n),
                           "mean_ms": round((a.get("sum", 0) - b.get("sum", 0)) / n * 1000, 1)}
    bounds = sorted((float(k[3:]), a[k] - b.get(k, 0)) for k in a
                    if k.startswith("le=") and k != "le=+Inf")
    for p in (50, 99):
        out[f"p{p}_le_ms"] = next((round(le * 1000, 1) for le, c in bounds if c >= n * p / 100),
                                  None)
    return out


def _control(url: str, path: str) -> dict[str, Any]:
    with httpx.Client(timeout=30) as c:
        return c.get(url + path).json()


def _node_count(server: FleetServer) -> int:
    assert server.info is not None
    with httpx.Client(base_url=server.info.base_url, headers=auth_headers(server.info.token),
                      verify=server.info.verify(), timeout=60) as c:
        body = c.get("/api/v1/nodes", params={"limit": 1}).json()
    md = body.get("metadata") or {}
    return len(body.get("items") or []) + int(md.get("remainingItemCount") or 0)


def run_one(nodes: int, sample: float, lease_interval: float,
            variant: str = "full") -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "variant": variant, "lease_interval_s": lease_interval}
    srv = VariantServer()
    srv.stub = _NO_NODE_LIFECYCLE if variant == "no-node-lifecycle" else None
    with srv as server:
        assert server.info is not None
        idle = Sampler({"server": server.pid})
        idle.run(5)
        out["server_idle"] = idle.summary("server")
        kubeconfig = server.data_dir / "data" / "admin.kubeconfig"
        log_path = server.data_dir / "simulator.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        argv = [PYTHON, "-m", "fleet.cli.main", "agent", "--simulate", str(nodes),
                "--kubeconfig", str(kubeconfig), "--lease-interval", str(lease_interval),
                "--simulate-control-port", "0", "--log-level", "WARNING"]
        with open(log_path, "wb") as log:
            t0 = time.monotonic()
            sim = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            control = None
            deadline = t0 + 600
            reg = None
            while time.monotonic() < deadline:
                if sim.poll() is not None:
                    raise RuntimeError(f"simulator exited: {log_path.read_text()[-3000:]}")
                text = log_path.read_text(errors="replace")
                m = REGISTERED.search(text)
                c = CONTROL.search(text)
                if m and c:
                    reg = time.monotonic() - t0
                    control = c.group(1)
                    out["registration_s_reported"] = float(m.group(2))
                    break
                time.sleep(0.2)
            if reg is None or control is None:
                raise RuntimeError("simulator did not finish registering in 600 s")
            out["registration_s"] = round(reg, 2)
            out["registration_nodes_per_s"] = round(nodes / reg, 1)
            out["nodes_in_api"] = _node_count(server)
            # Let the first round of staggered renewals settle before measuring.
            time.sleep(min(lease_interval, 10))
            metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            m0 = _latency_metrics(metrics_url)
            s0 = _control(control, "/stats")
            steady = Sampler({"server": server.pid, "simulator": sim.pid})
            steady.run(sample)
            s1 = _control(control, "/stats")
            m1 = _latency_metrics(metrics_url)
            out["server_latency"] = {
                "lease_patch": _latency_between(m0, m1, ("leases", "patch")),
                "node_status_patch": _latency_between(m0, m1, ("nodes/status", "patch")),
            }
            wall = steady.t1 - steady.t0
            out["server_steady"] = steady.summary("server")
            out["simulator_steady"] = steady.summary("simulator")
            out["lease_renewals_per_s"] = round((s1["lease_renewals"] - s0["lease_renewals"]) / wall, 1)
            out["lease_renewals_expected_per_s"] = round(nodes / lease_interval, 1)
            out["lease_failures"] = s1["lease_failures"]
            out["node_status_updates_per_s"] = round(
                (s1["node_status_updates"] - s0["node_status_updates"]) / wall, 1)
            ages = [n["secondsSinceRenewal"] for n in _control(control, "/nodes")["nodes"]
                    if n["secondsSinceRenewal"] is not None]
            out["max_seconds_since_renewal"] = round(max(ages), 2) if ages else None
            per_1000 = 1000 / nodes
            srv = out["server_steady"]
            if srv["cpu_percent"] is not None:
                out["server_cpu_percent_per_1000_nodes"] = round(
                    (srv["cpu_percent"] - (out["server_idle"]["cpu_percent"] or 0)) * per_1000, 1)
            if srv["rss_mb_mean"] is not None and out["server_idle"]["rss_mb_mean"] is not None:
                out["server_rss_mb_per_1000_nodes"] = round(
                    (srv["rss_mb_mean"] - out["server_idle"]["rss_mb_mean"]) * per_1000, 1)
        finally:
            if sim.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(sim.pid, signal.SIGINT)
                try:
                    sim.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.kill(sim.pid, signal.SIGKILL)
                    sim.wait(timeout=10)
        server_log = server.log_path.read_text(errors="replace")
        out["nodeipam_no_cidr_log_lines"] = server_log.count("gets no pod CIDR")
        # Simulated nodes the node lifecycle controller gave up on: heartbeats that
        # did not reach the server in time.
        out["nodes_marked_unknown_log_lines"] = server_log.count("conditions set to Unknown")
        out["server_log_lines"] = server_log.count("\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--sample", type=float, default=60.0)
    ap.add_argument("--lease-interval", type=float, default=10.0)
    ap.add_argument("--variants", default="full",
                    help="comma-separated: full, no-node-lifecycle")
    args = ap.parse_args(argv)
    runs = []
    for n in args.nodes:
        for variant in args.variants.split(","):
            print(f"simulated nodes: {n} ({variant}) ...", flush=True)
            r = run_one(n, args.sample, args.lease_interval, variant)
            print(json.dumps(r, indent=1), flush=True)
            runs.append(r)
    path = write_results("sim_nodes", {"sample_s": args.sample, "runs": runs})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
