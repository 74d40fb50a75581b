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
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {"$ref": "#/components/schemas/" + schema.openapi_name(t)}


def _op(info: KindInfo, action: str, verb_params: list[str], body: bool = False,
        patch_types: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"{action}{info.kind}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(info),
        "parameters": [_param(p, desc=_QUERY.get(p, "")) for p in verb_params],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": _schema_ref(info)}}},
                      "401": {"description": "Unauthorized"}},
    }
    if body:
        types = (["application/json-patch+json", "application/merge-patch+json"] if patch_types
                 else ["application/json", "application/yaml"])
        if patch_types and info.strategic_merge:
            # kubectl apply sends a strategic merge patch only when the PATCH operation
            # lists it (it falls back to a JSON merge patch, as for custom resources).
            types.append("application/strategic-merge-patch+json")
        op["requestBody"] = {"required": True, "content": {
            t: {"schema": {"type": "object"} if patch_types else _schema_ref(info)} for t in types}}
    return op


def document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    kinds = registry.in_group_version(group, version)
    if not kinds:
        return None
    prefix = "/" + gv_path(group, version)
    paths: dict[str, Any] = {}
    roots: list[str] = []
    for info in kinds:
        base = f"{prefix}/namespaces/{{namespace}}/{info.plural}" if info.namespaced else f"{prefix}/{info.plural}"
        path_params = [_param("namespace", "path", True)] if info.namespaced else []
        collection = {
            "get": ("list", _op(info, "list", _LIST_QUERY + ["pretty"])),
            "post": ("create", _op(info, "post", ["dryRun", "fieldManager", "fieldValidation", "pretty"], body=True)),
            "delete": ("deletecollection", _op(info, "deletecollection", ["dryRun", "labelSelector",
                                                                          "fieldSelector"])),
        }
        item = {
            "get": ("get", _op(info, "get", ["pretty"])),
            "put": ("update", _op(info, "put", ["dryRun", "fieldManager", "fieldValidation", "pretty"], body=True)),
            "patch": ("patch", _op(info, "patch", ["dryRun", "fieldManager", "fieldValidation", "force", "pretty"],
                                   body=True, patch_types=True)),
            "delete": ("delete", _op(info, "delete", ["dryRun", "gracePeriodSeconds", "propagationPolicy",
                                                      "pretty"])),
        }
        # Only what the kind serves (its discovery verbs): a create-only review has one POST,
        # metrics only GETs, and namespaces no collection DELETE.
        for path, ops, params in ((base, collection, path_params),
                                  (base + "/{name}", item, path_params + [_param("name", "path", True)])):
            served = {method: op for method, (verb, op) in ops.items() if verb in info.verbs}
            if served:
                paths[path] = {"parameters": params, **served}
        if info.namespaced and "list" in info.verbs:
            paths[f"{prefix}/{info.plural}"] = {"get": _op(info, "list", _LIST_QUERY + ["pretty"])}
        t = schema.root_type(info.group, info.version, info.kind)
        if t is not None:
            roots.append(t)
    schemas = schema.openapi_schemas(roots) if roots else {}
    for info in kinds:
        t = schema.root_type(info.group, info.version, info.kind)
        if t is not None:
            s = schemas[schema.openapi_name(t)]
            s.setdefault("x-kubernetes-group-version-kind", []).append(_gvk(info))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Fleet", "version": __version__},
        "paths": paths,
        "components": {"schemas": schemas},
    }


class OpenAPICache:
    """Documents are generated once per registry generation and served with a content hash."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._docs: dict[str, bytes] = {}
        self._hashes: dict[str, str] = {}
        self._signature: tuple[Any, ...] = ()

    def _refresh(self) -> None:
        sig = tuple(sorted((i.group, i.version, i.plural) for i in self.registry.all()))
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
