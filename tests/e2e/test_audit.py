"""The audit log end to end: a real `fleet server --audit-log-path --audit-policy-file`,
a scripted kubectl session, and the log read back.

kubectl runs with `-v=6`, which prints every request it sends (method, URL, status):
each of those must have exactly one ResponseComplete line in the log (same
requestURI, a kubectl user agent, the same code), and no kubectl line may be extra.
"""

from __future__ import annotations

import base64
import collections
import json
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import FleetServer, ServerFactory

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")

POLICY = """
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  # Asks for everything on secrets: capped at Metadata by the server whatever this says.
  - level: RequestResponse
    resources:
      - group: ""
        resources: ["secrets"]
  - level: RequestResponse
    resources:
      - group: ""
        resources: ["configmaps"]
  - level: None
    nonResourceURLs: ["/healthz*", "/readyz*", "/livez*"]
  - level: Request
    resources:
      - group: "apps"
  - level: Metadata
"""


def read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for p in sorted(path.parent.glob(path.stem + "*" + path.suffix)):
        try:
            text = p.read_text()
        except FileNotFoundError:  # rotated or pruned since the glob
            continue
        for line in text.splitlines():
            if line.strip():
                events.append(json.loads(line))
    return events


def wait_for(path: Path, pred: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        events = read_events(path)
        if pred(events) or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


@pytest.fixture
def audited(fleet_server_factory: ServerFactory, tmp_path: Path) -> tuple[FleetServer, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    log = tmp_path / "logs" / "audit.log"
    srv = fleet_server_factory.start(extra_args=["--audit-log-path", str(log),
                                                 "--audit-policy-file", str(policy)])
    return srv, log


# kubectl -v=6: `round_trippers.go:560] POST https://127.0.0.1:9300/api/v1/namespaces?... 201 Created in 3 ms`
SENT = re.compile(r"round_trippers\.go:\d+\] (GET|POST|PUT|PATCH|DELETE) https?://[^/\s]+(\S*) (\d{3}) ")


class Script:
    """kubectl commands against `srv`, recording every request they send."""

    def __init__(self, srv: FleetServer) -> None:
        self.srv = srv
        self.sent: list[tuple[str, str, int]] = []  # (method, request URI, code)

    def run(self, *args: str, input: str | None = None) -> tuple[int, str, str]:
        rc, out, err = self.srv.kubectl("-v=6", *args, input=input)
        self.sent += [(m, uri, int(code)) for m, uri, code in SENT.findall(err)]
        return rc, out, err

    def ok(self, *args: str, input: str | None = None) -> str:
        rc, out, err = self.run(*args, input=input)
        assert rc == 0, f"kubectl {' '.join(args)}: {err}"
        return out


def test_kubectl_script_is_audited_once_per_request_and_secrets_never_leak(
        audited: tuple[FleetServer, Path]) -> None:
    srv, log = audited
    ns = "aud-" + uuid.uuid4().hex[:6]
    payload = "s3cr3t-" + uuid.uuid4().hex
    script = Script(srv)
    script.ok("create", "namespace", ns)
    script.ok("-n", ns, "create", "secret", "generic", "creds", f"--from-literal=password={payload}")
    out = script.ok("-n", ns, "get", "secret", "creds", "-o", "yaml")
    assert base64.b64encode(payload.encode()).decode() in out  # the client does get it
    script.ok("-n", ns, "create", "configmap", "cfg", "--from-literal=colour=blue")
    script.ok("-n", ns, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}))
    script.ok("-n", ns, "delete", "deployment", "web")
    rc, _, err = script.run("-n", ns, "get", "configmap", "nope")
    assert rc != 0 and "NotFound" in err
    # A 401: a bad token (plain httpx, so the request is exactly one).
    with httpx.Client(base_url=srv.url, verify=srv.verify(), timeout=10,
                      headers={"Authorization": "Bearer not-a-token", "User-Agent": "audit-e2e-401"}) as c:
        r = c.get(f"/api/v1/namespaces/{ns}/pods")
    assert r.status_code == 401
    assert r.headers.get("Audit-Id")
    assert "token" not in r.text.lower().replace("unauthorized", "")

    def done(events: list[dict[str, Any]]) -> bool:
        return any(e.get("userAgent") == "audit-e2e-401" for e in events)

    events = wait_for(log, done)
    raw = "\n".join(p.read_text() for p in log.parent.iterdir())
    # The Secret's payload never appears, plain or base64 (nor base64 of the JSON value).
    assert payload not in raw
    assert base64.b64encode(payload.encode()).decode() not in raw

    mine = [e for e in events if ns in e["requestURI"] or ns in (e.get("objectRef") or {}).values()
            or e.get("userAgent") == "audit-e2e-401"]
    for e in mine:
        assert e["kind"] == "Event" and e["apiVersion"] == "audit.k8s.io/v1"
        assert e["stage"] != "RequestReceived"  # omitted by the policy
    complete = [e for e in mine if e["stage"] == "ResponseComplete"]
    ids = [e["auditID"] for e in complete]
    assert len(ids) == len(set(ids)), "one ResponseComplete per request"
    # Every request kubectl sent has exactly one ResponseComplete line, with its code.
    assert len(script.sent) >= 8
    by_kubectl = [e for e in events if e["stage"] == "ResponseComplete"
                  and e.get("userAgent", "").startswith("kubectl/")]  # not the dispatcher wrapper
    assert collections.Counter((uri, code) for _, uri, code in script.sent) == collections.Counter(
        (e["requestURI"], e["responseStatus"]["code"]) for e in by_kubectl)
    for e in by_kubectl:
        assert len([x for x in events if x["auditID"] == e["auditID"]]) == 1  # no other stage

    def find(verb: str, resource: str, **kw: Any) -> list[dict[str, Any]]:
        out = []
        for e in complete:
            ref = e.get("objectRef") or {}
            if e["verb"] == verb and ref.get("resource") == resource and all(
                    ref.get(k) == v for k, v in kw.items()):
                out.append(e)
        return out

    # create ns (objectRef's name completed from the request body, as kube-apiserver's)
    (ns_create,) = find("create", "namespaces", name=ns)
    assert ns_create["responseStatus"]["code"] == 201
    assert ns_create["level"] == "Metadata" and "requestObject" not in ns_create
    assert ns_create["user"]["username"] and "system:masters" in ns_create["user"]["groups"]
    assert ns_create["annotations"]["authorization.k8s.io/decision"] == "allow"
    assert ns_create["sourceIPs"] == ["127.0.0.1"]
    assert ns_create["userAgent"].startswith("kubectl")
    # create / get secret: Metadata though the policy asks for RequestResponse
    (sec_create,) = find("create", "secrets", namespace=ns)
    (sec_get,) = find("get", "secrets", namespace=ns, name="creds")
    for e in (sec_create, sec_get):
        assert e["level"] == "Metadata"
        assert "requestObject" not in e and "responseObject" not in e
    assert sec_create["objectRef"]["name"] == "creds"  # completed from the request body
    assert sec_get["responseStatus"]["code"] == 200
    # configmaps at RequestResponse: both objects
    (cm_create,) = find("create", "configmaps", namespace=ns, name="cfg")  # not kube-root-ca.crt
    assert cm_create["level"] == "RequestResponse"
    assert cm_create["requestObject"]["data"] == {"colour": "blue"}
    assert cm_create["responseObject"]["metadata"]["uid"]
    # the 404
    (missing,) = find("get", "configmaps", namespace=ns, name="nope")
    assert missing["responseStatus"]["code"] == 404
    assert missing["responseStatus"]["reason"] == "NotFound"
    assert "responseObject" in missing  # a Status, at RequestResponse
    # apply (a get then a create, or a patch) and delete of the deployment, at Request
    dep = [e for e in complete if (e.get("objectRef") or {}).get("resource") == "deployments"]
    assert {e["verb"] for e in dep} >= {"delete"}
    writes = [e for e in dep if e["verb"] in ("create", "patch")]
    assert writes and all(e["level"] == "Request" and "requestObject" in e and "responseObject" not in e
                          for e in writes)
    (dep_delete,) = [e for e in dep if e["verb"] == "delete"]
    assert dep_delete["responseStatus"]["code"] == 200
    # the 401: audited, no user, the reason only in the log
    (unauth,) = [e for e in complete if e.get("userAgent") == "audit-e2e-401"]
    assert unauth["user"] == {}
    assert unauth["responseStatus"]["code"] == 401
    assert unauth["verb"] == "list" and unauth["objectRef"]["resource"] == "pods"
    assert unauth["annotations"]["authentication.fleet.dev/failure-reason"].startswith(
        "Authentication failed, attempted: bearer")
    assert unauth["auditID"] == r.headers["Audit-Id"]


def test_rotation_with_a_tiny_maxsize(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    policy = tmp_path / "policy.json"  # JSON is a policy format too
    policy.write_text(json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [
        {"level": "RequestResponse", "resources": [{"group": "", "resources": ["configmaps"]}]},
        {"level": "Metadata"}]}))
    srv = fleet_server_factory.start(extra_args=["--audit-log-path", str(log), "--audit-log-maxsize", "1",
                                                 "--audit-log-maxbackup", "2",
                                                 "--audit-policy-file", str(policy)])
    big = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big", "namespace": "default"},
           "data": {"blob": "x" * 300_000}}
    with srv.client() as c:
        assert c.post("/api/v1/namespaces/default/configmaps", json=big).status_code == 201
        # ~300 kB a line at RequestResponse: 1 MB holds three; 16 gets make five rotations.
        for _ in range(16):
            assert c.get("/api/v1/namespaces/default/configmaps/big").status_code == 200
    deadline = time.monotonic() + 10
    backups: list[Path] = []
    while time.monotonic() < deadline:
        backups = sorted(p for p in tmp_path.iterdir() if p.name.startswith("audit-"))
        if len(backups) == 2 and len(read_events(log)) >= 17:
            break
        time.sleep(0.2)
    metrics = httpx.get(srv.metrics_url, timeout=10).text
    (count,) = re.findall(r"^apiserver_audit_event_total (\S+)$", metrics, re.M)
    assert float(count) >= 17
    assert 'apiserver_audit_error_total{plugin="log"}' not in metrics  # no failure, no series
    assert srv.stop() == 0  # the server's own clients write too: no rotation while we look
    backups = sorted(p for p in tmp_path.iterdir() if p.name.startswith("audit-"))
    # Pruned to --audit-log-maxbackup; each file within --audit-log-maxsize, whole lines only.
    assert len(backups) == 2, [p.name for p in tmp_path.iterdir()]
    for p in [*backups, log]:
        assert p.stat().st_size <= 1024 * 1024
        assert all(json.loads(line)["kind"] == "Event" for line in p.read_text().splitlines())
    for p in backups:
        assert re.fullmatch(r"audit-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3}\.log", p.name), p.name


def test_nothing_lost_on_orderly_shutdown(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    srv = fleet_server_factory.start(extra_args=["--audit-log-path", str(log)])
    marker = uuid.uuid4().hex[:8]
    with srv.client() as c:
        for i in range(300):
            assert c.get(f"/api/v1/namespaces/default/configmaps/{marker}-{i}").status_code == 404
    assert srv.stop() == 0  # SIGTERM right after the last answer: the writer's batch is still queued
    got = {e["objectRef"]["name"] for e in read_events(log)
           if (e.get("objectRef") or {}).get("name", "").startswith(marker)}
    assert got == {f"{marker}-{i}" for i in range(300)}


def test_bad_policy_refuses_to_start(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Everything\n")
    srv = fleet_server_factory.new(extra_args=["--audit-log-path", str(tmp_path / "a.log"),
                                               "--audit-policy-file", str(policy)])
    srv.spawn()
    assert srv.proc is not None
    rc = srv.proc.wait(timeout=60)
    assert rc != 0
    out = srv.output()
    assert 'rules[0].level: Unsupported value: "Everything"' in out
    assert str(policy) in out
