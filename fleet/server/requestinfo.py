"""What a request asks for, as kube-apiserver's RequestInfo has it: its verb, the
object it names (a `fieldSelector` on `metadata.name` included), the authorization
attributes the audit log records and the (verb, resource) labels of the metrics.
Pure functions of the request; the API server (`fleet.server.app`) calls them."""

from __future__ import annotations

from fleet.api import errors
from fleet.api.selectors import parse_field_selector
from fleet.auth import Attributes, non_resource
from fleet.server.http import Req
from fleet.server.paths import node_proxy_route, resource_route, route_segments
from fleet.server.proxy import NODE_PROXY_VERBS
from fleet.server.routes import Route, parse_route


def request_name(route: Route, verb: str, req: Req) -> str:
    """The object a request names, as kube-apiserver's RequestInfo has it: the URL's
    name, or for a list or watch a `fieldSelector` pinning `metadata.name` — so
    `watch secrets?fieldSelector=metadata.name=x` (how a kubelet follows one Secret)
    is authorized as a read of `x` (RBAC resourceNames, the Node authorizer).  A
    selector that does not parse names nothing here; the list answers its 400."""
    if route.name is not None or verb not in ("list", "watch"):
        return route.name or ""
    try:
        name = parse_field_selector(req.query.get("fieldSelector", ""), lambda _path: True
                                    ).exact_value("metadata.name")
    except errors.APIError:
        return ""
    if not name or name in (".", "..") or "/" in name or "%" in name:
        return ""
    return name


def is_node_proxy(segments: list[str]) -> bool:
    try:
        return node_proxy_route(segments) is not None
    except errors.APIError:
        return False  # a bad node name: read as an ordinary request, refused by dispatch


def request_verb(req: Req, route: Route) -> str:
    """The Kubernetes verb of a resource request (RequestInfo): watch, get/list,
    delete/deletecollection by whether a name is given, else by HTTP method."""
    method = req.method
    if route.sse_watch or (method == "GET" and req.flag("watch")):
        return "watch"
    if method == "GET":
        return "get" if route.name is not None else "list"
    if method == "DELETE":
        return "delete" if route.name is not None else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def request_attributes(req: Req) -> Attributes:
    """What a request asks for as the audit policy sees it (kube-apiserver's RequestInfo):
    resource attributes for an API path (a Namespace's own name is its namespace),
    else the non-resource path with the lower-case HTTP verb."""
    segments = req.segments
    if len(segments) >= 5 and segments[:3] == ["api", "v1", "nodes"] and segments[4] == "proxy":
        verb = NODE_PROXY_VERBS.get(req.method, req.method.lower())
        return Attributes(verb, "", "v1", "nodes", "proxy", "", segments[3])
    segs = route_segments(segments)
    route = parse_route(segs) if segs else None
    if route is None:
        return non_resource(req.method.lower(), req.path)
    verb = request_verb(req, route)
    namespace = route.namespace or ""
    if not namespace and route.group == "" and route.plural == "namespaces" and route.name:
        namespace = route.name
    return Attributes(verb, route.group, route.version, route.plural, route.subresource, namespace,
                      route.name or "")


def request_labels(req: Req) -> tuple[str, str]:
    """The (verb, resource) a request targets, Kubernetes-style, for metrics."""
    if is_node_proxy(req.segments):
        return NODE_PROXY_VERBS.get(req.method, req.method.lower()), "nodes/proxy"
    segs = route_segments(req.segments)
    try:
        route = resource_route(segs)
    except errors.APIError:
        route = None  # an impossible name: dispatch answers 400
    if route is None:
        return req.method.lower(), (segs[0] if segs else "root")
    resource = route.plural + (f"/{route.subresource}" if route.subresource else "")
    verb = request_verb(req, route)
    return verb, resource
