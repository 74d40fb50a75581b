"""What dynamic admission webhooks cost: ConfigMap create latency with one mutating and one
validating webhook, beside the same creates with none, on one server in one run.

`python -m bench.bench_webhooks [--per-arm 300] [--rounds 6] [--rate 20] [--no-doc]`

One `fleet server` (no agent) and, in this process, one HTTPS webhook server on 127.0.0.1
(fleet/testing/webhook.py, its certificate from a test CA made by
fleet/testing/oidc.py's `loopback_tls`) answering:

- `/mutate`: allowed, with a JSONPatch adding the label `bench-webhook: mutated`;
- `/validate`: allowed.

A MutatingWebhookConfiguration and a ValidatingWebhookConfiguration (`caBundle` = the test
CA, `failurePolicy: Fail`) select ConfigMap creates in one namespace only
(namespaceSelector on `kubernetes.io/metadata.name`); a second namespace has none.  The
two arms — `webhooks` (that namespace) and `none` (the other) — run as paced open-loop
creates (`bench.loadgen`, its own process) at `--rate`, alternating in rounds with the
order flipped every round (ABBA...), so drift and bursts from other users of this shared
machine land on both; `--per-arm` creates per arm in all.  Reported: p50/p99 of every
create of each arm (latency from its scheduled time), the ratios webhooks/none, and the
server's CPU per create (less its idle CPU), and one webhook call's own cost from a
client on the same machine (new connection vs kept alive).  Checked, not assumed: every create of the webhook arm was
reviewed by both webhooks and carries the label, and none of the other arm was.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    FleetServer,
    ServerInfo,
    cpu_s,
    ensure_namespace,
    finish_loadgen,
    log,
    replace_doc_section,
    spawn_loadgen,
    summarize_ms,
    sync_client,
    write_results,
)
from fleet.testing.oidc import loopback_tls
from fleet.testing.webhook import API, WebhookServer, configmap_hook, json_patch, review_response

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench_webhooks:begin -->", "<!-- bench_webhooks:end -->"
LABEL = "bench-webhook"
ARMS = ("webhooks", "none")


def answer(path: str, review: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's two webhooks: `/mutate` labels the object, `/validate` allows."""
    if path == "/mutate":
        labels = ((review["request"].get("object") or {}).get("metadata") or {}).get("labels")
        ops: list[dict[str, Any]] = [] if labels else [{"op": "add", "path": "/metadata/labels", "value": {}}]
        ops.append({"op": "add", "path": f"/metadata/labels/{LABEL}", "value": "mutated"})
        return review_response(review, **json_patch(ops))
    return review_response(review)


def install(info: ServerInfo, ns: str, hook: WebhookServer, ca: bytes) -> None:
    """Both configurations, selecting `ns`; returns once the server calls both webhooks."""
    with sync_client(info) as c:
        for kind, path, name in (("MutatingWebhookConfiguration", "/mutate", "label.bench.fleet.test"),
                                 ("ValidatingWebhookConfiguration", "/validate", "allow.bench.fleet.test")):
            c.post(f"/apis/{API}/{kind.lower()}s", json={
                "apiVersion": API, "kind": kind, "metadata": {"name": f"bench-{ns}"},
                "webhooks": [configmap_hook(name, ns, hook.url(path), ca, failurePolicy="Fail")],
            }).raise_for_status()
        # The configuration caches are watch-fed: probe until a create goes through both.
        deadline = time.monotonic() + 30
        for i in range(1_000_000):
            name = f"probe-{i}"
            r = c.post(f"/api/v1/namespaces/{ns}/configmaps",
                       json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
            r.raise_for_status()
            labelled = (r.json()["metadata"].get("labels") or {}).get(LABEL) == "mutated"
            validated = any(rv["path"] == "/validate" and rv["request"].get("name") == name
                            for rv in hook.reviews)
            if labelled and validated:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the webhooks were not called within 30 s of their configurations")
            time.sleep(0.1)


def idle_cpu_rate(pid: int, seconds: float = 10.0) -> float:
    """The server's CPU seconds per second with no requests (its background loops)."""
    cpu0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = cpu_s(pid), time.monotonic()
    return 0.0 if cpu0 is None or cpu1 is None else max(0.0, (cpu1 - cpu0) / (t1 - t0))


def webhook_call_ms(hook: WebhookServer, ca: bytes, calls: int = 100) -> dict[str, Any]:
    """The transport alone, from this process: p50/p99 of a POSTed AdmissionReview to
    `/validate`, on a new HTTPS connection each and on one kept-alive connection (as Fleet's
    pooled webhook clients call)."""
    import ssl

    import httpx

    ctx = ssl.create_default_context(cadata=ca.decode())
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "bench", "namespace": "bench", "name": "bench", "object": {}}}
    fresh, kept = [], []
    with httpx.Client(verify=ctx) as c:
        for _ in range(calls):
            t0 = time.perf_counter()
            with httpx.Client(verify=ctx) as one:
                one.post(hook.url("/validate"), json=review).raise_for_status()
            fresh.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c.post(hook.url("/validate"), json=review).raise_for_status()
            kept.append(time.perf_counter() - t0)
    return {"new_connection": summarize_ms(fresh), "keep_alive": summarize_ms(kept)}


def _paced(info: ServerInfo, pid: int, ns: str, rate: float, count: int, prefix: str,
           idle_rate: float = 0.0) -> dict[str, Any]:
    seconds = count / rate
    spec = {**info.as_args(), "mode": "paced", "op": "create", "rate": rate, "duration": seconds,
            "namespace": ns, "name_prefix": prefix, "start_at": time.time() + 1.5, "prewarm": 4}
    proc = spawn_loadgen(spec)
    # The server's CPU from the first scheduled create to the load generator's exit.
    time.sleep(max(0.0, spec["start_at"] - time.time()))
    cpu0, t0 = cpu_s(pid), time.monotonic()
    r = finish_loadgen(proc, timeout=seconds + 90)
    cpu1, wall = cpu_s(pid), time.monotonic() - t0
    if "error" in r:
        raise RuntimeError(f"loadgen: {r['error']} {r.get('stderr', '')[-500:]}")
    if r["ok"] != r["scheduled"]:
        raise RuntimeError(f"{ns}: {r['ok']}/{r['scheduled']} creates succeeded: {r['statuses']} "
                           f"{r['sample_errors']}")
    return {"ok": r["ok"], "statuses": r["statuses"], "latencies": r["latencies"],
            "service_times": r["service_times"], "launch_lag_p99_ms": r["launch_lag_p99_ms"],
            # Less what the server burns idle over the same time.
            "server_cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0 - idle_rate * wall, 3)}


def check(info: ServerInfo, hook: WebhookServer, nss: dict[str, str], prefix: str,
          expected: dict[str, int]) -> dict[str, Any]:
    """Every measured create of the webhook arm went through both webhooks and is labelled;
    none of the other arm's did or is."""
    out: dict[str, Any] = {}
    with sync_client(info) as c:
        for arm, ns in nss.items():
            items = [o for o in c.get(f"/api/v1/namespaces/{ns}/configmaps").json()["items"]
                     if o["metadata"]["name"].startswith(prefix)]
            labelled = sum(1 for o in items if (o["metadata"].get("labels") or {}).get(LABEL) == "mutated")
            reviews = {p: sum(1 for rv in hook.reviews if rv["path"] == p and rv["request"]["namespace"] == ns
                              and rv["request"].get("name", "").startswith(prefix))
                       for p in ("/mutate", "/validate")}
            out[arm] = {"objects": len(items), "labelled": labelled, "reviews": reviews}
            want = expected[arm] if arm == "webhooks" else 0
            if len(items) != expected[arm] or labelled != want or reviews != {"/mutate": want, "/validate": want}:
                raise RuntimeError(f"{arm}: expected {expected[arm]} objects, {want} labelled and reviewed "
                                   f"by each webhook; found {out[arm]}")
    return out


def run(per_arm: int, rounds: int, rate: float) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    nss = {"webhooks": f"wh-hooked-{run_id}", "none": f"wh-plain-{run_id}"}
    per_round = max(1, per_arm // rounds)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-webhook-") as tmp:
        ca_file, cert_file, key_file = loopback_tls(Path(tmp), "webhook")
        ca = ca_file.read_bytes()
        with WebhookServer(cert_file, key_file, answer) as hook, FleetServer() as srv:
            assert srv.info is not None
            for ns in nss.values():
                ensure_namespace(srv.info, ns)
            install(srv.info, nss["webhooks"], hook, ca)
            for arm in ARMS:  # warm-up, not measured: first connections, caches
                _paced(srv.info, srv.pid, nss[arm], rate, min(40, per_round), "warm-")
            idle = idle_cpu_rate(srv.pid)
            runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
            for rnd in range(rounds):
                for arm in (ARMS if rnd % 2 == 0 else ARMS[::-1]):
                    r = _paced(srv.info, srv.pid, nss[arm], rate, per_round, f"m-{rnd}-", idle)
                    runs[arm].append(r)
                    lat = summarize_ms(r["latencies"])
                    log(f"round {rnd} {arm:8s}: create p50/p99 {lat['p50_ms']}/{lat['p99_ms']} ms, "
                        f"server CPU {r['server_cpu_s']} s")
            checked = check(srv.info, hook, nss, "m-", {arm: per_round * rounds for arm in ARMS})
            transport = webhook_call_ms(hook, ca)
    r = summarize(runs, per_round, rounds, rate, checked)
    r["server_idle_cpu_s_per_s"] = round(idle, 4)
    r["webhook_call"] = transport
    return r


def summarize(runs: dict[str, list[dict[str, Any]]], per_round: int, rounds: int, rate: float,
              checked: dict[str, Any]) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm, rs in runs.items():
        lat = [x for r in rs for x in r["latencies"]]
        cpu = [r["server_cpu_s"] for r in rs]
        arms[arm] = {
            "creates": len(lat),
            "latency": summarize_ms(lat),
            "service": summarize_ms([x for r in rs for x in r["service_times"]]),
            "server_cpu_ms_per_create": (round(1000 * sum(cpu) / len(lat), 2)  # type: ignore[arg-type]
                                         if lat and all(c is not None for c in cpu) else None),
            "rounds": [{**summarize_ms(r["latencies"]), "server_cpu_s": r["server_cpu_s"]} for r in rs],
        }
        # A tail less at the mercy of one burst from another user of the machine.
        arms[arm]["round_p99_median_ms"] = round(statistics.median(x["p99_ms"] for x in arms[arm]["rounds"]), 3)
    w, n = arms["webhooks"], arms["none"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    ratios = {"p50": ratio(w["latency"]["p50_ms"], n["latency"]["p50_ms"]),
              "p99": ratio(w["latency"]["p99_ms"], n["latency"]["p99_ms"]),
              "round_p99_median": ratio(w["round_p99_median_ms"], n["round_p99_median_ms"]),
              "server_cpu_per_create": ratio(w["server_cpu_ms_per_create"], n["server_cpu_ms_per_create"])}
    return {"rate": rate, "rounds": rounds, "per_round": per_round, "arms": arms, "ratios": ratios,
            "added_p50_ms": round(w["latency"]["p50_ms"] - n["latency"]["p50_ms"], 2),
            "checked": checked}


def render_doc(r: dict[str, Any]) -> str:
    w, n, q = r["arms"]["webhooks"], r["arms"]["none"], r["ratios"]
    t = r["webhook_call"]
    return "\n".join([
        BEGIN,
        f"`python -m bench.bench_webhooks` — ConfigMap creates paced at {r['rate']:.0f}/s, "
        f"{r['rounds']} rounds of {r['per_round']} per arm, arms alternating (order flipped each round); "
        "p50/p99 over every create of the arm, latency from its scheduled send time.  Webhooks = one "
        "mutating (JSONPatch adding a label) and one validating (allows) webhook, HTTPS on 127.0.0.1 "
        "(Python `http.server`, test CA), both `failurePolicy: Fail`, selecting the arm's namespace; "
        "none = a namespace no webhook selects, same server.",
        "",
        "| | none | webhooks | webhooks / none |",
        "|---|---|---|---|",
        f"| create p50 (ms) | {n['latency']['p50_ms']} | {w['latency']['p50_ms']} | {q['p50']} |",
        f"| create p99 (ms) | {n['latency']['p99_ms']} | {w['latency']['p99_ms']} | {q['p99']} |",
        f"| median of the rounds' p99 (ms) | {n['round_p99_median_ms']} | {w['round_p99_median_ms']} | "
        f"{q['round_p99_median']} |",
        f"| server CPU per create (ms) | {n['server_cpu_ms_per_create']} | {w['server_cpu_ms_per_create']} | "
        f"{q['server_cpu_per_create']} |",
        f"| creates measured | {n['creates']} | {w['creates']} | |",
        "",
        f"One webhook call from a client on the same machine (POST of an AdmissionReview to the same "
        f"server): p50 {t['new_connection']['p50_ms']} ms on a new HTTPS connection each time and "
        f"{t['keep_alive']['p50_ms']} ms on a kept-alive one — Fleet keeps one pooled client per "
        f"caBundle, so its calls are the kept-alive kind.",
        END,
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-arm", type=int, default=300, help="creates per arm, over all rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--rate", type=float, default=20.0, help="creates per second while an arm runs")
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/benchmarks.md")
    a = ap.parse_args()
    r = run(a.per_arm, a.rounds, a.rate)
    write_results("bench_webhooks", r)
    log(render_doc(r))
    if not a.no_doc:
        replace_doc_section(DOC, render_doc(r), BEGIN, END, "Admission webhooks")


if __name__ == "__main__":
    main()
