"""Cluster DNS: queries/s and latency for cluster names, Fleet vs dnsmasq, in one run.

Fleet's server (`fleet server --no-agent`, its DNS listener on a loopback port) serves
N Services created through the API; dnsmasq serves the same names and addresses from
a hosts file (`--addn-hosts`, `--local-ttl 5`, no upstream).  Both on 127.0.0.1, both
asked by the same client — a separate process (`python -m bench.bench_dns --client`)
with pre-built queries over one UDP socket — in alternating rounds:

* **throughput**: closed loop, `window` queries in flight, `seconds` per round →
  queries/s, p50/p99 latency, and the server's CPU per query (from /proc: the
  comparison that does not depend on how fast the client is);
* **latency**: one query in flight (round trips), p50/p99;
* **throughput, misses**: as the first, every query naming a different Service that
  does not exist (NXDOMAIN; dnsmasq is `--local=/cluster.local/` for that), so Fleet's
  answer cache never hits: the cost of building each answer.

The best round of each server is reported and the ratios Fleet/dnsmasq (≥ 0.5× is the
target for queries/s).  dnsmasq comes from Debian's `dnsmasq-base` (the binary without
the system service); run as root, the bench installs it with apt-get when missing.
Every loop is bounded in count and time; processes are stopped by pid.

    python -m bench.bench_dns [--services 200] [--seconds 5] [--rounds 2] [--window 32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    REPO,
    FleetServer,
    cpu_s,
    ensure_namespace,
    free_port,
    percentile,
    sync_client,
    write_results,
)

NS = "fs-bench-dns"
ZONE = "cluster.local"


# --------------------------------------------------------------------------- the client


def _query(qid: int, name: str) -> bytes:
    q = qid.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00\x00\x01\x00\x01"  # A, IN


def client(port: int, names: list[str], seconds: float, window: int, max_queries: int,
           misses: bool = False) -> dict[str, Any]:
    """Closed loop: keep `window` queries in flight for `seconds` (or `max_queries`).
    `misses`: every query names a different Service that does not exist (NXDOMAIN is
    the right answer), so no answer cache helps: each answer is built."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    rng = random.Random(2)
    packets = [_query(i, f"m{i}-{rng.randrange(1 << 30)}.{NS}.svc.{ZONE}" if misses
                      else names[i % len(names)]) for i in range(65536)]
    pending: dict[int, float] = {}
    lat: list[float] = []
    sent = ok = bad = lost = 0
    nxt = 0
    start = time.perf_counter()
    end = start + seconds
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        now = time.perf_counter()
        if now >= end or sent >= max_queries:
            break
        while len(pending) < window and sent < max_queries:
            qid = nxt
            nxt = (nxt + 1) & 0xFFFF
            if qid in pending:  # wrapped onto a query still out: count it lost
                del pending[qid]
                lost += 1
            pending[qid] = time.perf_counter()
            try:
                sock.send(packets[qid])
            except BlockingIOError:
                del pending[qid]
                break
            sent += 1
        if not poller.poll(50):
            # Nothing for 50 ms: whatever is out that long is lost (UDP).
            cutoff = time.perf_counter() - 1.0
            for qid in [q for q, t in pending.items() if t < cutoff]:
                del pending[qid]
                lost += 1
            continue
        while True:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                break
            t = time.perf_counter()
            qid = int.from_bytes(data[:2], "big")
            t0 = pending.pop(qid, None)
            if t0 is None:
                continue
            lat.append(t - t0)
            # NOERROR with at least one answer.
            rcode = data[3] & 0x0F if len(data) >= 12 else -1
            if (rcode == 3 if misses else rcode == 0 and int.from_bytes(data[6:8], "big") >= 1):
                ok += 1
            else:
                bad += 1
    wall = time.perf_counter() - start
    sock.close()
    # `lost`: no answer within 1 s; `in_flight_at_end`: still out when time was up.
    return {"sent": sent, "ok": ok, "bad": bad, "lost": lost, "in_flight_at_end": len(pending),
            "seconds": wall,
            "qps": ok / wall if wall else 0.0,
            "p50_ms": _ms(percentile(lat, 50)), "p99_ms": _ms(percentile(lat, 99))}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


def run_client(port: int, names_file: Path, seconds: float, window: int, max_queries: int,
               server_pid: int, misses: bool = False) -> dict[str, Any]:
    """One client round in its own process; adds the server's CPU per query."""
    cpu0 = cpu_s(server_pid)
    p = subprocess.run([PYTHON, "-m", "bench.bench_dns", "--client", str(port), str(names_file),
                        str(seconds), str(window), str(max_queries), str(int(misses))],
                       cwd=REPO, capture_output=True, text=True, timeout=seconds + 30)
    cpu1 = cpu_s(server_pid)
    if p.returncode != 0:
        raise RuntimeError(f"client failed: {p.stderr[-2000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    if cpu0 is not None and cpu1 is not None and res["ok"]:
        res["server_cpu_us_per_query"] = round((cpu1 - cpu0) / (res["ok"] + res["bad"]) * 1e6, 2)
    return res


# --------------------------------------------------------------------------- the servers


def ensure_dnsmasq() -> str:
    path = shutil.which("dnsmasq") or ("/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq") else None)
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "dnsmasq-base"], check=True, env=env,
                       timeout=600, stdout=subprocess.DEVNULL)
        path = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        if os.path.exists(path):
            return path
    sys.exit("bench_dns: dnsmasq is not installed (apt-get install dnsmasq-base, as root)")


def start_dnsmasq(binary: str, hosts: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [binary, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
           f"--addn-hosts={hosts}", f"--local=/{ZONE}/", "--listen-address=127.0.0.1", "--bind-interfaces",
           f"--port={port}", "--local-ttl=5", "--user=root", "--pid-file=",
           "--log-facility=-", "--cache-size=10000"]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def wait_answers(port: int, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        while time.monotonic() < deadline:
            try:
                s.sendto(_query(7, name), ("127.0.0.1", port))
                data = s.recv(4096)
                if data[3] & 0x0F == 0 and int.from_bytes(data[6:8], "big") >= 1:
                    return
            except OSError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"no answer for {name} on port {port} after {timeout}s")


def create_services(srv: FleetServer, n: int) -> list[tuple[str, str]]:
    """n Services with explicit ClusterIPs; returns (name, ip)."""
    assert srv.info is not None
    ensure_namespace(srv.info, NS)
    out = []
    with sync_client(srv.info) as c:
        for i in range(n):
            ip = f"10.43.{200 + i // 250}.{1 + i % 250}"
            name = f"svc-{i:04d}"
            r = c.post(f"/api/v1/namespaces/{NS}/services", json={
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"clusterIP": ip, "selector": {"app": name},
                         "ports": [{"name": "http", "port": 80}]}})
            if r.status_code not in (201, 409):
                raise RuntimeError(f"creating {name}: {r.status_code} {r.text[:300]}")
            out.append((name, (r.json().get("spec") or {}).get("clusterIP") or ip))
    return out


def best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rounds, key=lambda r: r["qps"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--max-queries", type=int, default=2_000_000)
    args = ap.parse_args(argv)
    binary = ensure_dnsmasq()
    work = Path(tempfile.mkdtemp(prefix="fs-bench-dns-"))
    fleet_port, dnsmasq_port = free_port(), free_port()
    srv = FleetServer(extra_args=["--cluster-dns-bind", f"127.0.0.1:{fleet_port}",
                                  "--dns-upstream", "127.0.0.1:9"])
    dnsmasq: subprocess.Popen[bytes] | None = None
    try:
        srv.start()
        services = create_services(srv, args.services)
        fqdns = [f"{n}.{NS}.svc.{ZONE}" for n, _ in services]
        hosts = work / "hosts"
        hosts.write_text("".join(f"{ip} {f}\n" for (_, ip), f in zip(services, fqdns, strict=True)))
        names_file = work / "names"
        shuffled = fqdns[:]
        random.Random(1).shuffle(shuffled)
        names_file.write_text("\n".join(shuffled) + "\n")
        dnsmasq = start_dnsmasq(binary, hosts, dnsmasq_port)
        wait_answers(fleet_port, fqdns[-1])
        wait_answers(dnsmasq_port, fqdns[-1])
        targets = {"fleet": (fleet_port, srv.pid), "dnsmasq": (dnsmasq_port, dnsmasq.pid)}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            k: {"throughput": [], "latency": [], "throughput_misses": []} for k in targets}
        for _ in range(args.rounds):
            for name, (port, pid) in targets.items():
                runs[name]["throughput"].append(run_client(port, names_file, args.seconds, args.window,
                                                           args.max_queries, pid))
                runs[name]["latency"].append(run_client(port, names_file, min(args.seconds, 3.0), 1,
                                                        args.max_queries, pid))
                runs[name]["throughput_misses"].append(run_client(
                    port, names_file, args.seconds, args.window, args.max_queries, pid, misses=True))
        summary: dict[str, Any] = {}
        for name in targets:
            summary[name] = {k: best(v) for k, v in runs[name].items()}
        f, d = summary["fleet"], summary["dnsmasq"]
        ratios: dict[str, Any] = {
            "qps": round(f["throughput"]["qps"] / d["throughput"]["qps"], 3),
            "p99_under_load": round(f["throughput"]["p99_ms"] / d["throughput"]["p99_ms"], 3),
            "p99_round_trip": round(f["latency"]["p99_ms"] / d["latency"]["p99_ms"], 3),
            "qps_misses": round(f["throughput_misses"]["qps"] / d["throughput_misses"]["qps"], 3),
        }
        # Rounds run back to back, so each round's pair saw about the same machine load.
        ratios["qps_per_round"] = [round(a["qps"] / b["qps"], 3) for a, b in
                                   zip(runs["fleet"]["throughput"], runs["dnsmasq"]["throughput"], strict=True)]
        fc, dc = f["throughput"].get("server_cpu_us_per_query"), d["throughput"].get("server_cpu_us_per_query")
        if fc and dc:
            ratios["server_cpu_per_query"] = round(fc / dc, 3)
        result = {"services": args.services, "seconds": args.seconds, "window": args.window,
                  "rounds": runs, "best": summary, "ratios_fleet_over_dnsmasq": ratios,
                  "target": "qps ratio >= 0.5", "met": ratios["qps"] >= 0.5}
        path = write_results("dns", result)
        print(json.dumps({"best": summary, "ratios_fleet_over_dnsmasq": ratios,
                          "met": result["met"], "results": str(path)}, indent=2))
        return 0
    finally:
        if dnsmasq is not None:
            stop(dnsmasq)
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, names_path, seconds, window, max_q, mix = sys.argv[2:8]
        names = [n for n in Path(names_path).read_text().split() if n]
        print(json.dumps(client(int(port), names, float(seconds), int(window), int(max_q),
                                misses=mix == "1")))
        sys.exit(0)
    sys.exit(main())
