"""`/openapi/v3`: per-group-version OpenAPI documents generated from the registry.

kubectl needs this for its default `--validate=strict`: it looks for the PATCH
operation of the object's group/version/kind (`x-kubernetes-group-version-kind`)
and checks that it declares the `fieldValidation` query parameter, then leaves
validation to the server.  `kubectl explain` reads the component schemas,
which come from fleet/api/k8s_schema.json for built-in kinds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet import __version__
from fleet.api import schema
from fleet.api.registry import KindInfo, Registry

_QUERY = {
    "dryRun": "When present, indicates that modifications should not be persisted. Valid value: All",
    "fieldManager": "A name associated with the actor or entity that is making these changes.",
    "fieldValidation": "How the server handles unknown or duplicate fields: Ignore, Warn or Strict.",
    "pretty": "If 'true', then the output is pretty printed.",
}
_LIST_QUERY = ["labelSelector", "fieldSelector", "limit", "continue", "resourceVersion",
               "resourceVersionMatch", "timeoutSeconds", "watch", "allowWatchBookmarks",
               "sendInitialEvents"]


def _param(name: str, where: str = "query", required: bool = False, desc: str = "") -> dict[str, Any]:
    p: dict[str, Any] = {"name": name, "in": where, "schema": {"type": "string", "uniqueItems": True}}
    if desc:
        p["description"] = desc
    if required:
        p["required"] = True
    return p


def gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _gvk(info: KindInfo) -> dict[str, str]:
    return {"group": info.group, "version": info.version, "kind": info.kind}


def _schema_ref(info: KindInfo) -> dict[str, Any]:
    t = schema.root_type(info.group, info.version, info.kind)
    if t is None:
        if info.openapi_schema is not None:
            return {"$ref": "#/components/schemas/" + custom_definition_name(info)}
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {"$ref": "#/components/schemas/" + schema.openapi_name(t)}


def custom_definition_name(info: KindInfo) -> str:
    """The schema name of a kind k8s_schema.json does not describe (a custom resource).

    apiextensions-apiserver's REST-friendly name: the reversed group, the version, the kind
    (`com.example.stable.v1.CronTab`); an unqualified group is a Kubernetes API group.
    """
    if "." not in info.group:
        return f"io.k8s.api.{info.group or 'core'}.{info.version}.{info.kind}"
    return ".".join(reversed(info.group.split("."))) + f".{info.version}.{info.kind}"


_API_VERSION_DOC = ("APIVersion defines the versioned schema of this representation of an object. Servers should "
                    "convert recognized schemas to the latest internal value, and may reject unrecognized values.")
_KIND_DOC = ("Kind is a string value representing the REST resource this object represents. Servers may infer "
             "this from the endpoint the client submits requests to. Cannot be updated. In CamelCase.")
_METADATA_DOC = ("Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/"
                 "sig-architecture/api-conventions.md#metadata")


def custom_schema(info: KindInfo, dialect: schema.Dialect,
                  convert: Callable[[Any], Any] = lambda s: s) -> dict[str, Any]:
    """The schema of a kind with no built-in one, as kube-apiserver publishes a CRD's.

    The kind's `openapi_schema` (`convert`ed to the document's dialect) or, lacking one, an object
    that keeps unknown fields; with `apiVersion`, `kind` and `metadata` (ObjectMeta) always
    declared, so `kubectl explain` has fields to show.
    """
    s = convert(info.openapi_schema) if info.openapi_schema else {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    props = dict(s.get("properties") or {})
    props.setdefault("apiVersion", {"type": "string", "description": _API_VERSION_DOC})
    props.setdefault("kind", {"type": "string", "description": _KIND_DOC})
    meta = {"$ref": dialect.ref_prefix + dialect.name("V1ObjectMeta")}
    props["metadata"] = ({"allOf": [meta]} if dialect.wrap_refs else meta) | {"description": _METADATA_DOC}
    return {**s, "type": s.get("type", "object"), "properties": props}


@dataclass(frozen=True)
class OpSpec:
    """One operation a kind serves: shared by /openapi/v3 and /openapi/v2, rendered by each."""

    method: str  # get, post, put, patch, delete
    action: str  # x-kubernetes-action
    params: tuple[str, ...]  # query parameter names
    body: bool = False
    patch: bool = False


@dataclass(frozen=True)
class PathSpec:
    path: str
    info: KindInfo
    path_params: tuple[str, ...]  # path parameter names (namespace, name)
    ops: tuple[OpSpec, ...]
    all_namespaces: bool = False  # the cluster-wide list of a namespaced kind (no path parameters)


_WRITE = ("dryRun", "fieldManager", "fieldValidation", "pretty")
# (method, verb the kind must serve, operation) for the collection path and the item path.
_COLLECTION = (
    ("get", "list", OpSpec("get", "list", (*_LIST_QUERY, "pretty"))),
    ("post", "create", OpSpec("post", "post", _WRITE, body=True)),
    ("delete", "deletecollection", OpSpec("delete", "deletecollection", ("dryRun", "labelSelector",
                                                                        "fieldSelector"))),
)
_ITEM = (
    ("get", "get", OpSpec("get", "get", ("pretty",))),
    ("put", "update", OpSpec("put", "put", _WRITE, body=True)),
    ("patch", "patch", OpSpec("patch", "patch", ("dryRun", "fieldManager", "fieldValidation", "force", "pretty"),
                              body=True, patch=True)),
    ("delete", "delete", OpSpec("delete", "delete", ("dryRun", "gracePeriodSeconds", "propagationPolicy",
                                                      "pretty"))),
)


def kind_paths(info: KindInfo) -> list[PathSpec]:
    """The paths and operations of one kind: only what it serves (its discovery verbs).

    A create-only review has one POST, metrics only GETs, and namespaces no collection DELETE.
    """
    prefix = "/" + gv_path(info.group, info.version)
    base = f"{prefix}/namespaces/{{namespace}}/{info.plural}" if info.namespaced else f"{prefix}/{info.plural}"
    ns = ("namespace",) if info.namespaced else ()
    out: list[PathSpec] = []
    for path, table, params in ((base, _COLLECTION, ns), (base + "/{name}", _ITEM, (*ns, "name"))):
        ops = tuple(op for _, verb, op in table if verb in info.verbs)
        if ops:
            out.append(PathSpec(path, info, params, ops))
    if info.namespaced and "list" in info.verbs:
        out.append(PathSpec(f"{prefix}/{info.plural}", info, (), (_COLLECTION[0][2],), all_namespaces=True))
    return out


def body_types(info: KindInfo, patch: bool) -> list[str]:
    """Media types a write operation consumes."""
    if not patch:
        return ["application/json", "application/yaml"]
    types = ["application/json-patch+json", "application/merge-patch+json"]
    if info.strategic_merge:
        # kubectl apply sends a strategic merge patch only when the PATCH operation
        # lists it (it falls back to a JSON merge patch, as for custom resources).
        types.append("application/strategic-merge-patch+json")
    return types


def _op(info: KindInfo, spec: OpSpec) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"{spec.action}{info.kind}",
        "x-kubernetes-action": spec.action,
        "x-kubernetes-group-version-kind": _gvk(info),
        "parameters": [_param(p, desc=_QUERY.get(p, "")) for p in spec.params],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": _schema_ref(info)}}},
                      "401": {"description": "Unauthorized"}},
    }
    if spec.body:
        op["requestBody"] = {"required": True, "content": {
            t: {"schema": {"type": "object"} if spec.patch else _schema_ref(info)}
            for t in body_types(info, spec.patch)}}
    return op


def document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    kinds = registry.in_group_version(group, version)
    if not kinds:
        return None
    paths: dict[str, Any] = {}
    roots: list[str] = []
    for info in kinds:
        for ps in kind_paths(info):
            ops = {op.method: _op(info, op) for op in ps.ops}
            if ps.all_namespaces:
                paths[ps.path] = ops
            else:
                paths[ps.path] = {"parameters": [_param(p, "path", True) for p in ps.path_params], **ops}
        t = schema.root_type(info.group, info.version, info.kind)
        if t is not None:
            roots.append(t)
        elif info.openapi_schema is not None:
            roots.append("V1ObjectMeta")
    schemas = schema.openapi_schemas(roots) if roots else {}
    for info in kinds:
        t = schema.root_type(info.group, info.version, info.kind)
        if t is None and info.openapi_schema is not None:
            schemas[custom_definition_name(info)] = custom_schema(info, schema.V3)
        if t is not None or info.openapi_schema is not None:
            name = schema.openapi_name(t) if t is not None else custom_definition_name(info)
            schemas[name].setdefault("x-kubernetes-group-version-kind", []).append(_gvk(info))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Fleet", "version": __version__},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def registry_signature(registry: Registry) -> tuple[Any, ...]:
    """What the generated documents depend on: a change regenerates them.

    A kind added or removed, or an entry registered anew with different contents (a custom
    resource whose definition changed its schema or verbs): entries compare by value.
    """
    return tuple(sorted(((i.group, i.version, i.plural), i) for i in registry.all()))


class OpenAPICache:
    """Documents are generated once per registry generation and served with a content hash."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._docs: dict[str, bytes] = {}
        self._hashes: dict[str, str] = {}
        self._signature: tuple[Any, ...] = ()

    def _refresh(self) -> None:
        sig = registry_signature(self.registry)
        if sig == self._signature:
            return
        self._docs.clear()
        self._hashes.clear()
        for group, versions in self.registry.group_versions().items():
            for v in versions:
                doc = document(self.registry, group, v)
                if doc is None:
                    continue
                raw = json.dumps(doc, separators=(",", ":")).encode()
                key = gv_path(group, v)
                self._docs[key] = raw
                self._hashes[key] = hashlib.sha512(raw).hexdigest()[:64].upper()
        self._signature = sig

    def index(self) -> dict[str, Any]:
        self._refresh()
        return {"paths": {k: {"serverRelativeURL": f"/openapi/v3/{k}?hash={h}"} for k, h in self._hashes.items()}}

    def get(self, key: str) -> bytes | None:
        self._refresh()
        return self._docs.get(key)
