"""Run every foundation benchmark in one go and rewrite the results table in docs/benchmarks.md.

`python -m bench.run_all [--quick]`

Order: the baselines first (raw SQLite, the load generator against a stub, the framework
memory floor), then one Fleet server for the rest: RSS at idle, `/healthz` throughput,
creates/s, paced latency, watch fan-out, RSS at idle again.  Each result also lands in
`bench/results/<name>.json`.  A step that fails is recorded as failed and the rest still
run.  Only the part of docs/benchmarks.md between the `results` markers is rewritten; the
hand-written analysis around it is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import client_ceiling, creates, latency, rss, sqlite_baseline, watch_fanout
from bench.common import REPO, FleetServer, log, machine_info, write_results

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _step(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    log(f"== {name}")
    load_before = os.getloadavg()[0]
    try:
        results[name] = fn()
        if isinstance(results[name], dict):
            # Other users of this shared machine: the 1-minute load before and after the step.
            results[name]["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    except Exception as e:  # noqa: BLE001 - one broken step must not hide the others
        log(f"!! {name} failed: {type(e).__name__}: {e}")
        results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    return results[name]


def wait_quiet(max_wait: float, threshold: float) -> float:
    """Wait (at most `max_wait` s) until the 1-minute load average drops below `threshold`."""
    end = time.monotonic() + max_wait
    while os.getloadavg()[0] >= threshold and time.monotonic() < end:
        time.sleep(5)
    return os.getloadavg()[0]


def run(quick: bool = False, profile: bool = False) -> dict[str, Any]:
    secs = 5.0 if quick else 10.0
    res: dict[str, Any] = {"machine": machine_info(), "quick": quick}
    _step(res, "sqlite_baseline", lambda: sqlite_baseline.run(secs))
    _step(res, "client_ceiling", lambda: {"stub": client_ceiling.stub_ceiling(duration=secs)})
    _step(res, "framework_floor_mb", rss.framework_floor_mb)
    srv = FleetServer()
    try:
        _step(res, "server_start", lambda: {"startup_s": srv.start().startup_s})
        if "error" not in res["server_start"]:
            _step(res, "rss_idle_startup", lambda: rss.idle_rss(srv))
            _step(res, "fleet_healthz", lambda: client_ceiling.fleet_healthz(srv, duration=secs))
            _step(res, "creates", lambda: creates.run(srv, count=2000 if quick else 5000,
                                                      duration=15 if quick else 30))
            _step(res, "latency", lambda: latency.run(srv, seconds=5 if quick else 12,
                                                                  rounds=1 if quick else 2))
            _step(res, "watch_fanout", lambda: watch_fanout.run(
                srv, watchers=200 if quick else 1000, events=20 if quick else 50))
            _step(res, "rss_idle_after", lambda: rss.idle_rss(srv, settle=15.0))
            if profile:
                # After the measured steps, so py-spy's sampling cannot skew them.
                _step(res, "profile_creates", lambda: creates.run(
                    srv, count=5000, duration=10, profile=True).get("profile"))
                _step(res, "profile_watch", lambda: watch_fanout.run_fanout(
                    srv, 200 if quick else 1000, 4, 20, 0.1, profile=True).get("profile"))
            res["server_alive_at_end"] = srv.alive()
            res["server_log_tail"] = srv.tail_log(20)
    finally:
        srv.stop()
    for name in ("creates", "latency", "watch_fanout"):
        if name in res:
            write_results(name, res[name])
    write_results("client_ceiling", {"stub": res.get("client_ceiling", {}).get("stub"),
                                     "fleet_healthz": res.get("fleet_healthz")})
    write_results("rss", {"framework_floor_mb": res.get("framework_floor_mb"),
                          "idle_after_startup": res.get("rss_idle_startup"),
                          "idle_after_load": res.get("rss_idle_after"), "target_mb": rss.TARGET_MB})
    write_results("run_all", res)
    return res


# --------------------------------------------------------------------------- docs


def _g(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        s = f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.2f}"
    else:
        s = f"{v:,}"
    return f"{s}{unit}"


def _ratio(a: Any, b: Any) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or a <= 0 or b <= 0:
        return "n/a"
    return f"{a / b:.2f}×"


def _met(v: Any, target: float, higher_is_better: bool) -> str:
    if not isinstance(v, int | float):
        return "not measured"
    ok = v >= target if higher_is_better else v <= target
    return "**met**" if ok else "**not met**"


def render(res: dict[str, Any]) -> str:
    m = res["machine"]
    date = m["date"].split(" ")[0]
    mach = f"{m['nproc']} CPU, Python {m['python']}"
    rows: list[tuple[str, Any, Any, str, str, str]] = []  # metric, fleet, baseline, ratio, target, unit

    def row(metric: str, fleet: Any, base: Any, target: str, unit: str = "", base_label: str = "") -> None:
        b = _fmt(base, unit) + (f" ({base_label})" if base_label and base is not None else "")
        rows.append((metric, _fmt(fleet, unit), b, _ratio(fleet, base), target, ""))

    sq = res.get("sqlite_baseline") or {}
    per_txn = _g(sq, "per_txn", "inserts_per_s")
    batch = _g(sq, "batch_50", "inserts_per_s")
    cr = res.get("creates") or {}
    cps = cr.get("ok_per_s")
    row("SQLite inserts/s, WAL + synchronous=FULL, 1 insert/txn", per_txn, None, "baseline", "/s")
    row("SQLite inserts/s, WAL + synchronous=FULL, 50 inserts/txn", batch, per_txn,
        "baseline (group-commit ceiling)", "/s", "1/txn")
    row("SQLite commit latency p99, 1 insert/txn", _g(sq, "per_txn", "commit_latency", "p99_ms"), None,
        "baseline", " ms")
    stub2 = _g(res, "client_ceiling", "stub", "procs_2", "ok_per_s")
    row("Load generator alone: GET req/s vs trivial stub server (2 procs, 50 conns)",
        stub2, None, "client ceiling", "/s")
    row("Fleet GET /healthz req/s (2 procs, 50 conns)", _g(res, "fleet_healthz", "ok_per_s"), stub2,
        "HTTP-stack ceiling", "/s", "stub")
    row("Creates/s, 50 concurrent clients, small ConfigMaps", cps, per_txn,
        f"≥ 1,000/s: {_met(cps, 1000, True)}", "/s", "SQLite 1/txn")
    row("Creates/s vs group-commit ceiling", cps, batch, "", "/s", "SQLite 50/txn")
    # Server CPU per request is far less sensitive to other users of the machine than rates.
    hz = res.get("fleet_healthz") or {}
    hz_cpu = (1000 * hz["server_cpu_s"] / hz["ok"]) if hz.get("ok") and "server_cpu_s" in hz else None
    row("Server CPU per create (closed loop), ms", cr.get("server_cpu_ms_per_create"), hz_cpu, "—", " ms",
        "per /healthz")
    if cr.get("server_cpu_ms_per_create"):
        row("CPU-bound create ceiling on one core (1000 / CPU ms per create)",
            1000 / cr["server_cpu_ms_per_create"], (1000 / hz_cpu) if hz_cpu else None,
            "≥ 1,000/s: " + _met(1000 / cr["server_cpu_ms_per_create"], 1000, True), "/s", "/healthz")
    lat = _g(res, "latency", "ops") or {}
    hz50, hz99 = _g(lat, "healthz", "latency", "p50_ms"), _g(lat, "healthz", "latency", "p99_ms")
    rate = _g(res, "latency", "rate") or 200
    rounds = _g(res, "latency", "rounds") or 1
    for op in ("create", "update", "get", "list"):
        p50, p99 = _g(lat, op, "latency", "p50_ms"), _g(lat, op, "latency", "p99_ms")
        tgt = f"p99 ≤ 50 ms: {_met(p99, 50, False)}" if op in ("create", "update") else "—"
        what = " (list of 100)" if op == "list" else ""
        best = f", best of {rounds} rounds" if rounds > 1 else ""
        row(f"{op}{what} latency p50 @ {rate:.0f}/s open loop{best}", p50, hz50, "—", " ms", "/healthz")
        row(f"{op}{what} latency p99 @ {rate:.0f}/s open loop{best}", p99, hz99, tgt, " ms", "/healthz")
    wf = res.get("watch_fanout") or {}
    fan, one = wf.get("fanout") or {}, wf.get("baseline_1_watcher") or {}
    nw = fan.get("watchers", 1000)
    for p in ("p50_ms", "p99_ms"):
        v = _g(fan, "latency", p)
        tgt = f"p99 ≤ 100 ms: {_met(v, 100, False)}" if p == "p99_ms" else "—"
        row(f"Watch event latency {p[:3]} (receive − write ack), {nw} watchers", v, _g(one, "latency", p), tgt,
            " ms", "1 watcher")
    for p in ("p50_ms", "p99_ms"):
        row(f"Watch event latency {p[:3]} (receive − write sent), {nw} watchers", _g(fan, "latency_from_send", p),
            _g(one, "latency_from_send", p), "—", " ms", "1 watcher")
    if fan:
        row(f"Watch (watcher, event) pairs missing, {nw} watchers", fan.get("pairs_missing"), None,
            f"0: {'**met**' if fan.get('pairs_missing') == 0 else '**not met**'}")
    floor = res.get("framework_floor_mb")
    for key, label in (("rss_idle_startup", "idle after start-up"), ("rss_idle_after", "idle after the benchmarks")):
        v = _g(res, key, "rss_mb")
        row(f"Server RSS, {label}", v, floor, f"≤ 100 MB: {_met(v, 100, False)}", " MB", "framework floor")

    out = [BEGIN, "", f"Measured {m['date']} on {m['cpu'] or 'unknown CPU'}, {mach}, {m['platform']}.",
           "Generated by `python -m bench.run_all`" + (" --quick" if res.get("quick") else "") + ".", "",
           "| metric | Fleet | baseline | ratio | target | date | machine |",
           "|---|---|---|---|---|---|---|"]
    for metric, fleet, base, ratio, target, _ in rows:
        out.append(f"| {metric} | {fleet} | {base} | {ratio} | {target} | {date} | {mach} |")
    out += ["", "Details:", ""]
    if cr and "error" not in cr:
        out.append(f"- creates: {cr['ok']} ok, {cr['failed']} failed in {cr['wall_s']} s over "
                   f"{cr['procs']} load-generator processes; client-side latency p50 "
                   f"{cr['latency']['p50_ms']} ms / p99 {cr['latency']['p99_ms']} ms; server CPU "
                   f"{cr['server_cpu_s']} s = {cr['server_cpu_ms_per_create']} ms per create; "
                   f"load-generator CPU {cr['client_cpu_s']} s; statuses {cr['statuses']}; server RSS right after "
                   f"{_g(cr, 'server_rss_after', 'rss_mb')} MB.")
    for op, d in lat.items():
        if "latency" in d:
            per = 1000 * d["server_cpu_s"] / d["ok"] if d["ok"] else float("nan")
            out.append(f"- {op} @ {d['rate']:.0f}/s for {d['seconds']} s: {d['ok']}/{d['scheduled']} ok, "
                       f"server CPU {per:.2f} ms per request, load-generator launch lag p99 "
                       f"{d['launch_lag_p99_ms']} ms, {d.get('connections_opened')} connections, "
                       f"p99 of each round {d.get('rounds_p99_ms')} ms, "
                       f"{d['unfinished']} unfinished, service time p99 {d['service_time']['p99_ms']} ms, "
                       f"max {d['latency']['max_ms']} ms, server CPU {d['server_cpu_s']} s, statuses {d['statuses']}"
                       + (f", list size {d['list_sizes'][:1]}" if d.get("list_sizes") else "") + ".")
    if fan:
        out.append(f"- watch: {fan['streams_connected']}/{nw} streams connected in {fan['connect_s']} s over "
                   f"{fan['procs']} processes; {fan['events_written']} writes planned "
                   f"{fan['spacing_s']} s apart, sent open loop ({fan.get('writes_sent_per_s')} writes/s "
                   f"sent); "
                   f"{fan['pairs_received']}/{fan['pairs_expected']} pairs received, "
                   f"{fan['watchers_missing_any']} watchers missed at least one event; max "
                   f"{fan['latency']['max_ms']} ms, min {fan['latency_min_ms']} ms; time until the *last* "
                   f"watcher had an event p50 {fan['last_watcher_latency']['p50_ms']} ms / p99 "
                   f"{fan['last_watcher_latency']['p99_ms']} ms; server RSS with the streams open "
                   f"{_g(fan, 'server_rss_connected', 'rss_mb')} MB; server CPU from the first write until every "
                   f"event was delivered {fan.get('server_cpu_writes_s')} s = {fan.get('server_cpu_ms_per_delivery')} "
                   f"ms per delivered (watcher, event); write (POST) latency during the fan-out p50 {_g(fan, 'write_latency', 'p50_ms')} ms"
                   f" / p99 {_g(fan, 'write_latency', 'p99_ms')} ms; load-generator CPU {fan['client_cpu_s']} s.")
    for key, what in (("profile_creates", "closed-loop creates"), ("profile_watch", "watch fan-out writes")):
        prof = res.get(key)
        if isinstance(prof, dict) and prof.get("buckets_pct"):
            out.append(f"- where the server's CPU goes during {what} (py-spy, GIL-holding samples, "
                       f"{prof['samples']} samples): "
                       + ", ".join(f"{name} {pct}%" for name, pct in prof["buckets_pct"]) + ".")
    loads = {k: v["loadavg_1m"] for k, v in res.items() if isinstance(v, dict) and "loadavg_1m" in v}
    if loads:
        out.append("- 1-minute load average (before, after) each step, from all users of this "
                   f"{m['nproc']}-CPU machine: " + ", ".join(f"{k} {v[0]}→{v[1]}" for k, v in loads.items()) + ".")
    for name in ("sqlite_baseline", "client_ceiling", "creates", "latency", "watch_fanout", "server_start"):
        if isinstance(res.get(name), dict) and "error" in res[name]:
            out.append(f"- **{name} failed**: `{res[name]['error']}`")
    out += ["", END]
    return "\n".join(out)


DOC_TEMPLATE = """# Benchmarks

The foundation benchmarks: the durable revision store and the API server, measured over
HTTP from separate load-generator processes on 127.0.0.1.  How to run them:
`bench/README.md`.  This machine is shared and noisy, so each number sits beside a
baseline measured in the same run, and the ratio is what to compare across runs.

{results}

## What limits the numbers

(Written by hand after a run; `bench/run_all.py` keeps this section.)
"""


def write_doc(res: dict[str, Any]) -> None:
    table = render(res)
    if DOC.exists() and BEGIN in DOC.read_text() and END in DOC.read_text():
        text = DOC.read_text()
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1]
        DOC.write_text(pre + table + post)
    else:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(DOC_TEMPLATE.format(results=table))
    log(f"wrote {DOC.relative_to(REPO)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs, 200 watchers (a smoke test)")
    ap.add_argument("--render-only", type=Path, help="re-render the doc from a saved run_all.json")
    ap.add_argument("--profile", action="store_true",
                    help="afterwards, sample the server with py-spy during creates and watch fan-out")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="first wait up to SECONDS for the 1-minute load average to fall below nproc/2")
    a = ap.parse_args()
    if a.wait_quiet and not a.render_only:
        threshold = max(1.0, (os.cpu_count() or 2) / 2)
        log(f"waiting up to {a.wait_quiet:.0f} s for load average < {threshold} (now {os.getloadavg()[0]:.2f})")
        log(f"load average now {wait_quiet(a.wait_quiet, threshold):.2f}")
    res = json.loads(a.render_only.read_text()) if a.render_only else run(a.quick, a.profile)
    write_doc(res)


if __name__ == "__main__":
    main()
