"""What security costs: request latency and creates/s with TLS client certificates, RBAC and
the audit log on, beside the same server with authorization always-allow and audit off.

`python -m bench.bench_security [--rate 200] [--seconds 8] [--rounds 2] [--creates-seconds 10]`

Two `fleet server`s (no agent) run side by side in one run:

- **baseline**: `--authorization-mode AlwaysAllow`, no audit log, the client authenticates
  with the static admin bearer token;
- **secured**: `--authorization-mode Node,RBAC`, `--audit-log-path` (the default policy:
  Metadata for every request), and the client is an ordinary user: a client certificate
  (CN=bench-user) issued through the CertificateSigningRequest API
  (`kubernetes.io/kube-apiserver-client`, approved by the admin), allowed by a RoleBinding to
  `edit` in the benchmark's namespaces — so every request is authenticated by x509,
  authorized by RBAC (not the system:masters bypass) and audited.

The operations alternate between the two servers round by round (paced open-loop get and
create at `--rate`, then closed-loop creates for `--creates-seconds`), so a burst from
another user of this shared machine lands on both.  Reported: p50/p99 of each, creates/s,
and the secured/baseline ratios.  Target: overhead ≤ 20% (p50 and creates/s).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    FleetServer,
    ServerInfo,
    bulk_create,
    ensure_namespace,
    log,
    merge_closed_loop,
    replace_doc_section,
    run_loadgen,
    summarize_ms,
    sync_client,
    write_results,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench_security:begin -->", "<!-- bench_security:end -->"
TARGET_OVERHEAD = 0.20
USER = "bench-user"


def user_credentials(admin: ServerInfo, namespaces: list[str]) -> ServerInfo:
    """A client certificate for USER through the CSR API, bound to `edit` in `namespaces`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, USER),
                                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "bench")]))
           .sign(key, hashes.SHA256()))
    name = f"bench-{uuid.uuid4().hex[:6]}"
    with sync_client(admin) as c:
        r = c.post("/apis/certificates.k8s.io/v1/certificatesigningrequests", json={
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {"request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
                     "signerName": "kubernetes.io/kube-apiserver-client",
                     "usages": ["digital signature", "client auth"]}})
        r.raise_for_status()
        csr_obj = r.json()
        csr_obj.setdefault("status", {})["conditions"] = [{
            "type": "Approved", "status": "True", "reason": "BenchApprove", "message": "bench",
            "lastUpdateTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}]
        path = f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}"
        c.put(path + "/approval", json=csr_obj).raise_for_status()
        deadline = time.monotonic() + 30
        cert = ""
        while time.monotonic() < deadline and not cert:
            cert = c.get(path).json().get("status", {}).get("certificate", "")
            time.sleep(0.1)
        if not cert:
            raise RuntimeError("the bench user's CSR was not signed within 30 s")
        for ns in namespaces:
            c.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", json={
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "bench-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
            }).raise_for_status()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return ServerInfo(admin.base_url, None, admin.ca_pem, base64.b64decode(cert).decode(), key_pem)


def _paced(info: ServerInfo, op: str, rate: float, seconds: float, **extra: Any) -> dict[str, Any]:
    spec = {**info.as_args(), "mode": "paced", "op": op, "rate": rate, "duration": seconds,
            "start_at": time.time() + 1.5, **extra}
    (r,) = run_loadgen([spec], timeout=seconds + 90)
    if "error" in r:
        raise RuntimeError(f"{op}: {r['error']} {r.get('stderr', '')[-500:]}")
    return {"ok": r["ok"], "scheduled": r["scheduled"], "statuses": r["statuses"],
            "latency": summarize_ms(r["latencies"])}


def _creates(info: ServerInfo, ns: str, seconds: float, clients: int = 20) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    start_at = time.time() + 1.5
    specs = [{**info.as_args(), "mode": "closed", "op": "create", "namespace": ns,
              "name_prefix": f"c{run_id}-{k}-", "concurrency": clients // 2, "count": 100_000,
              "duration": seconds, "start_at": start_at} for k in range(2)]
    r = merge_closed_loop(run_loadgen(specs, timeout=seconds + 90))
    return {"ok": r["ok"], "failed": r["failed"], "ok_per_s": r["ok_per_s"], "latency": r["latency"],
            "statuses": r["statuses"]}


def run(rate: float, seconds: float, rounds: int, creates_seconds: float) -> dict[str, Any]:
    servers = {
        "baseline": FleetServer(extra_args=["--authorization-mode", "AlwaysAllow"]),
        "secured": FleetServer(extra_args=["--authorization-mode", "Node,RBAC"]),
    }
    servers["secured"].extra_args += ["--audit-log-path", str(servers["secured"].data_dir / "audit.log")]
    try:
        clients: dict[str, ServerInfo] = {}
        nss: dict[str, dict[str, str]] = {}
        for label, srv in servers.items():
            srv.start()
            assert srv.info is not None
            run_id = uuid.uuid4().hex[:6]
            ns = {"read": f"sec-read-{run_id}", "create": f"sec-create-{run_id}", "bulk": f"sec-bulk-{run_id}"}
            for n in ns.values():
                ensure_namespace(srv.info, n)
            bulk_create(srv.info, ns["read"], [f"r{i}" for i in range(100)])
            nss[label] = ns
            clients[label] = (user_credentials(srv.info, list(ns.values())) if label == "secured"
                              else srv.info)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            label: {"get": [], "create": [], "creates": []} for label in servers}
        for rnd in range(rounds):
            for label in servers:
                info, ns = clients[label], nss[label]
                runs[label]["get"].append(_paced(info, "get", rate, seconds, namespace=ns["read"],
                                                 names=[f"r{i}" for i in range(100)]))
                runs[label]["create"].append(_paced(info, "create", rate, seconds, namespace=ns["create"],
                                                    name_prefix=f"p{rnd}-"))
                runs[label]["creates"].append(_creates(info, ns["bulk"], creates_seconds))
                last = runs[label]
                log(f"{label:8s} round {rnd}: get p50/p99 {last['get'][-1]['latency']['p50_ms']}/"
                    f"{last['get'][-1]['latency']['p99_ms']} ms, create p50/p99 "
                    f"{last['create'][-1]['latency']['p50_ms']}/{last['create'][-1]['latency']['p99_ms']} ms, "
                    f"creates {last['creates'][-1]['ok_per_s']}/s")
        audit_lines = sum(1 for _ in open(servers["secured"].data_dir / "audit.log"))  # noqa: SIM115
    finally:
        for srv in servers.values():
            srv.stop()
    return summarize(runs, rate, seconds, rounds, creates_seconds, audit_lines)


def _best(rs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The best round (lowest p50, or highest creates/s): the one least hit by noise."""
    if key == "creates":
        return max(rs, key=lambda r: r["ok_per_s"])
    return min(rs, key=lambda r: r["latency"]["p50_ms"] or 1e9)


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]], rate: float, seconds: float, rounds: int,
              creates_seconds: float, audit_lines: int) -> dict[str, Any]:
    best = {label: {op: _best(rs, op) for op, rs in ops.items()} for label, ops in runs.items()}
    b, s = best["baseline"], best["secured"]
    ratios = {
        "get_p50": round(s["get"]["latency"]["p50_ms"] / b["get"]["latency"]["p50_ms"], 3),
        "get_p99": round(s["get"]["latency"]["p99_ms"] / b["get"]["latency"]["p99_ms"], 3),
        "create_p50": round(s["create"]["latency"]["p50_ms"] / b["create"]["latency"]["p50_ms"], 3),
        "create_p99": round(s["create"]["latency"]["p99_ms"] / b["create"]["latency"]["p99_ms"], 3),
        "creates_per_s": round(s["creates"]["ok_per_s"] / b["creates"]["ok_per_s"], 3),
    }
    met = (ratios["get_p50"] <= 1 + TARGET_OVERHEAD and ratios["create_p50"] <= 1 + TARGET_OVERHEAD
           and ratios["creates_per_s"] >= 1 - TARGET_OVERHEAD)
    return {"rate": rate, "seconds": seconds, "rounds": rounds, "creates_seconds": creates_seconds,
            "best": best, "runs": runs, "ratios": ratios, "target_overhead": TARGET_OVERHEAD, "met": met,
            "audit_lines": audit_lines}


def render_doc(r: dict[str, Any]) -> str:
    b, s, q = r["best"]["baseline"], r["best"]["secured"], r["ratios"]

    def lat(x: dict[str, Any]) -> str:
        return f"{x['latency']['p50_ms']} / {x['latency']['p99_ms']}"

    return "\n".join([
        BEGIN,
        f"`python -m bench.bench_security` — {r['rounds']} alternating rounds; paced get and create at "
        f"{r['rate']:.0f}/s for {r['seconds']:.0f} s each, closed-loop creates (20 clients) for "
        f"{r['creates_seconds']:.0f} s; best round of each reported.  Secured = x509 client certificate "
        "of an ordinary user + `--authorization-mode Node,RBAC` (a RoleBinding to `edit`) + audit log "
        f"(Metadata level; {r['audit_lines']} lines written); baseline = admin token + AlwaysAllow, no audit.",
        "",
        "| | baseline | secured | secured / baseline |",
        "|---|---|---|---|",
        f"| get p50 / p99 (ms) | {lat(b['get'])} | {lat(s['get'])} | {q['get_p50']} / {q['get_p99']} |",
        f"| create p50 / p99 (ms) | {lat(b['create'])} | {lat(s['create'])} | "
        f"{q['create_p50']} / {q['create_p99']} |",
        f"| creates/s | {b['creates']['ok_per_s']:.0f} | {s['creates']['ok_per_s']:.0f} | {q['creates_per_s']} |",
        "",
        f"Target: overhead ≤ {int(TARGET_OVERHEAD * 100)}% (p50 ratios ≤ {1 + TARGET_OVERHEAD}, "
        f"creates/s ratio ≥ {1 - TARGET_OVERHEAD}): **{'met' if r['met'] else 'not met'}**.  The "
        "target is on p50 and throughput: a p99 is the tail of some 1,600 requests per round on a "
        "shared 2-core machine and moves by 2-3x between rounds of the same server.",
        END,
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--creates-seconds", type=float, default=10.0)
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/benchmarks.md")
    a = ap.parse_args()
    r = run(a.rate, a.seconds, a.rounds, a.creates_seconds)
    write_results("bench_security", r)
    log(render_doc(r))
    if not a.no_doc:
        replace_doc_section(DOC, render_doc(r), BEGIN, END, "Security overhead")


if __name__ == "__main__":
    main()
