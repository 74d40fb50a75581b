"""Liveness, readiness and startup probes of one container, with Kubernetes semantics.

The pod worker starts one `ProbeRunner` per running container *instance* (a restarted
container gets a fresh runner, as the kubelet resets its probe workers) and reads
`ready` / `started` from it; `on_change` tells it when either flips.  When liveness (or
startup) fails `failureThreshold` times in a row, the runner calls `on_liveness_failure`
with a `ProbeFailure` — the kubelet's message, e.g. `Liveness probe failed: HTTP probe
failed with statuscode: 500` — and stops that probe: the worker restarts the container.
Every failed check is also reported to `on_unhealthy` (the kubelet's `Unhealthy` event).

Timeline of one container::

    container start ──initialDelaySeconds──► probe ─periodSeconds─► probe ─► ...
    startupProbe:   runs first; until it succeeds `started` is False, liveness and
                    readiness do not run and the container is not ready.
    readiness:      `ready` turns True after successThreshold consecutive successes,
                    False after failureThreshold consecutive failures; no readiness
                    probe → ready as soon as started.
    liveness:       failureThreshold consecutive failures → on_liveness_failure.

Each check is bounded by `timeoutSeconds`; a check that runs out of time is a failure.
Checks (usable on their own, and by `fleet.agent.hooks`):

- exec      — `exec_in_container(argv, timeout) -> exit code`, supplied by the worker
              (built on `Driver.exec`); exit 0 is success.
- httpGet   — GET scheme://host:port/path (host = pod IP unless given; port by number or
              by the container port's name); 200 ≤ status < 400 succeeds; HTTPS is not
              verified; same-host redirects are followed, as the kubelet does.
- tcpSocket — a TCP connect.
- grpc      — the standard `grpc.health.v1.Health/Check` over HTTP/2 cleartext; status
              SERVING succeeds.

All waiting uses Trio's clock, so tests drive it with `trio.testing.MockClock`.
"""

from __future__ import annotations

import inspect
import logging
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import trio

log = logging.getLogger(__name__)

ProbeKind = Literal["liveness", "readiness", "startup"]

# exec_in_container(argv, timeout_seconds) -> exit code.  The timeout is math.inf for a
# hook with no deadline; the caller also cancels the call when its own deadline passes.
ExecInContainer = Callable[[Sequence[str], float], Awaitable[int]]

USER_AGENT = "kube-probe/1.32"
# The kubelet reads at most this much of a probe's response body.
_MAX_BODY = 10 * 1024
_MAX_REDIRECTS = 10


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    message: str = ""


@dataclass(frozen=True)
class ProbeFailure:
    """Liveness or startup failed for good; the container must be restarted."""

    probe: ProbeKind
    message: str
    # The probe's own terminationGracePeriodSeconds, overriding the pod's when set.
    grace_period_seconds: int | None = None


@dataclass(frozen=True)
class ProbeSpec:
    """A probe with Kubernetes' defaults filled in."""

    handler: Mapping[str, Any]
    initial_delay: float = 0
    period: float = 10
    timeout: float = 1
    success_threshold: int = 1
    failure_threshold: int = 3
    grace_period_seconds: int | None = None

    @classmethod
    def from_dict(cls, probe: Mapping[str, Any]) -> ProbeSpec:
        def num(key: str, default: int, minimum: int) -> int:
            value = probe.get(key)
            return max(int(value), minimum) if value is not None else default

        return cls(handler=probe,
                   initial_delay=num("initialDelaySeconds", 0, 0),
                   period=num("periodSeconds", 10, 1),
                   timeout=num("timeoutSeconds", 1, 1),
                   success_threshold=num("successThreshold", 1, 1),
                   failure_threshold=num("failureThreshold", 3, 1),
                   grace_period_seconds=probe.get("terminationGracePeriodSeconds"))


# ---------------------------------------------------------------------------------------
# Single checks


def resolve_port(port: int | str | None, container: Mapping[str, Any] | None) -> int:
    """A probe/handler port: a number, or the name of one of the container's ports."""
    if isinstance(port, str) and not port.isdigit():
        for p in (container or {}).get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"couldn't find port: {port} in container "
                         f"{(container or {}).get('name', '')!r}")
    if port is None:
        raise ValueError("port is required")
    number = int(port)
    if not 0 < number < 65536:
        raise ValueError(f"invalid port number: {number}")
    return number


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_url(action: Mapping[str, Any], pod_ip: str | None,
             container: Mapping[str, Any] | None) -> str:
    """The URL of an httpGet action (probe or lifecycle handler)."""
    host = action.get("host") or pod_ip
    if not host:
        raise ValueError("no host: the pod has no IP yet and httpGet.host is not set")
    port = resolve_port(action.get("port"), container)
    scheme = (action.get("scheme") or "HTTP").lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported scheme: {action.get('scheme')}")
    path = action.get("path") or ""
    if not path.startswith("/"):
        path = "/" + path
    return f"{scheme}://{_host_port(host, port)}{path}"


def request_headers(action: Mapping[str, Any]) -> list[tuple[str, str]]:
    given = [(h.get("name", ""), h.get("value", "")) for h in action.get("httpHeaders") or []]
    names = {n.lower() for n, _ in given}
    headers = []
    # Defaults only when the user did not set the header: a probe may need its own
    # User-Agent or Host (virtual hosting), as in Kubernetes.
    if "user-agent" not in names:
        headers.append(("User-Agent", USER_AGENT))
    if "accept" not in names:
        headers.append(("Accept", "*/*"))
    # One connection per probe: a reused connection could hide a server that stopped
    # accepting new ones.
    headers.append(("Connection", "close"))
    return headers + given


def new_http_client() -> httpx.AsyncClient:
    """The client probes and hooks share: no verification (as the kubelet), no pooling."""
    return httpx.AsyncClient(verify=False, timeout=None, follow_redirects=False,
                             limits=httpx.Limits(max_keepalive_connections=0), trust_env=False)


async def _http_get(client: httpx.AsyncClient, url: str,
                    headers: list[tuple[str, str]]) -> tuple[httpx.Response, bool]:
    """GET following same-host redirects; (response, stopped at a foreign redirect)."""
    first_host = httpx.URL(url).host
    for _ in range(_MAX_REDIRECTS + 1):
        async with client.stream("GET", url, headers=headers) as resp:
            read = 0
            async for chunk in resp.aiter_raw():
                read += len(chunk)
                if read >= _MAX_BODY:
                    break
        location = resp.headers.get("location")
        if not (300 <= resp.status_code < 400 and location):
            return resp, False
        nxt = resp.url.join(location)
        if nxt.host != first_host:
            # The kubelet does not follow a redirect to another host: it reports the
            # probe as succeeded with a warning (the 3xx is in range).
            return resp, True
        url = str(nxt)
    return resp, False


async def http_get_check(action: Mapping[str, Any], *, pod_ip: str | None,
                         container: Mapping[str, Any] | None, timeout: float,
                         client: httpx.AsyncClient | None = None) -> CheckResult:
    """One httpGet probe: success when 200 ≤ status < 400 within `timeout` seconds."""
    try:
        url = http_url(action, pod_ip, container)
    except ValueError as e:
        return CheckResult(False, str(e))
    own_client = client is None
    client = client or new_http_client()
    try:
        with trio.move_on_after(timeout) as scope:
            resp, foreign = await _http_get(client, url, request_headers(action))
        if scope.cancelled_caught:
            return CheckResult(False, f'Get "{url}": context deadline exceeded '
                                      f"(Client.Timeout exceeded while awaiting headers)")
    except (httpx.HTTPError, OSError, trio.BrokenResourceError) as e:
        return CheckResult(False, f'Get "{url}": {describe_error(e)}')
    finally:
        if own_client:
            await client.aclose()
    if 200 <= resp.status_code < 400:
        if foreign:
            return CheckResult(True, f"Probe terminated redirects, Response status code: "
                                     f"{resp.status_code}")
        return CheckResult(True)
    return CheckResult(False, f"HTTP probe failed with statuscode: {resp.status_code}")


def describe_error(e: BaseException) -> str:
    """The innermost cause of an httpx/anyio error, which says what happened
    ("Connection refused") where the outer ones only say that connecting failed."""
    inner: BaseException = e
    for _ in range(16):  # bounded: cause chains can be cyclic in pathological cases
        if isinstance(inner, BaseExceptionGroup) and inner.exceptions:
            inner = inner.exceptions[0]
            continue
        nxt = inner.__cause__ or inner.__context__
        if nxt is None:
            break
        inner = nxt
    if isinstance(inner, OSError) and inner.errno:
        # The plain C text ("Connection refused"): trio's own wording adds the address,
        # which the caller's message already carries.
        return os.strerror(inner.errno)
    return str(inner) or str(e) or type(inner).__name__


async def tcp_check(action: Mapping[str, Any], *, pod_ip: str | None,
                    container: Mapping[str, Any] | None, timeout: float) -> CheckResult:
    """One tcpSocket probe: the connect succeeds within `timeout` seconds."""
    host = action.get("host") or pod_ip
    try:
        if not host:
            raise ValueError("no host: the pod has no IP yet and tcpSocket.host is not set")
        port = resolve_port(action.get("port"), container)
    except ValueError as e:
        return CheckResult(False, str(e))
    addr = _host_port(host, port)
    try:
        with trio.move_on_after(timeout) as scope:
            stream = await trio.open_tcp_stream(host, port)
            await stream.aclose()
    except OSError as e:
        return CheckResult(False, f"dial tcp {addr}: connect: {describe_error(e)}")
    if scope.cancelled_caught:
        return CheckResult(False, f"dial tcp {addr}: i/o timeout")
    return CheckResult(True)


async def exec_check(action: Mapping[str, Any], *, exec_in_container: ExecInContainer | None,
                     timeout: float) -> CheckResult:
    """One exec probe: the command exits 0 within `timeout` seconds."""
    argv = list(action.get("command") or [])
    if exec_in_container is None:
        return CheckResult(False, "exec probes are not available for this container")
    if not argv:
        return CheckResult(False, "exec probe has no command")
    try:
        # The callable gets the timeout too, so it can stop the process itself; our own
        # deadline is what guarantees the probe ends on time.
        with trio.move_on_after(timeout) as scope:
            code = await exec_in_container(argv, timeout)
    except Exception as e:  # any runtime failure (container gone...) is a failed probe
        return CheckResult(False, f"command {argv!r} failed: {e}")
    if scope.cancelled_caught:
        return CheckResult(False, f"command {argv!r} timed out after {_secs(timeout)}")
    if code != 0:
        return CheckResult(False, f"command {argv!r} exited with {code}")
    return CheckResult(True)


def _secs(t: float) -> str:
    return f"{t:g}s"


# -- gRPC health checking, without a gRPC library: the request and response are tiny
# protobuf messages and the transport is plain HTTP/2 (h2c with prior knowledge).

_GRPC_CODES = ["OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
               "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
               "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
               "Unauthenticated"]
_SERVING_STATUS = ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while i < len(buf):
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            break
    raise ValueError("truncated varint")


def health_request(service: str) -> bytes:
    """A length-prefixed grpc.health.v1.HealthCheckRequest{service}."""
    raw = service.encode()
    msg = b"\x0a" + _varint(len(raw)) + raw if raw else b""
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


def parse_health_response(body: bytes) -> int:
    """The `status` of a length-prefixed HealthCheckResponse (0 when absent)."""
    if len(body) < 5:
        raise ValueError("empty response")
    if body[0] != 0:
        raise ValueError("compressed response (not requested)")
    length = int.from_bytes(body[1:5], "big")
    msg = body[5:5 + length]
    if len(msg) != length:
        raise ValueError("truncated response")
    i, status = 0, 0
    while i < len(msg):
        tag, i = _read_varint(msg, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _read_varint(msg, i)
            if field == 1:
                status = value
        elif wire == 2:
            n, i = _read_varint(msg, i)
            i += n
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return status


async def grpc_check(action: Mapping[str, Any], *, pod_ip: str | None, timeout: float,
                     client: httpx.AsyncClient | None = None) -> CheckResult:
    """One grpc probe against the pod IP: Health/Check answers SERVING within `timeout`."""
    try:
        port = resolve_port(action.get("port"), None)
    except ValueError as e:
        return CheckResult(False, str(e))
    if not pod_ip:
        return CheckResult(False, "no host: the pod has no IP yet")
    addr = _host_port(pod_ip, port)
    own_client = client is None
    if client is None:
        try:
            client = httpx.AsyncClient(http1=False, http2=True, timeout=None, trust_env=False)
        except ImportError:
            return CheckResult(False, "grpc probes need the h2 package, which is not installed")
    try:
        with trio.move_on_after(timeout) as scope:
            resp = await client.post(
                f"http://{addr}/grpc.health.v1.Health/Check",
                content=health_request(action.get("service") or ""),
                headers={"content-type": "application/grpc", "te": "trailers",
                         "user-agent": USER_AGENT})
        if scope.cancelled_caught:
            return CheckResult(False, f'timeout: health rpc did not complete within '
                                      f'{_secs(timeout)}')
    except (httpx.HTTPError, OSError) as e:
        return CheckResult(False, f'failed to connect service "{addr}": {describe_error(e)}')
    finally:
        if own_client:
            await client.aclose()
    # An error without a body comes "trailers-only": grpc-status in the headers.
    code = int(resp.headers.get("grpc-status", "0") or 0)
    if resp.status_code != 200 or code != 0:
        name = _GRPC_CODES[code] if 0 <= code < len(_GRPC_CODES) else str(code)
        if resp.status_code != 200 and code == 0:
            name = "Unknown"
        desc = urllib.parse.unquote(resp.headers.get("grpc-message", "")) or \
            f"HTTP status {resp.status_code}"
        return CheckResult(False, f"rpc error: code = {name} desc = {desc}")
    try:
        status = parse_health_response(resp.content)
    except ValueError as e:
        return CheckResult(False, f"rpc error: code = Internal desc = {e}")
    if status != 1:
        name = _SERVING_STATUS[status] if status < len(_SERVING_STATUS) else str(status)
        return CheckResult(False, f'service unhealthy (responded with "{name}")')
    return CheckResult(True)


# ---------------------------------------------------------------------------------------
# The runner


async def _call(callback: Callable[..., Any] | None, *args: Any) -> None:
    if callback is None:
        return
    result = callback(*args)
    if inspect.isawaitable(result):
        await result


_TITLE = {"liveness": "Liveness", "readiness": "Readiness", "startup": "Startup"}


class ProbeRunner:
    """Runs the probes of one container instance; see the module docstring."""

    def __init__(self, container: Mapping[str, Any], *, pod_ip: str | None,
                 exec_in_container: ExecInContainer | None = None,
                 on_liveness_failure: Callable[[ProbeFailure], Any] | None = None,
                 on_unhealthy: Callable[[ProbeKind, str], Any] | None = None,
                 on_change: Callable[[], Any] | None = None,
                 started_at: float | None = None) -> None:
        """`started_at` is the container's start on Trio's clock (default: when `run`
        begins); initialDelaySeconds counts from it."""
        self.container = container
        self.pod_ip = pod_ip
        self._exec = exec_in_container
        self._on_liveness_failure = on_liveness_failure
        self._on_unhealthy = on_unhealthy
        self._on_change = on_change
        self._started_at = started_at
        self._specs: dict[ProbeKind, ProbeSpec] = {}
        for kind, key in (("startup", "startupProbe"), ("liveness", "livenessProbe"),
                          ("readiness", "readinessProbe")):
            if container.get(key):
                self._specs[kind] = ProbeSpec.from_dict(container[key])  # type: ignore[index]
        self.started = "startup" not in self._specs
        self.ready = self.started and "readiness" not in self._specs
        # The last failure message per probe, for status and debugging.
        self.last_message: dict[ProbeKind, str] = {}
        self.failure: ProbeFailure | None = None
        self._client: httpx.AsyncClient | None = None

    async def check(self, kind: ProbeKind) -> CheckResult:
        """Run the `kind` probe once, bounded by its timeoutSeconds."""
        spec = self._specs[kind]
        h = spec.handler
        if "exec" in h:
            return await exec_check(h["exec"] or {}, exec_in_container=self._exec,
                                    timeout=spec.timeout)
        if "httpGet" in h:
            return await http_get_check(h["httpGet"] or {}, pod_ip=self.pod_ip,
                                        container=self.container, timeout=spec.timeout,
                                        client=self._client)
        if "tcpSocket" in h:
            return await tcp_check(h["tcpSocket"] or {}, pod_ip=self.pod_ip,
                                   container=self.container, timeout=spec.timeout)
        if "grpc" in h:
            return await grpc_check(h["grpc"] or {}, pod_ip=self.pod_ip, timeout=spec.timeout)
        return CheckResult(False, "probe has no handler (exec, httpGet, tcpSocket or grpc)")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe until cancelled."""
        if self._started_at is None:
            self._started_at = trio.current_time()
        needs_http = any("httpGet" in s.handler for s in self._specs.values())
        async with (new_http_client() if needs_http else _NoClient()) as client:
            self._client = client if needs_http else None
            task_status.started()
            if "startup" in self._specs:
                if not await self._loop("startup"):
                    # Startup failed for good; the worker restarts the container.
                    await trio.sleep_forever()
                self.started = True
                if "readiness" not in self._specs:
                    self.ready = True
                await _call(self._on_change)
            async with trio.open_nursery() as nursery:
                if "liveness" in self._specs:
                    nursery.start_soon(self._loop, "liveness")
                if "readiness" in self._specs:
                    nursery.start_soon(self._loop, "readiness")
                await trio.sleep_forever()

    async def _loop(self, kind: ProbeKind) -> bool:
        """Probe `kind` on its period; returns True when startup succeeded, False when
        startup/liveness failed for good; readiness never returns."""
        spec = self._specs[kind]
        assert self._started_at is not None
        next_at = self._started_at + spec.initial_delay
        successes = failures = 0
        while True:
            await trio.sleep_until(next_at)
            # A ticker, like the kubelet's: the next probe is one period after this one
            # began, not after it ended, so a slow probe does not stretch the period.
            next_at = max(next_at + spec.period, trio.current_time())
            result = await self.check(kind)
            if result.ok:
                successes, failures = successes + 1, 0
                self.last_message.pop(kind, None)
                if result.message:
                    log.info("%s probe of %s: %s", kind, self.container.get("name"),
                             result.message)
                if successes >= spec.success_threshold:
                    if kind == "startup":
                        return True
                    if kind == "readiness" and not self.ready:
                        self.ready = True
                        await _call(self._on_change)
                continue
            successes, failures = 0, failures + 1
            message = f"{_TITLE[kind]} probe failed: {result.message}"
            self.last_message[kind] = message
            await _call(self._on_unhealthy, kind, message)
            if failures < spec.failure_threshold:
                continue
            if kind == "readiness":
                if self.ready:
                    self.ready = False
                    await _call(self._on_change)
                continue
            self.failure = ProbeFailure(kind, message, spec.grace_period_seconds)
            await _call(self._on_liveness_failure, self.failure)
            return False


class _NoClient:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


__all__ = ["CheckResult", "ExecInContainer", "ProbeFailure", "ProbeKind", "ProbeRunner",
           "ProbeSpec", "exec_check", "grpc_check", "health_request", "http_get_check",
           "describe_error", "http_url", "new_http_client", "request_headers", "parse_health_response", "resolve_port",
           "tcp_check"]
