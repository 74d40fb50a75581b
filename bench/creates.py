"""Creates/s: 50 concurrent clients POSTing small ConfigMaps with distinct names.

`python -m bench.creates [--count 5000] [--seconds 30] [--clients 50] [--procs 2]`

Closed loop, bounded by `--count` creates or `--seconds`, whichever comes first, spread
over `--procs` load-generator processes so one Python client is not the bottleneck (see
`bench.client_ceiling` for what the client alone can do).  Target: >= 1,000 creates/s.
Also records the server's CPU seconds over the run (CPU cost per create).
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from bench.common import (
    RESULTS_DIR,
    FleetServer,
    cpu_s,
    log,
    merge_closed_loop,
    rss_mb,
    run_loadgen,
    start_profiler,
    summarize_profile,
    write_results,
)

TARGET_PER_S = 1000.0


def run(srv: FleetServer, count: int = 5000, duration: float = 30.0, clients: int = 50, procs: int = 2,
        namespace: str = "default", profile: bool = False) -> dict[str, Any]:
    assert srv.info is not None
    run_id = uuid.uuid4().hex[:6]
    start_at = time.time() + 1.5
    specs = [
        {
            **srv.info.as_args(),
            "mode": "closed",
            "op": "create",
            "namespace": namespace,
            "name_prefix": f"c{run_id}-{k}-",
            "concurrency": clients // procs + (1 if k < clients % procs else 0),
            "count": count // procs + (1 if k < count % procs else 0),
            "duration": duration,
            "start_at": start_at,
        }
        for k in range(procs)
    ]
    raw = RESULTS_DIR / "creates-profile.txt"
    prof = start_profiler(srv.pid, min(duration, 10.0), raw) if profile else None
    c0 = cpu_s(srv.pid)
    r = merge_closed_loop(run_loadgen(specs, timeout=duration + 90))
    c1 = cpu_s(srv.pid)
    if prof is not None:
        prof.wait(timeout=60)
        if raw.exists():
            r["profile"] = summarize_profile(raw)
            log(f"  profile (where server CPU goes, %): {r['profile']['buckets_pct']}")
            log(f"  profile (self %): {r['profile']['self_pct'][:12]}")
    r["server_cpu_s"] = round((c1 or 0) - (c0 or 0), 2)
    r["server_cpu_ms_per_create"] = round(1000 * r["server_cpu_s"] / r["ok"], 3) if r["ok"] else None
    r.update({"clients": clients, "procs": procs, "count_limit": count, "seconds_limit": duration,
              "target_per_s": TARGET_PER_S, "met": r["ok_per_s"] >= TARGET_PER_S,
              "server_rss_after": rss_mb(srv.pid)})
    log(f"creates: {r['ok']} ok / {r['failed']} failed in {r['wall_s']} s = {r['ok_per_s']:.0f}/s "
        f"(p50 {r['latency']['p50_ms']} ms, p99 {r['latency']['p99_ms']} ms); "
        f"server CPU {r['server_cpu_s']} s = {r['server_cpu_ms_per_create']} ms/create")
    if r["errors"]:
        log(f"  sample errors: {r['errors'][:3]}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="sample the server with py-spy")
    a = ap.parse_args()
    with FleetServer() as srv:
        r = run(srv, a.count, a.seconds, a.clients, a.procs, profile=a.profile)
    write_results("creates", r)


if __name__ == "__main__":
    main()
