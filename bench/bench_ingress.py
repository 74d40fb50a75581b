"""Requests/s, paced p99 and memory of the ingress engines beside nginx hand-configured as a proxy.

`python -m bench.bench_ingress [--seconds 5] [--connections 16] [--rate 1000] [--idle 1000]`
(nginx and wrk installed; loopback only; about a minute)

1. A backend: nginx (one worker) serving a static 612-byte page on 127.0.0.1.
2. Targets, each proxying to that same backend, each its own process:
   - `nginx-proxy`: nginx hand-configured as a reverse proxy (one worker, upstream
     keep-alive) — the yardstick;
   - every engine in `BENCH_ENGINES` (the built-in Trio proxy and the nginx engine,
     one nginx worker like the yardstick), started by `python -m bench.bench_ingress --serve NAME …`
     which runs `Engine(options)` and applies a one-route RouteTable;
   - `direct`: the backend itself, for scale.
3. For each target: `wrk -t1 -c<connections> -d<seconds>s` (keep-alive, closed loop)
   → requests/s; then an open-loop paced load generator (below) at `--rate` req/s for
   `--seconds` over 32 keep-alive connections → p50/p99, measured from each request's
   scheduled time, so a stall counts as latency rather than as less load.
4. RSS of the built-in engine's process with no client connection, then with `--idle`
   keep-alive connections that each made one request and now sit idle.

Results: bench/results/ingress.json and the "Ingress" section of docs/benchmarks.md
(ratios against nginx-proxy within this one run).  Targets: built-in ≥ 0.1× nginx,
p99 ≤ 10 ms at 1,000 req/s.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import (
    REPO,
    cpu_s,
    free_port,
    log,
    machine_info,
    raise_nofile_limit,
    replace_doc_section,
    rss_kib,
    summarize_ms,
    write_results,
)

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- ingress:begin -->", "<!-- ingress:end -->"

#: Engines measured, as "module:Class" so the serving subprocess can import them.
BENCH_ENGINES: dict[str, str] = {
    "builtin": "fleet.network.ingress_proxy:ProxyEngine",
    "nginx": "fleet.network.ingress_nginx:NginxEngine",
}
#: Extra constructor arguments: the nginx engine runs one worker, as the hand-configured
#: nginx it is compared with does (the same work on the same cores).
ENGINE_ARGS: dict[str, dict[str, object]] = {"nginx": {"workers": 1}}

NGINX_BACKEND = """
worker_processes 1; pid {dir}/backend.pid; error_log {dir}/backend.err warn; daemon off;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000;
  server {{ listen 127.0.0.1:{port}; location / {{ root {dir}/www; }} }} }}
"""

NGINX_PROXY = """
worker_processes 1; pid {dir}/proxy.pid; error_log {dir}/proxy.err warn; daemon off;
events {{ worker_connections 4096; }}
http {{ access_log off; keepalive_requests 1000000;
  upstream backend {{ server 127.0.0.1:{backend}; keepalive 32; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://backend; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; }} }} }}
"""


# ---- serving an engine (subprocess mode) -----------------------------------------

def serve_engine(name: str, port: int, backend: int, runtime_dir: str) -> None:
    """Run engine `name` on `port` proxying everything to 127.0.0.1:`backend`."""
    from fleet.network.routetable import (
        Backend,
        Endpoint,
        EngineOptions,
        Listener,
        Route,
        RouteTable,
        Source,
        VirtualHost,
    )

    raise_nofile_limit()
    module, cls = BENCH_ENGINES[name].split(":")
    engine_cls = getattr(importlib.import_module(module), cls)
    table = RouteTable((Listener(port, "HTTP", (VirtualHost("", (Route(
        Source("Ingress", "bench", "web"),
        backends=(Backend("bench", "web", 80, 1, (Endpoint("127.0.0.1", backend),)),)),)),)),), generation=1)

    async def main() -> None:
        engine = engine_cls(EngineOptions(bind_address="127.0.0.1", runtime_dir=runtime_dir),
                            **ENGINE_ARGS.get(name, {}))
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await engine.apply(table)
            print("ready", flush=True)
            await trio.sleep_forever()

    trio.run(main)


# ---- load ------------------------------------------------------------------------

REQUEST = b"GET / HTTP/1.1\r\nHost: bench.example\r\n\r\n"


async def _read_response(stream: trio.SocketStream, buf: bytearray) -> None:
    """Read one Content-Length response (what nginx and the engines send here)."""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            m = re.search(rb"(?i)content-length:\s*(\d+)", bytes(buf[:end]))
            total = end + 4 + (int(m.group(1)) if m else 0)
            if len(buf) >= total:
                del buf[:total]
                return
        data = await stream.receive_some(65536)
        if not data:
            raise ConnectionError("closed mid-response")
        buf += data


async def paced(port: int, rate: float, seconds: float, connections: int = 32) -> dict[str, Any]:
    """Open loop: request i is due at start + i/rate on any free keep-alive connection;
    latency counts from the due time."""
    total = int(rate * seconds)
    send, recv = trio.open_memory_channel[float](total)
    latencies: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        buf = bytearray()
        async for due in recv:
            try:
                await stream.send_all(REQUEST)
                await _read_response(stream, buf)
                latencies.append(trio.current_time() - due)
            except (OSError, trio.BrokenResourceError, ConnectionError):
                errors += 1
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                buf = bytearray()

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(worker)
        start = trio.current_time() + 0.2
        for i in range(total):
            due = start + i / rate
            await trio.sleep_until(due)
            send.send_nowait(due)
        await send.aclose()
    return {**summarize_ms(latencies), "errors": errors, "rate": rate, "seconds": seconds}


def wrk_rate(port: int, seconds: int, connections: int) -> tuple[float, int]:
    """(requests/s, requests) from wrk; non-2xx answers and socket errors are logged."""
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    n = re.search(r"(\d+) requests in", out)
    if not m or not n:
        raise RuntimeError(f"wrk printed no rate:\n{out}")
    if "Non-2xx" in out or "Socket errors" in out:
        log(f"  wrk: {[ln for ln in out.splitlines() if 'Non-2xx' in ln or 'Socket errors' in ln]}")
    return float(m.group(1)), int(n.group(1))


async def idle_rss(pid: int, port: int, idle: int) -> dict[str, Any]:
    """RSS of `pid` with no clients, then with `idle` keep-alive connections that made one request."""
    await trio.sleep(0.5)
    before = rss_kib(pid) or 0
    streams = []
    try:
        for _ in range(idle):
            s = await trio.open_tcp_stream("127.0.0.1", port)
            await s.send_all(REQUEST)
            await _read_response(s, bytearray())
            streams.append(s)
        await trio.sleep(1.0)
        after = rss_kib(pid) or 0
    finally:
        for s in streams:
            await s.aclose()
    return {"idle_connections": len(streams), "rss_kib_none": before, "rss_kib_idle": after,
            "kib_per_connection": round((after - before) / max(1, len(streams)), 2)}


# ---- orchestration -----------------------------------------------------------------

def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    base.chmod(0o755)  # nginx workers (not root) read the page
    (base / "www").mkdir(mode=0o755)
    (base / "www" / "index.html").write_text("x" * 611 + "\n")
    procs: list[subprocess.Popen] = []
    try:
        backend = free_port()
        conf = base / "backend.conf"
        conf.write_text(NGINX_BACKEND.format(dir=base, port=backend))
        procs.append(subprocess.Popen(["nginx", "-c", str(conf), "-p", str(base)], stderr=subprocess.DEVNULL))
        _wait_port(backend, procs[-1])
        targets: dict[str, int] = {"direct": backend}
        proxy = free_port()
        conf = base / "proxy.conf"
        conf.write_text(NGINX_PROXY.format(dir=base, port=proxy, backend=backend))
        procs.append(subprocess.Popen(["nginx", "-c", str(conf), "-p", str(base)], stderr=subprocess.DEVNULL))
        _wait_port(proxy, procs[-1])
        targets["nginx-proxy"] = proxy
        engine_pids: dict[str, int] = {}
        for name in args.engines:
            port = free_port()
            p = subprocess.Popen([sys.executable, "-m", "bench.bench_ingress", "--serve", name, "--port", str(port),
                                  "--backend", str(backend), "--runtime-dir", str(base / f"rt-{name}")],
                                 cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE)
            procs.append(p)
            assert p.stdout is not None
            if p.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"engine {name} did not start")
            targets[f"engine:{name}"] = port
            engine_pids[name] = p.pid
        pids = {"direct": procs[0].pid, "nginx-proxy": procs[1].pid,
                **{f"engine:{k}": v for k, v in engine_pids.items()}}
        out: dict[str, Any] = {"targets": {}}
        for name, port in targets.items():
            wrk_rate(port, 1, 4)  # warm-up (and a check that it answers)
            cpu0 = cpu_s(pids[name]) or 0.0
            rps, n = wrk_rate(port, args.seconds, args.connections)
            cpu = (cpu_s(pids[name]) or 0.0) - cpu0
            lat = trio.run(paced, port, args.rate, args.seconds)
            # CPU per request of the target's process tree: what a loaded machine cannot hide.
            us = round(cpu / n * 1e6, 1) if n else None
            out["targets"][name] = {"rps": rps, "paced": lat, "cpu_us_per_request": us}
            log(f"  {name}: {rps:,.0f} req/s, {us} µs CPU/request; at {args.rate:g}/s p50 {lat['p50_ms']} ms "
                f"p99 {lat['p99_ms']} ms ({lat['errors']} errors)")
        if "builtin" in engine_pids:
            out["builtin_memory"] = trio.run(idle_rss, engine_pids["builtin"], targets["engine:builtin"], args.idle)
            log(f"  builtin RSS: {out['builtin_memory']}")
        ref = out["targets"]["nginx-proxy"]["rps"]
        for t in out["targets"].values():
            t["ratio_to_nginx_proxy"] = round(t["rps"] / ref, 3) if ref else None
        out.update(seconds=args.seconds, connections=args.connections, rate=args.rate)
        return out
    finally:
        for p in reversed(procs):
            _stop(p)


def render_doc(res: dict[str, Any]) -> str:
    m = res["machine"]
    rows = []
    for name, t in res["targets"].items():
        p = t["paced"]
        target = ""
        if name == "engine:builtin":
            ok_rps = "met" if t["ratio_to_nginx_proxy"] >= 0.1 else "**not met**"
            ok_p99 = "met" if p["p99_ms"] is not None and p["p99_ms"] <= 10 else "**not met**"
            target = f"≥ 0.1×: {ok_rps}; p99 ≤ 10 ms: {ok_p99}"
        elif name == "engine:nginx":
            target = "≥ 0.9×: " + ("met" if t["ratio_to_nginx_proxy"] >= 0.9 else "**not met**")
        rows.append(f"| {name} | {t['rps']:,.0f}/s | {t['ratio_to_nginx_proxy']:.2f}× | "
                    f"{t['cpu_us_per_request']} µs | {p['p50_ms']} ms | {p['p99_ms']} ms | {p['errors']} | {target} |")
    mem = res.get("builtin_memory")
    note = ("CPU per request is that target's own process tree during the wrk run: on a shared "
            "machine it is the steadier figure (requests/s ratios moved by about ±10% between runs).")
    lines = [
        BEGIN, "",
        f"Measured {m['date']} on {m['cpu']}, {m['nproc']} CPU, Python {m['python']}, "
        f"load {m['loadavg_1m_at_record']:.1f}.",
        "Generated by `python -m bench.bench_ingress`: a static 612-byte page from nginx (one worker) on "
        f"loopback; requests/s from `wrk -t1 -c{res['connections']} -d{res['seconds']}s` (keep-alive); "
        f"latency from an open-loop generator at {res['rate']:g} req/s for {res['seconds']} s over 32 "
        "keep-alive connections, measured from each request's scheduled time.  `nginx-proxy` is nginx "
        "hand-configured as a reverse proxy (one worker, upstream keep-alive); `direct` is the backend itself.",
        "",
        "| target | requests/s | ratio to nginx-proxy | CPU per request | p50 paced | p99 paced | errors | target |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        note,
    ]
    if mem:
        lines += ["", f"Built-in engine memory: RSS {mem['rss_kib_none'] / 1024:.1f} MiB with no client "
                  f"connection, {mem['rss_kib_idle'] / 1024:.1f} MiB with {mem['idle_connections']:,} idle "
                  f"keep-alive connections (≈ {mem['kib_per_connection']:.1f} KiB per connection)."]
    lines += ["", END]
    return "\n".join(lines)


def update_doc(res: dict[str, Any]) -> None:
    replace_doc_section(DOC, render_doc(res), BEGIN, END, "Ingress")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--engines", nargs="*", default=list(BENCH_ENGINES))
    ap.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--backend", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--runtime-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_engine(args.serve, args.port, args.backend, args.runtime_dir)
        return
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench_ingress: needs {tool} (apt-get install {tool})")
    raise_nofile_limit()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-ingress-") as tmp:
        res = measure(args, Path(tmp))
    res["machine"] = machine_info()
    write_results("ingress", res)
    log(json.dumps({k: v["rps"] for k, v in res["targets"].items()}))
    if not args.no_doc:
        update_doc(res)


if __name__ == "__main__":
    main()
