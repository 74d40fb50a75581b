"""Watch fan-out: 1,000 concurrent watchers on one namespace, then ~50 spaced writes.

`python -m bench.watch_fanout [--watchers 1000] [--procs 4] [--events 50] [--spacing 0.1]`

The watchers are streaming HTTP connections (`?watch=1&resourceVersion=RV`) spread over
`--procs` load-generator processes.  Once every stream has answered 200 and received a
warm-up event, this process creates `--events` ConfigMaps `--spacing` seconds apart and
notes time.time() when each create is acknowledged (open loop: write i is sent at
start + i*spacing from a few writer threads, whether or not earlier writes were answered); each watcher notes time.time() when the
event's line arrives (same machine, same clock).  Event latency = receive - ack, over every
(watcher, event) pair; a negative value means the event reached the watcher before the
writer had read its own response.  Missing pairs are counted, never guessed.

A single-watcher run first gives the baseline: the same path with no fan-out.
Target: p99 <= 100 ms with 1,000 watchers, and no missing events.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    REPO,
    RESULTS_DIR,
    FleetServer,
    _child_raise_nofile,
    configmap,
    cpu_s,
    ensure_namespace,
    log,
    rss_mb,
    start_profiler,
    summarize_ms,
    summarize_profile,
    sync_client,
    write_results,
)

TARGET_P99_MS = 100.0
WRITER_THREADS = 8


def _reader(p: subprocess.Popen, k: int, q: queue.Queue) -> None:
    assert p.stdout is not None
    for line in p.stdout:
        q.put((k, line.rstrip("\n")))
    q.put((k, None))


def _wait_for(q: queue.Queue, word: str, procs: int, timeout: float, finals: dict[int, Any]) -> dict[int, str]:
    """Collect the first line starting with `word` from each process (or give up at timeout)."""
    got: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while len(got) + len([k for k in finals if k not in got]) < procs and time.monotonic() < deadline:
        try:
            k, line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            finals.setdefault(k, {"error": "exited early"})
        elif line.startswith(word):
            got[k] = line
        elif line.startswith("{"):
            finals[k] = json.loads(line)
    return got


def run_fanout(srv: FleetServer, watchers: int, procs: int, events: int, spacing: float,
               profile: bool = False) -> dict[str, Any]:
    assert srv.info is not None
    run_id = uuid.uuid4().hex[:6]
    ns = f"watch-{run_id}"
    ensure_namespace(srv.info, ns)
    prefix = f"fan{run_id}-"
    expected = [f"{prefix}{i}" for i in range(events)]
    warm = f"{prefix}warm"
    with sync_client(srv.info) as c:
        r = c.get(f"/api/v1/namespaces/{ns}/configmaps")
        r.raise_for_status()
        rv = r.json()["metadata"]["resourceVersion"]

    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-watch-"))
    stop_file = tmp / "stop"
    connect_budget, warm_budget, grace = 120.0, 60.0, 15.0
    duration = connect_budget + warm_budget + events * spacing + grace + 30
    per = [watchers // procs + (1 if k < watchers % procs else 0) for k in range(procs)]
    q: queue.Queue = queue.Queue()
    ps: list[subprocess.Popen] = []
    finals: dict[int, Any] = {}
    acks: dict[str, float] = {}  # time.time() when the write's response arrived
    sends: dict[str, float] = {}  # time.time() just before the write was sent
    write_errors: list[str] = []
    c0 = cpu_s(srv.pid)
    t_begin = time.monotonic()
    try:
        for k, n in enumerate(per):
            spec = {
                **srv.info.as_args(),
                "mode": "watch",
                "namespace": ns,
                "watchers": n,
                "resource_version": rv,
                "name_prefix": prefix,
                "expected_names": expected,
                "warm_name": warm,
                "duration": duration,
                "connect_timeout": connect_budget,
                "stop_file": str(stop_file),
            }
            p = subprocess.Popen(
                [PYTHON, "-m", "bench.loadgen", json.dumps(spec)],
                cwd=REPO, stdout=subprocess.PIPE, stderr=open(tmp / f"stderr-{k}", "w"),  # noqa: SIM115
                stdin=subprocess.DEVNULL, text=True, preexec_fn=_child_raise_nofile,
            )
            ps.append(p)
            threading.Thread(target=_reader, args=(p, k, q), daemon=True).start()

        connected = _wait_for(q, "CONNECTED", procs, connect_budget, finals)
        n_conn = sum(int(v.split()[1]) for v in connected.values())
        t_connected = time.monotonic() - t_begin
        log(f"watch x{watchers}: {n_conn} streams connected in {t_connected:.1f} s; rss {rss_mb(srv.pid)}")
        rss_connected = rss_mb(srv.pid)

        with sync_client(srv.info) as c:
            r = c.post(f"/api/v1/namespaces/{ns}/configmaps", json=configmap(warm, ns))
            r.raise_for_status()
            warmed = _wait_for(q, "WARM", procs, warm_budget, finals)
            n_warm = sum(int(v.split()[1]) for v in warmed.values())
            log(f"watch x{watchers}: {n_warm} streams saw the warm-up event")

            raw = RESULTS_DIR / f"watch-{watchers}-profile.txt"
            prof = start_profiler(srv.pid, events * spacing + 2, raw) if profile else None
            cw0 = cpu_s(srv.pid)
            # Open loop: write i is sent at start + i*spacing whether or not earlier writes
            # were acknowledged (a few writer threads, one connection each), so a server
            # that falls behind shows up as latency, not as a slower write rate.
            writers = queue.SimpleQueue()
            for _ in range(WRITER_THREADS):
                wc = sync_client(srv.info)
                wc.get("/healthz")  # connect (TLS handshake) before the clock starts
                writers.put(wc)

            def write(name: str, scheduled: float) -> None:
                delay = scheduled - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                wc = writers.get()
                try:
                    sent = time.time()
                    r = wc.post(f"/api/v1/namespaces/{ns}/configmaps", json=configmap(name, ns))
                    ack = time.time()
                finally:
                    writers.put(wc)
                if r.status_code < 300:
                    acks[name] = ack
                    sends[name] = sent
                elif len(write_errors) < 5:
                    write_errors.append(f"{r.status_code}: {r.text[:200]}")

            t0 = time.monotonic() + 0.05
            with ThreadPoolExecutor(WRITER_THREADS) as pool:
                futures = [pool.submit(write, name, t0 + i * spacing) for i, name in enumerate(expected)]
                for f in futures:
                    with contextlib.suppress(Exception):
                        f.result(timeout=120)
            while not writers.empty():
                writers.get().close()
        # Give the events time to arrive, then tell the watchers to stop.
        end = time.monotonic() + grace
        while time.monotonic() < end and any(p.poll() is None for p in ps):
            time.sleep(0.1)
        cw1 = cpu_s(srv.pid)  # includes idle grace time, during which the server does ~nothing
        stop_file.touch()
        c1 = cpu_s(srv.pid)
        if prof is not None:
            prof.wait(timeout=60)
        for p in ps:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
        # Drain the remaining lines (final JSON results).
        _wait_for(q, "\0", procs, 5.0, finals)
    finally:
        for p in ps:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        stderr_tail = [(tmp / f"stderr-{k}").read_text()[-500:] for k in range(len(ps))]
        shutil.rmtree(tmp, ignore_errors=True)

    lat: list[float] = []
    lat_send: list[float] = []
    missing = 0
    watchers_missing = 0
    per_event_last: dict[str, float] = {}
    watch_errors: list[str] = []
    reported = 0
    for k in range(procs):
        res = finals.get(k, {"error": "no result"})
        if "error" in res or "received" not in res:
            missing += per[k] * len(acks)
            watchers_missing += per[k]
            watch_errors.append(str(res.get("error")))
            continue
        watch_errors.extend(res.get("errors", []))
        for got in res["received"]:
            reported += 1
            miss = 0
            for name, ack in acks.items():
                t = got.get(name)
                if t is None:
                    miss += 1
                    continue
                lat.append(t - ack)
                lat_send.append(t - sends[name])
                per_event_last[name] = max(per_event_last.get(name, t), t)
            missing += miss
            watchers_missing += 1 if miss else 0
    fan_done = [per_event_last[n] - acks[n] for n in per_event_last]
    out = {
        "watchers": watchers,
        "procs": procs,
        "events_written": len(acks),
        "events_planned": events,
        "spacing_s": spacing,
        "streams_connected": n_conn,
        "connect_s": round(t_connected, 2),
        "streams_warm": n_warm,
        "pairs_expected": watchers * len(acks),
        "pairs_received": len(lat),
        "pairs_missing": missing,
        "watchers_missing_any": watchers_missing,
        "latency": summarize_ms(lat),
        "latency_min_ms": round(min(lat) * 1000, 3) if lat else None,
        # Receive time - time the write was *sent*: an upper bound that includes the write.
        "latency_from_send": summarize_ms(lat_send),
        "write_latency": summarize_ms([acks[n] - sends[n] for n in acks]),
        # Writes are sent open loop, so this is the planned rate unless the writer itself lags.
        "writes_sent_per_s": round((len(sends) - 1) / (max(sends.values()) - min(sends.values())), 2)
        if len(sends) > 1 else None,
        "last_watcher_latency": summarize_ms(fan_done),
        "server_cpu_s": round((c1 or 0) - (c0 or 0), 2),
        "server_cpu_writes_s": round((cw1 or 0) - (cw0 or 0), 2),
        "server_cpu_ms_per_delivery": round(1000 * ((cw1 or 0) - (cw0 or 0)) / len(lat), 4) if lat else None,
        "server_rss_connected": rss_connected,
        "server_rss_after": rss_mb(srv.pid),
        "client_cpu_s": round(sum(f.get("cpu_s", 0) for f in finals.values() if isinstance(f, dict)), 2),
        "write_errors": write_errors,
        "watch_errors": watch_errors[:10],
        "loadgen_stderr": [s for s in stderr_tail if s.strip()][:2],
    }
    if profile and raw.exists():
        out["profile"] = summarize_profile(raw)
        log(f"  profile (where server CPU goes, %): {out['profile']['buckets_pct']}")
        log(f"  profile (self %): {out['profile']['self_pct'][:12]}")
    lt = out["latency"]
    log(f"watch x{watchers}: event latency p50 {lt['p50_ms']} ms, p99 {lt['p99_ms']} ms, "
        f"max {lt['max_ms']} ms over {len(lat)} pairs; missing {missing} pairs "
        f"({watchers_missing} watchers); last-watcher p99 {out['last_watcher_latency']['p99_ms']} ms; "
        f"from send p50 {out['latency_from_send']['p50_ms']} ms, p99 {out['latency_from_send']['p99_ms']} ms")
    return out


def run(srv: FleetServer, watchers: int = 1000, procs: int = 4, events: int = 50,
        spacing: float = 0.1, profile: bool = False) -> dict[str, Any]:
    baseline = run_fanout(srv, 1, 1, min(events, 20), spacing)
    fan = run_fanout(srv, watchers, procs, events, spacing, profile=profile)
    p99 = fan["latency"]["p99_ms"]
    return {
        "baseline_1_watcher": baseline,
        "fanout": fan,
        "target_p99_ms": TARGET_P99_MS,
        "met": p99 is not None and p99 <= TARGET_P99_MS and fan["pairs_missing"] == 0,
        "p99_ratio_vs_1_watcher": (round(p99 / baseline["latency"]["p99_ms"], 2)
                                   if p99 and baseline["latency"]["p99_ms"] else None),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--watchers", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--spacing", type=float, default=0.1)
    ap.add_argument("--profile", action="store_true", help="sample the server with py-spy while writing")
    a = ap.parse_args()
    with FleetServer() as srv:
        r = run(srv, a.watchers, a.procs, a.events, a.spacing, profile=a.profile)
    write_results("watch_fanout", r)


if __name__ == "__main__":
    main()
