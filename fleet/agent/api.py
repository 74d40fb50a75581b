"""The agent's own HTTP API (default port 9301): container logs, exec, attach, stats.

The API server never touches a node's files or runtime; for `pods/log`, `pods/exec`
and `pods/attach` it proxies the client's request here, to the agent running the pod.
So the paths are the kubelet's and need no translation on the way:

    GET /containerLogs/{namespace}/{pod}/{container}?follow&tailLines&sinceSeconds
        &sinceTime&timestamps&previous&limitBytes          text/plain, streamed
    GET /exec/{namespace}/{pod}/{container}?command=..&stdin&stdout&stderr&tty
                                                           WebSocket, channel protocol
    GET /attach/{namespace}/{pod}/{container}?stdin&stdout&stderr&tty    WebSocket
    POST /signal/{namespace}/{pod}/{container}?signal=SIGHUP
                                                           Fleet's pods/signal: the signal to
                                                           the container's main process
    GET /portForward/{namespace}/{pod}?port=N              WebSocket, one TCP connection
                                                           into the pod (agent/portforward.py)
    GET /stats/summary                                     the kubelet's Summary API shape
    GET /metrics/resource                                  cpu/memory counters (Prometheus
                                                           text), scraped by the API server
    GET /metrics                                           the agent's own counters and
                                                           kubelet_volume_stats_* (Prometheus
                                                           text): restarts, skipped objects,
                                                           clean-up failures
    GET /healthz                                           "ok", no authentication

(`{container}` may be left out when the pod has exactly one container.)  Every other
request must be authenticated: with TLS (fleet/agent/tls.py, the default) by a client
certificate of the cluster's client CA in `system:masters` (the API server's), or by
`Authorization: Bearer <token>` when the agent has a token; errors are `meta/v1
Status` JSON.

What the API knows about pods comes through a `ContainerLocator`, which the agent's
pod sync implements: it maps (namespace, pod, container) to the driver, the running
handle and the log files of the current and previous attempt.  This module never
learns how pods are tracked, and tests drive it with a locator of their own.

Why Quart (quart-trio on hypercorn) for the WebSockets: it is the server stack the API
server already runs, it negotiates subprotocols and can still refuse an upgrade with a
plain HTTP Status (hypercorn's `websocket.http.response` extension), and quart-trio
cancels the handler when the client goes away — which is what bounds a `follow` log
stream and kills an exec'd process whose client vanished.

HTTPS with a certificate from the cluster's server CA when given an `AgentTLS`;
plain HTTP otherwise (a token-only agent, and tests of the endpoints themselves).
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve as hypercorn_serve
from quart import Response, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from fleet.agent import channels, logs, portforward
from fleet.agent.tls import AgentTLS, authorize_request
from fleet.api import meta
from fleet.api.errors import APIError, BadRequest, Forbidden, InternalError, NotFound, Unauthorized
from fleet.api.kinds.processcontrol import parse_signal, signal_name
from fleet.runtime import shim
from fleet.runtime.driver import (
    ContainerHandle,
    ContainerNotFound,
    ContainerStatus,
    Driver,
    RuntimeDriverError,
)
from fleet.server.limits import BodyIdleTimeout, ClientTimeouts
from fleet.server.tlsconn import scope_peer_certs

log = logging.getLogger(__name__)

DEFAULT_PORT = 9301


# ---------------------------------------------------------------------------------------
# What the agent tells us about its pods


@dataclass(frozen=True)
class LocatedContainer:
    """One container of a pod on this node, as the API needs it."""

    driver: Driver
    # The running attempt; None when the container is not running (exited, waiting).
    handle: ContainerHandle | None
    # The current attempt's log (None before the first start).
    log_path: Path | None = None
    # The log of the attempt before the current one (`previous=true`), if kept.
    previous_log_path: Path | None = None
    # The container's stdin FIFO (`ShimDriver.stdin_path`), if it has `stdin: true`.
    stdin_path: Path | None = None
    tty: bool = False
    # The container's name (for messages when the request left it out).
    name: str = ""


class LocateError(APIError):
    """The pod exists but the request does not name one of its containers properly."""

    def __init__(self, code: int, message: str) -> None:
        reason = {400: "BadRequest", 404: "NotFound"}.get(code, "InternalError")
        super().__init__(message, code=code, reason=reason)

    @classmethod
    def container_required(cls, pod: str, names: list[str]) -> LocateError:
        return cls(400, f"a container name must be specified for pod {pod}, "
                        f"choose one of: [{' '.join(names)}]")

    @classmethod
    def invalid_container(cls, container: str, pod: str) -> LocateError:
        return cls(400, f"container {container} is not valid for pod {pod}")


# (namespace, pod name, pod uid, [(container name, located)])
PodContainers = tuple[str, str, str, list[tuple[str, LocatedContainer]]]


class ContainerLocator(Protocol):
    """Implemented by the agent's pod sync."""

    def find(self, namespace: str, pod: str, container: str | None) -> LocatedContainer | None:
        """The container; `container=None` means the pod's only container.  None if the
        pod is not on this node; raises LocateError when the name is missing although
        the pod has several containers, or names none of them."""
        ...

    def all(self) -> list[PodContainers]:
        """Every pod on this node with its containers (for /stats/summary)."""
        ...

    def pod_sandbox(self, namespace: str, pod: str) -> portforward.PodSandboxRef | None:
        """Where the pod's ports are (port forwarding); None when the pod is not on this
        node or has no sandbox yet."""
        ...


# Extra routes the agent may add (Quart rule → handler taking the rule's values);
# they sit behind the same token check.  A rule is GET unless it starts with its
# methods: "POST /images/import", "GET,DELETE /things/<name>".
ExtraRoutes = Mapping[str, Callable[..., Awaitable[Any]]]


def split_rule(rule: str) -> tuple[list[str], str]:
    """(methods, Quart rule) of an ExtraRoutes key."""
    if rule.startswith("/"):
        return ["GET"], rule
    methods, _, path = rule.partition(" ")
    return [m.strip().upper() for m in methods.split(",") if m.strip()], path.strip()


# ---------------------------------------------------------------------------------------
# Helpers


def _status_response(err: APIError) -> Response:
    return Response(json.dumps(err.status()), status=err.code,
                    content_type="application/json")


def _flag(args: Mapping[str, str], name: str) -> bool:
    # kubectl sends "true" to the API server, which passes "1" on to the kubelet.
    return args.get(name, "").lower() in ("1", "true", "yes")


def _int_arg(args: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = args.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: invalid value {raw!r}: must be an integer") from None
    if value < minimum:
        raise BadRequest(f"{name}: invalid value {value}: must be at least {minimum}")
    return value


def log_options(args: Mapping[str, str], now_ns: int | None = None) -> logs.LogOptions:
    """The containerLogs query string as `LogOptions` (BadRequest if malformed)."""
    since: int | None = None
    seconds = _int_arg(args, "sinceSeconds", minimum=1)
    if seconds is not None:
        since = (now_ns if now_ns is not None else time.time_ns()) - seconds * 1_000_000_000
    raw_time = args.get("sinceTime")
    if raw_time:
        try:
            t = logs.parse_timestamp(raw_time)
        except ValueError as e:
            raise BadRequest(f"sinceTime: {e}") from None
        since = t if since is None else max(since, t)
    tail = _int_arg(args, "tailLines", minimum=-1)
    return logs.LogOptions(
        follow=_flag(args, "follow"),
        tail_lines=None if tail is None or tail < 0 else tail,
        since_ns=since,
        timestamps=_flag(args, "timestamps"),
        limit_bytes=_int_arg(args, "limitBytes", minimum=1),
    )


def _locate(locator: ContainerLocator, namespace: str, pod: str,
            container: str | None) -> LocatedContainer:
    found = locator.find(namespace, pod, container)
    if found is None:
        raise NotFound(f'pods "{pod}" not found', name=pod, kind="pods")
    return found


def _is_running_fn(located: LocatedContainer) -> Callable[[], Awaitable[bool]]:
    async def is_running() -> bool:
        if located.handle is None:
            return False
        try:
            state = await located.driver.inspect(located.handle)
        except ContainerNotFound:
            return False
        return state.status is not ContainerStatus.EXITED

    return is_running


def _authorized(header: str | None, token: str | None) -> bool:
    if not token or not header or not header.startswith("Bearer "):
        return False
    # Constant time: the token is the only thing between a client and exec as root.
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())


# ---------------------------------------------------------------------------------------
# Logs


async def _containerlogs(locator: ContainerLocator, namespace: str, pod: str,
                         container: str | None) -> Response:
    opts = log_options(request.args)
    located = _locate(locator, namespace, pod, container)
    cname = container or located.name
    if _flag(request.args, "previous"):
        path = located.previous_log_path
        exists = path is not None and await trio.to_thread.run_sync(path.exists)
        if path is None or not exists:
            raise BadRequest(f'previous terminated container "{cname}" in pod "{pod}" '
                             "not found")

        async def never_running() -> bool:
            return False
        is_running: Callable[[], Awaitable[bool]] = never_running
    else:
        if located.log_path is None:
            raise BadRequest(f'container "{cname}" in pod "{pod}" is waiting to start: '
                             "ContainerCreating")
        path = located.log_path
        is_running = _is_running_fn(located)

    async def body() -> AsyncIterator[bytes]:
        # aclosing: the file is closed as soon as the client goes (quart-trio cancels).
        async with contextlib.aclosing(logs.stream_log(path, opts,
                                                       is_running=is_running)) as chunks:
            async for chunk in chunks:
                yield chunk

    resp = Response(body(), status=200, content_type="text/plain; charset=utf-8")
    resp.timeout = None  # a follow stream lasts as long as the container
    return resp


# ---------------------------------------------------------------------------------------
# Exec and attach (WebSocket)


@dataclass(frozen=True)
class _StreamOpts:
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def _stream_opts(args: Mapping[str, str]) -> _StreamOpts:
    tty = _flag(args, "tty")
    opts = _StreamOpts(stdin=_flag(args, "stdin"), stdout=_flag(args, "stdout"),
                       # A terminal has one output: stderr is merged into stdout.
                       stderr=_flag(args, "stderr") and not tty, tty=tty)
    if not (opts.stdin or opts.stdout or opts.stderr):
        raise BadRequest("you must specify at least 1 of stdin, stdout, stderr")
    return opts


def _negotiate() -> str:
    proto = channels.negotiate(websocket.requested_subprotocols)
    if proto is None:
        raise BadRequest("requested protocol(s) are not supported: "
                         f"{websocket.requested_subprotocols}; supported: "
                         f"{list(channels.SUPPORTED)}")
    return proto


async def _receive_frames() -> AsyncIterator[tuple[int, bytes]]:
    """(channel, data) of the client's messages; ends never (the socket closing cancels
    the handler)."""
    while True:
        msg = await websocket.receive()
        if not msg:
            continue  # Quart hands an empty binary message over as None
        raw = msg.encode() if isinstance(msg, str) else msg
        yield channels.decode(raw)


async def _send(frame: bytes) -> None:
    await websocket.send(frame)


async def _finish(protocol: str, status: dict[str, Any]) -> None:
    frame = channels.status_frame(protocol, status)
    with contextlib.suppress(Exception):  # the client may already be gone
        if frame is not None:
            await _send(frame)
        await websocket.close(1000)


async def _exec(locator: ContainerLocator, namespace: str, pod: str,
                container: str | None) -> Response | None:
    argv = [v for v in websocket.args.getlist("command") if v != ""]
    if not argv:
        raise BadRequest("you must specify at least one command for the container")
    opts = _stream_opts(websocket.args)
    located = _locate(locator, namespace, pod, container)
    if located.handle is None:
        raise BadRequest(f'container "{container or located.name}" in pod "{pod}" '
                         "is not running")
    protocol = _negotiate()
    await websocket.accept(subprotocol=protocol or None)
    await _send(channels.ready_frame(opts.stdout, opts.stderr))

    stdin_send, stdin_recv = trio.open_memory_channel[bytes](16)
    resize_send, resize_recv = trio.open_memory_channel[tuple[int, int]](16)

    async def pump_client() -> None:
        async with stdin_send, resize_send:
            async for channel, data in _receive_frames():
                if channel == channels.STDIN and opts.stdin and data:
                    with contextlib.suppress(trio.ClosedResourceError):
                        await stdin_send.send(data)
                elif channel == channels.RESIZE and opts.tty:
                    with contextlib.suppress(channels.ProtocolError):
                        size = channels.decode_resize(data)
                        # Only the newest size matters: drop one when the queue is full.
                        with contextlib.suppress(trio.WouldBlock):
                            resize_send.send_nowait(size)
                elif channel == channels.CLOSE and data[:1] == bytes((channels.STDIN,)):
                    await stdin_send.aclose()  # v5: stdin EOF

    def out(channel: int) -> Callable[[bytes], Awaitable[None]]:
        async def sink(chunk: bytes) -> None:
            await _send(channels.encode(channel, chunk))
        return sink

    handle = located.handle
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump_client)
        try:
            rc = await located.driver.exec(
                handle, argv,
                stdin=stdin_recv if opts.stdin else None,
                stdout=out(channels.STDOUT) if opts.stdout else None,
                stderr=out(channels.STDERR) if opts.stderr else None,
                tty=opts.tty, resize=resize_recv if opts.tty else None)
            status = channels.exit_status(rc, argv)
        except RuntimeDriverError as e:
            status = channels.error_status(f"error executing command {argv}: {e}")
        except Exception as e:
            # After the upgrade an HTTP error page is no longer possible: the client
            # learns of the failure on the error channel, as from the kubelet.
            log.exception("exec %s in %s/%s failed", argv, namespace, pod)
            status = channels.error_status(f"error executing command {argv}: {e}")
        nursery.cancel_scope.cancel()
    await _finish(protocol, status)
    return None


async def _signal(locator: ContainerLocator, namespace: str, pod: str,
                  container: str | None) -> Response:
    """Send `?signal=` to the container's main process (its runtime driver's `signal`:
    runc kill for OCI, the process group for the process driver)."""
    raw = request.args.get("signal", "")
    num = parse_signal(raw)
    if num is None:
        raise BadRequest(f"unknown signal {raw!r}; use a name such as SIGHUP or SIGTERM")
    located = _locate(locator, namespace, pod, container)
    name = located.name or container or ""
    not_running = BadRequest(f'container "{name}" in pod "{pod}" is not running')
    if located.handle is None or not await _is_running_fn(located)():
        raise not_running
    try:
        await located.driver.signal(located.handle, num)
    except (ContainerNotFound, ProcessLookupError):
        raise not_running from None
    log.info("sent %s to container %s of pod %s/%s", signal_name(num), name, namespace, pod)
    return Response(json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Success"}), content_type="application/json")


def _request_resize(located: Any, cols: int, rows: int) -> None:
    """Write one "<cols> <rows>" line to the shim's resize FIFO (if it has one)."""
    handle = located.handle
    if handle is None or handle.bundle is None:
        return
    fd = _open_fifo_for_writing(Path(handle.bundle) / shim.RESIZE_FIFO)
    try:
        os.write(fd, f"{cols} {rows}\n".encode())
    finally:
        os.close(fd)


def _open_fifo_for_writing(path: Path) -> int:
    # Non-blocking: the shim keeps a reader open (or waits in open() for stdinOnce);
    # with nobody reading, ENXIO says so at once instead of hanging here.
    return os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)


async def _attach(locator: ContainerLocator, namespace: str, pod: str,
                  container: str | None) -> Response | None:
    opts = _stream_opts(websocket.args)
    located = _locate(locator, namespace, pod, container)
    cname = container or located.name
    if located.handle is None:
        raise BadRequest(f'container "{cname}" in pod "{pod}" is not running')
    if located.log_path is None and (opts.stdout or opts.stderr):
        raise BadRequest(f'container "{cname}" in pod "{pod}" has no log to attach to')
    fifo: trio.lowlevel.FdStream | None = None
    if opts.stdin:
        if located.stdin_path is None:
            raise BadRequest(f'container "{cname}" in pod "{pod}" was not started with '
                             "stdin: true; attach without stdin")
        try:
            fd = await trio.to_thread.run_sync(_open_fifo_for_writing, located.stdin_path)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ENOENT):
                raise BadRequest(f'container "{cname}" in pod "{pod}" no longer reads '
                                 "its stdin") from None
            raise
        fifo = trio.lowlevel.FdStream(fd)
    protocol = _negotiate()
    is_running = _is_running_fn(located)
    # Output counts from here: a client may type (and the container answer) before
    # the output pump below has opened the log.
    offset = (await trio.to_thread.run_sync(logs.log_size, located.log_path)
              if located.log_path is not None else 0)
    try:
        await websocket.accept(subprotocol=protocol or None)
        await _send(channels.ready_frame(opts.stdout, opts.stderr))

        async def pump_client() -> None:
            async for channel, data in _receive_frames():
                if channel == channels.STDIN and fifo is not None and data:
                    try:
                        await fifo.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass  # the container stopped reading; output still flows
                elif channel == channels.CLOSE and data[:1] == bytes((channels.STDIN,)):
                    if fifo is not None:
                        # stdinOnce containers see EOF now; others keep stdin open
                        # (the shim holds its own writer), as in Kubernetes.
                        await fifo.aclose()
                elif channel == channels.RESIZE and opts.tty and located.tty:
                    # The container's terminal belongs to its shim: ask it to resize.
                    with contextlib.suppress(channels.ProtocolError, OSError):
                        cols, rows = channels.decode_resize(data)
                        await trio.to_thread.run_sync(_request_resize, located, cols, rows)

        async def pump_output() -> None:
            assert located.log_path is not None
            records = logs.follow_records(located.log_path, from_offset=offset, follow=True,
                                          is_running=is_running)
            async with contextlib.aclosing(records) as recs:
                async for rec in recs:
                    data = rec.content if rec.partial else rec.content + b"\n"
                    channel = channels.STDERR if rec.stream == logs.STDERR and not \
                        located.tty else channels.STDOUT
                    if (channel == channels.STDOUT and opts.stdout) or \
                            (channel == channels.STDERR and opts.stderr):
                        await _send(channels.encode(channel, data))

        async def wait_exit() -> None:
            while await is_running():
                await trio.sleep(logs.POLL_INTERVAL)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump_client)
            if opts.stdout or opts.stderr:
                await pump_output()
            else:
                await wait_exit()
            nursery.cancel_scope.cancel()
    finally:
        if fifo is not None:
            with trio.CancelScope(shield=True), contextlib.suppress(OSError):
                await fifo.aclose()
    await _finish(protocol, channels.success_status())
    return None


# ---------------------------------------------------------------------------------------
# Stats


def _node_cpu_ns() -> int | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    ticks = [int(x) for x in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _node_memory() -> tuple[int, int] | None:
    """(usage, working set) bytes from /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f
                    if len(line.split()) >= 2}
    except (OSError, ValueError):
        return None
    total = info.get("MemTotal", 0)
    return total - info.get("MemFree", 0), total - info.get("MemAvailable", 0)


class _CpuRates:
    """usageNanoCores from two readings of a cumulative counter, as cAdvisor does:
    the first reading of a series has no rate yet."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}

    def rate(self, key: str, now_ns: int, cumulative_ns: int) -> int | None:
        prev = self._last.get(key)
        self._last[key] = (now_ns, cumulative_ns)
        if prev is None or now_ns <= prev[0] or cumulative_ns < prev[1]:
            return None
        return (cumulative_ns - prev[1]) * 1_000_000_000 // (now_ns - prev[0])

    def forget_except(self, keys: set[str]) -> None:
        for k in [k for k in self._last if k not in keys]:
            del self._last[k]


_rfc3339 = meta.format_time


def _cpu(ts: str, key: str, now_ns: int, cumulative: int | None,
         rates: _CpuRates) -> dict[str, Any]:
    out: dict[str, Any] = {"time": ts}
    if cumulative is not None:
        out["usageCoreNanoSeconds"] = cumulative
        rate = rates.rate(key, now_ns, cumulative)
        if rate is not None:
            out["usageNanoCores"] = rate
    return out


def _memory(ts: str, usage: int | None, working_set: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"time": ts}
    if usage is not None:
        out["usageBytes"] = usage
    if working_set is not None:
        out["workingSetBytes"] = working_set
    return out


async def stats_summary(locator: ContainerLocator, node_name: str,
                        rates: _CpuRates) -> dict[str, Any]:
    """The kubelet's /stats/summary document (node, pods, containers: cpu and memory)."""
    now = datetime.now(UTC)
    now_ns = time.time_ns()
    ts = _rfc3339(now)
    node_cpu = await trio.to_thread.run_sync(_node_cpu_ns)
    node_mem = await trio.to_thread.run_sync(_node_memory)
    keys = {"node"}
    summary: dict[str, Any] = {
        "node": {"nodeName": node_name, "cpu": _cpu(ts, "node", now_ns, node_cpu, rates),
                 "memory": _memory(ts, *(node_mem or (None, None)))},
        "pods": [],
    }
    for namespace, pod, uid, containers in locator.all():
        entries = []
        pod_cpu = pod_mem = pod_ws = 0
        for cname, located in containers:
            if located.handle is None:
                continue
            try:
                st = await located.driver.stats(located.handle)
            except RuntimeDriverError:
                continue  # gone between the listing and now
            key = f"{uid}/{cname}"
            keys.add(key)
            cts = _rfc3339(st.timestamp)
            entries.append({
                "name": cname, "startTime": _rfc3339(located.handle.started_at),
                "cpu": _cpu(cts, key, now_ns, st.cpu_usage_ns, rates),
                "memory": _memory(cts, st.memory_usage_bytes, st.memory_working_set_bytes),
            })
            pod_cpu += st.cpu_usage_ns or 0
            pod_mem += st.memory_usage_bytes or 0
            pod_ws += st.memory_working_set_bytes or 0
        keys.add(uid)
        pod_entry: dict[str, Any] = {
            "podRef": {"name": pod, "namespace": namespace, "uid": uid},
            "containers": entries,
            "cpu": _cpu(ts, uid, now_ns, pod_cpu if entries else None, rates),
            "memory": _memory(ts, pod_mem if entries else None, pod_ws if entries else None),
        }
        volume_entries = getattr(locator, "volume_entries", None)
        if volume_entries is not None:
            volumes = await volume_entries(uid)
            if volumes:
                pod_entry["volume"] = volumes
        summary["pods"].append(pod_entry)
    rates.forget_except(keys)
    return summary


# ---------------------------------------------------------------------------------------
# Resource metrics (what metrics-server scrapes from the kubelet)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(name: str, labels: dict[str, str], value: float, ts_ms: int) -> str:
    lbl = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    return f"{name}{{{lbl}}} {value!r} {ts_ms}" if lbl else f"{name} {value!r} {ts_ms}"


async def resource_metrics(locator: ContainerLocator) -> str:
    """The kubelet's `/metrics/resource` in Prometheus text format.

    Cumulative cpu seconds, memory working set and start time per running
    container, and the node's totals, each with the millisecond time it was
    read.  Counters rather than rates on purpose: the API server scrapes every
    node on its own schedule and derives rates from two of its own scrapes, so
    a second reader (a `/stats/summary` client) cannot shorten its window.
    """
    lines = ["# TYPE node_cpu_usage_seconds_total counter",
             "# TYPE node_memory_working_set_bytes gauge",
             "# TYPE container_cpu_usage_seconds_total counter",
             "# TYPE container_memory_working_set_bytes gauge",
             "# TYPE container_start_time_seconds gauge",
             "# TYPE scrape_error gauge"]
    now_ms = time.time_ns() // 1_000_000
    node_cpu = await trio.to_thread.run_sync(_node_cpu_ns)
    node_mem = await trio.to_thread.run_sync(_node_memory)
    if node_cpu is not None:
        lines.append(_sample("node_cpu_usage_seconds_total", {}, node_cpu / 1e9, now_ms))
    if node_mem is not None:
        lines.append(_sample("node_memory_working_set_bytes", {}, float(node_mem[1]), now_ms))
    for namespace, pod, _uid, containers in locator.all():
        for cname, located in containers:
            if located.handle is None:
                continue
            try:
                st = await located.driver.stats(located.handle)
            except RuntimeDriverError:
                continue  # gone between the listing and now
            labels = {"container": cname, "namespace": namespace, "pod": pod}
            ts_ms = int(st.timestamp.timestamp() * 1000)
            if st.cpu_usage_ns is not None:
                lines.append(_sample("container_cpu_usage_seconds_total", labels,
                                     st.cpu_usage_ns / 1e9, ts_ms))
            if st.memory_working_set_bytes is not None:
                lines.append(_sample("container_memory_working_set_bytes", labels,
                                     float(st.memory_working_set_bytes), ts_ms))
            lines.append(_sample("container_start_time_seconds", labels,
                                 located.handle.started_at.timestamp(), ts_ms))
    lines.append("scrape_error 0")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# The app


def create_app(locator: ContainerLocator, *, token: str | None, node_name: str = "",
               extra_routes: ExtraRoutes | None = None, tls: AgentTLS | None = None) -> QuartTrio:
    """The Quart app serving the endpoints in the module docstring."""
    app = QuartTrio("fleet-agent")
    # Quart's default 60 s response timeout would cut `logs -f` short.
    app.config["RESPONSE_TIMEOUT"] = None
    # No framework-wide body cap (Quart's 16 MiB would refuse an image archive by
    # its Content-Length): the built-in endpoints read no body, and an extra route
    # that reads one streams it and enforces its own limit (images_api: 4 GiB).
    app.config["MAX_CONTENT_LENGTH"] = None
    node = node_name or socket.gethostname()
    rates = _CpuRates()

    def check_auth() -> Response | None:
        headers = websocket.headers if has_websocket_context() else request.headers
        path = websocket.path if has_websocket_context() else request.path
        if path == "/healthz":
            return None
        scope = (websocket if has_websocket_context() else request).scope
        code = authorize_request(tls, scope_peer_certs(scope),
                                 lambda: _authorized(headers.get("Authorization"), token))
        if code == 401:
            return _status_response(Unauthorized("Unauthorized"))
        if code == 403:
            return _status_response(Forbidden(f"Forbidden (path={path})"))
        return None

    app.before_request(check_auth)
    app.before_websocket(check_auth)

    @app.errorhandler(APIError)
    async def api_error(err: APIError) -> Response:
        return _status_response(err)

    @app.errorhandler(HTTPException)
    async def http_error(err: HTTPException) -> Response:
        code = err.code or 500
        reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(code, "BadRequest")
        return _status_response(APIError(err.description or err.name, code=code,
                                         reason=reason))

    @app.errorhandler(Exception)
    async def unexpected(err: Exception) -> Response:
        log.exception("agent API request failed")
        return _status_response(InternalError(f"{type(err).__name__}: {err}"))

    @app.route("/healthz")
    async def healthz() -> Response:
        return Response(b"ok", content_type="text/plain")

    @app.route("/containerLogs/<namespace>/<pod>/<container>")
    async def container_logs(namespace: str, pod: str, container: str) -> Response:
        return await _containerlogs(locator, namespace, pod, container)

    @app.route("/containerLogs/<namespace>/<pod>")
    async def container_logs_only(namespace: str, pod: str) -> Response:
        return await _containerlogs(locator, namespace, pod, None)

    @app.websocket("/exec/<namespace>/<pod>/<container>")
    async def exec_ws(namespace: str, pod: str, container: str) -> Response | None:
        return await _exec(locator, namespace, pod, container)

    @app.websocket("/exec/<namespace>/<pod>")
    async def exec_ws_only(namespace: str, pod: str) -> Response | None:
        return await _exec(locator, namespace, pod, None)

    @app.websocket("/attach/<namespace>/<pod>/<container>")
    async def attach_ws(namespace: str, pod: str, container: str) -> Response | None:
        return await _attach(locator, namespace, pod, container)

    @app.websocket("/attach/<namespace>/<pod>")
    async def attach_ws_only(namespace: str, pod: str) -> Response | None:
        return await _attach(locator, namespace, pod, None)

    @app.websocket("/portForward/<namespace>/<pod>")
    async def port_forward_ws(namespace: str, pod: str) -> None:
        await portforward.serve(getattr(locator, "pod_sandbox", None), namespace, pod, websocket)

    @app.route("/signal/<namespace>/<pod>/<container>", methods=["POST"])
    async def signal_container(namespace: str, pod: str, container: str) -> Response:
        return await _signal(locator, namespace, pod, container)

    @app.route("/stats/summary")
    async def summary() -> Response:
        doc = await stats_summary(locator, node, rates)
        return Response(json.dumps(doc), content_type="application/json")

    @app.route("/metrics/resource")
    async def metrics_resource() -> Response:
        return Response(await resource_metrics(locator),
                        content_type="text/plain; version=0.0.4; charset=utf-8")

    @app.route("/metrics")
    async def metrics() -> Response:
        # The process-wide registry (fleet._core.supervise): what `fleet server`
        # shows on its /metrics for the built-in agent, for a standalone one too.
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        from fleet._core.supervise import REGISTRY

        body = generate_latest(REGISTRY)
        # kubelet_volume_stats_* of this node's claimed volumes (fleet.agent.csivolumes).
        volume_metrics = getattr(locator, "volume_metrics", None)
        if volume_metrics is not None:
            body += (await volume_metrics()).encode()
        return Response(body, content_type=CONTENT_TYPE_LATEST)

    for rule, handler in (extra_routes or {}).items():
        methods, path = split_rule(rule)
        app.add_url_rule(path, endpoint=f"extra:{rule}", view_func=handler, methods=methods)

    return app


async def serve(locator: ContainerLocator, *, address: str = "0.0.0.0",
                port: int = DEFAULT_PORT, token: str | None, node_name: str = "",
                extra_routes: ExtraRoutes | None = None,
                timeouts: ClientTimeouts | None = None, tls: AgentTLS | None = None,
                task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the agent API on address:port until cancelled.

    `task_status.started(url)` once listening, with the URL actually bound (so
    `port=0` picks a free port and the caller learns which).  `timeouts` bound
    slow clients (fleet/server/limits.py); the defaults are kube-apiserver's."""
    if not token and tls is None:
        raise ValueError("the agent API needs TLS or a token: it grants exec into containers")
    app = create_app(locator, token=token, node_name=node_name, extra_routes=extra_routes, tls=tls)
    # With TLS: the live context of `tls` (renewed certificates, client certificates
    # asked for and checked by `tls`); else plain HTTP.
    cfg = tls.config if tls is not None else HyperConfig()
    cfg.bind = [f"[{address}]:{port}" if ":" in address else f"{address}:{port}"]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    timeouts = timeouts or ClientTimeouts()
    timeouts.apply(cfg)
    # Quart's own bound on reading a whole body (`await request.get_data()`); a
    # streamed one (the image upload) is bounded per chunk by BodyIdleTimeout.
    app.config["BODY_TIMEOUT"] = timeouts.body_timeout
    cfg.graceful_timeout = 2

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(hypercorn_serve, BodyIdleTimeout(app, timeouts.body_timeout), cfg)
        scheme = "https" if tls is not None else "http"
        task_status.started(binds[0] if binds else f"{scheme}://{address}:{port}")
