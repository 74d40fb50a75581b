"""`/openapi/v2`: one Swagger 2.0 document for every kind the registry serves, as JSON and protobuf.

Older kubectl and client-go versions, Helm (its schema validation and `lookup`), and kubectl 1.32
itself for `explain --output=plaintext-openapiv2` and as the `--validate` fallback read this
document instead of the per-group-version /openapi/v3 ones.  It is generated from the same sources
as v3 -- the registry's kinds (`fleet.server.openapi.kind_paths`: the same paths, operations and
query parameters) and the field schemas of fleet/api/schema.py -- so a kind registered at run
time (a custom resource) appears in both with nothing special to do.  Differences from v3 are
Swagger 2.0's own: body parameters instead of `requestBody`, `consumes`/`produces`, typed
non-body parameters, `#/definitions/` named as Kubernetes names them (`io.k8s.api.core.v1.Pod`,
from fleet/api/k8s_names.json), and `x-kubernetes-list-type` beside the patch extensions.

A kind without a built-in schema gets a definition of its own, as kube-apiserver builds for a
CRD: named by its reversed group (`com.example.stable.v1.CronTab`), with the kind's
`openapi_schema` (a custom resource's `openAPIV3Schema`, converted to v2 the way
apiextensions-apiserver does: no `nullable`, `oneOf`, `anyOf` or `not`) or, lacking one, an
object that preserves unknown fields -- plus `apiVersion`, `kind` and `metadata`, so
`kubectl explain` has fields to show.

Serving follows kube-openapi's handler: the media type is negotiated from `Accept` (JSON, the
protobuf form, or its legacy spelling; 406 otherwise), the body carries a quoted SHA-512 `ETag`
and `If-None-Match` with it answers 304, and a client accepting gzip gets the body gzipped.
Documents are built once per registry signature (the invalidation /openapi/v3 uses), the
protobuf and gzip forms on first request, in a worker thread.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import time
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

import trio

from fleet import __version__
from fleet.api import schema
from fleet.api.registry import KindInfo, Registry
from fleet.server import openapi_proto
from fleet.server.http import Resp
from fleet.server.openapi import (
    _QUERY,
    OpSpec,
    body_types,
    custom_definition_name,
    custom_schema,
    kind_paths,
    registry_signature,
)

JSON = "application/json"
PROTOBUF = openapi_proto.MEDIA_TYPE
# (type, subtype, Content-Type answered), in kube-openapi's order of preference.  Both protobuf
# spellings are answered with the one without `@`, which Go's mime parser (kubectl's) accepts.
_OFFERS = (
    ("application", "json", JSON),
    ("application", openapi_proto.DEPRECATED_MEDIA_TYPE.split("/", 1)[1], PROTOBUF),
    ("application", PROTOBUF.split("/", 1)[1], PROTOBUF),
)

PATCH_DEF = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
_DROPPED_V3 = ("nullable", "oneOf", "anyOf", "not")

# Kubernetes' types for the query parameters v3 declares as strings.
_PARAM_TYPES = {"limit": "integer", "timeoutSeconds": "integer", "gracePeriodSeconds": "integer",
                "watch": "boolean", "allowWatchBookmarks": "boolean", "sendInitialEvents": "boolean",
                "force": "boolean"}
_DESCRIPTIONS = {
    "list": "list or watch objects of kind {kind}", "post": "create a {kind}", "get": "read the specified {kind}",
    "put": "replace the specified {kind}", "patch": "partially update the specified {kind}",
    "delete": "delete a {kind}", "deletecollection": "delete collection of {kind}",
}
_OP_VERBS = {"list": "list", "post": "create", "get": "read", "put": "replace", "patch": "patch",
             "delete": "delete", "deletecollection": "delete"}
_RESPONSES = {"get": ("200",), "list": ("200",), "post": ("200", "201", "202"), "put": ("200", "201"),
              "patch": ("200", "201"), "delete": ("200", "202"), "deletecollection": ("200",)}


def group_camel(group: str) -> str:
    """`apps` -> Apps, `` -> Core, `rbac.authorization.k8s.io` -> RbacAuthorization (operation ids, tags)."""
    if not group:
        return "Core"
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[.\-]", group.removesuffix(".k8s.io")) if p)


def _gvk(info: KindInfo) -> dict[str, str]:
    return {"group": info.group, "kind": info.kind, "version": info.version}


def to_v2(s: Any) -> Any:
    """A v3 schema (a CRD's structural schema) as Swagger 2.0 can say it."""
    if isinstance(s, list):
        return [to_v2(i) for i in s]
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k in _DROPPED_V3:
            continue
        if k == "$ref" and isinstance(v, str):
            out[k] = v.replace("#/components/schemas/", "#/definitions/")
        elif k in ("properties", "patternProperties", "definitions"):
            out[k] = {name: to_v2(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties", "allOf"):
            out[k] = to_v2(v)
        else:
            out[k] = v
    return out


def _param(name: str, where: str = "query", required: bool = False, desc: str = "") -> dict[str, Any]:
    p: dict[str, Any] = {"uniqueItems": True, "type": _PARAM_TYPES.get(name, "string"), "name": name, "in": where}
    if desc:
        p["description"] = desc
    if required:
        p["required"] = True
    return p


def _operation(info: KindInfo, spec: OpSpec, ref: dict[str, Any], scope: str) -> dict[str, Any]:
    gv = group_camel(info.group) + info.version[:1].upper() + info.version[1:]
    collection = "Collection" if spec.action == "deletecollection" else ""
    suffix = "ForAllNamespaces" if scope == "all" else ""
    namespaced = "Namespaced" if scope == "namespaced" else ""
    params = [_param(p, desc=_QUERY.get(p, "")) for p in spec.params]
    if spec.body:
        body = {"$ref": "#/definitions/" + PATCH_DEF} if spec.patch else ref
        params.insert(0, {"name": "body", "in": "body", "required": True, "schema": body})
    elif spec.method == "delete":
        params.insert(0, {"name": "body", "in": "body",
                          "schema": {"$ref": "#/definitions/" + schema.definition_name("V1DeleteOptions")}})
    produces = [JSON]
    if spec.action == "list":
        produces.append(JSON + ";stream=watch")
    op: dict[str, Any] = {
        "consumes": body_types(info, True) if spec.patch else ["*/*"],
        "description": _DESCRIPTIONS[spec.action].format(kind=info.kind),
        "operationId": f"{_OP_VERBS[spec.action]}{gv}{collection}{namespaced}{info.kind}{suffix}",
        "parameters": params,
        "produces": produces,
        "responses": {**{code: {"description": _STATUS_TEXT[code], "schema": ref}
                         for code in _RESPONSES[spec.action]},
                      "401": {"description": "Unauthorized"}},
        "schemes": ["https"],
        "tags": [(info.group.removesuffix(".k8s.io").replace(".", "_") or "core") + "_" + info.version],
        "x-kubernetes-action": spec.action,
        "x-kubernetes-group-version-kind": _gvk(info),
    }
    return op


_STATUS_TEXT = {"200": "OK", "201": "Created", "202": "Accepted"}


def document(registry: Registry) -> dict[str, Any]:
    """The Swagger 2.0 document of every kind in the registry."""
    kinds = sorted(registry.all(), key=lambda i: (i.group, i.version, i.plural))
    roots = [t for i in kinds if (t := schema.root_type(i.group, i.version, i.kind)) is not None]
    roots += ["V1DeleteOptions", "V1ObjectMeta"]
    definitions = schema.openapi_schemas(roots, schema.V2)
    definitions[PATCH_DEF] = {
        "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.",
        "type": "object"}
    refs: dict[int, dict[str, Any]] = {}
    for info in kinds:
        t = schema.root_type(info.group, info.version, info.kind)
        name = schema.definition_name(t) if t is not None else custom_definition_name(info)
        if t is None:
            definitions[name] = custom_schema(info, schema.V2, to_v2)
        gvks = definitions[name].setdefault("x-kubernetes-group-version-kind", [])
        if _gvk(info) not in gvks:
            gvks.append(_gvk(info))
        refs[id(info)] = {"$ref": "#/definitions/" + name}
    paths: dict[str, Any] = {}
    for info in kinds:
        for ps in kind_paths(info):
            scope = "all" if ps.all_namespaces else "namespaced" if info.namespaced else "cluster"
            ops = {op.method: _operation(info, op, refs[id(info)], scope) for op in ps.ops}
            params = [_param(p, "path", True, f"{p} of the {info.kind}" if p == "name" else
                             "object name and auth scope, such as for teams and projects")
                      for p in ps.path_params]
            params.append(_param("pretty", desc=_QUERY["pretty"]))
            paths[ps.path] = {**ops, "parameters": params}
    return {
        "swagger": "2.0",
        "info": {"title": "Fleet", "version": __version__},
        "paths": paths,
        "definitions": dict(sorted(definitions.items())),
        "securityDefinitions": {"BearerToken": {"description": "Bearer Token authentication", "type": "apiKey",
                                                "name": "authorization", "in": "header"}},
        "security": [{"BearerToken": []}],
    }


def negotiate(accept: str) -> str | None:
    """The Content-Type to answer for an `Accept` header, as kube-openapi's handler picks it; None: 406."""
    clauses = []
    for i, part in enumerate((accept or "*/*").split(",")):
        fields = [f.strip() for f in part.split(";")]
        if not fields[0] or "/" not in fields[0]:
            continue
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        typ, _, sub = fields[0].partition("/")
        # goautoneg's order: by q, then specific before wildcard, then as written.
        clauses.append((-q, typ == "*", sub == "*", i, typ.lower(), sub.lower()))
    for negq, _, _, _, typ, sub in sorted(clauses):
        if negq == 0:
            continue
        for otyp, osub, ctype in _OFFERS:
            if typ in (otyp, "*") and sub in (osub.lower(), "*"):
                return ctype
    return None


def wants_gzip(accept_encoding: str) -> bool:
    for part in (accept_encoding or "").split(","):
        fields = [f.strip() for f in part.split(";")]
        if fields[0].lower() in ("gzip", "*"):
            return not any(f.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for f in fields[1:])
    return False


class OpenAPIV2Cache:
    """The document, regenerated when the registry changes; each form built once and kept with its ETag."""

    # kube-openapi wraps the handler in gziphandler, which leaves bodies under 1400 bytes alone.
    GZIP_MIN = 1400

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._signature: tuple[Any, ...] = ()
        self._doc: dict[str, Any] = {}
        self._bodies: dict[str, tuple[bytes, str]] = {}
        self._gzipped: dict[str, bytes] = {}
        self.last_modified = 0  # whole seconds, as HTTP dates carry them
        self._lock = trio.Lock()

    def _ready(self, sig: tuple[Any, ...], content_type: str, gz: bool) -> bool:
        return (sig == self._signature and bool(self._doc) and content_type in self._bodies
                and (not gz or content_type in self._gzipped))

    def _ensure(self, registry: Registry, sig: tuple[Any, ...], content_type: str, gz: bool) -> None:
        """Build whatever of the document, this form and its gzip is missing or stale."""
        if sig != self._signature or not self._doc:
            doc = document(registry)
            self._bodies, self._gzipped = {}, {}
            self._doc, self._signature, self.last_modified = doc, sig, int(time.time())
        if JSON not in self._bodies:
            raw = json.dumps(self._doc, separators=(",", ":")).encode()
            # kube-openapi: the upper-case hex SHA-512 of the JSON body, quoted.  The protobuf
            # form reuses it (the response varies by Accept).
            self._bodies[JSON] = raw, '"' + hashlib.sha512(raw).hexdigest().upper() + '"'
        if content_type not in self._bodies:
            self._bodies[content_type] = openapi_proto.document(self._doc), self._bodies[JSON][1]
        if gz and content_type not in self._gzipped:
            self._gzipped[content_type] = gzip.compress(self._bodies[content_type][0], compresslevel=6, mtime=0)

    async def prepare(self, content_type: str, gz: bool) -> None:
        """Build what a request needs in a worker thread: a first build takes ~0.3 s of CPU,
        which must not stall the event loop.  The thread gets a snapshot of the registry, which
        the loop may change meanwhile (a CRD registered)."""
        async with self._lock:
            sig = registry_signature(self.registry)
            if self._ready(sig, content_type, gz):
                return
            snapshot = Registry()
            for info in self.registry.all():
                snapshot.register(info)
            await trio.to_thread.run_sync(self._ensure, snapshot, sig, content_type, gz)

    def document(self) -> dict[str, Any]:
        self._ensure(self.registry, registry_signature(self.registry), JSON, False)
        return self._doc

    def body(self, content_type: str) -> tuple[bytes, str]:
        """(body, ETag) of the document in a negotiated content type (JSON or PROTOBUF)."""
        self._ensure(self.registry, registry_signature(self.registry), content_type, False)
        return self._bodies[content_type]

    def gzipped(self, content_type: str) -> bytes:
        self._ensure(self.registry, registry_signature(self.registry), content_type, True)
        return self._gzipped[content_type]


def _etag_matches(header: str, etag: str) -> bool:
    """`If-None-Match` by weak comparison (Go's http.ServeContent): a list of tags, or `*`."""
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


def _not_modified_since(header: str, last_modified: int) -> bool:
    try:
        return last_modified <= parsedate_to_datetime(header).timestamp()
    except (TypeError, ValueError):
        return False


def response(cache: OpenAPIV2Cache, headers: dict[str, str]) -> Resp:
    """Answer `GET /openapi/v2` for these (lower-case) request headers."""
    vary = {"Vary": "Accept"}
    ctype = negotiate(headers.get("accept", ""))
    if ctype is None:
        return Resp(406, b"", "text/plain; charset=utf-8", vary)
    raw, etag = cache.body(ctype)
    out = {**vary, "Etag": etag, "Last-Modified": formatdate(cache.last_modified, usegmt=True)}
    inm = headers.get("if-none-match")
    if inm is not None:
        if _etag_matches(inm, etag):
            return Resp(304, b"", ctype, out)
    elif "if-modified-since" in headers and _not_modified_since(headers["if-modified-since"], cache.last_modified):
        return Resp(304, b"", ctype, out)
    out["Vary"] = "Accept, Accept-Encoding"
    if len(raw) >= cache.GZIP_MIN and wants_gzip(headers.get("accept-encoding", "")):
        return Resp(200, cache.gzipped(ctype), ctype, {**out, "Content-Encoding": "gzip"})
    return Resp(200, raw, ctype, out)


async def serve(cache: OpenAPIV2Cache, headers: dict[str, str]) -> Resp:
    """`response`, with what it needs built off the event loop first."""
    ctype = negotiate(headers.get("accept", ""))
    if ctype is not None:
        await cache.prepare(ctype, wants_gzip(headers.get("accept-encoding", "")))
    return response(cache, headers)
