"""Server-side apply latency beside the writes it replaces, at a paced rate (open loop).

`python -m bench.bench_apply [--rate 100] [--seconds 8] [--rounds 2]`

Small ConfigMaps, as `bench.latency`, every write tracked in managedFields:

- ``create``: POST a new ConfigMap (an Update entry for the creator);
- ``apply_create``: PATCH `application/apply-patch+yaml` to a new name (apply creates);
- ``update``: PUT one of 300 ConfigMaps with its resourceVersion;
- ``apply_update``: server-side apply of one of 300 ConfigMaps, changing one key (force);
- ``patch``: the strategic merge patch client-side `kubectl apply` sends for the same change.

Interleaved rounds, the best p99 reported with every round's p50/p99 beside it (see
bench/latency.py for why).  Not part of `run_all`; writes bench/results/bench_apply.json.
The issue's target is SSA within reach of client-side apply's PATCH; reported as ratios.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from bench.common import FleetServer, bulk_create, ensure_namespace, log, sync_client, write_results
from bench.latency import _paced

OPS = ("create", "apply_create", "update", "apply_update", "patch")


def run(srv: FleetServer, rate: float = 100.0, seconds: float = 8.0, rounds: int = 2) -> dict[str, Any]:
    assert srv.info is not None
    run_id = uuid.uuid4().hex[:6]
    ns_create, ns_upd = f"ssa-create-{run_id}", f"ssa-upd-{run_id}"
    for ns in (ns_create, ns_upd):
        ensure_namespace(srv.info, ns)
    names = [f"u{i}" for i in range(300)]
    bulk_create(srv.info, ns_upd, names)

    def current_rvs() -> dict[str, str]:
        with sync_client(srv.info) as c:
            items = c.get(f"/api/v1/namespaces/{ns_upd}/configmaps").json()["items"]
        return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}

    runs: dict[str, list[dict[str, Any]]] = {op: [] for op in OPS}
    for rnd in range(rounds):
        runs["create"].append(_paced(srv, "create", rate, seconds, namespace=ns_create,
                                     name_prefix=f"c{run_id}-{rnd}-"))
        runs["apply_create"].append(_paced(srv, "apply", rate, seconds, namespace=ns_create,
                                           name_prefix=f"a{run_id}-{rnd}-"))
        runs["update"].append(_paced(srv, "update", rate, seconds, namespace=ns_upd, names=names,
                                     resource_versions=current_rvs()))
        runs["apply_update"].append(_paced(srv, "apply", rate, seconds, namespace=ns_upd, names=names))
        runs["patch"].append(_paced(srv, "patch", rate, seconds, namespace=ns_upd, names=names))
    results: dict[str, Any] = {}
    for op, rs in runs.items():
        good = [r for r in rs if "latency" in r and r["latency"]["p99_ms"] is not None]
        if not good:
            results[op] = rs[-1]
            continue
        best = min(good, key=lambda r: r["latency"]["p99_ms"])
        results[op] = {**best, "rounds": len(rs), "rounds_p50_ms": [r["latency"]["p50_ms"] for r in good],
                       "rounds_p99_ms": [r["latency"]["p99_ms"] for r in good],
                       "server_cpu_ms_per_op": round(1000 * best["server_cpu_s"] / max(best["ok"], 1), 3)}

    def ratio(a: str, b: str, q: str) -> float | None:
        x, y = results[a].get("latency", {}).get(q), results[b].get("latency", {}).get(q)
        return round(x / y, 2) if x and y else None

    ratios = {f"{a}/{b} {q}": ratio(a, b, q) for a, b in (("apply_create", "create"), ("apply_update", "patch"),
                                                          ("apply_update", "update")) for q in ("p50_ms", "p99_ms")}
    for k, v in ratios.items():
        log(f"ratio {k}: {v}")
    return {"rate": rate, "seconds": seconds, "rounds": rounds, "ops": results, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with FleetServer() as srv:
        r = run(srv, a.rate, a.seconds, a.rounds)
    write_results("bench_apply", r)


if __name__ == "__main__":
    main()
