"""The audit hooks of APIServer.handle, in process: one ResponseComplete per request,
401s and 403s audited, streamed responses started/completed, Panic for an internal
error, the Audit-Id header — and nothing at all with audit off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.auth import Attributes, Decision, UserInfo
from fleet.auth.audit import DEFAULT_POLICY, Auditor, parse_policy
from fleet.auth.audit_log import AuditLog
from fleet.server.http import Req
from fleet.testing.apiserver import TOKEN, InProcessAPI, open_api


class DenySecrets:
    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        if attrs.resource == "secrets":
            return Decision(False, "secrets are not for you")
        return Decision(True, "allowed by the test")


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
async def api(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with open_api(tmp_path, namespace_controller=False) as api:
        yield api


def audit_on(api: InProcessAPI, tmp_path: Path, policy: str | None = None) -> Path:
    path = tmp_path / "audit.log"
    sink = AuditLog(str(path))  # no writer task: synchronous writes
    api.server.audit = Auditor(DEFAULT_POLICY if policy is None else parse_policy(policy), sink)
    sink.counters = api.server.metrics
    return path


async def test_audit_off_writes_nothing_and_sets_no_header(api: InProcessAPI, tmp_path: Path) -> None:
    resp = await api.call("GET", "/api/v1/namespaces/default")
    assert resp.status == 200 and "Audit-Id" not in resp.headers
    assert not (tmp_path / "audit.log").exists()


async def test_one_response_complete_per_request(api: InProcessAPI, tmp_path: Path) -> None:
    log = audit_on(api, tmp_path)
    ok = await api.call("GET", "/api/v1/namespaces/default", headers={"user-agent": "t/1"})
    created = await api.call("POST", "/api/v1/namespaces/default/configmaps",
                             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    missing = await api.call("GET", "/api/v1/namespaces/default/configmaps/nope")
    version = await api.call("GET", "/version")
    evs = events(log)
    assert [e["stage"] for e in evs] == ["ResponseComplete"] * 4  # the default omits RequestReceived
    assert [e["auditID"] for e in evs] == [r.headers["Audit-Id"] for r in (ok, created, missing, version)]
    get_ns, create, not_found, ver = evs
    assert get_ns["objectRef"] == {"resource": "namespaces", "namespace": "default", "name": "default",
                                   "apiVersion": "v1"}
    assert get_ns["userAgent"] == "t/1" and get_ns["verb"] == "get"
    assert create["verb"] == "create" and create["objectRef"]["name"] == "c"
    assert create["responseStatus"]["code"] == 201 and create["level"] == "Metadata"
    assert not_found["responseStatus"]["reason"] == "NotFound"
    assert ver["verb"] == "get" and ver["requestURI"] == "/version" and "objectRef" not in ver
    assert api.server.metrics.audit_events._value.get() == 4  # apiserver_audit_event_total


async def test_unauthorized_and_forbidden(api: InProcessAPI, tmp_path: Path) -> None:
    log = audit_on(api, tmp_path)
    api.server.authorizer = DenySecrets()
    r401 = await api.call("GET", "/api/v1/pods", token="wrong")
    assert r401.status == 401 and b"wrong" not in r401.body
    r403 = await api.call("GET", "/api/v1/namespaces/default/secrets/s")
    assert r403.status == 403
    unauth, forbidden = events(log)
    assert unauth["user"] == {} and unauth["responseStatus"]["code"] == 401
    assert unauth["annotations"] == {
        "authentication.fleet.dev/failure-reason": "Authentication failed, attempted: bearer"}
    assert unauth["objectRef"] == {"resource": "pods", "apiVersion": "v1"} and unauth["verb"] == "list"
    assert forbidden["responseStatus"]["code"] == 403
    assert forbidden["annotations"] == {"authorization.k8s.io/decision": "forbid",
                                        "authorization.k8s.io/reason": "secrets are not for you"}
    assert forbidden["user"]["username"] == "system:admin"


async def test_request_response_policy_and_received_stage(api: InProcessAPI, tmp_path: Path) -> None:
    log = audit_on(api, tmp_path, json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [
        {"level": "RequestResponse"}]}))
    await api.call("POST", "/api/v1/namespaces/default/configmaps",
                   {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}})
    await api.call("POST", "/api/v1/namespaces/default/secrets",
                   {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                    "stringData": {"password": "hunter2"}})
    received, cm, received2, secret = events(log)
    assert received["stage"] == "RequestReceived" and "requestObject" not in received
    assert cm["requestObject"]["data"] == {"a": "b"} and cm["responseObject"]["metadata"]["name"] == "c"
    assert received2["auditID"] == secret["auditID"]
    assert secret["level"] == "Metadata" and "requestObject" not in secret and "responseObject" not in secret
    assert "hunter2" not in log.read_text() and "aHVudGVyMg" not in log.read_text()


async def test_watch_started_and_complete(api: InProcessAPI, tmp_path: Path) -> None:
    log = audit_on(api, tmp_path)
    resp = await api.call("GET", "/api/v1/namespaces/default/configmaps", query={"watch": "1"})
    assert not isinstance(resp.body, bytes)
    assert events(log) == []  # nothing until the response starts
    with trio.move_on_after(0.2):
        async for _ in resp.body:
            pass
    await resp.body.aclose()  # type: ignore[union-attr]
    started, complete = events(log)
    assert started["stage"] == "ResponseStarted" and complete["stage"] == "ResponseComplete"
    assert started["verb"] == complete["verb"] == "watch"
    assert started["auditID"] == complete["auditID"] == resp.headers["Audit-Id"]


async def test_internal_error_is_a_panic_event(api: InProcessAPI, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    log = audit_on(api, tmp_path)

    async def boom(req: Req) -> Any:
        raise KeyError("x")

    monkeypatch.setattr(api.server, "dispatch", boom)
    resp, _, _ = await api.server.handle(Req("GET", "/api/v1/pods", {}, {"authorization": f"Bearer {TOKEN}"}))
    assert resp.status == 500
    (ev,) = events(log)
    assert ev["stage"] == "Panic" and ev["responseStatus"]["code"] == 500


@pytest.mark.parametrize(("kind", "token", "code"), [
    ("websocket", False, 401), ("websocket", True, 404), ("raw", False, 401), ("raw", True, 404)])
async def test_upgrades_are_audited(api: InProcessAPI, tmp_path: Path, kind: str, token: bool,
                                    code: int) -> None:
    from fleet.server import upgrade
    from fleet.server.asgi import create_app

    log = audit_on(api, tmp_path)
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "raw.disconnect"}

    sub = "exec" if kind == "websocket" else "portforward"
    path = f"/api/v1/namespaces/default/pods/nope/{sub}"
    headers = [(b"user-agent", b"kubectl/v1.32.4")]
    if token:
        headers.append((b"authorization", f"Bearer {TOKEN}".encode()))
    scope: dict[str, Any] = {"type": "websocket" if kind == "websocket" else upgrade.SCOPE_TYPE,
                             "method": "GET" if kind == "websocket" else "POST", "path": path,
                             "raw_path": path.encode(), "query_string": b"command=ls",
                             "headers": headers, "client": ("10.1.2.3", 4444),
                             "extensions": {"websocket.http.response": {}}}
    await create_app(api.server)(scope, receive, send)
    evs = events(log)
    # No such pod: refused by the process-control gate (fleet/server/processcontrol.py,
    # which reads the pod) before anything is relayed, so no response was started.
    assert [e["stage"] for e in evs] == ["ResponseComplete"]
    assert all(e["responseStatus"]["code"] == code for e in evs)
    ev = evs[-1]
    assert ev["verb"] == "create" and ev["sourceIPs"] == ["10.1.2.3"]
    assert ev["objectRef"] == {"resource": "pods", "namespace": "default", "name": "nope",
                               "apiVersion": "v1", "subresource": sub}
    assert ev["requestURI"] == path + "?command=ls"
    assert (ev["user"] == {}) is (not token)


async def test_request_refused_before_the_pipeline_is_audited(api: InProcessAPI, tmp_path: Path) -> None:
    from fleet.server.asgi import create_app
    from fleet.server.request_params import MAX_BODY

    log = audit_on(api, tmp_path)
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    async def receive() -> dict[str, Any]:
        raise AssertionError("a declared oversized body is refused unread")

    path = "/api/v1/namespaces/default/configmaps"
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"authorization", f"Bearer {TOKEN}".encode()),
                         (b"content-length", str(MAX_BODY + 1).encode())], "client": ("127.0.0.1", 1)}
    await create_app(api.server)(scope, receive, send)
    assert sent[0]["status"] == 413
    (ev,) = events(log)
    assert ev["responseStatus"]["code"] == 413 and ev["verb"] == "create"
    assert ev["user"]["username"] == "system:admin"
    assert (b"audit-id", ev["auditID"].encode()) in [(k.lower(), v) for k, v in sent[0]["headers"]]
