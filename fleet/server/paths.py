"""Request paths split into segments the way kube-apiserver sees them.

Hypercorn's `scope["path"]` is already percent-decoded, so splitting it on
"/" lets `%2F` inside a name become a separator: `.../configmaps/%2F`
decoded is `.../configmaps//`, which, with empty segments dropped, is the
collection — and a DELETE of it deleted every ConfigMap in the namespace.
So the RAW path is split first and each segment decoded afterwards: a
decoded segment may then contain "/", and the names that reach a handler
are checked as kube-apiserver's `path.IsValidPathSegmentName` does (not
".", "..", no "/" or "%"), answering 400 BadRequest.  Empty segments inside
a path (`//`) are not collapsed: such a path is no route (404).  One
trailing slash is ignored, as kube-apiserver's request-info parser does.
"""

from __future__ import annotations

from fleet.api import errors
from fleet.server.http import split_raw_path
from fleet.server.routes import Route, parse_route

__all__ = ["check_name", "node_proxy_route", "path_segment_errors", "resource_route", "route_segments",
           "split_raw_path"]

# kube-apiserver's apimachinery/pkg/api/validation/path: NameMayNotBe, NameMayNotContain.
NAME_MAY_NOT_BE = (".", "..")
NAME_MAY_NOT_CONTAIN = ("/", "%")


def route_segments(segments: list[str]) -> list[str] | None:
    """The segments to route on: one trailing slash dropped; None if an empty
    segment remains (`//` or a trailing `//`), which is no route."""
    segs = segments[:-1] if segments and segments[-1] == "" else segments
    if "" in segs:
        return None
    return segs


def path_segment_errors(name: str) -> list[str]:
    """kube-apiserver's IsValidPathSegmentName: why `name` cannot be one path segment."""
    if name in NAME_MAY_NOT_BE:
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in NAME_MAY_NOT_CONTAIN if c in name]


def _go_list(msgs: list[str]) -> str:
    return "[" + " ".join(msgs) + "]"  # how Go's %v prints a []string, as kube-apiserver's message does


def check_name(name: str, what: str = "resource") -> None:
    """Raise 400 BadRequest for a name no object can have in a path."""
    errs = path_segment_errors(name)
    if errs:
        # kube-apiserver: `invalid resource name "a/b": [may not contain '/']`
        raise errors.BadRequest(f'invalid {what} name "{name}": {_go_list(errs)}')


def resource_route(segments: list[str] | None) -> Route | None:
    """The Route of a resource path (None: not one), its names checked.

    `segments` come from `route_segments`; a namespace or name that could not
    be a single path segment raises BadRequest rather than reaching a handler
    (a name of "/" must never address the collection).
    """
    if segments is None:
        return None
    route = parse_route(segments)
    if route is None:
        return None
    if route.namespace is not None:
        check_name(route.namespace, "namespace")
    if route.name is not None:
        check_name(route.name)
    return route


def node_proxy_route(segments: list[str]) -> tuple[str, str] | None:
    """(node name, agent path) for `/api/v1/nodes/{name}/proxy[/{path...}]`, else None.

    Works on the raw segments (before `route_segments`): everything after
    `proxy` belongs to the agent, empty segments and trailing slash included,
    and is handed on decoded (the relay re-quotes it).  The node name is
    checked like any other name.
    """
    if len(segments) < 5 or segments[:3] != ["api", "v1", "nodes"] or segments[4] != "proxy":
        return None
    name = segments[3]
    if not name:
        return None
    check_name(name)
    tail = segments[5:]
    return name, "/" + "/".join(tail)
