"""The agent's side of port forwarding: one TCP connection into a pod per WebSocket.

    GET /portForward/{namespace}/{pod}?port=N     WebSocket (the API server's relay)

The API server (`fleet.server.portforward`) opens one of these per forwarded
connection.  The agent connects to 127.0.0.1:N *inside the pod's network
namespace* and answers with a first text message, a `meta/v1 Status`: Success, or
Failure carrying the error text the client will print — the wording of
containerd's CRI port forward, which is what kubectl shows for Kubernetes.  Then
bytes flow as binary messages both ways; an empty message is a half-close
(shutdown of the writing side), and closing the WebSocket ends the connection.

Connecting inside the namespace: a worker thread `setns()`-es into the pod's
namespace (`fleet.network.netns.enter_netns`, ctypes: Python 3.11 has no
os.setns), creates and connects the socket there and steps back; the socket
keeps the namespace it was created in, and the file descriptor is handed to Trio
(`trio.socket.from_stdlib_socket`).  Pods without a namespace of their own
(hostNetwork, no pod network) connect on the node's loopback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from fleet.api.errors import BadRequest, NotFound
from fleet.network.netns import NetnsError, enter_netns

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class PodSandboxRef:
    """Where a pod's ports are: its sandbox id (for messages) and network namespace."""

    sandbox_id: str
    netns_path: str | None  # None: the node's own network (hostNetwork, no pod network)


class ConnectError(Exception):
    """The pod's port could not be reached; the text is what the client sees."""


def _go_errno(e: OSError) -> str:
    """An errno as Go's syscall.Errno prints it ("connection refused")."""
    text = os.strerror(e.errno) if e.errno else str(e)
    return text[:1].lower() + text[1:]


def connect_error_text(port: int, ref: PodSandboxRef, err4: str, err6: str) -> str:
    """containerd's message for a refused port forward, inside the kubelet's prefix."""
    where = ref.netns_path or "host"
    return (f"error forwarding port {port} to pod {ref.sandbox_id}, uid : failed to execute "
            f'portforward in network namespace "{where}": failed to connect to '
            f'localhost:{port} inside namespace "{ref.sandbox_id}", IPv4: {err4} IPv6 {err6} ')


def _try_connect(family: int, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def connect_in_pod(ref: PodSandboxRef, port: int) -> socket.socket:
    """Blocking: a socket connected to localhost:port in the pod's namespace (IPv4 first,
    then IPv6, as containerd does).  Run it in a worker thread."""
    try:
        v6 = [ai[4][:2] for ai in socket.getaddrinfo("localhost", port, socket.AF_INET6,
                                                     socket.SOCK_STREAM)]
    except socket.gaierror:
        v6 = []
    try:
        with enter_netns(ref.netns_path):
            try:
                return _try_connect(socket.AF_INET, ("127.0.0.1", port))
            except OSError as e:
                err4 = f"dial tcp4 127.0.0.1:{port}: connect: {_go_errno(e)}"
            if not v6:
                err6 = "dial tcp6: address localhost: no suitable address found"
            else:
                err6 = ""
                for host, p in v6:
                    try:
                        return _try_connect(socket.AF_INET6, (host, p))
                    except OSError as e:
                        err6 = f"dial tcp6 [{host}]:{p}: connect: {_go_errno(e)}"
    except NetnsError as e:
        raise ConnectError(f"error forwarding port {port} to pod {ref.sandbox_id}, uid : "
                           f"failed to execute portforward in network namespace "
                           f'"{ref.netns_path}": {e.strerror}') from None
    raise ConnectError(connect_error_text(port, ref, err4, err6))


async def open_pod_stream(ref: PodSandboxRef, port: int) -> trio.SocketStream:
    sock = await trio.to_thread.run_sync(connect_in_pod, ref, port)
    sock.setblocking(False)
    return trio.SocketStream(trio.socket.from_stdlib_socket(sock))


def _status(message: str | None) -> str:
    if message is None:
        return json.dumps({"metadata": {}, "status": "Success"})
    return json.dumps({"metadata": {}, "status": "Failure", "message": message,
                       "reason": "InternalError"})


async def relay(ref: PodSandboxRef, port: int, *,
                accept: Callable[[], Awaitable[None]],
                receive: Callable[[], Awaitable[bytes | str | None]],
                send: Callable[[bytes | str], Awaitable[None]]) -> None:
    """Accept the WebSocket, connect, report, then copy until both sides are done or the
    WebSocket goes away (the caller's framework then cancels this)."""
    await accept()
    try:
        stream = await open_pod_stream(ref, port)
    except ConnectError as e:
        log.info("port forward to %s port %d: %s", ref.sandbox_id, port, e)
        await send(_status(str(e)))
        return
    async with stream:
        await send(_status(None))

        async def to_pod() -> None:
            while True:
                msg = await receive()
                if not msg:  # an empty message (Quart: None) is the client's half-close
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                             OSError):
                        await stream.send_eof()
                    return
                if isinstance(msg, bytes):
                    try:
                        await stream.send_all(msg)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return

        async def from_pod() -> None:
            while True:
                try:
                    data = await stream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    if getattr(e, "errno", None) not in (None, errno.ECONNRESET):
                        log.debug("port forward read: %s", e)
                    data = b""
                await send(data)
                if not data:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(to_pod)
            nursery.start_soon(from_pod)


async def serve(find: Callable[[str, str], PodSandboxRef | None] | None, namespace: str,
                pod: str, ws: Any) -> None:
    """The route's handler (`ws`: Quart's websocket); errors before the upgrade are HTTP
    Statuses, as the kubelet's."""
    raw = ws.args.get("port", "")
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise BadRequest(f'unable to parse "{raw}" as a port')
    ref = find(namespace, pod) if find is not None else None
    if ref is None:
        raise NotFound(f'pod not found ("{pod}_{namespace}")')
    await relay(ref, int(raw), accept=ws.accept, receive=ws.receive, send=ws.send)
