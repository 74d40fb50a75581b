"""The API server's HTTP application (quart-trio on hypercorn).

`FleetASGI` adapts every HTTP request into a `Req` and `APIServer.handle`
runs the pipeline as explicit stages:

    authenticate → authorize → decode → default → mutating admission → validate
                 → validating admission → store

Discovery, OpenAPI, version and health endpoints are answered here; every
resource path goes to the generic handlers in rest.py / watch.py, except the
pod subresources served by the node agents (`log`, `exec`, `attach`) and
`nodes/{name}/proxy/...`, which proxy.py relays, and Fleet's node maintenance
subresources (`nodes/{name}/drain`, `nodes/{name}/schedulable`), served by
drain.py.  Errors of any stage become Kubernetes `Status` objects.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import ssl
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import trio
from quart_trio import QuartTrio

from fleet import __version__
from fleet.admission import AdmissionChain, collect_warnings
from fleet.api import errors
from fleet.api.registry import Registry
from fleet.auth import (
    ANONYMOUS,
    Attributes,
    AuthenticationError,
    Authenticator,
    Authorizer,
    Credentials,
    UserInfo,
    non_resource,
)
from fleet.auth.audit import (
    AUDIT_ID_RESPONSE_HEADER,
    Auditor,
    RequestAudit,
    auth_methods,
    record_authentication_failure,
    record_decision,
    record_impersonation,
)
from fleet.auth.audit import CURRENT as AUDIT_CURRENT
from fleet.auth.impersonation import (
    ImpersonationHeaderError,
    impersonate,
    plain_text_body,
    without_impersonation_headers,
)
from fleet.server import discovery, upgrade
from fleet.server.drain import NodeMaintenance
from fleet.server.hpa_v1 import GROUP as HPA_GROUP
from fleet.server.hpa_v1 import PLURAL as HPA_PLURAL
from fleet.server.hpa_v1 import AutoscalingV1
from fleet.server.http import JSON, Req, Resp, dumps, split_raw_path
from fleet.server.limits import DEFAULT_BODY_TIMEOUT
from fleet.server.metrics import Metrics
from fleet.server.openapi import OpenAPICache
from fleet.server.paths import node_proxy_route, resource_route, route_segments
from fleet.server.portforward import PortForwardProxy
from fleet.server.processcontrol import ProcessControlGate
from fleet.server.proxy import (
    NODE_PROXY_VERBS,
    STREAM_SUBRESOURCES,
    WEBSOCKET_SUBRESOURCES,
    NodeProxy,
    PodProxy,
    admin_token_from,
    reject_websocket,
)
from fleet.server.request_params import MAX_BODY, add_warning_headers
from fleet.server.requestinfo import (
    is_node_proxy,
    request_attributes,
    request_labels,
    request_name,
    request_verb,
)
from fleet.server.resource_metrics import ResourceMetrics
from fleet.server.rest import ResourceAPI
from fleet.server.routes import SUBRESOURCE_VERBS, Route, parse_route
from fleet.server.watch import WatchCounter, watch
from fleet.store import Store

log = logging.getLogger(__name__)


def version_info() -> dict[str, str]:
    major, minor = 1, 32
    return {
        "major": str(major),
        "minor": str(minor),
        "gitVersion": f"v{major}.{minor}.0-fleet.{__version__}",
        "gitCommit": "fleet",
        "gitTreeState": "clean",
        "buildDate": "2026-11-29T00:00:00Z",
        "goVersion": "python" + platform.python_version(),
        "compiler": "cpython",
        "platform": f"{sys.platform}/{platform.machine()}",
    }


class APIServer:
    """Holds the pieces of the pipeline and dispatches one request."""

    def __init__(self, store: Store, registry: Registry, authenticator: Authenticator,
                 authorizer: Authorizer, admission: AdmissionChain, resources: ResourceAPI,
                 metrics: Metrics, watches: WatchCounter, server_address: str, *,
                 agent_token: str | None = None, maintenance: NodeMaintenance | None = None,
                 resource_metrics: ResourceMetrics | None = None, anonymous: bool = False,
                 audit: Auditor | None = None, agent_tls: ssl.SSLContext | None = None,
                 process_control_consent: bool = False) -> None:
        self.store = store
        # The audit trail (fleet/auth/audit.py; None: off, and the hooks cost one check).
        self.audit = audit
        if audit is not None:
            audit.sink.counters = metrics
        # --anonymous-auth: a request with no credentials is system:anonymous (and
        # RBAC decides what it may see) instead of a 401.
        self.anonymous = anonymous
        self.registry = registry
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.admission = admission
        self.resources = resources
        self.metrics = metrics
        self.watches = watches
        self.server_address = server_address
        self.openapi = OpenAPICache(registry)
        # Agents accept the cluster's admin token; without an explicit one the
        # server presents the admin token its own authenticator knows.
        agent_token = agent_token or admin_token_from(authenticator)
        # `agent_tls`: the client context for agents' HTTPS (fleet/server/proxy.py).
        self.pods = PodProxy(store, registry, agent_token, tls=agent_tls)
        self.portforward = PortForwardProxy(self.pods)
        # exec/attach/port-forward/signal past RBAC: the ProcessControl consent gate (on
        # with --hardened / --process-control-consent) and CONNECT admission.
        self.process_control = ProcessControlGate(store, registry, admission, self.pods,
                                                  consent=process_control_consent)
        self.nodes = NodeProxy(store, registry, agent_token, tls=agent_tls)
        # nodes/drain and nodes/schedulable; its runner (`maintenance.run`) is
        # started by whoever runs the server (fleet/server/run.py).
        self.maintenance = maintenance or NodeMaintenance(resources)
        # metrics.k8s.io (kubectl top, the HPA): served from what `resource_metrics.run`
        # scrapes from the agents; run.py starts that loop.
        self.resource_metrics = resource_metrics or ResourceMetrics(store, registry, agent_token,
                                                                    tls=agent_tls)
        # autoscaling/v1 horizontalpodautoscalers: the stored v2 objects, converted.
        self.hpa_v1 = AutoscalingV1(resources, registry, watches)
        # Resources served by their own handler instead of the generic REST one (the
        # per-resource rest.Storage of kube-apiserver), as a table rather than
        # branches: Fleet's node maintenance subresources, metrics.k8s.io (served
        # from scraped readings, never stored) and autoscaling/v1 HPAs (the stored
        # v2 objects, converted).
        self.resource_handlers: dict[tuple[str, str, str, str], Any] = {
            ("", "v1", "nodes", "drain"): self._maintenance,
            ("", "v1", "nodes", "schedulable"): self._maintenance,
            (HPA_GROUP, "v1", HPA_PLURAL, ""): self._hpa_v1,
        }
        for m in registry.in_group_version("metrics.k8s.io", "v1beta1"):
            self.resource_handlers[(m.group, m.version, m.plural, "")] = self._metrics
        # Non-resource paths served by a handler (the ServiceAccount issuer's
        # /.well-known/openid-configuration and /openid/v1/jwks): path -> async fn(req).
        self.path_handlers: dict[str, Any] = {}
        self.ready = True

    async def handle(self, req: Req) -> tuple[Resp, str, str]:
        """Returns the response and the (verb, resource) labels for metrics."""
        # Labels come from the request itself, so refused requests (401, 404,
        # 409, 422, ...) are counted under the verb and resource they aimed at.
        verb, resource = request_labels(req)
        # Warnings admission adds (PodSecurity's `would violate ...`) go out as
        # Warning headers, on refusals too, after the handler's own.
        with collect_warnings() as warnings:
            if self.audit is not None:
                resp, verb, resource = await self.handle_audited(req, verb, resource)
            else:
                resp, verb, resource = await self._handle(req, verb, resource)
        add_warning_headers(resp.headers, warnings)
        return resp, verb, resource

    async def _handle(self, req: Req, verb: str, resource: str) -> tuple[Resp, str, str]:
        try:
            req.user = await self.authenticate(req.headers, req.peer_certs, req.remote)
            self.apply_impersonation(req)
            resp, verb, resource = await self.dispatch(req)
        except errors.APIError as e:
            resp = Resp.error(e)
        except ImpersonationHeaderError as e:
            resp = impersonation_header_error(req, e)
        except Exception as e:  # never leak a traceback to the client; log it
            resp = internal_error(req, e)
        return resp, verb, resource

    async def handle_audited(self, req: Req, verb: str, resource: str) -> tuple[Resp, str, str]:
        """`handle` with the audit trail: RequestReceived once authenticated (a 401 is
        audited with no user), then ResponseComplete — around a streamed body
        ResponseStarted and ResponseComplete, Panic for an internal error."""
        assert self.audit is not None
        ra = self.audit.begin(request_uri=req.request_uri or req.path, headers=req.headers,
                              remote=req.remote)
        token = AUDIT_CURRENT.set(ra)
        try:
            try:
                req.user = await self.authenticate(req.headers, req.peer_certs, req.remote)
            except errors.Unauthorized:
                ra.refused(request_attributes(req), auth_methods(req.headers, req.peer_certs, req.query))
                raise
            ra.authenticated(req.user, request_attributes(req))
            self.apply_impersonation(req)
            if req.body:
                ra.request_body(req.body, req.headers.get("content-type", ""))
            resp, verb, resource = await self.dispatch(req)
        except errors.APIError as e:
            resp = Resp.error(e)
        except ImpersonationHeaderError as e:
            resp = impersonation_header_error(req, e)
        except Exception as e:
            resp = internal_error(req, e)
            ra.panic(f"APIServer panic'd on {req.method} {req.request_uri or req.path}: {type(e).__name__}")
        finally:
            AUDIT_CURRENT.reset(token)
        resp.headers[AUDIT_ID_RESPONSE_HEADER] = ra.audit_id
        if isinstance(resp.body, bytes):
            ra.complete(resp.status, resp.body, resp.content_type)
        else:
            resp.body = ra.stream(resp.status, resp.body)
        await self.audit.sink.wait_room()
        return resp, verb, resource

    async def audit_refused(self, req: Req, resp: Resp) -> None:
        """Audit a request answered before the pipeline (body too large, or too slow to
        arrive) as whoever its credentials say, like any other."""
        assert self.audit is not None
        ra = self.audit.begin(request_uri=req.request_uri or req.path, headers=req.headers,
                              remote=req.remote)
        token = AUDIT_CURRENT.set(ra)
        try:
            ra.authenticated(await self.authenticate(req.headers, req.peer_certs, req.remote),
                             request_attributes(req))
        except errors.APIError:
            ra.refused(request_attributes(req), auth_methods(req.headers, req.peer_certs, req.query))
        finally:
            AUDIT_CURRENT.reset(token)
        resp.headers[AUDIT_ID_RESPONSE_HEADER] = ra.audit_id
        ra.complete(resp.status, resp.body if isinstance(resp.body, bytes) else b"", resp.content_type)

    def audit_begin(self, scope: dict[str, Any], headers: dict[str, str]) -> RequestAudit | None:
        """The audit of a request served outside `handle` (WebSocket and SPDY upgrades)."""
        if self.audit is None:
            return None
        return self.audit.begin(request_uri=request_uri(scope), headers=headers, remote=_remote(scope))

    async def authenticate(self, headers: Mapping[str, str], peer_certs: tuple[bytes, ...] = (),
                           remote: str = "") -> UserInfo:
        """Who sends the request: a user, system:anonymous (if allowed), or 401.

        Why credentials were refused goes to the log, never to the client."""
        try:
            user = await self.authenticator.authenticate(Credentials(headers, peer_certs, remote))
        except AuthenticationError as e:
            log.info("authentication failed%s: %s", f" for {remote}" if remote else "", e)
            record_authentication_failure(str(e))
            raise errors.Unauthorized("Unauthorized") from None
        if user is not None:
            return user
        if self.anonymous:
            return ANONYMOUS
        raise errors.Unauthorized("Unauthorized")

    def impersonate(self, user: UserInfo, headers: Mapping[str, str]) -> UserInfo | None:
        """The user a request acts as when it carries Impersonate-* headers (None
        otherwise), each impersonated attribute authorized for `user`
        (fleet/auth/impersonation.py): 403 when one is not allowed."""
        return impersonate(user, headers, lambda attrs: self.authorizer.authorize(user, attrs))

    def authorize_path(self, req: Req, path: str) -> None:
        """A non-resource request (health, version, discovery, OpenAPI) is authorized
        on its path, as kube-apiserver does (RBAC's nonResourceURLs)."""
        assert req.user is not None
        verb = req.method.lower()
        decision = self.authorizer.authorize(req.user, non_resource(verb, path))
        record_decision(decision)
        if not decision.allowed:
            msg = f'forbidden: User "{req.user.name}" cannot {verb} path "{path}"'
            raise errors.Forbidden(msg + (f": {decision.reason}" if decision.reason else ""))

    async def dispatch(self, req: Req) -> tuple[Resp, str, str]:
        method = req.method
        # Before anything drops empty segments: the proxy's tail is the agent's, as sent.
        node_proxy = node_proxy_route(req.segments)
        if node_proxy is not None:
            return await self.node_proxy(req, *node_proxy)
        found = route_segments(req.segments)
        if found is None:  # an empty segment inside the path (`//`): no route, never collapsed
            raise errors.NotFound("the server could not find the requested resource")
        segs = found
        if parse_route(segs) is None:  # not a resource: authorized on its path
            self.authorize_path(req, "/" + "/".join(segs))
        if segs and segs[0] in ("healthz", "livez", "readyz"):
            ok = self.ready
            return Resp(200 if ok else 503, b"ok" if ok else b"not ready", "text/plain"), "get", "health"
        if segs == ["version"]:
            return Resp.json(200, version_info()), "get", "version"
        path_handler = self.path_handlers.get("/" + "/".join(segs)) if segs else None
        if path_handler is not None:
            if method not in ("GET", "HEAD"):
                raise errors.MethodNotAllowed(f"method {method} is not supported")
            return await path_handler(req), "get", "/" + "/".join(segs)
        if not segs:
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version", "/openapi/v3"]
            paths += list(self.path_handlers)
            paths += [f"/apis/{g}/{v}" for g, vs in self.registry.group_versions().items() if g for v in vs]
            return Resp.json(200, {"paths": sorted(paths)}), "get", "root"
        if segs and segs[0] == "openapi":
            return self.openapi_route(segs), "get", "openapi"
        if segs in (["api"], ["apis"]) and discovery.wants_aggregated(req.headers.get("accept", "")):
            doc = discovery.aggregated(self.registry, core=segs == ["api"])
            return Resp(200, dumps(doc), discovery.AGGREGATED_CTYPE), "get", "discovery"
        if segs == ["api"]:
            return Resp.json(200, discovery.api_versions(self.server_address)), "get", "discovery"
        if segs == ["apis"]:
            return Resp.json(200, discovery.api_group_list(self.registry)), "get", "discovery"
        if len(segs) == 2 and segs[0] == "apis":
            doc = discovery.api_group(self.registry, segs[1])
            if doc is None:
                raise errors.NotFound("the server could not find the requested resource")
            return Resp.json(200, doc), "get", "discovery"
        if (len(segs) == 2 and segs[0] == "api") or (len(segs) == 3 and segs[0] == "apis"):
            group, version = ("", segs[1]) if segs[0] == "api" else (segs[1], segs[2])
            doc = discovery.api_resource_list(self.registry, group, version)
            if doc is None:
                raise errors.NotFound("the server could not find the requested resource")
            return Resp.json(200, doc), "get", "discovery"
        route = resource_route(segs)  # raises BadRequest for a name like "/" or ".."
        if route is None:
            raise errors.NotFound("the server could not find the requested resource")
        return await self.resource_request(req, route, method)

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

    def openapi_route(self, segs: list[str]) -> Resp:
        if len(segs) >= 2 and segs[1] == "v3":
            if len(segs) == 2:
                return Resp.json(200, self.openapi.index())
            raw = self.openapi.get("/".join(segs[2:]))
            if raw is not None:
                return Resp(200, raw, "application/json")
        raise errors.NotFound("the server could not find the requested resource")

    async def resource_request(self, req: Req, route: Route, method: str) -> tuple[Resp, str, str]:
        api = self.resources
        if route.subresource in STREAM_SUBRESOURCES and route.name is not None:
            return await self.agent_subresource(req, route, method)
        if route.subresource == "signal" and route.name is not None:
            return await self.pod_signal(req, route, method)
        info = api.kind_for(route)
        resource = route.plural + (f"/{route.subresource}" if route.subresource else "")
        if route.sse_watch and (method != "GET" or route.subresource):
            raise errors.MethodNotAllowed("the watch path only supports GET")
        if method not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            raise errors.MethodNotAllowed(f"method {method} is not supported")
        verb = request_verb(req, route)
        if route.name is None and verb in ("update", "patch"):
            raise errors.MethodNotAllowed(f"{method} requires a resource name")
        # pods/binding and pods/eviction are create-only (a POSTed Binding / Eviction).
        sub_verbs = SUBRESOURCE_VERBS.get(route.subresource, ())
        if route.subresource and verb not in sub_verbs:
            raise errors.MethodNotAllowed(f"{method} is not supported on {resource}")
        base_verb = verb if not route.subresource else verb
        if base_verb not in info.verbs and not route.subresource:
            raise errors.MethodNotAllowed(f"{verb} is not supported on {info.plural}")
        assert req.user is not None
        decision = self.authorizer.authorize(req.user, Attributes(
            verb, route.group, route.version, route.plural, route.subresource,
            route.namespace or "", request_name(route, verb, req)))
        record_decision(decision)
        if not decision.allowed:
            raise errors.Forbidden(self.forbidden_message(req.user, verb, info.plural, info.group,
                                                          route.namespace, decision.reason,
                                                          name=route.name or "",
                                                          subresource=route.subresource),
                                   name=route.name, group=info.group, kind=info.plural)
        user = req.user
        special = self.resource_handlers.get((route.group, route.version, route.plural, route.subresource))
        if special is not None:
            return await special(req, route, verb, user, info), verb, resource
        if verb == "watch":
            return await watch(api, info, route, req, self.watches, sse=route.sse_watch), verb, resource
        if verb == "get":
            return await api.get(info, route, req), verb, resource
        if verb == "list":
            return await api.list(info, route, req), verb, resource
        if verb == "create":
            return await api.create(info, route, req, user), verb, resource
        if verb == "update":
            return await api.update(info, route, req, user), verb, resource
        if verb == "patch":
            return await api.patch(info, route, req, user), verb, resource
        if verb == "delete":
            return await api.delete(info, route, req, user), verb, resource
        return await api.delete_collection(info, route, req, user), verb, resource

    async def _maintenance(self, req: Req, route: Route, verb: str, user: UserInfo, info: Any) -> Resp:
        return await self.maintenance.handle(route, req, verb)

    async def _metrics(self, req: Req, route: Route, verb: str, user: UserInfo, info: Any) -> Resp:
        if verb not in ("get", "list"):
            raise errors.MethodNotAllowed(f"{verb} is not supported on {info.plural}.{info.group}")
        return await self.resource_metrics.serve(info, route.namespace, route.name, req)

    async def _hpa_v1(self, req: Req, route: Route, verb: str, user: UserInfo, info: Any) -> Resp:
        return await self.hpa_v1.handle(req, route, verb, user)

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

    def authorize(self, user: UserInfo | None, verb: str, route: Route, info: Any) -> None:
        assert user is not None
        decision = self.authorizer.authorize(user, Attributes(
            verb, route.group, route.version, route.plural, route.subresource,
            route.namespace or "", route.name or ""))
        record_decision(decision)
        if not decision.allowed:
            raise errors.Forbidden(self.forbidden_message(user, verb, info.plural, info.group,
                                                          route.namespace, decision.reason,
                                                          name=route.name or "",
                                                          subresource=route.subresource),
                                   name=route.name, group=info.group, kind=info.plural)

    async def websocket_subresource(self, scope: dict[str, Any], receive: Any, send: Any,
                                    route: Route) -> None:
        """pods/exec and pods/attach over WebSocket: authenticate, authorize, relay."""
        t0 = time.perf_counter()
        resource = f"{route.plural}/{route.subresource}"
        msg = await receive()
        if msg["type"] != "websocket.connect":
            return  # the client left before the handshake completed
        extensions = scope.get("extensions") or {}
        headers = _headers(scope)
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
        certs = peer_certs(scope)
        try:
            user = await self.authenticate(headers, certs, _remote(scope))
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
        headers = _headers(scope)
        segments = split_raw_path(_raw_path(scope))
        try:
            route = resource_route(route_segments(segments) or [])
        except errors.APIError:
            route = None
        if route is None or route.subresource != "portforward" or route.name is None \
                or route.namespace is None or scope["method"] != "POST":
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            resp, verb, resource = await self.handle(Req(scope["method"], scope["path"], query,
                                                         headers, b"", segments=segments,
                                                         peer_certs=peer_certs(scope), remote=_remote(scope),
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

    def apply_impersonation(self, req: Req) -> None:
        """Impersonate-* headers: `req.user` becomes the impersonated user (checked with
        verb `impersonate`), the authenticated one is kept as `req.impersonator` (the
        audit event's user; impersonatedUser is the new one)."""
        assert req.user is not None
        acting = self.impersonate(req.user, req.headers)
        if acting is not None:
            req.impersonator, req.user = req.user, acting
            req.headers = without_impersonation_headers(req.headers)
            record_impersonation(acting)

    def _acting_user(self, user: UserInfo, headers: Mapping[str, str]) -> UserInfo:
        """`impersonate` for the upgrade paths (no Req): malformed headers become the
        500 kube-apiserver answers, as a Status."""
        try:
            acting = self.impersonate(user, headers)
        except ImpersonationHeaderError as e:
            raise errors.InternalError(f"Internal Server Error: {e}") from None
        if acting is None:
            return user
        record_impersonation(acting)
        return acting

    @staticmethod
    def forbidden_message(user: UserInfo, verb: str, plural: str, group: str, ns: str | None,
                          reason: str, *, name: str = "", subresource: str = "") -> str:
        """responsewriters.ForbiddenStatusError's message: the group-qualified resource and
        the object's name as apierrors.NewForbidden words them (`pods "p" is forbidden:
        User "u" cannot create resource "pods/exec" ...`)."""
        resource = plural + (f"/{subresource}" if subresource else "")
        scope = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        qualified = f"{plural}.{group}" if group else plural  # the object's resource, no subresource
        head = f'{qualified} "{name}"' if name else qualified
        msg = (f'{head} is forbidden: User "{user.name}" cannot {verb} resource "{resource}" '
               f'in API group "{group}"{scope}')
        return msg + (f": {reason}" if reason else "")


class FleetASGI:
    """The API's ASGI entry point.

    Plain HTTP requests — every REST, watch, discovery and health request —
    are adapted straight from the ASGI scope into a `Req`, without building a
    framework request object: on this hot path Quart's per-request machinery
    cost about a quarter of the server's CPU.  WebSocket upgrades of
    pods/exec and pods/attach are relayed to the node's agent (proxy.py) on
    the raw ASGI websocket protocol.  Everything else (lifespan) goes to the
    Quart app.
    """

    def __init__(self, server: APIServer, fallback: QuartTrio, *,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT) -> None:
        self.server = server
        self.fallback = fallback
        # How long a request body may take to arrive in full (408 after); see limits.py.
        self.body_timeout = body_timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == upgrade.SCOPE_TYPE:  # Upgrade: SPDY/3.1 (kubectl port-forward)
            await self.server.raw_upgrade(scope, receive, send)
            return
        if scope["type"] == "websocket":
            try:
                route = resource_route(route_segments(split_raw_path(_raw_path(scope))))
            except errors.APIError:
                route = None  # an impossible name: not an exec/attach target; the fallback refuses it
            if route is not None and route.subresource in WEBSOCKET_SUBRESOURCES and route.name:
                await self.server.websocket_subresource(scope, receive, send, route)
                return
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        t0 = time.perf_counter()
        headers = _headers(scope)
        query: dict[str, str] = {}
        qs = scope.get("query_string", b"")
        if qs:
            for k, v in parse_qsl(qs.decode("latin-1"), keep_blank_values=True):
                query.setdefault(k, v)
        method = scope["method"]
        segments = split_raw_path(_raw_path(scope))
        if is_node_proxy(segments):
            # Relayed to an agent as it arrives (image archives run to gigabytes);
            # MAX_BODY is for objects, the agent bounds what it accepts.
            body, refused = b"", None
            body_stream: BodyStream | None = BodyStream(receive)
            req = Req(method, scope["path"], query, headers, body,
                      raw_query=qs.decode("latin-1"), body_stream=body_stream, segments=segments,
                      peer_certs=peer_certs(scope), remote=_remote(scope), request_uri=request_uri(scope))
        else:
            body_stream = None
            body, refused = await _read_body(receive, headers, self.body_timeout)
            req = Req(method, scope["path"], query, headers, body, segments=segments,
                      peer_certs=peer_certs(scope), remote=_remote(scope), request_uri=request_uri(scope))
        if refused is not None:
            resp: Resp = Resp.error(refused)
            verb, resource = method.lower(), ""
            if self.server.audit is not None:
                await self.server.audit_refused(req, resp)
        else:
            resp, verb, resource = await self.server.handle(req)
        if body_stream is not None:
            await body_stream.drain()
        out_headers = [(b"content-type", resp.content_type.encode())]
        out_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()]
        if isinstance(resp.body, bytes):
            out_headers.append((b"content-length", str(len(resp.body)).encode()))
            await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
            await send({"type": "http.response.body", "body": resp.body})
            self.server.metrics.observe(verb, resource, resp.status, time.perf_counter() - t0)
            return
        await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
        self.server.metrics.observe(verb, resource, resp.status, time.perf_counter() - t0)
        await _stream(resp.body, receive, send)


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


def _raw_path(scope: dict[str, Any]) -> bytes:
    """The path as sent, still percent-encoded (hypercorn's `raw_path`; re-encoded
    from `path` for a server that gives none)."""
    raw = scope.get("raw_path")
    return raw if raw else quote(scope["path"]).encode()


def peer_certs(scope: dict[str, Any]) -> tuple[bytes, ...]:
    """The TLS client's certificate chain (DER, leaf first) from the ASGI TLS
    extension (`scope["extensions"]["tls"]["client_cert_chain"]`, PEM strings),
    which fleet/server/tlsconn.py fills in on hypercorn; () without one."""
    tls = (scope.get("extensions") or {}).get("tls") or {}
    chain = tls.get("client_cert_chain") or ()
    return tuple(ssl.PEM_cert_to_DER_cert(c) if isinstance(c, str) else bytes(c) for c in chain)


def request_uri(scope: dict[str, Any]) -> str:
    """The request target as sent: raw path and query (Go's `URL.RequestURI()`)."""
    qs = scope.get("query_string", b"")
    path = _raw_path(scope).decode("latin-1")
    return f"{path}?{qs.decode('latin-1')}" if qs else path


def internal_error(req: Req, e: Exception) -> Resp:
    """A 500 for an unexpected exception: logged with its traceback, never sent."""
    log.exception("internal error on %s %s", req.method, req.path, exc_info=e)
    return Resp.error(errors.InternalError(f"Internal error occurred: {type(e).__name__}: {e}"))


def _remote(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


def impersonation_header_error(req: Req, e: ImpersonationHeaderError) -> Resp:
    """kube-apiserver's answer to malformed Impersonate-* headers: a plain-text 500."""
    uri = req.path + (f"?{req.raw_query}" if req.raw_query else
                      (f"?{urlencode(req.query)}" if req.query else ""))
    return Resp(500, plain_text_body(uri, str(e)), "text/plain; charset=utf-8",
                {"X-Content-Type-Options": "nosniff"})


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    """Request headers with lower-case names; repeated headers joined with ", "."""
    headers: dict[str, str] = {}
    for k, v in scope["headers"]:
        name = k.decode("latin-1").lower()
        val = v.decode("latin-1")
        headers[name] = f"{headers[name]}, {val}" if name in headers else val
    return headers


def _too_large() -> errors.APIError:
    return errors.RequestEntityTooLarge(f"the request body is too large (limit {MAX_BODY} bytes)")


async def _read_body(receive: Any, headers: dict[str, str],
                     timeout: float) -> tuple[bytes, errors.APIError | None]:
    """The whole request body, or the error to answer instead (413, 408).

    A declared Content-Length beyond MAX_BODY is refused before reading: the
    client would otherwise hold the request open for as long as it promises
    to keep sending.  Everything else is read under one deadline (hypercorn
    times nothing out once the request head is in, see limits.py): a body
    that does not arrive in time is a 408, and hypercorn then closes the
    connection, as it does after any response to a request it has not read
    to the end.
    """
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:  # h11 has checked it is one decimal number
        return b"", _too_large()
    chunks: list[bytes] = []
    size = 0
    refused: errors.APIError | None = None
    with trio.move_on_after(timeout):
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                # A chunked body past the limit.  Drain the rest (under the same
                # deadline) so the client, still uploading, reads the 413 rather
                # than a reset connection, but keep nothing.
                refused = _too_large()
                while msg.get("more_body"):
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        break
                return b"", refused
            chunks.append(chunk)
            if not msg.get("more_body"):
                return b"".join(chunks), None
        return b"".join(chunks), None
    if refused is not None:
        return b"", refused
    return b"", errors.APIError(f"the request body did not arrive within {timeout:g}s", code=408,
                                reason="Timeout")


class BodyStream:
    """The request body chunk by chunk, for relays (an async iterator of bytes).

    A client that leaves mid-body raises (rather than ending the stream) so the
    relay aborts its upstream request instead of completing a truncated upload.
    """

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self.done = False

    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> bytes:
        while not self.done:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                self.done = True
                raise errors.BadRequest("the client went away before the request body ended")
            self.done = not msg.get("more_body")
            chunk = msg.get("body", b"")
            if chunk:
                return chunk
        raise StopAsyncIteration

    async def drain(self) -> None:
        """Read and drop what is left.

        Needed before answering a request refused without reading its body (no
        such node, forbidden): a client still uploading reads no response until
        its upload is done, and closing on unread data resets the connection, so
        it would see "connection reset" instead of the Status.
        """
        with contextlib.suppress(errors.BadRequest):
            async for _ in self:
                pass


async def _stream(body: AsyncIterator[bytes], receive: Any, send: Any) -> None:
    """Send a streaming body until it ends or the client goes away."""

    async def watch_disconnect(scope: trio.CancelScope) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                scope.cancel()
                return

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            async for chunk in body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            with trio.CancelScope(shield=True):
                await aclose()


def create_app(server: APIServer, *, body_timeout: float = DEFAULT_BODY_TIMEOUT) -> FleetASGI:
    """The API application: the ASGI fast path in front of a Quart app.

    `body_timeout` bounds how long a request body may take to arrive (408)."""
    return FleetASGI(server, QuartTrio("fleet"), body_timeout=body_timeout)
