"""Requests/s through a ClusterIP vs straight to the pod IP: same backend, same client.

`python -m bench.bench_clusterip [--seconds 5] [--rounds 3] [--connections 16]`
(root; `ip`, `nft`, `nsenter`, busybox; `wrk` is installed with apt-get when missing)

1. A node of its own in network namespaces (`fc-<random>-node`, pod namespaces under a
   temporary directory): Fleet's bridge driver wires two pods, `srv` (busybox httpd
   serving a 612-byte page, nginx's default page size) and `cli`.
2. `ServiceRules.sync` — what the agent's informer loop calls — programs one
   ClusterIP Service (port 80 → the pod's 8080) into the node's `fleet-proxy`-style
   table, so the ClusterIP path is the kernel's DNAT with conntrack, nothing else.
3. `wrk` runs in `cli` against the pod IP and against the ClusterIP, alternating,
   `--rounds` times each (`--seconds` per run).  busybox httpd closes every
   connection, so every request is a new connection: each one pays the NAT lookup
   and a conntrack entry, the worst case for a DNAT dataplane.

Results: bench/results/clusterip.json and the "ClusterIP throughput" section of
docs/benchmarks.md (median requests/s of each path, ratio ClusterIP / pod IP;
target ≥ 0.9×).  Bounded: rounds × seconds × 2 plus set-up.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import trio

from bench.common import REPO, log, machine_info, replace_doc_section, write_results
from fleet.network import NetworkConfig, PodRef, create_pod_netns
from fleet.network.bridge import BridgeDriver
from fleet.network.netns import delete_netns_sync, list_netns
from fleet.network.proxy_rules import ProxyOptions
from fleet.network.service_proxy import ServiceRules

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- clusterip:begin -->", "<!-- clusterip:end -->"
POD_CIDR, CLUSTER_CIDR, SERVICE_CIDR = "10.42.9.0/24", "10.42.0.0/16", "10.43.0.0/16"
CIP = "10.43.9.10"


def sh(*argv: str) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} -> {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    if os.geteuid() != 0:
        raise SystemExit("bench_clusterip: needs wrk (apt-get install wrk) and root")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which("wrk") or "wrk"


def wrk_rate(wrk: str, netns: str, url: str, seconds: int, connections: int, *,
             close: bool = False) -> float:
    """wrk's requests/s from `netns` (`close`: a new connection per request, whatever
    the server does)."""
    hdr = ["-H", "Connection: close"] if close else []
    out = sh("nsenter", f"--net={netns}", wrk, "-t1", f"-c{connections}", f"-d{seconds}s", *hdr, url)
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise RuntimeError(f"wrk printed no rate:\n{out}")
    errors = re.search(r"Socket errors: (.*)", out)
    if errors:
        log(f"  wrk socket errors ({url}): {errors.group(1)}")
    return float(m.group(1))


def service() -> dict[str, Any]:
    return {"metadata": {"namespace": "bench", "name": "web", "uid": "s1", "resourceVersion": "1"},
            "spec": {"type": "ClusterIP", "clusterIP": CIP,
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}


def endpoint_slice(ip: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "bench", "name": "web-1", "uid": "e1", "resourceVersion": "1",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "nodeName": "n1", "conditions": {"ready": True}}]}


async def measure(args: argparse.Namespace, wrk: str, base: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    node = f"fc-{tag}-node"
    pod_dir = base / "netns"
    www = base / "www"
    www.mkdir()
    (www / "index.html").write_text("x" * 611 + "\n")
    httpd: subprocess.Popen[bytes] | None = None
    sh("ip", "netns", "add", node)
    try:
        sh("ip", "-n", node, "link", "set", "lo", "up")
        node_ns = f"/run/netns/{node}"
        driver = BridgeDriver(NetworkConfig(pod_cidr=POD_CIDR, state_dir=str(base / "state"),
                                            cluster_cidr=CLUSTER_CIDR, host_netns=node_ns,
                                            options={"bridge": "fcbr0", "nft_table": "fc_fleet"}))
        pods = {}
        for name in ("srv", "cli"):
            ref = PodRef(uid=f"fc-{name}-{tag}", namespace="bench", name=name)
            ns = await create_pod_netns(ref.uid, pod_dir)
            net = await driver.setup(ref, ns)
            assert net.pod_ip
            pods[name] = (ns, net.pod_ip)
        srv_ns, srv_ip = pods["srv"]
        cli_ns, _ = pods["cli"]
        # busybox httpd closes first, so every request leaves a TIME_WAIT socket in the
        # server pod; at thousands of connections/s the client soon reuses ports still
        # in TIME_WAIT there and waits out SYN retransmits — measuring the port space,
        # not the path.  No TIME_WAIT buckets in the pods (per-netns sysctl) avoids it.
        for ns in (srv_ns, cli_ns):
            sh("nsenter", f"--net={ns}", "sysctl", "-qw", "net.ipv4.tcp_max_tw_buckets=0")
        httpd = subprocess.Popen(["nsenter", f"--net={srv_ns}", "busybox", "httpd", "-f", "-p", "8080",
                                  "-h", str(www)])
        rules = ServiceRules(ProxyOptions(node_name="n1", node_ips=(), cluster_cidr=CLUSTER_CIDR,
                                          service_cidr=SERVICE_CIDR, table="fc-proxy"), netns=node_ns)
        await rules.sync([service()], [endpoint_slice(srv_ip)])
        urls = {"pod": f"http://{srv_ip}:8080/", "clusterip": f"http://{CIP}:80/"}
        # Warm both paths (and check they answer) before measuring.
        for url in urls.values():
            wrk_rate(wrk, cli_ns, url, 1, 2)
        rates: dict[str, list[float]] = {"pod": [], "clusterip": []}
        for r in range(args.rounds):
            for path in ("pod", "clusterip") if r % 2 == 0 else ("clusterip", "pod"):
                rate = await trio.to_thread.run_sync(wrk_rate, wrk, cli_ns, urls[path], args.seconds,
                                                     args.connections)
                rates[path].append(rate)
                log(f"  round {r + 1} {path}: {rate:,.0f} req/s")
        pod_rate = statistics.median(rates["pod"])
        cip_rate = statistics.median(rates["clusterip"])
        return {"pod_ip_rps": pod_rate, "clusterip_rps": cip_rate, "ratio": cip_rate / pod_rate,
                "rounds": rates, "seconds": args.seconds, "connections": args.connections}
    finally:
        if httpd is not None:
            httpd.kill()
            httpd.wait()
        for path in list_netns(pod_dir):
            delete_netns_sync(path)
        if pod_dir.exists():
            subprocess.run(["umount", "-l", str(pod_dir)], capture_output=True)
        subprocess.run(["ip", "netns", "del", node], capture_output=True)


def render_doc(res: dict[str, Any]) -> str:
    m = res["machine"]
    ok = "met" if res["ratio"] >= 0.9 else "**not met**"
    return "\n".join([
        BEGIN,
        "",
        f"Measured {m['date']} on {m['cpu']}, {m['nproc']} CPU, Python {m['python']}, load {m['loadavg_1m_at_record']:.1f}.",
        "Generated by `python -m bench.bench_clusterip` (wrk, one thread, "
        f"{res['connections']} connections, {res['seconds']} s per run, median of "
        f"{len(res['rounds']['pod'])} alternating runs; busybox httpd closes every connection, "
        "so each request is a new connection through DNAT and conntrack).",
        "",
        "| metric | Fleet (ClusterIP) | baseline (pod IP) | ratio | target |",
        "|---|---|---|---|---|",
        f"| requests/s, pod → Service ClusterIP vs pod → pod IP | {res['clusterip_rps']:,.0f}/s | "
        f"{res['pod_ip_rps']:,.0f}/s | {res['ratio']:.2f}× | ≥ 0.9×: {ok} |",
        "",
        END,
    ])


def update_doc(res: dict[str, Any]) -> None:
    replace_doc_section(DOC, render_doc(res), BEGIN, END, "ClusterIP throughput")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_clusterip: needs root (network namespaces, nftables)")
    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-cip-") as tmp:
        res = trio.run(measure, args, wrk, Path(tmp))
    res["machine"] = machine_info()
    write_results("clusterip", res)
    log(f"pod IP {res['pod_ip_rps']:,.0f} req/s, ClusterIP {res['clusterip_rps']:,.0f} req/s, "
        f"ratio {res['ratio']:.2f}")
    if not args.no_doc:
        update_doc(res)


if __name__ == "__main__":
    main()
