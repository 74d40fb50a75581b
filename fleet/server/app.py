"""The API server's request pipeline and router (served over ASGI by asgi.py).

`APIServer.handle` runs one request as explicit stages:

    authenticate → authorize → decode → default → mutating admission → validate
                 → validating admission → store

and `dispatch` routes it: discovery, OpenAPI, version and health endpoints are
answered here; every resource path goes to the generic handlers in rest.py /
watch.py, or to a resource's own handler (Fleet's node maintenance
subresources `nodes/{name}/drain` and `nodes/{name}/schedulable`, served by
drain.py; metrics.k8s.io; autoscaling/v1).  The pod subresources served by the
node agents (`log`, `exec`, `attach`, `portforward`, `signal`) and
`nodes/{name}/proxy/...` are relayed by connect.py; authentication,
impersonation, authorization and the audit hooks are access.py.  Both are
bases of `APIServer`.  Errors of any stage become Kubernetes `Status` objects.
"""

from __future__ import annotations

import logging
import platform
import ssl
import sys
from typing import Any

from fleet import __version__
from fleet.admission import AdmissionChain, collect_warnings
from fleet.api import errors
from fleet.api.registry import Registry
from fleet.auth import Attributes, Authenticator, Authorizer, UserInfo
from fleet.auth.audit import AUDIT_ID_RESPONSE_HEADER, Auditor, auth_methods, record_decision
from fleet.auth.audit import CURRENT as AUDIT_CURRENT
from fleet.auth.impersonation import ImpersonationHeaderError
from fleet.server import discovery, health
from fleet.server.connect import ConnectVerbs
from fleet.server.drain import NodeMaintenance
from fleet.server.health import HealthChecks
from fleet.server.hpa_v1 import GROUP as HPA_GROUP
from fleet.server.hpa_v1 import PLURAL as HPA_PLURAL
from fleet.server.hpa_v1 import AutoscalingV1
from fleet.server.http import Req, Resp, dumps
from fleet.server.metrics import Metrics
from fleet.server.openapi import OpenAPICache
from fleet.server.openapi_v2 import OpenAPIV2Cache
from fleet.server.openapi_v2 import serve as serve_openapi_v2
from fleet.server.paths import node_proxy_route, resource_route, route_segments
from fleet.server.portforward import PortForwardProxy
from fleet.server.processcontrol import ProcessControlGate
from fleet.server.proxy import STREAM_SUBRESOURCES, NodeProxy, PodProxy, admin_token_from
from fleet.server.request_params import add_warning_headers
from fleet.server.requestinfo import request_attributes, request_labels, request_name, request_verb
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


class APIServer(ConnectVerbs):
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
        # An apply that creates needs `create` too (kube-apiserver's withAuthorization).
        resources.authorize_create = lambda user, route, info: self.authorize(user, "create", route, info)
        self.metrics = metrics
        self.watches = watches
        self.server_address = server_address
        self.openapi = OpenAPICache(registry)
        self.openapi_v2 = OpenAPIV2Cache(registry)
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
        # False once the server drains: /readyz's `shutdown` check fails.
        self.ready = True
        self.health = HealthChecks(self._health_checks())

    def _health_checks(self) -> dict[str, dict[str, Any]]:
        """The checks of /healthz, /livez and /readyz, in kube-apiserver's order (health.py)."""
        namespaces = self.resources.namespaces

        async def informer_sync() -> str | None:
            return None if namespaces is None or namespaces.synced else "the namespace cache has not synced"

        async def shutdown() -> str | None:
            return None if self.ready else "the server is shutting down"

        common = {"ping": health.ping, "etcd": health.store_check(self.store)}
        return {"healthz": dict(common), "livez": dict(common),
                "readyz": {**common, "informer-sync": informer_sync, "shutdown": shutdown}}

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
        if segs and segs[0] in health.ENDPOINTS:
            if len(segs) > 2 or (len(segs) == 2 and not self.health.has(segs[0], segs[1])):
                raise errors.NotFound("the server could not find the requested resource")
            return await self.health.serve(req, segs), "get", "health"
        if segs == ["version"]:
            return Resp.json(200, version_info()), "get", "version"
        path_handler = self.path_handlers.get("/" + "/".join(segs)) if segs else None
        if path_handler is not None:
            if method not in ("GET", "HEAD"):
                raise errors.MethodNotAllowed(f"method {method} is not supported")
            return await path_handler(req), "get", "/" + "/".join(segs)
        if not segs:
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version", "/openapi/v2",
                     "/openapi/v3"]
            paths += list(self.path_handlers)
            paths += [f"/apis/{g}/{v}" for g, vs in self.registry.group_versions().items() if g for v in vs]
            return Resp.json(200, {"paths": sorted(paths)}), "get", "root"
        if segs and segs[0] == "openapi":
            if segs == ["openapi", "v2"]:
                return await serve_openapi_v2(self.openapi_v2, req.headers), "get", "openapi"
            return self.openapi_route(segs), "get", "openapi"
        agg_version = discovery.aggregated_version(req.headers.get("accept", "")) if segs in (
            ["api"], ["apis"]) else None
        if agg_version is not None:
            doc = discovery.aggregated(self.registry, core=segs == ["api"], version=agg_version)
            return Resp(200, dumps(doc), discovery.aggregated_ctype(agg_version)), "get", "discovery"
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
            raise errors.MethodNotAllowed(info.refused_verbs.get(verb) or f"{verb} is not supported on {info.plural}")
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


def internal_error(req: Req, e: Exception) -> Resp:
    """A 500 for an unexpected exception: logged with its traceback, never sent."""
    log.exception("internal error on %s %s", req.method, req.path, exc_info=e)
    return Resp.error(errors.InternalError(f"Internal error occurred: {type(e).__name__}: {e}"))


def impersonation_header_error(req: Req, e: ImpersonationHeaderError) -> Resp:
    """Malformed Impersonate-* headers (groups, extras or a uid without a user): a 400
    BadRequest Status with kube-apiserver's message.  kube-apiserver answers a plain-text
    500 here; a client's malformed request is not a server error, so Fleet says 400."""
    return Resp.error(errors.BadRequest(str(e)))
