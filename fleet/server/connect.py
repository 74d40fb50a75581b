"""The API server's requests relayed to node agents: `ConnectVerbs`, a base of
`APIServer` (app.py).

pods/log (streamed), pods/exec|attach|portforward (CONNECT requests: over
WebSocket, over a raw `Upgrade: SPDY/3.1`, and the SPDY POST refused with the
"use WebSocket" Status), Fleet's pods/signal, and nodes/{name}/proxy.  Each is
authenticated, authorized as kube-apiserver does (exec/attach/portforward as
`create`, logs as `get`, the node proxy by method), passed through the
ProcessControl consent gate and CONNECT admission (processcontrol.py), then
relayed by proxy.py / portforward.py.  Upgrades are served outside
`APIServer.handle`, so they are audited and counted here.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fleet.api import errors
from fleet.auth import Attributes, UserInfo
from fleet.auth.audit import CURRENT as AUDIT_CURRENT
from fleet.auth.audit import RequestAudit, auth_methods
from fleet.server.access import RequestAccess
from fleet.server.asgi import raw_path, remote_address, request_uri, scope_headers
from fleet.server.http import JSON, Req, Resp, dumps, split_raw_path
from fleet.server.metrics import Metrics
from fleet.server.paths import resource_route, route_segments
from fleet.server.portforward import PortForwardProxy
from fleet.server.processcontrol import ProcessControlGate
from fleet.server.proxy import (
    NODE_PROXY_VERBS,
    WEBSOCKET_SUBRESOURCES,
    NodeProxy,
    PodProxy,
    reject_websocket,
)
from fleet.server.rest import ResourceAPI
from fleet.server.routes import Route
from fleet.server.tlsconn import scope_peer_certs


class ConnectVerbs(RequestAccess):
    """What the relays read; `APIServer.__init__` sets it (`handle`: the whole
    pipeline, for an upgrade that is not a port-forward)."""

    resources: ResourceAPI
    metrics: Metrics
    pods: PodProxy
    portforward: PortForwardProxy
    process_control: ProcessControlGate
    nodes: NodeProxy
    handle: Callable[[Req], Awaitable[tuple[Resp, str, str]]]

    async def node_proxy(self, req: Req, name: str, agent_path: str) -> tuple[Resp, str, str]:
        """`nodes/{name}/proxy/{path}`: authorize as kube-apiserver does, then relay.

        The verb follows the method (GET → get, POST → create, ...) on resource
        "nodes", subresource "proxy", so RBAC rules written for Kubernetes apply.
        """
        verb = NODE_PROXY_VERBS.get(req.method)
        if verb is None:
            raise errors.MethodNotAllowed(f"method {req.method} is not supported on nodes/proxy")
        route = Route("", "v1", "nodes", None, name, "proxy")
        self.authorize(req.user, verb, route, self.resources.kind_for(Route("", "v1", "nodes")))
        query = req.raw_query if req.raw_query is not None else urlencode(req.query)
        body = req.body_stream if req.body_stream is not None else req.body
        resp = await self.nodes.forward(name, req.method, agent_path, query, req.headers, body)
        return resp, verb, "nodes/proxy"

    async def pod_signal(self, req: Req, route: Route, method: str) -> tuple[Resp, str, str]:
        """Fleet's POST pods/{name}/signal: RBAC verb `signal`, then consent and
        admission (fleet/server/processcontrol.py), then the pod's agent."""
        info = self.resources.kind_for(replace(route, subresource=""))
        if "signal" not in info.subresources or route.namespace is None or route.name is None:
            raise errors.NotFound("the server could not find the requested resource")
        if method != "POST":
            raise errors.MethodNotAllowed(f"{method} is not supported on {info.plural}/signal")
        self.authorize(req.user, "signal", route, info)
        assert req.user is not None
        resp = await self.process_control.signal(route.namespace, route.name, req.body, req.user)
        return resp, "signal", f"{info.plural}/signal"

    async def agent_subresource(self, req: Req, route: Route, method: str) -> tuple[Resp, str, str]:
        """pods/log (GET, streamed) and the SPDY form of pods/exec|attach (POST, refused).

        The WebSocket form of exec/attach never gets here: FleetASGI hands
        websocket scopes to `websocket_subresource`.
        """
        info = self.resources.kind_for(replace(route, subresource=""))
        sub = route.subresource
        resource = f"{info.plural}/{sub}"
        if sub not in info.subresources or route.namespace is None or route.name is None:
            raise errors.NotFound("the server could not find the requested resource")
        if sub == "log" and method != "GET":
            raise errors.MethodNotAllowed(f"{method} is not supported on {resource}")
        if sub in WEBSOCKET_SUBRESOURCES and method not in ("GET", "POST"):
            raise errors.MethodNotAllowed(f"{method} is not supported on {resource}")
        # kube-apiserver authorizes exec/attach as `create` (also for the
        # WebSocket GET, since 1.30), logs as `get`.
        verb = "get" if sub == "log" else "create"
        self.authorize(req.user, verb, route, info)
        if sub == "log":
            return await self.pods.logs(route.namespace, route.name, req.query), verb, resource
        if sub == "portforward":  # upgrades never get here (FleetASGI routes them)
            await self.pods.pod_agent(route.namespace, route.name)
            raise errors.BadRequest("Upgrade request required")
        # A plain GET or a POST here is not a WebSocket upgrade: SPDY clients
        # (kubectl before 1.30, or its fallback after a failed WebSocket upgrade).
        # The consent gate answers them too: kubectl prints only the fallback's error.
        assert req.user is not None
        await self.process_control.check(req.user, sub, route.namespace, route.name,
                                         req.query.get("container") or None,
                                         options=dict(req.query))
        return await self.pods.refuse_spdy(sub, route.namespace, route.name, req.query), verb, resource

    async def websocket_subresource(self, scope: dict[str, Any], receive: Any, send: Any,
                                    route: Route) -> None:
        """pods/exec and pods/attach over WebSocket: authenticate, authorize, relay."""
        t0 = time.perf_counter()
        resource = f"{route.plural}/{route.subresource}"
        msg = await receive()
        if msg["type"] != "websocket.connect":
            return  # the client left before the handshake completed
        extensions = scope.get("extensions") or {}
        headers = scope_headers(scope)
        ra = self.audit_begin(scope, headers)
        token = AUDIT_CURRENT.set(ra) if ra is not None else None
        try:
            user = await self.upgrade_user(ra, scope, headers, route)
            info = self.resources.kind_for(replace(route, subresource=""))
            if route.subresource not in info.subresources or route.namespace is None:
                raise errors.NotFound("the server could not find the requested resource")
            self.authorize(user, "create", route, info)
            assert route.name is not None
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            await self.process_control.check(
                user, route.subresource, route.namespace, route.name,
                next((v for k, v in query if k == "container"), None) or None,
                command=[v for k, v in query if k == "command"] if route.subresource == "exec" else (),
                options=_connect_options(query))
        except errors.APIError as e:
            await reject_websocket(send, extensions, e)
            self.metrics.observe("create", resource, e.code, time.perf_counter() - t0)
            if ra is not None:
                ra.complete(e.code, dumps(e.status()), JSON)
            return
        finally:
            if token is not None:
                AUDIT_CURRENT.reset(token)
        if ra is not None:
            send = ra.upgrade_send(send)
        offered = list(scope.get("subprotocols") or [])
        if route.subresource == "portforward":
            status = await self.portforward.websocket(route.namespace, route.name, query, offered,
                                                      receive, send, extensions)
        else:
            status = await self.pods.websocket(route.subresource, route.namespace, route.name,
                                               query, offered, receive, send, extensions)
        self.metrics.observe("create", resource, status, time.perf_counter() - t0)
        if ra is not None:
            ra.complete(status)

    async def upgrade_user(self, ra: RequestAudit | None, scope: dict[str, Any], headers: dict[str, str],
                           route: Route) -> UserInfo:
        """Authenticate an upgrade request (exec, attach, port-forward), audited as `create`."""
        attrs = Attributes("create", route.group, route.version, route.plural, route.subresource,
                           route.namespace or "", route.name or "")
        certs = scope_peer_certs(scope)
        try:
            user = await self.authenticate(headers, certs, remote_address(scope))
        except errors.Unauthorized:
            if ra is not None:
                ra.refused(attrs, auth_methods(headers, certs))
            raise
        if ra is not None:
            ra.authenticated(user, attrs)
        return self._acting_user(user, headers)

    async def raw_upgrade(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A plain `Upgrade: SPDY/3.1` (fleet/server/upgrade.py): pods/portforward's is
        served (portforward.py); any other gets what the request without the upgrade
        would (exec/attach: the "use WebSocket" Status)."""
        t0 = time.perf_counter()
        headers = scope_headers(scope)
        segments = split_raw_path(raw_path(scope))
        try:
            route = resource_route(route_segments(segments) or [])
        except errors.APIError:
            route = None
        if route is None or route.subresource != "portforward" or route.name is None \
                or route.namespace is None or scope["method"] != "POST":
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            resp, verb, resource = await self.handle(Req(scope["method"], scope["path"], query,
                                                         headers, b"", segments=segments,
                                                         peer_certs=scope_peer_certs(scope), remote=remote_address(scope),
                                                         request_uri=request_uri(scope)))
            body = resp.body if isinstance(resp.body, bytes) else b""
            await send({"type": "raw.response", "status": resp.status, "body": body,
                        "headers": [(b"content-type", resp.content_type.encode()),
                                    *((k.encode("latin-1"), v.encode("latin-1"))
                                      for k, v in resp.headers.items())]})
            self.metrics.observe(verb, resource, resp.status, time.perf_counter() - t0)
            return
        resource = "pods/portforward"
        ra = self.audit_begin(scope, headers)
        token = AUDIT_CURRENT.set(ra) if ra is not None else None
        try:
            user = await self.upgrade_user(ra, scope, headers, route)
            self.authorize(user, "create", route, self.resources.kind_for(replace(route, subresource="")))
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            await self.process_control.check(user, "portforward", route.namespace, route.name,
                                             options=_connect_options(query))
        except errors.APIError as e:
            await send({"type": "raw.response", "status": e.code, "body": dumps(e.status()),
                        "headers": [(b"content-type", b"application/json")]})
            self.metrics.observe("create", resource, e.code, time.perf_counter() - t0)
            if ra is not None:
                ra.complete(e.code, dumps(e.status()), JSON)
            return
        finally:
            if token is not None:
                AUDIT_CURRENT.reset(token)
        if ra is not None:
            send = ra.upgrade_send(send)
        offered = [p.strip() for k, v in scope["headers"] if k.lower() == b"x-stream-protocol-version"
                   for p in v.decode("latin-1").split(",") if p.strip()]
        status = await self.portforward.raw(route.namespace, route.name, offered, receive, send)
        self.metrics.observe("create", resource, status, time.perf_counter() - t0)
        if ra is not None:
            ra.complete(status)


def _connect_options(query: list[tuple[str, str]]) -> dict[str, Any]:
    """The connect request's query as the options object admission sees (repeated
    keys — exec's `command`, port-forward's `ports` — become lists)."""
    out: dict[str, Any] = {}
    for k, v in query:
        if k in ("command", "ports"):
            out.setdefault(k, []).append(v)
        else:
            out[k] = v
    return out
