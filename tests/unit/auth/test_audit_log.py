"""Audit events (their audit.k8s.io/v1 shape, stage by stage) and the log writer
(buffering, shutdown, failures, lumberjack rotation and pruning with a fake clock)."""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.auth import Attributes, Decision, UserInfo, non_resource
from fleet.auth.audit import (
    AUTHN_FAILURE_ANNOTATION,
    CURRENT,
    DEFAULT_POLICY,
    RequestAudit,
    auth_methods,
    parse_policy,
    record_decision,
    record_impersonation,
    source_ips,
)
from fleet.auth.audit_log import AuditLog, RotatingFile, backup_name, parse_backup_time

# audit.k8s.io/v1 Event and ObjectReference fields (k8s.io/apiserver/pkg/apis/audit/v1/types.go).
EVENT_FIELDS = {"kind", "apiVersion", "level", "auditID", "stage", "requestURI", "verb", "user",
                "impersonatedUser", "sourceIPs", "userAgent", "objectRef", "responseStatus", "requestObject",
                "responseObject", "requestReceivedTimestamp", "stageTimestamp", "annotations"}
REQUIRED = {"kind", "apiVersion", "level", "auditID", "stage", "requestURI", "verb", "user",
            "requestReceivedTimestamp", "stageTimestamp"}
OBJECT_REF_FIELDS = {"resource", "namespace", "name", "uid", "apiGroup", "apiVersion", "resourceVersion",
                     "subresource"}
USER_FIELDS = {"username", "uid", "groups", "extra"}
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

ADMIN = UserInfo("admin", "uid-1", ("system:masters", "system:authenticated"), {"scopes": ["a", "b"]})


class ListSink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(json.loads(json.dumps(event)))  # what a line would read back as


def check_shape(ev: dict[str, Any]) -> None:
    assert set(ev) <= EVENT_FIELDS and REQUIRED <= set(ev), set(ev) ^ EVENT_FIELDS
    assert ev["kind"] == "Event" and ev["apiVersion"] == "audit.k8s.io/v1"
    assert ev["level"] in ("Metadata", "Request", "RequestResponse")
    assert ev["stage"] in ("RequestReceived", "ResponseStarted", "ResponseComplete", "Panic")
    assert MICRO_TIME.match(ev["requestReceivedTimestamp"]) and MICRO_TIME.match(ev["stageTimestamp"])
    assert ev["stageTimestamp"] >= ev["requestReceivedTimestamp"]
    assert set(ev["user"]) <= USER_FIELDS
    assert set(ev.get("objectRef", {})) <= OBJECT_REF_FIELDS
    if "responseStatus" in ev:
        assert isinstance(ev["responseStatus"]["code"], int) and ev["responseStatus"]["metadata"] == {}
    assert all(isinstance(v, str) for v in ev.get("annotations", {}).values())
    assert isinstance(ev["sourceIPs"], list)


def audit(policy_doc: dict[str, Any] | None = None, **kw: Any) -> tuple[RequestAudit, ListSink]:
    sink = ListSink()
    pol = DEFAULT_POLICY if policy_doc is None else parse_policy(json.dumps(
        {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", **policy_doc}))
    headers = {"user-agent": "kubectl/v1.32.4 (linux/amd64)", **kw.pop("headers", {})}
    ra = RequestAudit(sink, pol, request_uri=kw.pop("uri", "/api/v1/namespaces/a/configmaps?limit=5"),
                      headers=headers, remote=kw.pop("remote", "10.0.0.7:51234"), **kw)
    return ra, sink


RR = {"rules": [{"level": "RequestResponse"}]}


def test_metadata_event_shape_and_stages() -> None:
    ra, sink = audit({"rules": [{"level": "Metadata"}]})
    ra.authenticated(ADMIN, Attributes("list", "", "v1", "configmaps", namespace="a"))
    ra.decision(Decision(True, 'RBAC: allowed by ClusterRoleBinding "x"'))
    ra.complete(200, b'{"kind":"ConfigMapList","items":[]}', "application/json")
    received, done = sink.events
    for ev in sink.events:
        check_shape(ev)
    assert received["stage"] == "RequestReceived" and "responseStatus" not in received
    assert "annotations" not in received  # authorization comes after RequestReceived
    assert done["stage"] == "ResponseComplete"
    assert done["auditID"] == received["auditID"] and UUID.match(done["auditID"])
    assert done["requestReceivedTimestamp"] == received["requestReceivedTimestamp"]
    assert done["requestURI"] == "/api/v1/namespaces/a/configmaps?limit=5"
    assert done["verb"] == "list"
    assert done["user"] == {"username": "admin", "uid": "uid-1", "groups": ["system:masters",
                            "system:authenticated"], "extra": {"scopes": ["a", "b"]}}
    assert done["sourceIPs"] == ["10.0.0.7"]
    assert done["userAgent"] == "kubectl/v1.32.4 (linux/amd64)"
    assert done["objectRef"] == {"resource": "configmaps", "namespace": "a", "apiVersion": "v1"}
    assert done["responseStatus"] == {"metadata": {}, "code": 200}
    assert "requestObject" not in done and "responseObject" not in done
    assert done["annotations"] == {"authorization.k8s.io/decision": "allow",
                                   "authorization.k8s.io/reason": 'RBAC: allowed by ClusterRoleBinding "x"'}
    # Exactly one ResponseComplete, however often completion is reported.
    ra.complete(200)
    assert len(sink.events) == 2


def test_request_response_objects_and_error_status() -> None:
    ra, sink = audit(RR, uri="/api/v1/namespaces/a/configmaps")
    ra.authenticated(ADMIN, Attributes("create", "", "v1", "configmaps", namespace="a"))
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "managedFields": [{"m": 1}]},
            "data": {"k": "v"}}
    ra.request_body(json.dumps(body).encode(), "application/json")
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": 'configmaps "c" already exists', "reason": "AlreadyExists",
              "details": {"name": "c", "kind": "configmaps"}, "code": 409}
    ra.complete(409, json.dumps(status).encode(), "application/json")
    ev = sink.events[-1]
    check_shape(ev)
    assert ev["objectRef"] == {"resource": "configmaps", "namespace": "a", "name": "c", "apiVersion": "v1"}
    assert ev["requestObject"] == body  # managedFields kept unless omitManagedFields
    assert ev["responseObject"] == status
    assert ev["responseStatus"] == {"metadata": {}, "status": "Failure", "message": 'configmaps "c" already exists',
                                    "reason": "AlreadyExists", "details": {"name": "c", "kind": "configmaps"},
                                    "code": 409}


def test_omit_managed_fields_and_request_level_has_no_response_object() -> None:
    ra, sink = audit({"omitManagedFields": True, "rules": [{"level": "Request"}]})
    ra.authenticated(ADMIN, Attributes("update", "apps", "v1", "deployments", namespace="a", name="d"))
    obj = {"kind": "Deployment", "metadata": {"name": "d", "managedFields": [{"manager": "kubectl"}]}}
    ra.request_body(json.dumps(obj).encode(), "application/json")
    ra.complete(200, json.dumps(obj).encode(), "application/json")
    ev = sink.events[-1]
    assert ev["requestObject"] == {"kind": "Deployment", "metadata": {"name": "d"}}
    assert "responseObject" not in ev
    assert ev["objectRef"]["apiGroup"] == "apps"


def test_secret_bodies_never_logged_even_if_they_turn_up_elsewhere() -> None:
    ra, sink = audit(RR, uri="/apis/example.com/v1/things")
    ra.authenticated(ADMIN, Attributes("create", "example.com", "v1", "things"))
    ra.request_body(b'{"kind":"Secret","data":{"p":"c2VjcmV0"}}', "application/json")
    ra.complete(201, b'{"kind":"SecretList","items":[{"kind":"Secret","data":{"p":"c2VjcmV0"}}]}',
                "application/json")
    assert "c2VjcmV0" not in json.dumps(sink.events)
    # and the secrets resource itself: Metadata, whatever the policy
    ra, sink = audit(RR, uri="/api/v1/namespaces/a/secrets")
    ra.authenticated(ADMIN, Attributes("create", "", "v1", "secrets", namespace="a"))
    ra.request_body(b'{"kind":"Secret","metadata":{"name":"s"},"stringData":{"p":"hunter2"}}',
                    "application/json")
    ra.complete(201, b'{"kind":"Secret","metadata":{"name":"s"},"data":{"p":"aHVudGVyMg=="}}',
                "application/json")
    ev = sink.events[-1]
    assert ev["level"] == "Metadata" and ev["objectRef"]["name"] == "s"
    assert "hunter2" not in json.dumps(sink.events) and "aHVudGVyMg==" not in json.dumps(sink.events)


def test_unauthenticated_request() -> None:
    ra, sink = audit(headers={"authorization": "Bearer bad"})
    token = CURRENT.set(ra)
    try:
        from fleet.auth.audit import record_authentication_failure
        record_authentication_failure("token has expired")
    finally:
        CURRENT.reset(token)
    ra.refused(Attributes("list", "", "v1", "pods"), auth_methods({"authorization": "Bearer bad"}))
    ra.complete(401, b'{"kind":"Status","status":"Failure","message":"Unauthorized","reason":"Unauthorized",'
                     b'"code":401}', "application/json")
    (ev,) = sink.events  # no RequestReceived: the request never got past authentication
    check_shape(ev)
    assert ev["user"] == {}
    assert ev["responseStatus"]["code"] == 401 and ev["responseStatus"]["message"] == "Unauthorized"
    assert ev["annotations"] == {
        AUTHN_FAILURE_ANNOTATION: "Authentication failed, attempted: bearer: token has expired"}


def test_auth_methods_and_source_ips() -> None:
    assert auth_methods({}) == "Authentication failed, no credentials provided"
    assert auth_methods({"authorization": "Basic eDp5"}, (b"cert",)) == \
        "Authentication failed, attempted: basic, x509"
    assert source_ips({"x-forwarded-for": "1.2.3.4, 5.6.7.8", "x-real-ip": "1.2.3.4"}, "127.0.0.1:80") == \
        ["1.2.3.4", "5.6.7.8", "127.0.0.1"]
    assert source_ips({}, "::1:5555") == ["::1"]
    assert source_ips({"x-forwarded-for": "not-an-ip"}, "") == []


def test_impersonation_decision_panic_and_omitted_stages() -> None:
    ra, sink = audit({"omitStages": ["RequestReceived"], "rules": [{"level": "Metadata"}]})
    token = CURRENT.set(ra)
    try:
        ra.authenticated(ADMIN, non_resource("get", "/healthz"))
        record_impersonation(UserInfo("jane", groups=("devs",)))
        record_decision(Decision(False, "no RBAC policy matched"))
    finally:
        CURRENT.reset(token)
    ra.panic("APIServer panic'd on GET /healthz: KeyError")
    ra.complete(500)  # the Panic stage replaces ResponseComplete
    (ev,) = sink.events
    check_shape(ev)
    assert ev["stage"] == "Panic" and ev["responseStatus"]["code"] == 500
    assert ev["impersonatedUser"] == {"username": "jane", "groups": ["devs"]}
    assert "objectRef" not in ev and ev["verb"] == "get"
    assert ev["annotations"]["authorization.k8s.io/decision"] == "forbid"


def test_level_none_emits_nothing_and_audit_id_header_is_honoured() -> None:
    ra, sink = audit({"rules": [{"level": "None"}]}, headers={"audit-id": "from-the-client"})
    ra.authenticated(ADMIN, non_resource("get", "/version"))
    ra.complete(200)
    assert sink.events == [] and ra.audit_id == "from-the-client"


async def test_streamed_response_started_then_complete() -> None:
    ra, sink = audit({"rules": [{"level": "RequestResponse"}]}, uri="/api/v1/pods?watch=1")
    ra.authenticated(ADMIN, Attributes("watch", "", "v1", "pods"))
    closed = []

    async def body():  # type: ignore[no-untyped-def]
        try:
            yield b"a"
            yield b"b"
            await trio.sleep_forever()
        finally:
            closed.append(True)

    stream = ra.stream(200, body())
    assert sink.events[-1]["stage"] == "RequestReceived"  # nothing before the first chunk is asked for
    with trio.move_on_after(0.05):
        async for _ in stream:
            pass
    await stream.aclose()  # the ASGI layer closes it when the client leaves
    stages = [e["stage"] for e in sink.events]
    assert stages == ["RequestReceived", "ResponseStarted", "ResponseComplete"]
    assert closed == [True]
    assert all(e["responseStatus"]["code"] == 200 for e in sink.events[1:])
    assert "responseObject" not in sink.events[-1]  # a watch's events are not logged


async def test_stream_closed_before_its_first_chunk_still_closes_and_completes() -> None:
    ra, sink = audit({"rules": [{"level": "Metadata"}]}, uri="/api/v1/namespaces/a/pods/p/log?follow=true")
    ra.authenticated(ADMIN, Attributes("get", "", "v1", "pods", "log", "a", "p"))

    class AgentStream:  # like proxy.LogStream: holds a connection until closed
        closed = False

        def __aiter__(self) -> AgentStream:
            return self

        async def __anext__(self) -> bytes:
            return b"line"

        async def aclose(self) -> None:
            self.closed = True

    agent = AgentStream()
    stream = ra.stream(200, agent)
    await stream.aclose()  # the client left before the first chunk
    assert agent.closed
    assert [e["stage"] for e in sink.events] == ["RequestReceived", "ResponseComplete"]


# -- the writer ----------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = datetime(2026, 12, 1, 8, 0, 0, 123000, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.t

    def advance(self, **kw: float) -> None:
        self.t += timedelta(**kw)


def line(n: int, size: int = 100) -> bytes:
    body = json.dumps({"n": n, "pad": "x" * size})
    return body.encode() + b"\n"


def test_backup_names_like_lumberjack(tmp_path: Path) -> None:
    p = tmp_path / "audit.log"
    t = datetime(2026, 12, 3, 10, 27, 5, 123456, tzinfo=UTC)
    assert backup_name(p, t).name == "audit-2026-12-03T10-27-05.123.log"
    assert parse_backup_time(p, "audit-2026-12-03T10-27-05.123.log") == t.replace(microsecond=123000)
    assert parse_backup_time(p, "audit.log") is None
    assert parse_backup_time(p, "other-2026-12-03T10-27-05.123.log") is None
    assert parse_backup_time(p, "audit-garbage.log") is None
    assert backup_name(tmp_path / "audit", t).name == "audit-2026-12-03T10-27-05.123"


def test_rotation_by_size(tmp_path: Path) -> None:
    clock = Clock()
    f = RotatingFile(tmp_path / "audit.log", max_size_mb=1, now=clock)
    big = line(0, 300_000)  # three fit in 1 MB, the fourth does not
    f.write_lines([big, big, big])
    assert f.backups() == []
    clock.advance(seconds=1)
    f.write_lines([big])  # would pass 1 MB: the file is rotated first
    (backup,) = f.backups()
    assert backup[1].name == "audit-2026-12-01T08-00-01.123.log"
    assert backup[1].stat().st_size == 3 * len(big)
    assert (tmp_path / "audit.log").stat().st_size == len(big)
    assert oct(os.stat(tmp_path / "audit.log").st_mode & 0o777) == "0o600"
    # rotations within one batch split it between whole lines; same-millisecond names never collide
    f.write_lines([big] * 7)
    names = [p.name for _, p in f.backups()]
    assert len(names) == len(set(names)) == 3
    for _, p in f.backups():
        assert all(json.loads(x) for x in p.read_text().splitlines())
        assert p.stat().st_size <= 1024 * 1024
    # a line larger than the limit still gets written (a file of its own)
    f.write_lines([line(1, 1_200_000)])
    assert (tmp_path / "audit.log").stat().st_size > 1024 * 1024
    f.close()


def test_existing_full_file_rotated_at_open(tmp_path: Path) -> None:
    p = tmp_path / "audit.log"
    p.write_bytes(b"x" * (1024 * 1024))
    f = RotatingFile(p, max_size_mb=1, now=Clock())
    f.open()
    assert len(f.backups()) == 1 and p.stat().st_size == 0
    f.close()
    p.write_bytes(b"{}\n")
    f = RotatingFile(p, max_size_mb=1, now=Clock())
    f.write_lines([b"{}\n"])  # appended, not truncated
    assert p.read_bytes() == b"{}\n{}\n"
    f.close()


def test_backups_pruned_by_age_with_a_fake_clock(tmp_path: Path) -> None:
    clock = Clock()
    f = RotatingFile(tmp_path / "audit.log", max_size_mb=1, max_age_days=3, now=clock)
    big = line(0, 600_000)
    for _ in range(4):  # a rotation a day
        f.write_lines([big])
        clock.advance(days=1)
    ages = [(clock() - t).days for t, _ in f.backups()]
    assert ages == [1, 2, 3]  # 3 backups: day 1..3 old, none pruned yet (cutoff is strict)
    clock.advance(hours=1)
    removed = f.prune()  # the periodic prune (AuditLog.run) or the next rotation
    assert [p.name for p in removed] == ["audit-2026-12-02T08-00-00.123.log"]
    clock.advance(days=10)
    f.prune()
    assert f.backups() == []
    assert (tmp_path / "audit.log").exists()  # the active file is never pruned
    # a stranger's file beside the log is left alone
    (tmp_path / "audit-notes.log").write_text("mine")
    f.prune()
    assert (tmp_path / "audit-notes.log").exists()
    f.close()


def test_backups_pruned_by_count(tmp_path: Path) -> None:
    clock = Clock()
    f = RotatingFile(tmp_path / "audit.log", max_size_mb=1, max_backups=2, now=clock)
    big = line(0, 600_000)
    for _ in range(6):
        f.write_lines([big])
        clock.advance(minutes=1)
    kept = f.backups()
    assert len(kept) == 2
    assert [t for t, _ in kept] == sorted((t for t, _ in kept), reverse=True)
    assert kept[0][0] == datetime(2026, 12, 1, 8, 5, 0, 123000, tzinfo=UTC)  # the newest survive
    f.close()


async def test_writer_buffers_flushes_and_never_loses_events_on_shutdown(tmp_path: Path) -> None:
    p = tmp_path / "a" / "audit.log"  # the directory is created
    log = AuditLog(str(p), flush_interval=0.01)
    log.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        for i in range(100):
            log.emit({"kind": "Event", "n": i})
        assert log.pending == 100  # the request path only appended
        await trio.sleep(0.2)
        assert log.pending == 0 and len(p.read_text().splitlines()) == 100
        for i in range(100, 150):
            log.emit({"kind": "Event", "n": i})
        nursery.cancel_scope.cancel()  # shutdown before the next flush
    log.emit({"kind": "Event", "n": 150})  # a request finishing after the writer stopped
    got = [json.loads(x)["n"] for x in p.read_text().splitlines()]
    assert got == list(range(151))
    assert log.events_total == 151 and log.errors_total == 0
    log.close()


async def test_backpressure_waits_for_the_writer(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.log"), flush_interval=0.01, max_pending=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        for i in range(10):
            log.emit({"n": i})
        with trio.fail_after(5):
            await log.wait_room()
        assert log.pending < 10
        nursery.cancel_scope.cancel()
    log.close()


class Counters:
    def __init__(self) -> None:
        self.events = 0
        self.errors = 0

    def audit_event(self) -> None:
        self.events += 1

    def audit_error(self, n: int) -> None:
        self.errors += n


class BrokenTarget:
    path = Path("/broken/audit.log")

    def open(self) -> None:
        pass

    def write_lines(self, lines: list[bytes]) -> None:
        raise OSError(28, "No space left on device")

    def prune(self) -> list[Path]:
        return []

    def close(self) -> None:
        pass


async def test_write_failures_are_logged_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = AuditLog(str(tmp_path / "audit.log"), flush_interval=0.01)
    log.target = BrokenTarget()  # type: ignore[assignment]
    log.counters = counters = Counters()
    caplog.set_level(logging.ERROR)
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        for i in range(5):
            log.emit({"n": i})
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert counters.events == 5 and counters.errors == 5 and log.errors_total == 5
    assert "audit log: 5 event(s) could not be written" in caplog.text
    assert "No space left on device" in caplog.text


def test_stdout_target(capfd: pytest.CaptureFixture[str]) -> None:
    log = AuditLog("-")
    log.emit({"kind": "Event", "stage": "ResponseComplete"})
    out, _ = capfd.readouterr()
    assert json.loads(out) == {"kind": "Event", "stage": "ResponseComplete"}


def test_metrics_names() -> None:
    from prometheus_client.exposition import generate_latest

    from fleet.server.metrics import Metrics

    m = Metrics(lambda: {}, lambda: 0)
    m.audit_event()
    m.audit_error(3)
    text = generate_latest(m.registry).decode()
    assert "apiserver_audit_event_total 1.0" in text
    assert 'apiserver_audit_error_total{plugin="log"} 3.0' in text
