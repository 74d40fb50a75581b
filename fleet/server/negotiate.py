"""Accept negotiation of the read verbs, and the `as=` transformations it selects.

kube-apiserver reads the `Accept` header of a get, list or watch as a list of
media ranges (goautoneg: sorted by q, then by wildcards), takes the first one
it can serve, and a range may ask for the answer in another shape with the
`as`/`g`/`v` parameters (`negotiation.NegotiateMediaTypeOptions`,
`handlers/response.go`):

- `as=Table;g=meta.k8s.io;v=v1` (or v1beta1): rows and columns (tables.py),
  only in JSON or YAML — kubectl's human output;
- `as=PartialObjectMetadata`: the object's metadata only — client-go's metadata
  client, and with it controller-runtime's metadata-only informers and the
  garbage collectors of operators; on a watch every event carries one;
- `as=PartialObjectMetadataList`: a list of them with the list's metadata.

A range whose conversion the server cannot do (another group or version, an
unknown kind, a Table in protobuf, `stream=` other than `watch`) is skipped; if
none is left the answer is 406 NotAcceptable naming the media types the
endpoint serves.  A conversion that was accepted but does not fit the result
(PartialObjectMetadata asked of a list, PartialObjectMetadataList of one
object) is a 406 with kube-apiserver's message.

Fleet writes JSON only: a range that asked for YAML or protobuf is honoured in
JSON (with its conversion), which clients decode by the response's Content-Type
(kubectl and client-go ask for protobuf and accept JSON).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.api import errors
from fleet.api.registry import KindInfo
from fleet.server.tables import table

META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")
TABLE = "Table"
PARTIAL = "PartialObjectMetadata"
PARTIAL_LIST = "PartialObjectMetadataList"

# The media types kube-apiserver serves for built-in kinds, in its order, and the
# ones with a stream (watch) serializer.
MEDIA_TYPES = ("application/json", "application/yaml", "application/vnd.kubernetes.protobuf")
STREAM_MEDIA_TYPES = ("application/json", "application/vnd.kubernetes.protobuf")
# The media types a Table can be written in (RequestScope.AllowsMediaTypeTransform).
TABLE_MEDIA_TYPES = ("application/json", "application/yaml")
INCLUDE_OBJECT = ("", "Metadata", "Object", "None")


@dataclass(frozen=True)
class Target:
    """What a read answers: the object itself (`kind` None) or a meta.k8s.io conversion."""

    kind: str | None = None
    version: str = "v1"

    @property
    def api_version(self) -> str:
        return f"{META_GROUP}/{self.version}"


OBJECT = Target()


@dataclass(frozen=True)
class Clause:
    type: str
    subtype: str
    q: float
    params: dict[str, str]


def parse_accept(header: str) -> list[Clause]:
    """The media ranges of an Accept header, best first (goautoneg.ParseAccept)."""
    out: list[Clause] = []
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        mr = fields[0]
        if not mr:
            continue
        if "/" in mr:
            typ, _, sub = mr.partition("/")
        else:
            typ, sub = mr, "*"
        q, params = 1.0, {}
        for f in fields[1:]:
            k, sep, v = f.partition("=")
            if not sep:
                continue
            k, v = k.strip(), v.strip()
            if k == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
            else:
                params[k] = v
        out.append(Clause(typ.strip().lower(), sub.strip().lower(), q, params))
    # goautoneg's order: q, then a concrete type, then a concrete subtype; parameters do
    # not count, and equal ranges keep the client's order (Go sorts these few stably).
    out.sort(key=lambda c: (-c.q, c.type == "*", c.subtype == "*"))
    return out


def _clause_target(clause: Clause, media_type: str) -> Target | None:
    """The conversion `clause` asks for if the server can serve it as `media_type`, else None."""
    p = clause.params
    s = p.get("stream", "")
    if s and (media_type not in STREAM_MEDIA_TYPES or s != "watch"):
        return None
    if p.get("sv", "") not in ("", "v1"):
        return None
    if not any(k in p for k in ("as", "g", "v")):
        return OBJECT
    kind, group, version = p.get("as", ""), p.get("g", ""), p.get("v", "")
    if group != META_GROUP or version not in META_VERSIONS:
        return None
    if kind == TABLE and media_type in TABLE_MEDIA_TYPES:
        return Target(TABLE, version)
    if kind in (PARTIAL, PARTIAL_LIST):
        return Target(kind, version)
    return None


def _matches(clause: Clause, media_type: str) -> bool:
    typ, _, sub = media_type.partition("/")
    return (clause.type == typ and clause.subtype in (sub, "*")) or (clause.type, clause.subtype) == ("*", "*")


def negotiate(accept: str, *, stream: bool = False) -> Target:
    """The answer's shape for this Accept header; NotAcceptable if no range can be served.

    `stream`: a watch, served only in the media types with a stream serializer."""
    if not accept.strip():
        return OBJECT
    served = STREAM_MEDIA_TYPES if stream else MEDIA_TYPES
    for clause in parse_accept(accept):
        for mt in served:
            if _matches(clause, mt):
                target = _clause_target(clause, mt)
                if target is not None:
                    return target
    listed = [m + ";stream=watch" for m in served] if stream else list(served)
    raise errors.NotAcceptable("only the following media types are accepted: " + ", ".join(listed))


def _go_type(info: KindInfo, list_: bool) -> str:
    """How kube-apiserver's message names the internal Go type (`*core.ConfigMapList`)."""
    pkg = info.group.split(".")[0] if info.group else "core"
    return f"*{pkg}.{info.kind}{'List' if list_ else ''}"


def partial(obj: dict[str, Any], target: Target) -> dict[str, Any]:
    """meta.AsPartialObjectMetadata: the object's kind becomes PartialObjectMetadata."""
    return {"kind": PARTIAL, "apiVersion": target.api_version, "metadata": obj.get("metadata", {})}


def include_object(target: Target, query: dict[str, str]) -> str:
    """The Table's `includeObject` option, validated as kube's ValidateTableOptions does."""
    value = query.get("includeObject", "")
    if target.kind == TABLE and value not in INCLUDE_OBJECT:
        raise errors.BadRequest(f'Unable to convert to Table as requested: includeObject: Invalid value: '
                                f'"{value}": must be \'Metadata\', \'Object\', \'None\', or empty')
    return value or "Metadata"


def render_object(info: KindInfo, obj: dict[str, Any], target: Target, query: dict[str, str]) -> dict[str, Any]:
    """The answer to a GET of one object."""
    if target.kind is None:
        return obj
    if target.kind == TABLE:
        return table(info, [obj], resource_version=obj.get("metadata", {}).get("resourceVersion", ""),
                     include=include_object(target, query), api_version=target.api_version)
    if target.kind == PARTIAL_LIST:
        raise errors.NotAcceptable(f"you requested {PARTIAL_LIST}, but the requested object is not a list "
                                   f"({_go_type(info, False)})")
    return partial(obj, target)


def render_list(info: KindInfo, items: list[dict[str, Any]], target: Target, query: dict[str, str], *,
                resource_version: str, cont: str = "", remaining: int | None = None) -> dict[str, Any]:
    """The answer to a LIST (`remaining`: remainingItemCount, when it may be told)."""
    if target.kind == TABLE:
        return table(info, items, resource_version=resource_version, cont=cont,
                     include=include_object(target, query), remaining=remaining,
                     api_version=target.api_version)
    if target.kind == PARTIAL:
        raise errors.NotAcceptable(f"you requested {PARTIAL}, but the requested object is a list "
                                   f"({_go_type(info, True)})")
    md: dict[str, Any] = {"resourceVersion": resource_version}
    if cont:
        md["continue"] = cont
        if remaining is not None:
            md["remainingItemCount"] = remaining
    if target.kind == PARTIAL_LIST:
        return {"kind": PARTIAL_LIST, "apiVersion": target.api_version, "metadata": md,
                "items": [partial(o, target) for o in items]}
    return {"kind": info.list_kind, "apiVersion": info.api_version, "metadata": md, "items": items}


def watch_target(target: Target) -> Target:
    """The conversion of a watch's events: a PartialObjectMetadataList cannot convert one
    object, and kube-apiserver's watch encoder then sends the object itself."""
    return OBJECT if target.kind == PARTIAL_LIST else target


__all__ = ["OBJECT", "PARTIAL", "PARTIAL_LIST", "TABLE", "Target", "include_object", "negotiate",
           "parse_accept", "partial", "render_list", "render_object", "watch_target"]
