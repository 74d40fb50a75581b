"""Service rule update latency: endpoint change → rule live, incremental vs full rewrite.

`python -m bench.bench_service_rules [--services 1000] [--endpoints 10] [--changes 200]
[--full-rewrites 20] [--max-seconds 180]`   (root; `ip`, `nft`)

1. A network namespace of its own (`fd-bench-<random>`) holds the table, so the
   machine's own rules are never touched; it is deleted at the end (with the table).
2. `--services` ClusterIP Services with `--endpoints` ready endpoints each, as the
   agent's informers would hold them (EndpointSlices with uid and resourceVersion),
   are loaded by `ServiceRules.sync` — the function the agent's loop calls — as the
   first, full sync.
3. `--changes` times: one endpoint of one random Service moves to a new address (a new
   slice revision), and `sync` runs.  Latency = from handing over the changed objects
   to `nft -f` returning (render + diff + the kernel's transaction: the rule is live).
   Every tenth change is checked with `nft list chain` (outside the timing).
4. In the same run, `--full-rewrites` of the same kind of change applied as a full
   table rewrite (`add/delete/add table` + every chain, one transaction) — what a
   proxy without incremental updates pays per change.

Results: bench/results/service_rules.json and the "Service rules" section of
docs/benchmarks.md (ratios incremental/full; this is a shared, noisy 2-core machine).
Every loop is bounded by count and by `--max-seconds`.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from bench.common import REPO, log, machine_info, replace_doc_section, summarize_ms, write_results
from fleet.network import nft
from fleet.network.proxy_objects import Endpoint, service_ports
from fleet.network.proxy_rules import ProxyOptions, endpoint_chain
from fleet.network.service_proxy import ServiceRules

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- service-rules:begin -->", "<!-- service-rules:end -->"


def make_world(n_services: int, n_endpoints: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    services, slices = [], []
    for i in range(n_services):
        services.append({"metadata": {"namespace": "bench", "name": f"svc-{i}", "uid": f"s{i}",
                                      "resourceVersion": "1"},
                         "spec": {"type": "ClusterIP", "clusterIP": f"10.43.{i // 250}.{i % 250 + 2}",
                                  "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
        slices.append({"metadata": {"namespace": "bench", "name": f"svc-{i}-abc", "uid": f"e{i}",
                                    "resourceVersion": "1",
                                    "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
                       "addressType": "IPv4",
                       "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                       "endpoints": [{"addresses": [_pod_ip(i * n_endpoints + j)], "nodeName": "n1",
                                      "conditions": {"ready": True}} for j in range(n_endpoints)]})
    return services, slices


def _pod_ip(k: int) -> str:
    return f"10.42.{k // 250}.{k % 250 + 2}"


class Changer:
    """Moves one endpoint of one random Service to a fresh address, as a new revision."""

    def __init__(self, services: list[dict[str, Any]], slices: list[dict[str, Any]], seed: int = 7) -> None:
        self.services, self.slices = services, slices
        self.rng = random.Random(seed)
        self.next_ip = 200_000
        self.rv = 1

    def change(self) -> tuple[int, str]:
        i = self.rng.randrange(len(self.slices))
        old = self.slices[i]
        eps = [dict(e) for e in old["endpoints"]]
        j = self.rng.randrange(len(eps))
        self.next_ip += 1
        self.rv += 1
        new_ip = f"10.{100 + self.next_ip // 62500}.{self.next_ip // 250 % 250}.{self.next_ip % 250 + 2}"
        eps[j]["addresses"] = [new_ip]
        self.slices[i] = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self.rv)},
                          "endpoints": eps}
        return i, new_ip


def sh(*argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=60).stdout


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    netns_name = f"fd-bench-{uuid.uuid4().hex[:6]}"
    sh("ip", "netns", "add", netns_name)
    netns = f"/run/netns/{netns_name}"
    deadline = time.monotonic() + args.max_seconds
    try:
        services, slices = make_world(args.services, args.endpoints)
        rules = ServiceRules(ProxyOptions(node_name="n1", table="fd-bench"), netns=netns)
        t0 = time.perf_counter()
        first = await rules.sync(services, slices)
        initial = time.perf_counter() - t0
        assert first.kind == "full" and rules.applied is not None
        rule_count = rules.applied.rule_count()
        chains = len(rules.applied.chains)
        log(f"initial full sync: {initial:.3f}s ({chains} chains, {rule_count} rules+elements, "
            f"{len(first.script) / 1e6:.1f} MB of nft text)")
        changer = Changer(services, slices)

        inc_total, inc_render, inc_apply, inc_ops, inc_bytes = [], [], [], [], []
        checked = 0
        for n in range(args.changes):
            if time.monotonic() > deadline:
                log(f"time bound reached after {n} incremental changes")
                break
            i, new_ip = changer.change()
            t0 = time.perf_counter()
            res = await rules.sync(services, slices)
            inc_total.append(time.perf_counter() - t0)
            assert res.kind == "incremental", res.kind
            inc_render.append(res.render_seconds)
            inc_apply.append(res.apply_seconds)
            inc_ops.append(len(res.ops))
            inc_bytes.append(len(res.script))
            if n % 10 == 0:
                sp = service_ports(services[i])[0]
                name = endpoint_chain(sp, Endpoint(new_ip, 8080))
                out = await nft.run_nft(["list", "chain", "ip", "fd-bench", name], netns=netns)
                assert re.search(rf"dnat to {re.escape(new_ip)}:8080", out), out
                checked += 1
        log(f"incremental: {len(inc_total)} changes, p50 {summarize_ms(inc_total)['p50_ms']} ms")

        full_total, full_render, full_apply, full_bytes = [], [], [], []
        for n in range(args.full_rewrites):
            if time.monotonic() > deadline:
                log(f"time bound reached after {n} full rewrites")
                break
            changer.change()
            rules.applied = None  # forces the whole-table transaction
            t0 = time.perf_counter()
            res = await rules.sync(services, slices)
            full_total.append(time.perf_counter() - t0)
            assert res.kind == "full"
            full_render.append(res.render_seconds)
            full_apply.append(res.apply_seconds)
            full_bytes.append(len(res.script))
        log(f"full rewrite: {len(full_total)} changes, p50 {summarize_ms(full_total)['p50_ms']} ms")
    finally:
        subprocess.run(["ip", "netns", "del", netns_name], capture_output=True)

    inc, full = summarize_ms(inc_total), summarize_ms(full_total)
    return {
        "params": vars(args),
        "table": {"chains": chains, "rules_and_elements": rule_count,
                  "initial_full_sync_s": round(initial, 3)},
        "incremental": {"total": inc, "render_diff": summarize_ms(inc_render),
                        "nft_apply": summarize_ms(inc_apply),
                        "ops_median": sorted(inc_ops)[len(inc_ops) // 2] if inc_ops else None,
                        "script_bytes_median": sorted(inc_bytes)[len(inc_bytes) // 2] if inc_bytes else None,
                        "verified_live": checked},
        "full_rewrite": {"total": full, "render_script": summarize_ms(full_render),
                         "nft_apply": summarize_ms(full_apply),
                         "script_bytes_median": sorted(full_bytes)[len(full_bytes) // 2] if full_bytes else None},
        "ratio_p50": _ratio(inc["p50_ms"], full["p50_ms"]),
        "ratio_p99": _ratio(inc["p99_ms"], full["p99_ms"]),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def render_doc(res: dict[str, Any]) -> str:
    m = res.get("machine") or machine_info()
    p = res["params"]
    inc, full = res["incremental"], res["full_rewrite"]
    t = res["table"]

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:,.1f} ms"

    return "\n".join([
        BEGIN,
        f"Measured {m['date']} on {m['nproc']} CPU, Python {m['python']} "
        f"(`python -m bench.bench_service_rules`; results in `bench/results/service_rules.json`).",
        f"{p['services']:,} Services × {p['endpoints']} endpoints = {t['chains']:,} chains, "
        f"{t['rules_and_elements']:,} rules + map elements; initial full sync {t['initial_full_sync_s']} s.",
        "",
        "| metric | incremental (one transaction, changed service only) | full-table rewrite | ratio | target |",
        "|---|---|---|---|---|",
        f"| endpoint change → rule live, p50 | {ms(inc['total']['p50_ms'])} | {ms(full['total']['p50_ms'])} "
        f"| {res['ratio_p50']}× | — |",
        f"| endpoint change → rule live, p99 | {ms(inc['total']['p99_ms'])} | {ms(full['total']['p99_ms'])} "
        f"| {res['ratio_p99']}× | — |",
        f"| of which `nft -f` (kernel transaction), p50 | {ms(inc['nft_apply']['p50_ms'])} "
        f"| {ms(full['nft_apply']['p50_ms'])} | — | — |",
        f"| of which render + diff (Python), p50 | {ms(inc['render_diff']['p50_ms'])} "
        f"| {ms(full['render_script']['p50_ms'])} | — | — |",
        f"| nft text per change (median) | {inc['script_bytes_median']:,} B "
        f"| {full['script_bytes_median']:,} B | — | — |",
        "",
        f"{inc['total']['n']} incremental changes ({inc['verified_live']} checked live with "
        f"`nft list chain`), {full['total']['n']} full rewrites, same process and table.",
        END,
    ])


def update_doc(res: dict[str, Any]) -> None:
    replace_doc_section(DOC, render_doc(res), BEGIN, END, "Service rules (issue 11)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--full-rewrites", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=180.0)
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    args = ap.parse_args()
    res = trio.run(measure, args)
    path = write_results("service_rules", res)
    res["machine"] = machine_info()
    log(f"results in {path}")
    if not args.no_doc:
        update_doc(res)
        log(f"updated {DOC.relative_to(REPO)}")
    print(render_doc(res))


if __name__ == "__main__":
    if not Path("/run").exists():  # pragma: no cover
        raise SystemExit("needs Linux")
    main()
