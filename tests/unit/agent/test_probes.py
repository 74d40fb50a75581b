"""Probes: thresholds, delays, startup gating and timeouts under a mock clock; the exec,
httpGet, tcpSocket and grpc checks against real servers on 127.0.0.1."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio.testing

from fleet.agent.probes import (
    ProbeFailure,
    ProbeRunner,
    grpc_check,
    health_request,
    http_get_check,
    parse_health_response,
    tcp_check,
)
from fleet.auth.pki import ensure_serving_tls


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def net_autojump() -> trio.testing.MockClock:
    """For runner tests that talk to a real loopback server: jump only after 20 ms of real
    idleness, so the clock never leaps past a probe timeout while a request is in flight
    on a busy machine (threshold 0 jumps the instant the loop waits on a socket)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


# -- fakes and servers -----------------------------------------------------------------


class FakeExec:
    """exec_in_container: results are taken in order (the last one repeats);
    "hang" never returns, a float sleeps that long then succeeds."""

    def __init__(self, *results: int | str | float) -> None:
        self.results = list(results)
        self.calls: list[tuple[float, list[str], float]] = []

    async def __call__(self, argv: Any, timeout: float) -> int:
        self.calls.append((trio.current_time(), list(argv), timeout))
        r = self.results.pop(0) if len(self.results) > 1 else self.results[0]
        if r == "hang":
            await trio.sleep_forever()
        if isinstance(r, float):
            await trio.sleep(r)
            return 0
        assert isinstance(r, int)
        return r

    def times(self) -> list[float]:
        return [t for t, _, _ in self.calls]


@dataclass
class HttpServer:
    """A tiny HTTP/1.1 server on 127.0.0.1 running in the test's own Trio loop."""

    port: int = 0
    status: int = 200
    hang: bool = False
    routes: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    async def handle(self, stream: trio.abc.Stream) -> None:
        try:
            buf = b""
            while b"\r\n\r\n" not in buf and len(buf) < 65536:
                data = await stream.receive_some(4096)
                if not data:
                    return
                buf += data
            head = buf.split(b"\r\n\r\n", 1)[0].decode()
            line, *lines = head.split("\r\n")
            target = line.split(" ")[1]
            headers = {k.strip().lower(): v.strip()
                       for k, _, v in (h.partition(":") for h in lines)}
            self.requests.append((target, headers))
            if self.hang:
                await trio.sleep_forever()
            status, extra = self.routes.get(target, (self.status, {}))
            more = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
            await stream.send_all(f"HTTP/1.1 {status} Whatever\r\nContent-Length: 2\r\n"
                                  f"Connection: close\r\n{more}\r\nok".encode())
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            pass


async def start_http(nursery: trio.Nursery, ssl_context: ssl.SSLContext | None = None) -> HttpServer:
    server = HttpServer()
    if ssl_context is None:
        listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    else:
        listeners = await nursery.start(partial(trio.serve_ssl_over_tcp, server.handle, 0,
                                                ssl_context, host="127.0.0.1"))
    server.port = listeners[0].transport_listener.socket.getsockname()[1] if ssl_context \
        else listeners[0].socket.getsockname()[1]
    return server


def closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now: connects are refused
    return port


def runner(container: dict[str, Any], **kw: Any) -> tuple[ProbeRunner, dict[str, list[Any]]]:
    seen: dict[str, list[Any]] = {"change": [], "failure": [], "unhealthy": []}
    r: ProbeRunner

    def on_change() -> None:
        seen["change"].append((trio.current_time(), r.started, r.ready))

    async def on_failure(f: ProbeFailure) -> None:
        seen["failure"].append((trio.current_time(), f))

    def on_unhealthy(kind: str, message: str) -> None:
        seen["unhealthy"].append((trio.current_time(), kind, message))

    r = ProbeRunner({"name": "app", **container}, pod_ip="127.0.0.1", on_change=on_change,
                    on_liveness_failure=on_failure, on_unhealthy=on_unhealthy, **kw)
    return r, seen


def exec_probe(**kw: Any) -> dict[str, Any]:
    return {"exec": {"command": ["check"]}, **kw}


# -- the runner, on a mock clock -------------------------------------------------------


async def test_no_probes_means_started_and_ready(autojump: trio.testing.MockClock) -> None:
    r, _ = runner({})
    assert r.started and r.ready


async def test_readiness_thresholds_and_initial_delay(autojump: trio.testing.MockClock,
                                                      nursery: trio.Nursery) -> None:
    fake = FakeExec(0, 0, 1, 1, 1, 0, 0)
    r, seen = runner({"readinessProbe": exec_probe(initialDelaySeconds=5, periodSeconds=10,
                                                   successThreshold=2, failureThreshold=3)},
                     exec_in_container=fake)
    assert r.started and not r.ready
    t0 = trio.current_time()
    await nursery.start(r.run)
    await trio.sleep(70)
    assert [t - t0 for t in fake.times()] == [5, 15, 25, 35, 45, 55, 65]
    # ready after the 2nd success, unready after the 3rd failure in a row, ready again
    assert [(t - t0, ready) for t, _, ready in seen["change"]] == [(15, True), (45, False),
                                                                   (65, True)]
    assert [t - t0 for t, _, _ in seen["unhealthy"]] == [25, 35, 45]
    assert seen["unhealthy"][0][2] == "Readiness probe failed: command ['check'] exited with 1"
    assert fake.calls[0][2] == 1  # default timeoutSeconds reaches the exec callable
    assert seen["failure"] == []


async def test_liveness_failure_after_consecutive_failures(autojump: trio.testing.MockClock,
                                                          nursery: trio.Nursery) -> None:
    fake = FakeExec(1, 1, 0, 1, 1, 1, 0)
    r, seen = runner({"livenessProbe": exec_probe(periodSeconds=2, failureThreshold=3,
                                                  terminationGracePeriodSeconds=7)},
                     exec_in_container=fake)
    t0 = trio.current_time()
    await nursery.start(r.run)
    await trio.sleep(30)
    # The success at t=4 resets the count: failing for good at the 6th probe (t=10).
    ((when, failure),) = seen["failure"]
    assert when - t0 == 10
    assert failure == ProbeFailure("liveness", "Liveness probe failed: command ['check'] "
                                               "exited with 1", 7)
    assert r.failure == failure
    # After a liveness failure the probe stops: the worker restarts the container.
    assert len(fake.calls) == 6
    assert r.ready and r.started  # no readiness probe: readiness is not liveness' business


async def test_startup_probe_gates_liveness_and_readiness(autojump: trio.testing.MockClock,
                                                         nursery: trio.Nursery) -> None:
    startup = FakeExec(1, 1, 1, 0)
    others = FakeExec(0)

    async def exec_in(argv: Any, timeout: float) -> int:
        return await (startup if argv[0] == "startup" else others)(argv, timeout)

    r, seen = runner({
        "startupProbe": {"exec": {"command": ["startup"]}, "periodSeconds": 3,
                         "failureThreshold": 10},
        "livenessProbe": {"exec": {"command": ["live"]}, "periodSeconds": 5},
        "readinessProbe": {"exec": {"command": ["ready"]}, "periodSeconds": 5},
    }, exec_in_container=exec_in)
    assert not r.started and not r.ready
    t0 = trio.current_time()
    await nursery.start(r.run)
    await trio.sleep(8)
    assert not r.started and others.calls == []
    await trio.sleep(2)  # 4th startup probe at t=9 succeeds
    assert r.started and r.ready
    assert [t - t0 for t in startup.times()] == [0, 3, 6, 9]
    first_other = min(others.times()) - t0
    assert first_other == 9  # liveness and readiness begin only once started
    assert seen["change"][0][1:] == (True, False)  # started, readiness still pending
    assert seen["change"][-1][1:] == (True, True)
    assert startup.calls[-1][0] - t0 == 9 and len(startup.calls) == 4  # startup stops


async def test_startup_failure_restarts_and_never_runs_liveness(
        autojump: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    startup = FakeExec(1)
    live = FakeExec(0)

    async def exec_in(argv: Any, timeout: float) -> int:
        return await (startup if argv[0] == "startup" else live)(argv, timeout)

    r, seen = runner({"startupProbe": {"exec": {"command": ["startup"]}, "periodSeconds": 1,
                                       "failureThreshold": 4},
                      "livenessProbe": {"exec": {"command": ["live"]}}},
                     exec_in_container=exec_in)
    await nursery.start(r.run)
    await trio.sleep(60)
    assert [f.probe for _, f in seen["failure"]] == ["startup"]
    assert seen["failure"][0][1].message.startswith("Startup probe failed: ")
    assert len(startup.calls) == 4 and live.calls == []
    assert not r.started and not r.ready


async def test_exec_timeout_is_enforced(autojump: trio.testing.MockClock,
                                        nursery: trio.Nursery) -> None:
    fake = FakeExec("hang")
    r, seen = runner({"livenessProbe": exec_probe(timeoutSeconds=4, periodSeconds=10,
                                                  failureThreshold=1)},
                     exec_in_container=fake)
    t0 = trio.current_time()
    await nursery.start(r.run)
    await trio.sleep(20)
    ((when, failure),) = seen["failure"]
    assert when - t0 == 4
    assert failure.message == "Liveness probe failed: command ['check'] timed out after 4s"
    assert fake.calls[0][2] == 4


async def test_a_slow_probe_does_not_stretch_the_period(autojump: trio.testing.MockClock,
                                                        nursery: trio.Nursery) -> None:
    fake = FakeExec(3.0)  # each exec takes 3 s (timeout 5)
    r, _ = runner({"readinessProbe": exec_probe(periodSeconds=10, timeoutSeconds=5)},
                  exec_in_container=fake)
    t0 = trio.current_time()
    await nursery.start(r.run)
    await trio.sleep(35)
    assert [t - t0 for t in fake.times()] == [0, 10, 20, 30]


async def test_started_at_counts_initial_delay_from_container_start(
        autojump: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    fake = FakeExec(0)
    t0 = trio.current_time()
    await trio.sleep(7)
    r, _ = runner({"readinessProbe": exec_probe(initialDelaySeconds=10)},
                  exec_in_container=fake, started_at=t0)
    await nursery.start(r.run)
    await trio.sleep(5)
    assert [t - t0 for t in fake.times()] == [10]


async def test_exec_errors_and_missing_handlers_fail(autojump: trio.testing.MockClock) -> None:
    async def broken(argv: Any, timeout: float) -> int:
        raise RuntimeError("container is gone")

    r, _ = runner({"livenessProbe": exec_probe(), "readinessProbe": {"periodSeconds": 1}},
                  exec_in_container=broken)
    res = await r.check("liveness")
    assert not res.ok and "container is gone" in res.message
    res = await r.check("readiness")
    assert not res.ok and "no handler" in res.message
    r2, _ = runner({"livenessProbe": exec_probe()})  # no exec callable
    assert not (await r2.check("liveness")).ok


# -- httpGet through the runner (mock clock, real loopback server) -----------------------


async def test_http_readiness_with_named_port_follows_the_server(
        net_autojump: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    server = await start_http(nursery)
    r, seen = runner({"ports": [{"name": "web", "containerPort": server.port}],
                      "readinessProbe": {"httpGet": {"path": "/ready", "port": "web"},
                                         "periodSeconds": 5, "failureThreshold": 2}})
    await nursery.start(r.run)
    await trio.sleep(1)
    assert r.ready
    server.status = 503
    await trio.sleep(10)
    assert not r.ready
    assert seen["unhealthy"][-1][2] == ("Readiness probe failed: HTTP probe failed with "
                                        "statuscode: 503")
    server.status = 200
    await trio.sleep(5)
    assert r.ready
    assert all(path == "/ready" for path, _ in server.requests)


async def test_http_liveness_timeout(net_autojump: trio.testing.MockClock,
                                     nursery: trio.Nursery) -> None:
    server = await start_http(nursery)
    server.hang = True
    r, seen = runner({"livenessProbe": {"httpGet": {"port": server.port}, "timeoutSeconds": 2,
                                        "periodSeconds": 10, "failureThreshold": 2}})
    t0 = trio.current_time()
    await nursery.start(r.run)
    await trio.sleep(30)
    ((when, failure),) = seen["failure"]
    assert when - t0 == 12  # second probe at t=10 times out after 2 s
    assert failure.message.startswith(f'Liveness probe failed: Get "http://127.0.0.1:{server.port}/"')
    assert "context deadline exceeded" in failure.message


async def test_tcp_liveness_through_the_runner(net_autojump: trio.testing.MockClock,
                                               nursery: trio.Nursery) -> None:
    server = await start_http(nursery)
    r, seen = runner({"ports": [{"name": "p", "containerPort": server.port}],
                      "livenessProbe": {"tcpSocket": {"port": "p"}, "periodSeconds": 1,
                                        "failureThreshold": 1},
                      "readinessProbe": {"tcpSocket": {"port": closed_port()},
                                         "periodSeconds": 1}})
    await nursery.start(r.run)
    await trio.sleep(5)
    assert seen["failure"] == [] and not r.ready
    assert "connect: Connection refused" in seen["unhealthy"][0][2]


# -- single checks against real servers (real clock) -----------------------------------


@pytest.mark.parametrize(("status", "ok"), [(200, True), (204, True), (302, True), (399, True),
                                            (400, False), (404, False), (500, False)])
async def test_http_status_ranges(nursery: trio.Nursery, status: int, ok: bool) -> None:
    server = await start_http(nursery)
    server.status = status
    res = await http_get_check({"port": server.port, "path": "/x"}, pod_ip="127.0.0.1",
                               container=None, timeout=5)
    assert res.ok is ok
    if not ok:
        assert res.message == f"HTTP probe failed with statuscode: {status}"


async def test_http_request_shape(nursery: trio.Nursery) -> None:
    server = await start_http(nursery)
    action = {"port": "metrics", "path": "healthz?deep=1", "host": "127.0.0.1",
              "httpHeaders": [{"name": "X-Probe", "value": "yes"},
                              {"name": "Host", "value": "app.example"}]}
    container = {"ports": [{"name": "other", "containerPort": 1},
                           {"name": "metrics", "containerPort": server.port}]}
    res = await http_get_check(action, pod_ip="192.0.2.1", container=container, timeout=5)
    assert res.ok, res.message
    ((path, headers),) = server.requests
    assert path == "/healthz?deep=1"
    assert headers["x-probe"] == "yes" and headers["host"] == "app.example"
    assert headers["user-agent"].startswith("kube-probe/")
    assert headers["accept"] == "*/*" and headers["connection"] == "close"
    action = {"port": server.port, "httpHeaders": [{"name": "User-Agent", "value": "mine"}]}
    assert (await http_get_check(action, pod_ip="127.0.0.1", container=None, timeout=5)).ok
    assert server.requests[-1][1]["user-agent"] == "mine"


async def test_http_redirects(nursery: trio.Nursery) -> None:
    server = await start_http(nursery)
    server.routes = {"/moved": (302, {"Location": "/broken"}), "/broken": (500, {}),
                     "/away": (301, {"Location": "http://elsewhere.invalid/"}),
                     "/ok": (307, {"Location": "/fine"}), "/fine": (200, {})}
    check = lambda path: http_get_check({"port": server.port, "path": path},  # noqa: E731
                                        pod_ip="127.0.0.1", container=None, timeout=5)
    assert (await check("/moved")).message == "HTTP probe failed with statuscode: 500"
    assert (await check("/ok")).ok
    away = await check("/away")
    assert away.ok and "Probe terminated redirects" in away.message


async def test_https_is_not_verified(nursery: trio.Nursery, tmp_path: Path) -> None:
    tls = ensure_serving_tls(tmp_path)  # signed by a CA the probe does not know
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    server = await start_http(nursery, ctx)
    res = await http_get_check({"port": server.port, "scheme": "HTTPS", "path": "/secure"},
                               pod_ip="127.0.0.1", container=None, timeout=5)
    assert res.ok, res.message
    assert server.requests[0][0] == "/secure"


@pytest.mark.parametrize(("action", "pod_ip", "message"), [
    ({"port": "nope"}, "127.0.0.1", "couldn't find port: nope"),
    ({"port": 0}, "127.0.0.1", "invalid port number: 0"),
    ({"port": 80}, None, "no host"),
    ({"port": 80, "scheme": "GOPHER"}, "127.0.0.1", "unsupported scheme"),
])
async def test_http_bad_actions(action: dict[str, Any], pod_ip: str | None, message: str) -> None:
    res = await http_get_check(action, pod_ip=pod_ip, container={"ports": []}, timeout=1)
    assert not res.ok and message in res.message


async def test_http_connection_refused_and_timeout(nursery: trio.Nursery) -> None:
    port = closed_port()
    res = await http_get_check({"port": port}, pod_ip="127.0.0.1", container=None, timeout=5)
    assert not res.ok
    assert res.message.startswith(f'Get "http://127.0.0.1:{port}/": ')
    assert "refused" in res.message.lower()
    server = await start_http(nursery)
    server.hang = True
    with trio.fail_after(5):
        res = await http_get_check({"port": server.port}, pod_ip="127.0.0.1", container=None,
                                   timeout=0.2)
    assert not res.ok and "context deadline exceeded" in res.message


async def test_tcp_check(nursery: trio.Nursery) -> None:
    server = await start_http(nursery)
    assert (await tcp_check({"port": server.port}, pod_ip="127.0.0.1", container=None,
                            timeout=5)).ok
    port = closed_port()
    res = await tcp_check({"port": port, "host": "127.0.0.1"}, pod_ip=None, container=None,
                          timeout=5)
    assert res.message == f"dial tcp 127.0.0.1:{port}: connect: Connection refused"
    res = await tcp_check({"port": "missing"}, pod_ip="127.0.0.1", container={}, timeout=5)
    assert not res.ok and "couldn't find port" in res.message


# -- grpc ------------------------------------------------------------------------------


def test_health_messages_round_trip() -> None:
    assert health_request("") == b"\x00\x00\x00\x00\x00"
    assert health_request("svc") == b"\x00\x00\x00\x00\x05\x0a\x03svc"
    assert parse_health_response(b"\x00\x00\x00\x00\x02\x08\x01") == 1
    assert parse_health_response(b"\x00\x00\x00\x00\x00") == 0  # status omitted = UNKNOWN
    # unknown fields are skipped
    assert parse_health_response(b"\x00\x00\x00\x00\x06\x12\x02hi\x08\x02") == 2
    with pytest.raises(ValueError):
        parse_health_response(b"\x00\x00\x00\x00\x05\x08")


@dataclass
class GrpcServer:
    """grpc.health.v1 over h2c, answering `statuses[service]` (missing → NOT_FOUND)."""

    statuses: dict[str, int]
    port: int = 0
    services: list[str] = field(default_factory=list)

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        await stream.send_all(conn.data_to_send())
        bodies: dict[int, bytes] = {}
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.DataReceived):
                        bodies[ev.stream_id] = bodies.get(ev.stream_id, b"") + ev.data
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded):
                        self._answer(conn, ev.stream_id, bodies.pop(ev.stream_id, b""))
                await stream.send_all(conn.data_to_send())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _answer(self, conn: h2.connection.H2Connection, sid: int, body: bytes) -> None:
        msg = body[5:]
        service = msg[2:].decode() if msg[:1] == b"\x0a" else ""
        self.services.append(service)
        if service not in self.statuses:
            conn.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc"),
                                    ("grpc-status", "5"), ("grpc-message", "unknown%20service")],
                              end_stream=True)
            return
        reply = b"\x08" + bytes([self.statuses[service]])
        conn.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        conn.send_data(sid, b"\x00" + len(reply).to_bytes(4, "big") + reply)
        conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)


async def test_grpc_check(nursery: trio.Nursery) -> None:
    server = GrpcServer({"": 1, "db": 2})
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    check: Callable[..., Any] = grpc_check
    assert (await check({"port": port}, pod_ip="127.0.0.1", timeout=5)).ok
    res = await check({"port": port, "service": "db"}, pod_ip="127.0.0.1", timeout=5)
    assert res.message == 'service unhealthy (responded with "NOT_SERVING")'
    res = await check({"port": port, "service": "nope"}, pod_ip="127.0.0.1", timeout=5)
    assert res.message == "rpc error: code = NotFound desc = unknown service"
    assert server.services == ["", "db", "nope"]
    res = await check({"port": closed_port()}, pod_ip="127.0.0.1", timeout=5)
    assert not res.ok and res.message.startswith("failed to connect service")
