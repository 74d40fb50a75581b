"""The API server's side of `pods/log`, `pods/exec`, `pods/attach` and `nodes/proxy`.

Like kube-apiserver, the server does not run containers: it finds the node a
pod is bound to and relays the request to that node's agent, which serves
kubelet-style endpoints on its own port: HTTPS, the agent's certificate verified
against the server CA bundle and the server's own client certificate
(CN=fleet-apiserver-kubelet-client, O=system:masters) presented to it, as
kube-apiserver does with --kubelet-certificate-authority and
--kubelet-client-certificate.  A node annotated `fleet.dev/agent-api-scheme: http`
(an agent with no TLS material, started with a token) is reached over plain HTTP
with the server's token:

    GET /containerLogs/{ns}/{pod}/{container}?follow=&tailLines=&...   text stream
    GET /exec/{ns}/{pod}/{container}?command=..&stdin=&stdout=&stderr=&tty=   WebSocket
    GET /attach/{ns}/{pod}/{container}?stdin=&stdout=&stderr=&tty=          WebSocket

`pods/log` is an HTTP stream passed through chunk by chunk until the agent's
stream ends or the client goes away.  `pods/exec` and `pods/attach` are
WebSocket sessions (kubectl's default since 1.30): the server opens a
WebSocket to the agent offering the subprotocols the client offered (in the
client's order), then accepts the client with the one the agent chose, and
copies frames both ways untouched until either side closes.  Connecting to
the agent *before* accepting the client means a failure there (agent down,
container not running) reaches the client as a real HTTP error carrying a
`Status`, which is what client-go reads out of a failed upgrade.

kubectl falls back to SPDY (a POST with `Upgrade: SPDY/3.1`) when the
WebSocket upgrade fails; Fleet speaks SPDY only for `pods/portforward`
(portforward.py), so an exec/attach POST gets the same lookup (so a missing
pod still reads "pods "x" not found") and then a 400 saying WebSocket is
required.

`nodes/{name}/proxy/{path}` is Kubernetes' plain-HTTP relay to a node's
agent: any agent endpoint (`kfleet image import` uploads archives to the
agent's `/images/import` this way) is reached through the API server, so
clients need only the API's address and credentials.  The caller's
credentials stay at the server; the agent sees the server's client certificate
(or, over plain HTTP, its token).  Request
and response bodies are streamed both ways, never held whole.

The pure parts — container choice, agent address, query translation,
subprotocol filtering and frame pumping — are plain functions so the unit
tests exercise them without sockets.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import httpx
import trio
import trio_websocket

from fleet.api import errors
from fleet.api.registry import KindInfo, Registry
from fleet.server.http import Resp, dumps
from fleet.store import KeyNotFound, Store

log = logging.getLogger(__name__)

# Subresources of pods this module serves, with their discovery verbs and
# kind, as kube-apiserver lists them in /api/v1.  discovery.py and app.py
# import this so there is one list of what is really served.
STREAM_SUBRESOURCES: dict[str, tuple[tuple[str, ...], str]] = {
    "log": (("get",), "Pod"),
    "exec": (("create", "get"), "PodExecOptions"),
    "attach": (("create", "get"), "PodAttachOptions"),
    "portforward": (("create", "get"), "PodPortForwardOptions"),  # portforward.py
}
WEBSOCKET_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})

# The remote-command subprotocols a client may ask for, newest first.  The
# proxy forwards only these (never arbitrary strings) and lets the agent pick.
CHANNEL_PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "base64.channel.k8s.io",
)

# Query parameters of PodLogOptions the agent understands.
LOG_PARAMS = ("follow", "tailLines", "sinceSeconds", "sinceTime", "timestamps", "previous",
              "limitBytes")
_LOG_INT_PARAMS = {"tailLines": 0, "sinceSeconds": 1, "limitBytes": 1}  # name -> minimum
_LOG_BOOL_PARAMS = ("follow", "timestamps", "previous")
EXEC_PARAMS = ("stdin", "stdout", "stderr", "tty")

DEFAULT_CONNECT_TIMEOUT = 10.0
# How long a refused WebSocket upgrade is remembered for the SPDY retry (see refuse_spdy).
REFUSAL_MEMORY_SECONDS = 30.0
REFUSAL_MEMORY_SIZE = 256
# kubectl writes stdin in chunks of at most 32 KiB and agents should write
# output in similar chunks; this only bounds a misbehaving peer.
MAX_MESSAGE_SIZE = 16 * 1024 * 1024
ADDRESS_PREFERENCE = ("InternalIP", "ExternalIP", "Hostname", "InternalDNS", "ExternalDNS")


# ------------------------------------------------------------------ pure parts
def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def pod_container_names(pod: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(containers, initContainers, ephemeralContainers) names of a pod."""
    spec = pod.get("spec") or {}

    def names(key: str) -> list[str]:
        return [c.get("name", "") for c in spec.get(key) or [] if isinstance(c, dict)]

    return names("containers"), names("initContainers"), names("ephemeralContainers")


def select_container(pod: Mapping[str, Any], requested: str | None) -> str:
    """The container a request targets, with kube-apiserver's errors.

    An explicit name must be one of the pod's (init, ephemeral) containers;
    without one, a single-container pod means that container.  (kubectl picks
    a default container itself — the annotation or the first — so the
    "choose one of" error mostly reaches other clients.)
    """
    name = (pod.get("metadata") or {}).get("name", "")
    containers, inits, ephemerals = pod_container_names(pod)
    if requested:
        if requested in containers or requested in inits or requested in ephemerals:
            return requested
        raise errors.BadRequest(f"container {requested} is not valid for pod {name}")
    if len(containers) == 1:
        return containers[0]
    if not containers:
        raise errors.BadRequest(f"pod {name} has no containers")
    msg = f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]"
    if inits:
        msg += f" or one of the init containers: [{' '.join(inits)}]"
    if ephemerals:
        msg += f" or one of the ephemeral containers: [{' '.join(ephemerals)}]"
    raise errors.BadRequest(msg)


AGENT_API_SCHEME = "fleet.dev/agent-api-scheme"


@dataclass(frozen=True)
class AgentAddress:
    host: str
    port: int
    scheme: str = "https"

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.netloc}{path}"

    @property
    def ws_scheme(self) -> str:
        return "wss" if self.scheme == "https" else "ws"

    def ssl_context(self, tls: ssl.SSLContext | None) -> ssl.SSLContext | None:
        """The client context for this agent: `tls` (server CA trust, the server's client
        certificate) over HTTPS; None over plain HTTP."""
        if self.scheme != "https":
            return None
        return tls if tls is not None else ssl.create_default_context()


def agent_address(node: Mapping[str, Any]) -> AgentAddress:
    """Where a node's agent listens: its preferred address and the kubelet endpoint port."""
    name = (node.get("metadata") or {}).get("name", "")
    status = node.get("status") or {}
    addresses = [a for a in status.get("addresses") or [] if isinstance(a, dict) and a.get("address")]
    host = None
    for kind in ADDRESS_PREFERENCE:
        host = next((a["address"] for a in addresses if a.get("type") == kind), None)
        if host:
            break
    if not host:
        known = [f"{a.get('type')}:{a.get('address')}" for a in addresses]
        raise errors.ServiceUnavailable(
            f"no preferred addresses found for node {name}; known addresses: {known}")
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise errors.ServiceUnavailable(f"node {name} does not report its agent port "
                                        "(status.daemonEndpoints.kubeletEndpoint.Port)")
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    scheme = "http" if annotations.get(AGENT_API_SCHEME) == "http" else "https"
    return AgentAddress(host, port, scheme)


def _path(kind: str, namespace: str, pod: str, container: str) -> str:
    return "/" + "/".join(quote(p, safe="") for p in (kind, namespace, pod, container))


def log_query(query: Mapping[str, str]) -> dict[str, str]:
    """Validated PodLogOptions query for the agent (unknown parameters dropped)."""
    out: dict[str, str] = {}
    for name, minimum in _LOG_INT_PARAMS.items():
        raw = query.get(name)
        if raw in (None, ""):
            continue
        try:
            value = int(raw)
        except ValueError:
            raise errors.BadRequest(f'{name}: Invalid value: "{raw}": must be an integer') from None
        if value < minimum:
            bound = "non-negative" if minimum == 0 else "greater than 0"
            raise errors.BadRequest(f"{name}: Invalid value: {value}: must be {bound}")
        out[name] = str(value)
    if query.get("sinceTime"):
        if "sinceSeconds" in out:
            raise errors.BadRequest("at most one of sinceTime or sinceSeconds may be specified")
        out["sinceTime"] = query["sinceTime"]
    for name in _LOG_BOOL_PARAMS:
        if _truthy(query.get(name)):
            out[name] = "true"
    return out


def log_url(addr: AgentAddress, namespace: str, pod: str, container: str,
            query: Mapping[str, str]) -> str:
    params = log_query(query)
    url = addr.url(_path('containerLogs', namespace, pod, container))
    return url + ("?" + urlencode(params) if params else "")


def stream_resource(kind: str, namespace: str, pod: str, container: str,
                    query: Iterable[tuple[str, str]]) -> str:
    """The agent's path + query for an exec/attach session.

    `query` keeps repeated keys: exec passes its argv as `command=..&command=..`.
    """
    pairs = list(query)
    commands = [v for k, v in pairs if k == "command"]
    flags = {k: v for k, v in pairs if k in EXEC_PARAMS}
    if kind == "exec" and not commands:
        raise errors.BadRequest("you must specify at least 1 command")
    if not any(_truthy(flags.get(k)) for k in ("stdin", "stdout", "stderr")):
        raise errors.BadRequest("you must specify at least 1 of stdin, stdout, stderr")
    out: list[tuple[str, str]] = [("command", c) for c in commands] if kind == "exec" else []
    out += [(k, "true" if _truthy(flags.get(k)) else "false") for k in EXEC_PARAMS]
    return _path(kind, namespace, pod, container) + "?" + urlencode(out)


def offered_protocols(offered: Iterable[str]) -> list[str]:
    """The client's subprotocols we relay, in the client's order of preference."""
    seen: list[str] = []
    for p in offered:
        p = p.strip()
        if p in CHANNEL_PROTOCOLS and p not in seen:
            seen.append(p)
    return seen


def negotiate(offered: Iterable[str], supported: Iterable[str] = CHANNEL_PROTOCOLS) -> str | None:
    """The first protocol the client offers that `supported` includes (None: no match)."""
    allowed = set(supported)
    return next((p for p in offered_protocols(offered) if p in allowed), None)


def agent_error(status_code: int, body: bytes) -> errors.APIError:
    """An agent's refusal as an APIError: its Status when it sent one, else its text."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        err = errors.APIError(str(doc.get("message") or ""), code=int(doc.get("code") or status_code),
                              reason=str(doc.get("reason") or "InternalError"))
        details = doc.get("details") or {}
        err.name, err.kind = details.get("name"), details.get("kind")
        err.causes = list(details.get("causes") or [])
        return err
    text = body.decode("utf-8", "replace").strip() or f"the agent answered {status_code}"
    reasons = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
               503: "ServiceUnavailable"}
    if status_code in reasons:
        return errors.APIError(text, code=status_code, reason=reasons[status_code])
    return errors.InternalError(text)


# ----------------------------------------------------------------- frame pump
class Endpoint(Protocol):
    """One side of a relayed WebSocket session."""

    async def receive(self) -> bytes | str | None:
        """The next message; None once the peer has closed."""

    async def send(self, message: bytes | str) -> None: ...

    async def close(self, code: int, reason: str) -> None:
        """Close (idempotent); must not fail if the peer is already gone."""


@dataclass
class PumpResult:
    closed_by: str  # "client" or "agent"
    code: int
    reason: str
    to_agent: int = 0  # messages relayed each way (for logs and tests)
    to_client: int = 0


async def pump(client: Endpoint, agent: Endpoint, close_info: Callable[[], tuple[int, str]]
               ) -> PumpResult:
    """Copy messages both ways until one side closes, then close the other.

    `close_info()` gives the close code and reason of whichever side ended,
    read once it has: the agent's close (its exit status already went out on
    channel 3) is passed on to the client as is.
    """
    result = PumpResult("", 1000, "")

    async def copy(src: Endpoint, dst: Endpoint, name: str, scope: trio.CancelScope) -> None:
        while True:
            msg = await src.receive()
            if msg is None:
                break
            await dst.send(msg)
            if name == "client":
                result.to_agent += 1
            else:
                result.to_client += 1
        if not result.closed_by:
            result.closed_by = name
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(copy, client, agent, "client", nursery.cancel_scope)
        nursery.start_soon(copy, agent, client, "agent", nursery.cancel_scope)
    result.code, result.reason = close_info()
    other = agent if result.closed_by == "client" else client
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        await other.close(result.code, result.reason)
    return result


class ASGIEndpoint:
    """The client's side: an accepted ASGI websocket (hypercorn)."""

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]],
                 send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self._receive = receive
        self._send = send
        self.closed = False
        self.close_code = 1000
        self.close_reason = ""

    async def receive(self) -> bytes | str | None:
        if self.closed:
            return None
        while True:
            msg = await self._receive()
            if msg["type"] == "websocket.receive":
                data = msg.get("bytes")
                return data if data is not None else msg.get("text") or ""
            if msg["type"] == "websocket.disconnect":
                self.closed = True
                code = msg.get("code", 1000)
                # 1005 "no status" and 1006 "abnormal" may not be sent in a
                # close frame; the agent is told it was a normal end.
                self.close_code = code if code not in (1005, 1006) else 1000
                return None

    async def send(self, message: bytes | str) -> None:
        if self.closed:
            return
        key = "bytes" if isinstance(message, bytes) else "text"
        await self._send({"type": "websocket.send", key: message})

    async def close(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        await self._send({"type": "websocket.close", "code": code, "reason": reason})


class TrioWebSocketEndpoint:
    """The agent's side: a trio-websocket client connection."""

    def __init__(self, conn: trio_websocket.WebSocketConnection) -> None:
        self.conn = conn

    async def receive(self) -> bytes | str | None:
        try:
            return await self.conn.get_message()
        except trio_websocket.ConnectionClosed:
            return None

    async def send(self, message: bytes | str) -> None:
        try:
            await self.conn.send_message(message)
        except trio_websocket.ConnectionClosed:
            # The agent went away; its receive side reports that and ends the pump.
            pass

    def close_info(self) -> tuple[int, str]:
        reason = self.conn.closed
        if reason is None:
            return 1000, ""
        code = reason.code if reason.code not in (1005, 1006) else 1000
        return code, reason.reason or ""

    async def close(self, code: int, reason: str) -> None:
        await self.conn.aclose(code, reason)


# ------------------------------------------------------------------ the proxy
@dataclass(frozen=True)
class Target:
    """A resolved pod/container and where its agent listens."""

    namespace: str
    pod: str
    container: str
    agent: AgentAddress


class PodProxy:
    """Relays pod log streams and exec/attach sessions to node agents."""

    def __init__(self, store: Store, registry: Registry, token: str | None, *,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 tls: ssl.SSLContext | None = None) -> None:
        self.store = store
        self.registry = registry
        self.token = token
        self.tls = tls  # the agent client context (see the module docstring)
        self.connect_timeout = connect_timeout
        # (subresource, namespace, pod) -> (when, error) of recent WebSocket refusals.
        self._refusals: dict[tuple[str, str, str], tuple[float, errors.APIError]] = {}

    def _remember_refusal(self, key: tuple[str, str, str], err: errors.APIError) -> None:
        if len(self._refusals) >= REFUSAL_MEMORY_SIZE:
            self._refusals.pop(next(iter(self._refusals)))
        self._refusals[key] = (trio.current_time(), err)

    def _recent_refusal(self, key: tuple[str, str, str]) -> errors.APIError | None:
        seen = self._refusals.pop(key, None)
        if seen is None or trio.current_time() - seen[0] > REFUSAL_MEMORY_SECONDS:
            return None
        return seen[1]

    def _kind(self, plural: str) -> KindInfo:
        info = self.registry.get("", "v1", plural)
        assert info is not None, f"core kind {plural} is not registered"
        return info

    async def resolve(self, namespace: str, name: str, container: str | None) -> Target:
        """Pod → container → node → agent address, or the APIError a client should see."""
        pod = await self._pod(namespace, name)
        chosen = select_container(pod, container)
        return Target(namespace, name, chosen, await self._agent_of(pod, name))

    async def pod_agent(self, namespace: str, name: str) -> AgentAddress:
        """Pod → node → agent address (pods/portforward names no container)."""
        return await self._agent_of(await self._pod(namespace, name), name)

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored pod, or the 404 a client should see."""
        return await self._pod(namespace, name)

    def auth_headers(self, agent: AgentAddress) -> dict[str, str]:
        """What authenticates the server to `agent` (see `_auth_headers`)."""
        return self._auth_headers(agent)

    async def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return await self.store.get(self._kind("pods").key(namespace, name))
        except KeyNotFound:
            raise errors.NotFound(f'pods "{name}" not found', name=name, kind="pods") from None

    async def _agent_of(self, pod: Mapping[str, Any], name: str) -> AgentAddress:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            raise errors.BadRequest(f"pod {name} does not have a host assigned")
        nodes = self._kind("nodes")
        try:
            node = await self.store.get(nodes.key(None, node_name))
        except KeyNotFound:
            raise errors.NotFound(f'nodes "{node_name}" not found', name=node_name, kind="nodes") from None
        return agent_address(node)

    def _auth_headers(self, agent: AgentAddress) -> dict[str, str]:
        # The token only to a token-only agent (plain HTTP); over HTTPS the server's
        # client certificate speaks for it and the token never leaves the server.
        return ({"Authorization": f"Bearer {self.token}"}
                if self.token and agent.scheme == "http" else {})

    # ---------------------------------------------------------------- logs
    async def logs(self, namespace: str, name: str, query: Mapping[str, str]) -> Resp:
        """GET pods/{name}/log: the agent's text stream, passed through as it comes."""
        target = await self.resolve(namespace, name, query.get("container") or None)
        url = log_url(target.agent, namespace, name, target.container, query)
        # Reads wait as long as the container is quiet (follow); connecting may not.
        timeout = httpx.Timeout(self.connect_timeout, read=None)
        http = httpx.AsyncClient(timeout=timeout, headers=self._auth_headers(target.agent),
                                 verify=target.agent.ssl_context(self.tls) or True)
        try:
            resp = await http.send(http.build_request("GET", url), stream=True)
        except httpx.TransportError as e:
            await http.aclose()
            raise errors.ServiceUnavailable(f'Get "{url}": {e or type(e).__name__}') from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await http.aclose()
            raise
        if resp.status_code != 200:
            try:
                body = await resp.aread()
            finally:
                await resp.aclose()
                await http.aclose()
            raise agent_error(resp.status_code, body)
        ctype = resp.headers.get("content-type", "text/plain")
        return Resp(200, LogStream(http, resp), ctype)

    # ---------------------------------------------------- exec/attach (SPDY)
    async def refuse_spdy(self, subresource: str, namespace: str, name: str,
                          query: Mapping[str, str]) -> Resp:
        """POST pods/{name}/exec|attach: SPDY is not served; say so after the usual checks.

        kubectl retries over SPDY after *any* failed WebSocket upgrade and
        prints only the retry's error, so when this pod's upgrade was just
        refused (agent unreachable, container not running) that error is
        the answer here; "use WebSocket" would hide the real cause.
        """
        await self.resolve(namespace, name, query.get("container") or None)
        recent = self._recent_refusal((subresource, namespace, name))
        if recent is not None:
            raise recent
        raise errors.BadRequest(
            f"Upgrade request required: Fleet serves pods/{subresource} over WebSocket only "
            "(subprotocols v5.channel.k8s.io, v4.channel.k8s.io); use kubectl 1.30 or newer "
            "or a client that speaks the WebSocket remote-command protocol")

    # ---------------------------------------------------- exec/attach (WS)
    async def websocket(self, subresource: str, namespace: str, name: str,
                        query: list[tuple[str, str]], offered: list[str],
                        receive: Callable[[], Awaitable[dict[str, Any]]],
                        send: Callable[[dict[str, Any]], Awaitable[None]],
                        extensions: Mapping[str, Any]) -> int:
        """Relay one exec/attach session; returns the HTTP status of the upgrade (101 or error)."""
        try:
            container = next((v for k, v in query if k == "container"), None) or None
            target = await self.resolve(namespace, name, container)
            resource = stream_resource(subresource, namespace, name, target.container, query)
            protocols = offered_protocols(offered)
            if offered and not protocols:
                raise errors.BadRequest(
                    f"none of the requested subprotocols are supported: {offered}; "
                    f"supported: {list(CHANNEL_PROTOCOLS)}")
        except errors.APIError as e:
            # No need to remember these: the SPDY retry's own lookup finds them again.
            await reject_websocket(send, extensions, e)
            return e.code
        headers = [(k.lower().encode(), v.encode()) for k, v in self._auth_headers(target.agent).items()]
        accepted = False
        try:
            async with trio_websocket.open_websocket(
                target.agent.host, target.agent.port, resource,
                use_ssl=target.agent.ssl_context(self.tls) or False,
                subprotocols=protocols or ["channel.k8s.io"], extra_headers=headers,
                max_message_size=MAX_MESSAGE_SIZE, connect_timeout=self.connect_timeout,
                disconnect_timeout=5,
            ) as conn:
                chosen = conn.subprotocol
                if protocols and chosen not in protocols:
                    await conn.aclose(1002, "no subprotocol negotiated")
                    err = errors.ServiceUnavailable(
                        f"the agent accepted none of the subprotocols {protocols}")
                    self._remember_refusal((subresource, namespace, name), err)
                    await reject_websocket(send, extensions, err)
                    return err.code
                # An empty offer is the original channel.k8s.io protocol; the
                # client then expects no Sec-WebSocket-Protocol in the answer.
                await send({"type": "websocket.accept", "subprotocol": chosen if protocols else None})
                accepted = True
                agent = TrioWebSocketEndpoint(conn)
                client = ASGIEndpoint(receive, send)

                def close_info() -> tuple[int, str]:
                    if client.closed and conn.closed is None:
                        return client.close_code, ""
                    return agent.close_info()

                result = await pump(client, agent, close_info)
                log.debug("pods/%s %s/%s: closed by %s (%d), %d messages in, %d out", subresource,
                          namespace, name, result.closed_by, result.code, result.to_agent,
                          result.to_client)
                return 101
        except trio_websocket.ConnectionRejected as e:
            err = agent_error(e.status_code, e.body or b"")
        except (trio_websocket.HandshakeError, OSError) as e:
            if accepted:
                # Only the closing handshake with the agent failed (it vanished
                # mid-close); the session itself already ended.
                log.debug("pods/%s %s/%s: agent close: %r", subresource, namespace, name, e)
                return 101
            where = f"{target.agent.ws_scheme}://{target.agent.netloc}{resource.split('?')[0]}"
            err = errors.ServiceUnavailable(f"error dialing the agent at {where}: "
                                            f"{e.__cause__ or e or type(e).__name__}")
        self._remember_refusal((subresource, namespace, name), err)
        await reject_websocket(send, extensions, err)
        return err.code


async def reject_websocket(send: Callable[[dict[str, Any]], Awaitable[None]],
                           extensions: Mapping[str, Any], err: errors.APIError) -> None:
    """Refuse a WebSocket upgrade with an HTTP error whose body is the Status.

    client-go puts that body into its error message (and, for kubectl exec,
    then retries over SPDY, whose POST gets the same Status back).  Servers
    without the ASGI http-response extension can only close (hypercorn: 403).
    """
    if "websocket.http.response" not in extensions:
        await send({"type": "websocket.close", "code": 1008, "reason": err.message[:120]})
        return
    body = dumps(err.status())
    await send({"type": "websocket.http.response.start", "status": err.code,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


class LogStream:
    """An agent's streamed response (pods/log, nodes/proxy) as a response body: chunks
    as they arrive, then cleanup.

    A class rather than an async generator: a generator that was never
    started (the client left before the first chunk) skips its `finally` on
    `aclose()`, which would leak the agent connection.
    """

    def __init__(self, http: httpx.AsyncClient, resp: httpx.Response) -> None:
        self._http = http
        self._resp = resp
        self._chunks = resp.aiter_raw()

    def __aiter__(self) -> LogStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            while True:
                chunk = await self._chunks.__anext__()
                if chunk:
                    return chunk
        except httpx.TransportError:
            # The agent dropped the stream (restart, node gone): end the
            # response cleanly; kubectl -f then ends like on a closed stream.
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._resp.aclose()
            await self._http.aclose()


def admin_token_from(authenticator: object) -> str | None:
    """The token the server presents to agents, when none was configured explicitly.

    Agents accept the cluster's admin token (`fleet agent --token`), and the
    server's static-token authenticator holds exactly that token for the
    `system:masters` user; an authenticator of another shape yields None, and
    the agent then refuses with 401, which reaches the client as such.
    """
    tokens = getattr(authenticator, "_tokens", None)
    if not isinstance(tokens, dict):
        return None
    for token, user in tokens.items():
        if "system:masters" in getattr(user, "groups", ()):
            return str(token)
    return None


# ------------------------------------------------------------- nodes/proxy
# How kube-apiserver authorizes a proxied request: the verb follows the HTTP method.
NODE_PROXY_VERBS: dict[str, str] = {
    "GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete",
}
# Connection-scoped headers (RFC 9110 7.6.1) never cross a proxy.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"})
# The caller's credentials are for the API server only: the agent gets the server's token.
_DROP_REQUEST_HEADERS = HOP_BY_HOP | {"host", "authorization", "cookie"}
# The response is re-framed (chunked) by the server; its type goes out separately.
_DROP_RESPONSE_HEADERS = HOP_BY_HOP | {"content-length", "content-type"}
_PROXY_PREFIX = "/api/v1/nodes/"
# Characters left as they are when the (decoded) agent path is put back into a URL.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def parse_node_proxy(path: str) -> tuple[str, str] | None:
    """(node name, agent path) for `/api/v1/nodes/{name}/proxy[/{path}]`, else None.

    Done on the raw path rather than through the generic route parser, which
    takes at most name/subresource: everything after `proxy` belongs to the agent,
    trailing slash included.
    """
    if not path.startswith(_PROXY_PREFIX):
        return None
    name, sep, tail = path[len(_PROXY_PREFIX):].partition("/")
    if not name or not sep:
        return None
    if tail == "proxy":
        return name, "/"
    if tail.startswith("proxy/"):
        return name, tail[len("proxy"):]
    return None


def proxy_request_headers(headers: Mapping[str, str], token: str | None) -> dict[str, str]:
    """The caller's headers as the agent should see them: end-to-end ones, server's token."""
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP_REQUEST_HEADERS}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def proxy_response_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The agent's response headers worth passing back (repeated ones joined)."""
    out: dict[str, str] = {}
    for k, v in headers:
        name = k.lower()
        if name in _DROP_RESPONSE_HEADERS:
            continue
        out[name] = f"{out[name]}, {v}" if name in out else v
    return out


class NodeProxy:
    """Relays `nodes/{name}/proxy/{path}` requests to the node's agent."""

    def __init__(self, store: Store, registry: Registry, token: str | None, *,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 tls: ssl.SSLContext | None = None) -> None:
        self.store = store
        self.registry = registry
        self.token = token
        self.tls = tls
        self.connect_timeout = connect_timeout

    async def agent_for(self, name: str) -> AgentAddress:
        """The node's agent address: 404 for an unknown node, 503 when it reports none."""
        nodes = self.registry.get("", "v1", "nodes")
        assert nodes is not None, "core kind nodes is not registered"
        try:
            node = await self.store.get(nodes.key(None, name))
        except KeyNotFound:
            raise errors.NotFound(f'nodes "{name}" not found', name=name, kind="nodes") from None
        return agent_address(node)

    async def forward(self, name: str, method: str, path: str, query: str,
                      headers: Mapping[str, str], body: bytes | AsyncIterator[bytes]) -> Resp:
        """Send one request to the agent; its status, headers and body come back as they are.

        The agent's own errors (401, 404, its 400 Status for a bad archive) are
        passed through untouched, as kube-apiserver does: the client talks to the
        agent, the server only carries the bytes.  Only failing to reach the agent
        becomes a 503 Status of the server's.
        """
        addr = await self.agent_for(name)
        url = addr.url(quote(path, safe=_PATH_SAFE))
        target = url + (f"?{query}" if query else "")
        # The agent may take long to answer (importing a large image happens before
        # the response); only connecting is bounded, like the log stream.
        timeout = httpx.Timeout(self.connect_timeout, read=None, write=None)
        http = httpx.AsyncClient(timeout=timeout, verify=addr.ssl_context(self.tls) or True)
        try:
            request = http.build_request(method, target, headers=proxy_request_headers(
                headers, self.token if addr.scheme == "http" else None), content=body)
            resp = await http.send(request, stream=True)
        except httpx.TransportError as e:
            await http.aclose()
            raise errors.ServiceUnavailable(f"error trying to reach the agent of node {name} "
                                            f"at {url}: {e or type(e).__name__}") from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await http.aclose()
            raise
        ctype = resp.headers.get("content-type", "application/octet-stream")
        return Resp(resp.status_code, LogStream(http, resp), ctype,
                    proxy_response_headers(resp.headers.multi_items()))
