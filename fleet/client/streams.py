"""Streaming pod calls: logs (an HTTP stream) and exec/attach (WebSocket).

`open_log_stream` yields the chunks of `GET pods/{name}/log` as the server
sends them (with `follow` it lasts as long as the container writes).

`run_remote_command` drives one exec or attach session with Kubernetes'
WebSocket remote-command protocol, the one kubectl speaks since 1.30:
subprotocol `v5.channel.k8s.io` (or `v4`), binary messages whose first byte
is the channel — 0 stdin, 1 stdout, 2 stderr, 3 the final Status, 4 terminal
resize (`{"Width": w, "Height": h}`), 255 "close this channel" (v5 only; it is
how the remote side learns that stdin reached EOF).  The exit code comes from
the channel-3 Status: Success → 0, `NonZeroExitCode` → the `ExitCode` cause.

Both take the same `ClientConfig` as `fleet.client.Client` and trust the
server exactly as it does (`ssl_context`).  The caller supplies stdin,
stdout/stderr writers and terminal sizes, so the CLI wires them to the
terminal and tests wire them to memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import trio
import trio_websocket

import fleet
from fleet.client.discovery import resource_path
from fleet.client.kubeconfig import ClientConfig
from fleet.client.rest import ApiException, ssl_context

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
PROTOCOLS = (V5, V4)
STDIN_CHUNK = 32 * 1024  # what kubectl writes per message
MAX_MESSAGE_SIZE = 16 * 1024 * 1024

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """A Go duration (`10s`, `5m`, `1h30m`, `250ms`) in seconds, as kubectl's --since takes."""
    s = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise ValueError(f'invalid duration "{text}" (use e.g. 10s, 5m, 1h)')
    return total


def _headers(config: ClientConfig) -> dict[str, str]:
    headers = {"User-Agent": f"kfleet/{fleet.__version__}"}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    return headers


# ----------------------------------------------------------------------- logs
@dataclass(frozen=True)
class LogOptions:
    container: str | None = None
    follow: bool = False
    tail_lines: int | None = None
    since_seconds: int | None = None
    since_time: str | None = None
    timestamps: bool = False
    previous: bool = False
    limit_bytes: int | None = None

    def params(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.container:
            out["container"] = self.container
        for name, flag in (("follow", self.follow), ("timestamps", self.timestamps),
                           ("previous", self.previous)):
            if flag:
                out[name] = "true"
        for name, value in (("tailLines", self.tail_lines), ("sinceSeconds", self.since_seconds),
                            ("limitBytes", self.limit_bytes)):
            if value is not None:
                out[name] = str(value)
        if self.since_time:
            out["sinceTime"] = self.since_time
        return out


@asynccontextmanager
async def open_log_stream(config: ClientConfig, namespace: str, pod: str,
                          options: LogOptions = LogOptions(), *,
                          connect_timeout: float = 30.0) -> AsyncIterator[AsyncIterator[bytes]]:
    """`async with open_log_stream(...) as chunks: async for chunk in chunks: ...`.

    Raises `ApiException` with the server's Status when the server refuses.
    """
    path = resource_path("v1", "pods", namespace, pod, "log")
    # No read timeout: a followed container may be quiet for hours.
    timeout = httpx.Timeout(connect_timeout, read=None)
    async with httpx.AsyncClient(base_url=config.server, headers=_headers(config),
                                 verify=ssl_context(config), timeout=timeout) as http:
        async with http.stream("GET", path, params=options.params()) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                raise ApiException.from_response(resp)
            yield resp.aiter_raw()


# ------------------------------------------------------------- exec / attach
@dataclass(frozen=True)
class ExecOptions:
    """What to run (exec) or join (attach), and which streams to connect."""

    command: tuple[str, ...] = ()
    container: str | None = None
    stdin: bool = False
    stdout: bool = True
    stderr: bool = True
    tty: bool = False

    def query(self) -> list[tuple[str, str]]:
        pairs = [("command", c) for c in self.command]
        if self.container:
            pairs.append(("container", self.container))
        # With a tty the remote side merges stderr into stdout, as kubectl asks.
        stderr = self.stderr and not self.tty
        for name, flag in (("stdin", self.stdin), ("stdout", self.stdout), ("stderr", stderr),
                           ("tty", self.tty)):
            pairs.append((name, "true" if flag else "false"))
        return pairs


def websocket_target(config: ClientConfig, namespace: str, pod: str, subresource: str,
                     options: ExecOptions) -> tuple[str, int, str, bool]:
    """(host, port, resource with query, TLS?) for an exec/attach upgrade."""
    url = urlsplit(config.server)
    tls = url.scheme == "https"
    port = url.port or (443 if tls else 80)
    base = url.path.rstrip("/")
    resource = base + resource_path("v1", "pods", namespace, pod, subresource)
    return url.hostname or "localhost", port, resource + "?" + urlencode(options.query()), tls


def frame(channel: int, data: bytes = b"") -> bytes:
    return bytes([channel]) + data


def resize_frame(width: int, height: int) -> bytes:
    return frame(RESIZE, json.dumps({"Width": width, "Height": height}).encode())


@dataclass
class CommandResult:
    """How a remote command ended: its exit code and, for failures, the message."""

    exit_code: int
    message: str = ""
    status: dict[str, Any] = field(default_factory=dict)


def result_from_status(status: dict[str, Any]) -> CommandResult:
    """The channel-3 Status as an exit code (client-go's reading of it)."""
    if status.get("status") == "Success":
        return CommandResult(0, "", status)
    message = str(status.get("message") or "error executing remote command")
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    code = int(cause.get("message"))
                except (TypeError, ValueError):
                    break
                return CommandResult(code, f"command terminated with exit code {code}", status)
    return CommandResult(1, message, status)


Reader = Callable[[], Awaitable[bytes]]
Writer = Callable[[bytes], None]


async def run_remote_command(
    config: ClientConfig, namespace: str, pod: str, subresource: str, options: ExecOptions, *,
    read_stdin: Reader | None = None, write_stdout: Writer, write_stderr: Writer,
    sizes: AsyncIterator[tuple[int, int]] | None = None, connect_timeout: float = 30.0,
) -> CommandResult:
    """Run one exec/attach session to its end and return how the command ended.

    `read_stdin()` returns the next chunk of input, b"" at EOF (used when
    `options.stdin`).  `sizes` yields terminal (width, height) pairs to send as
    resize messages (the first one right away).  Raises `ApiException` when
    the server refuses the upgrade.
    """
    host, port, resource, tls = websocket_target(config, namespace, pod, subresource, options)
    use_ssl: Any = ssl_context(config) if tls else False
    headers = [(k.lower().encode(), v.encode()) for k, v in _headers(config).items()]
    status: dict[str, Any] | None = None
    try:
        async with trio_websocket.open_websocket(
            host, port, resource, use_ssl=use_ssl, subprotocols=list(PROTOCOLS),
            extra_headers=headers, max_message_size=MAX_MESSAGE_SIZE,
            connect_timeout=connect_timeout, disconnect_timeout=5,
        ) as ws:
            v5 = ws.subprotocol == V5

            async def send_stdin() -> None:
                assert read_stdin is not None
                while True:
                    chunk = await read_stdin()
                    if not chunk:
                        break
                    await ws.send_message(frame(STDIN, chunk))
                # Only v5 can say "stdin is done"; under v4 the remote command
                # keeps its stdin open until the session ends.
                if v5:
                    await ws.send_message(frame(CLOSE, bytes([STDIN])))

            async def send_sizes() -> None:
                assert sizes is not None
                async for width, height in sizes:
                    await ws.send_message(resize_frame(width, height))

            async with trio.open_nursery() as nursery:
                if options.stdin and read_stdin is not None:
                    nursery.start_soon(_ignore_closed, send_stdin)
                if sizes is not None and options.tty:
                    nursery.start_soon(_ignore_closed, send_sizes)
                try:
                    while True:
                        msg = await ws.get_message()
                        if not isinstance(msg, bytes) or not msg:
                            continue
                        channel, data = msg[0], msg[1:]
                        if channel == STDOUT and data:
                            write_stdout(data)
                        elif channel == STDERR and data:
                            write_stderr(data)
                        elif channel == ERROR and data:
                            status = json.loads(data)
                except trio_websocket.ConnectionClosed:
                    pass
                nursery.cancel_scope.cancel()
    except trio_websocket.ConnectionRejected as e:
        raise _rejected(e) from None
    if status is None:
        # The server closed without a Status: the session ended without an
        # error report, which the protocol defines as success.
        return CommandResult(0)
    return result_from_status(status)


async def _ignore_closed(fn: Callable[[], Awaitable[None]]) -> None:
    try:
        await fn()
    except trio_websocket.ConnectionClosed:
        pass  # the session ended under us; the reader reports how


def _rejected(e: trio_websocket.ConnectionRejected) -> ApiException:
    body = e.body or b""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return ApiException(doc, e.status_code)
    text = body.decode("utf-8", "replace").strip()
    return ApiException({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": text or f"the server refused the upgrade ({e.status_code})",
                         "code": e.status_code}, e.status_code)
