"""Resource paths of the API server: a request path parsed into a `Route`
(group, version, namespace, plural, name, subresource), the subresources the
generic handlers serve with their verbs (discovery publishes them), and the
NotFound/Conflict errors that name a resource the way kube-apiserver does.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.api import errors
from fleet.api.registry import KindInfo


@dataclass
class Route:
    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str = ""
    sse_watch: bool = False  # Fleet's /api/v1/watch/{kind} (Server-Sent Events)


def parse_route(segments: list[str]) -> Route | None:
    """Map path segments after /api or /apis to a Route (None: not a resource path)."""
    if not segments:
        return None
    if segments[0] == "api":
        if len(segments) < 3:
            return None
        group, version, rest = "", segments[1], segments[2:]
    elif segments[0] == "apis":
        if len(segments) < 4:
            return None
        group, version, rest = segments[1], segments[2], segments[3:]
    else:
        return None
    sse = False
    if rest and rest[0] == "watch":
        sse, rest = True, rest[1:]
        if not rest:
            return None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            return None
        return Route(group, version, rest[0], ns, rest[1] if len(rest) > 1 else None,
                     rest[2] if len(rest) > 2 else "", sse)
    if len(rest) > 3:
        return None
    return Route(group, version, rest[0], None, rest[1] if len(rest) > 1 else None,
                 rest[2] if len(rest) > 2 else "", sse)


def resource_not_found() -> errors.NotFound:
    return errors.NotFound("the server could not find the requested resource")


def qualified(info: KindInfo) -> str:
    return f"{info.plural}.{info.group}" if info.group else info.plural


def not_found(info: KindInfo, name: str) -> errors.NotFound:
    return errors.NotFound(f'{qualified(info)} "{name}" not found', name=name,
                           group=info.group, kind=info.plural)


def conflict(info: KindInfo, name: str, why: str = "") -> errors.Conflict:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return errors.Conflict(f'Operation cannot be fulfilled on {qualified(info)} "{name}": {why}',
                           name=name, group=info.group, kind=info.plural)

# Subresources served by the generic handlers (and drain.py for nodes), with
# their verbs; the agent-relayed ones (log, exec, attach) are in proxy.py.
SUBRESOURCE_VERBS: dict[str, tuple[str, ...]] = {
    "status": ("get", "patch", "update"),
    "scale": ("get", "patch", "update"),
    "approval": ("get", "patch", "update"),  # certificatesigningrequests/{name}/approval
    "finalize": ("update",),  # namespaces/{name}/finalize: the namespace controller's PUT
    "binding": ("create",),
    "eviction": ("create",),
    "drain": ("create", "get"),
    "schedulable": ("create",),
    "token": ("create",),
    "signal": ("signal",),  # pods/{name}/signal: Fleet's own verb (fleet/server/processcontrol.py)  # serviceaccounts/{name}/token: a TokenRequest (fleet/server/tokenapi.py)
}
SUPPORTED_SUBRESOURCES = frozenset(SUBRESOURCE_VERBS)
