"""New connections/s into a pod with 200 NetworkPolicies selecting it vs none: same pods, same client.

`python -m bench.bench_netpolicy [--policies 200] [--seconds 4] [--rounds 3] [--connections 16]`
(root; `ip`, `nft`, `nsenter`, busybox; `wrk` is installed with apt-get when missing)

1. A node of its own in network namespaces (`fp-<random>-node`, pod namespaces under a
   temporary directory): Fleet's bridge driver wires two pods, `srv` (busybox httpd
   serving a 612-byte page) and `cli`.
2. The agent's enforcer (`fleet.agent.netpolicy.PolicyEnforcer.sync`, the pass its
   informer loop runs) programs both pods' `inet fleet-policy` tables from hand-written
   objects: with no NetworkPolicy ("none": the accept-all table every pod gets), or with
   `--policies` NetworkPolicies all selecting `srv` — a mix of rules by pod label, by
   namespace and pod label, by ipBlock (with an `except`) and by named port, each
   naming its own peers (as many fake peer pods), one of them admitting `cli`.
   A third, informational path has no table in `srv` at all.
3. `wrk -H 'Connection: close'` runs in `cli` against `srv`'s pod IP, the paths
   alternating, `--rounds` times each (`--seconds` per run).  Every request is a new
   connection, so every one goes through the isolated `input` chain's set lookups —
   the worst case for a policy dataplane (established traffic is accepted by the
   chain's first rule).

Results: bench/results/netpolicy.json and the "NetworkPolicy" section of
docs/benchmarks.md (median connections/s of each path, ratio policies / none;
target ≥ 0.9×).  Bounded: rounds × seconds × 3 plus set-up (about a minute).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from bench.bench_clusterip import ensure_wrk, sh, wrk_rate
from bench.common import REPO, log, machine_info, replace_doc_section, write_results
from fleet.agent.netpolicy import EnforcerConfig, PolicyEnforcer
from fleet.network import NetworkConfig, PodRef, create_pod_netns
from fleet.network.bridge import BridgeDriver
from fleet.network.netns import delete_netns_sync, list_netns
from fleet.network.nft import apply as nft_apply
from fleet.network.policy_nft import delete_script

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- netpolicy:begin -->", "<!-- netpolicy:end -->"
POD_CIDR, CLUSTER_CIDR = "10.42.9.0/24", "10.42.0.0/16"
NODE = "n1"


def pod(name: str, uid: str, ip: str, labels: dict[str, str], ns: str = "bench",
        node: str = NODE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [
                {"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def policies(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """`n` policies selecting app=srv, their peers (fake pods on another node) and the
    peers' namespaces.  Policy 0 admits the client (label peer=p0)."""
    pols, peers, namespaces = [], [], [{"metadata": {"name": "bench", "labels": {}}}]
    for i in range(n):
        ip = f"10.42.{100 + i // 250}.{1 + i % 250}"
        kind = i % 4 if i else 0
        if kind == 0:  # pods by label, numeric port
            peer = {"podSelector": {"matchLabels": {"peer": f"p{i}"}}}
            ports: list[dict[str, Any]] = [{"protocol": "TCP", "port": 8080}]
            peers.append(pod(f"peer{i}", f"peer-{i}", ip, {"peer": f"p{i}"}, node="n2"))
        elif kind == 1:  # namespace and pod label together, a port range
            peer = {"namespaceSelector": {"matchLabels": {"team": f"t{i}"}},
                    "podSelector": {"matchLabels": {"role": "api"}}}
            ports = [{"protocol": "TCP", "port": 8000, "endPort": 8100}]
            namespaces.append({"metadata": {"name": f"team{i}", "labels": {"team": f"t{i}"}}})
            peers.append(pod(f"peer{i}", f"peer-{i}", ip, {"role": "api"}, ns=f"team{i}", node="n2"))
        elif kind == 2:  # an ipBlock with an except
            peer = {"ipBlock": {"cidr": f"172.{16 + i % 16}.{i // 16}.0/24",
                                "except": [f"172.{16 + i % 16}.{i // 16}.128/25"]}}
            ports = [{"protocol": "TCP", "port": 8080}, {"protocol": "UDP", "port": 5353}]
        else:  # a named port
            peer = {"podSelector": {"matchLabels": {"peer": f"p{i}"}}}
            ports = [{"port": "http"}]
            peers.append(pod(f"peer{i}", f"peer-{i}", ip, {"peer": f"p{i}"}, node="n2"))
        pols.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": {"name": f"np{i}", "namespace": "bench"},
                     "spec": {"podSelector": {"matchLabels": {"app": "srv"}},
                              "policyTypes": ["Ingress"],
                              "ingress": [{"from": [peer], "ports": ports}]}})
    return pols, peers, namespaces


async def measure(args: argparse.Namespace, wrk: str, base: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    node = f"fp-{tag}-node"
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
                                            options={"bridge": "fpbr0", "nft_table": "fp_fleet"}))
        pods: dict[str, tuple[str, str, str]] = {}
        for name in ("srv", "cli"):
            ref = PodRef(uid=f"fp-{name}-{tag}", namespace="bench", name=name)
            ns = await create_pod_netns(ref.uid, pod_dir)
            net = await driver.setup(ref, ns)
            assert net.pod_ip
            pods[name] = (ref.uid, ns, net.pod_ip)
        (srv_uid, srv_ns, srv_ip), (cli_uid, cli_ns, cli_ip) = pods["srv"], pods["cli"]
        for ns in (srv_ns, cli_ns):  # see bench_clusterip: TIME_WAIT would measure port reuse
            sh("nsenter", f"--net={ns}", "sysctl", "-qw", "net.ipv4.tcp_max_tw_buckets=0")
        httpd = subprocess.Popen(["nsenter", f"--net={srv_ns}", "busybox", "httpd", "-f", "-p", "8080",
                                  "-h", str(www)])
        pols, peers, namespaces = policies(args.policies)
        world: dict[str, list[dict[str, Any]]] = {
            "policies": [], "namespaces": namespaces, "services": [], "slices": [],
            "pods": [pod("srv", srv_uid, srv_ip, {"app": "srv"}),
                     pod("cli", cli_uid, cli_ip, {"peer": "p0"}), *peers]}
        enforcer = PolicyEnforcer(EnforcerConfig(node_name=NODE, netns_dir=str(pod_dir),
                                                 always_allow=(str(driver.gateway),)))
        for key in world:
            enforcer.sources[key] = lambda key=key: world[key]

        async def program(path: str) -> float:
            t0 = time.perf_counter()
            if path == "no-table":
                await nft_apply(delete_script(), netns=srv_ns)
                enforcer.applied.pop(srv_uid, None)  # the next pass re-applies
                return time.perf_counter() - t0
            world["policies"] = pols if path == "policies" else []
            report, _ = await enforcer.sync()
            assert not report.failed, report
            return time.perf_counter() - t0

        url = f"http://{srv_ip}:8080/"
        program_seconds: dict[str, list[float]] = {}
        for path in ("none", "policies"):  # warm each path, and check it answers
            program_seconds.setdefault(path, []).append(await program(path))
            wrk_rate(wrk, cli_ns, url, 1, 2, close=True)
        rules_text = enforcer.applied[srv_uid]
        # The measured path really is the isolated one, admitting the client by its label.
        assert "policy drop" in rules_text and cli_ip in rules_text, rules_text[:2000]
        paths = ("none", "policies", "no-table")
        rates: dict[str, list[float]] = {p: [] for p in paths}
        for r in range(args.rounds):
            for path in paths if r % 2 == 0 else tuple(reversed(paths)):
                program_seconds.setdefault(path, []).append(await program(path))
                rate = await trio.to_thread.run_sync(
                    lambda: wrk_rate(wrk, cli_ns, url, args.seconds, args.connections, close=True))
                rates[path].append(rate)
                log(f"  round {r + 1} {path}: {rate:,.0f} connections/s")
        med = {p: statistics.median(v) for p, v in rates.items()}
        return {"policies": args.policies, "none_cps": med["none"], "policies_cps": med["policies"],
                "no_table_cps": med["no-table"], "ratio": med["policies"] / med["none"],
                "ratio_vs_no_table": med["policies"] / med["no-table"],
                "program_seconds": {p: statistics.median(v) for p, v in program_seconds.items()},
                "table_lines": rules_text.count("\n"), "rounds": rates, "seconds": args.seconds,
                "connections": args.connections}
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
    ps = res["program_seconds"]
    return "\n".join([
        BEGIN,
        "",
        f"Measured {m['date']} on {m['cpu']}, {m['nproc']} CPU, Python {m['python']}, load {m['loadavg_1m_at_record']:.1f}.",
        "Generated by `python -m bench.bench_netpolicy` (wrk `-H 'Connection: close'`, one thread, "
        f"{res['connections']} connections, {res['seconds']} s per run, median of "
        f"{len(res['rounds']['none'])} alternating runs; every request is a new connection into "
        "the server pod, through its `inet fleet-policy` input chain).",
        "",
        "| metric | Fleet (policies) | baseline | ratio | target |",
        "|---|---|---|---|---|",
        f"| new connections/s into a pod, {res['policies']} NetworkPolicies selecting it vs none "
        f"| {res['policies_cps']:,.0f}/s | {res['none_cps']:,.0f}/s | {res['ratio']:.2f}× | ≥ 0.9×: {ok} |",
        f"| the same vs no policy table in the pod at all (informational) | {res['policies_cps']:,.0f}/s "
        f"| {res['no_table_cps']:,.0f}/s | {res['ratio_vs_no_table']:.2f}× | — |",
        "",
        f"Programming the server pod (compute its rules from {res['policies']} policies, render, "
        f"`nft -f` in its netns; {res['table_lines']} lines): {ps['policies'] * 1000:,.0f} ms; "
        f"with no policy: {ps['none'] * 1000:,.0f} ms.",
        "",
        END,
    ])


def update_doc(res: dict[str, Any]) -> None:
    replace_doc_section(DOC, render_doc(res), BEGIN, END, "NetworkPolicy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", type=int, default=200)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md alone")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_netpolicy: needs root (network namespaces, nftables)")
    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-np-") as tmp:
        res = trio.run(measure, args, wrk, Path(tmp))
    res["machine"] = machine_info()
    write_results("netpolicy", res)
    log(f"none {res['none_cps']:,.0f} conn/s, {res['policies']} policies {res['policies_cps']:,.0f} "
        f"conn/s, ratio {res['ratio']:.2f} (no table: {res['no_table_cps']:,.0f} conn/s)")
    if not args.no_doc:
        update_doc(res)


if __name__ == "__main__":
    main()
