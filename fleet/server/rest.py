"""Generic REST over the kind registry: one handler for every kind.

A request path is parsed into a `Route` (group, version, namespace, plural,
name, subresource); the kind's `KindInfo` then drives everything: defaulting,
validation, tables, scale, status.  What differs per kind is a strategy, never
a branch on a kind's name: fields of the `KindInfo` (e.g. `status_on_create`),
and two tables on `ResourceAPI` — the POSTed subresources (`pods/binding`,
`pods/eviction`) and the kinds whose DELETE is their own (a namespace starts
finalization instead of being removed at once); graceful pod deletion is
deletion.py's pod strategy.  Resources served by a handler of their own
(nodes' `drain`/`schedulable`, metrics.k8s.io, autoscaling/v1) are a table in
app.py.

Every handler follows the pipeline order of kube-apiserver: decode → default
→ mutating admission → validate → validating admission → store.
Authentication and authorization happened before (see app.py), and anything
that goes wrong raises an `APIError`, rendered as a Status by the caller.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

import trio

from fleet.admission import AdmissionChain
from fleet.api import decode, errors, meta, patch, protobuf, schema, selectors, typecheck
from fleet.api.registry import KindInfo, Registry
from fleet.auth import Attributes, UserInfo
from fleet.server import deletion, eviction
from fleet.server.http import JSON, Req, Resp
from fleet.server.nscache import NamespaceCache
from fleet.server.tables import table, wants_table
from fleet.store import (
    KeyExists,
    KeyNotFound,
    RevisionCompacted,
    RevisionConflict,
    RevisionTooLarge,
    Store,
)

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's request body limit
PATCH_RETRIES = 8
PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


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


def decode_body(req: Req, *, allow_patch: bool = False) -> Any:
    return decode_request(req, allow_patch=allow_patch).value


def decode_request(req: Req, *, allow_patch: bool = False) -> decode.Decoded:
    """The body as plain, bounded JSON data (see fleet/api/decode.py), or a 400/413/415."""
    if len(req.body) > MAX_BODY:
        raise errors.RequestEntityTooLarge("the request body is too large (limit 3145728 bytes)")
    ctype = req.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if not req.body.strip():
        raise errors.BadRequest("the request body is empty")
    try:
        if ctype == protobuf.MEDIA_TYPE:
            # kubectl create/expose/run (client-go typed clients) send protobuf; see fleet/api/protobuf.py.
            try:
                value = protobuf.decode_body(req.body)
            except errors.APIError:
                raise
            except Exception as e:  # a hostile message must be a 400, whatever the decoder tripped on
                raise errors.BadRequest(f"the protobuf body could not be decoded: {type(e).__name__}") from None
            decode.check_value(value, max_bytes=MAX_BODY)
            return decode.Decoded(value)
        if ctype in ("application/json", "") or (allow_patch and ctype in (JSON_PATCH, MERGE_PATCH,
                                                                           STRATEGIC_PATCH)):
            return decode.decode_json(req.body, max_bytes=MAX_BODY)
        if ctype in ("application/yaml", "application/x-yaml", "text/yaml"):
            return decode.decode_yaml(req.body, max_bytes=MAX_BODY)
    except decode.TooLarge as e:
        raise errors.RequestEntityTooLarge(str(e)) from None
    except decode.DecodeError as e:
        raise errors.BadRequest(f"the request body could not be decoded: {e}") from None
    raise errors.UnsupportedMediaType(
        f'the body of the request was in an unknown format - accepted media types include: '
        f'application/json, application/yaml (got "{ctype}")')


def encode_continue(revision: int, key: str) -> str:
    raw = json.dumps({"v": "fleet/1", "rv": revision, "start": key}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str, prefix: str | None = None) -> tuple[int, str]:
    """(revision, start key) of a token made by `encode_continue`.

    Anything else is 400 BadRequest "continue key is not valid: ...", as from
    kube-apiserver's DecodeContinue: not base64 or JSON, another encoding (a
    real Kubernetes token), a revision that is not a positive int64 (SQLite
    binds no more; a forged one was a 500), an empty start key, or, given
    `prefix`, a start key outside the list being continued (a token of another
    namespace or kind must not page through this one).
    """
    def invalid(why: str) -> errors.BadRequest:
        return errors.BadRequest(f"continue key is not valid: {why}")

    try:
        pad = "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(token + pad))
    except (ValueError, TypeError, RecursionError) as e:  # RecursionError: deeply nested JSON
        raise invalid(str(e) or type(e).__name__) from None
    if not isinstance(data, dict):
        raise invalid("not an encoded continue token")
    if data.get("v") != "fleet/1":
        raise invalid(f"server does not recognize this encoded version {json.dumps(data.get('v'))}")
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or not 0 < rv <= _MAX_INT64:
        raise invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start:
        raise invalid("encoded start key empty")
    if prefix is not None and (not start.startswith(prefix) or start == prefix):
        raise invalid(f"start key {json.dumps(start)} is not in the requested list")
    return rv, start


def random_suffix(n: int = 5) -> str:
    # kube-apiserver's alphabet for generateName (no vowels, no confusable digits)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))


def parse_rv(value: Any, what: str = "resourceVersion") -> int | None:
    """A resourceVersion as the storage layer reads it: decimal digits of a uint64
    (Go's ParseUint; Python's int() would also take " 5", "+5" and "1_0")."""
    if value in (None, ""):
        return None
    text = value if isinstance(value, str) else None
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 20 or int(text) > 2**64 - 1:
        shown = value if isinstance(value, str) and len(value) <= 64 else type(value).__name__
        raise errors.BadRequest(f'invalid {what}: "{shown}" is not a valid resource version')
    return int(text)


class ResourceAPI:
    """The generic handlers.  One instance per server."""

    def __init__(self, store: Store, registry: Registry, admission: AdmissionChain,
                 namespace_finalizer: trio.MemorySendChannel | None = None,
                 namespaces: NamespaceCache | None = None) -> None:
        self.store = store
        self.namespaces = namespaces
        self.registry = registry
        self.admission = admission
        self._ns_finalizer = namespace_finalizer
        # The disruption-budget seam of the eviction subresource (see eviction.py).
        self.budgets = eviction.DisruptionBudgets(store, registry)
        # Per-kind strategies as tables (Kubernetes' rest.Storage per resource), so
        # the generic handlers below never branch on a kind's name: the POSTed
        # subresources by (group, plural, subresource), and the kinds whose
        # DELETE is not the generic one (a namespace starts finalization).
        self.create_subresources: dict[tuple[str, str, str], Any] = {
            ("", "pods", "binding"): self.bind,
            ("", "pods", "eviction"): self.evict,
        }
        self.delete_strategies: dict[tuple[str, str], Any] = {
            ("", "namespaces"): self._delete_namespace,
        }

    # ----------------------------------------------------------------- helpers
    def kind_for(self, route: Route) -> KindInfo:
        info = self.registry.get(route.group, route.version, route.plural)
        if info is None:
            raise resource_not_found()
        if route.namespace is not None and not info.namespaced:
            raise resource_not_found()
        if not info.namespaced:
            route.namespace = None
        if route.subresource and route.subresource not in SUPPORTED_SUBRESOURCES.intersection(info.subresources):
            raise resource_not_found()
        return info

    def attributes(self, route: Route, verb: str, req: Req) -> Attributes:
        return Attributes(verb=verb, group=route.group, version=route.version, resource=route.plural,
                          subresource=route.subresource, namespace=route.namespace or "",
                          name=route.name or "", dry_run=is_dry_run(req))

    def check_type(self, info: KindInfo, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise errors.BadRequest("the body must be a JSON object (got " + type(obj).__name__ + ")")
        api_version = obj.get("apiVersion")
        kind = obj.get("kind")
        if api_version is None and kind is None:
            obj["apiVersion"], obj["kind"] = info.api_version, info.kind
        elif kind != info.kind or api_version != info.api_version:
            raise errors.BadRequest(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({info.api_version})" if api_version != info.api_version else
                f"the kind in the data ({kind}) does not match the expected kind ({info.kind})")
        md = obj.get("metadata")
        if md is None:
            obj["metadata"] = {}
        elif not isinstance(md, dict):
            raise errors.BadRequest("metadata must be an object")
        return obj

    def field_validation(self, info: KindInfo, obj: dict[str, Any], req: Req,
                         duplicates: list[str] | None = None) -> list[str]:
        """Unknown and duplicate fields per fieldValidation: Strict → 400, Warn → warnings,
        Ignore → nothing.  Unknown fields are dropped in every mode (see `validate`)."""
        check_field_manager(req)
        mode = req.query.get("fieldValidation", "")
        if mode not in ("", "Strict", "Warn", "Ignore"):
            raise errors.BadRequest(f'fieldValidation must be one of "Ignore", "Warn", or "Strict" (got "{mode}")')
        if mode in ("Ignore",):
            return []
        msgs = [f'duplicate field "{d}"' for d in duplicates or []]
        type_name = schema.root_type(info.group, info.version, info.kind)
        unknown = schema.unknown_fields(type_name, obj) if type_name is not None else []
        msgs += [f'unknown field "{p.lstrip(".")}"' for p in unknown]
        if not msgs:
            return []
        if mode == "Strict":
            raise errors.BadRequest("strict decoding error: " + ", ".join(msgs))
        return msgs

    def type_check(self, info: KindInfo, obj: dict[str, Any]) -> None:
        """The decoding step of kube-apiserver: every field of the JSON type its schema
        says (422 naming each bad field), nulls normalized, unknown fields dropped.

        Runs before the kind's own validator, which may then rely on the types."""
        report = typecheck.check(schema.root_type(info.group, info.version, info.kind), obj)
        causes = report.causes
        md = obj.get("metadata")
        if isinstance(md, dict):
            causes += typecheck.owner_reference_causes(md.get("ownerReferences"))
            causes += typecheck.managed_fields_causes(md.get("managedFields"))
        if causes:
            name = md.get("name") or md.get("generateName") or "" if isinstance(md, dict) else ""
            raise errors.Invalid.for_object(info.kind, info.group, name if isinstance(name, str) else "",
                                            causes)

    def validate(self, info: KindInfo, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.type_check(info, obj)
        causes: list[dict[str, str]] = []
        md = obj["metadata"]
        if not md.get("name"):
            causes.append(errors.cause("metadata.name", "Required value: name or generateName is required",
                                       "FieldValueRequired"))
        if info.validate is not None:
            causes.extend(info.validate(obj, old))
        if causes:
            # Deduplicate: the kind validator may also report a missing name.
            seen, uniq = set(), []
            for c in causes:
                k = (c.get("field"), c.get("message"))
                if k not in seen:
                    seen.add(k)
                    uniq.append(c)
            raise errors.Invalid.for_object(info.kind, info.group, md.get("name") or md.get("generateName", ""),
                                            uniq)

    async def check_namespace(self, namespace: str) -> None:
        ns = self.namespaces.get(namespace) if self.namespaces is not None else None
        if ns is None:
            try:
                ns = await self.store.get(meta.store_key("", "namespaces", None, namespace))
            except KeyNotFound:
                raise errors.NotFound(f'namespaces "{namespace}" not found', name=namespace,
                                      kind="namespaces") from None
        if ns.get("metadata", {}).get("deletionTimestamp") or ns.get("status", {}).get("phase") == "Terminating":
            raise errors.Forbidden(
                f"unable to create new content in namespace {namespace} because it is being terminated",
                name=namespace, kind="namespaces",
                causes=[{"reason": "NamespaceTerminating", "message": f"namespace {namespace} is being terminated",
                         "field": "metadata.namespace"}])

    async def get_current(self, info: KindInfo, route: Route) -> dict[str, Any]:
        assert route.name is not None
        try:
            return await self.store.get(info.key(route.namespace, route.name))
        except KeyNotFound:
            raise not_found(info, route.name) from None

    # -------------------------------------------------------------------- read
    async def get(self, info: KindInfo, route: Route, req: Req) -> Resp:
        obj = await self.get_current(info, route)
        if route.subresource == "scale":
            return Resp.json(200, to_scale(info, obj))
        if wants_table(req.headers.get("accept", "")):
            return Resp.json(200, table(info, [obj], resource_version=obj["metadata"].get("resourceVersion", ""),
                                        include=req.query.get("includeObject", "Metadata")))
        return Resp.json(200, obj)

    def selectors(self, info: KindInfo, req: Req) -> tuple[selectors.LabelSelector, selectors.FieldSelector]:
        ls = selectors.parse_label_selector(req.query.get("labelSelector", ""))
        fs = selectors.parse_field_selector(req.query.get("fieldSelector", ""), info.field_selectable)
        return ls, fs

    async def list(self, info: KindInfo, route: Route, req: Req) -> Resp:
        ls, fs = self.selectors(info, req)
        limit = _int_param(req, "limit", 0)
        cont = req.query.get("continue", "")
        prefix = info.key(route.namespace)
        ns_pin = fs.exact_value("metadata.namespace")
        if ns_pin and info.namespaced and route.namespace is None:
            prefix = info.key(ns_pin)
        revision: int | None = None
        start_after: str | None = None
        rv_s = req.query.get("resourceVersion", "")
        match = req.query.get("resourceVersionMatch", "")
        rv = parse_rv(rv_s)
        if rv is not None and rv > _MAX_INT64:  # Go's ParseUint(64) range; SQLite binds no more
            raise errors.BadRequest(f'invalid resourceVersion: "{rv_s}" is not a valid resource version')
        # kube-apiserver's ValidateListOptions: 422 Invalid on ListOptions.meta.k8s.io.
        causes = []
        if match:
            if not rv_s:
                causes.append(errors.cause("resourceVersionMatch", "Forbidden: resourceVersionMatch is "
                                           "forbidden unless resourceVersion is provided", "FieldValueForbidden"))
            if cont:
                causes.append(errors.cause("resourceVersionMatch", "Forbidden: resourceVersionMatch is "
                                           "forbidden when continue is provided", "FieldValueForbidden"))
            if match not in ("Exact", "NotOlderThan"):
                causes.append(errors.cause("resourceVersionMatch", f"Unsupported value: {json.dumps(match)}: "
                                           'supported values: "Exact", "NotOlderThan", ""',
                                           "FieldValueNotSupported"))
            elif match == "Exact" and rv_s == "0":
                causes.append(errors.cause("resourceVersionMatch", 'Forbidden: resourceVersionMatch "exact" '
                                           'is forbidden for resourceVersion "0"', "FieldValueForbidden"))
        if causes:
            raise errors.Invalid.for_object("ListOptions", "meta.k8s.io", "", causes)

        def too_large(requested: int, current: int) -> errors.APIError:
            # kube-apiserver's NewTooLargeResourceVersionError: client-go's
            # reflector recognizes it and relists from the current state.
            return errors.APIError(f"Too large resource version: {requested}, current: {current}", code=504,
                                   reason="Timeout", retry_after=1, causes=[
                                       {"reason": "ResourceVersionTooLarge",
                                        "message": "Too large resource version"}])

        if cont:
            if rv_s and rv_s != "0":
                raise errors.BadRequest("specifying resource version is not allowed when using continue")
            revision, start_after = decode_continue(cont, prefix)
        elif match == "Exact":
            revision = rv
        elif rv:
            # NotOlderThan (also the legacy rv without a match): the watch cache of
            # kube-apiserver waits up to 3 s for a revision it has not seen yet.
            with trio.move_on_after(3.0):
                while self.store.current_revision() < rv:
                    await trio.sleep(0.05)
            if self.store.current_revision() < rv:
                raise too_large(rv, self.store.current_revision())
        items: list[dict[str, Any]] = []
        next_key: str | None = None
        remaining: int | None = None
        name_pin = fs.exact_value("metadata.name")
        while True:
            want = (limit - len(items)) if limit else 0
            try:
                if name_pin is not None and start_after is None and (route.namespace or not info.namespaced):
                    # Fast path: a name pin inside one namespace is a point read.
                    res = await self.store.list(info.key(route.namespace, name_pin), revision=revision)
                    res.items = [o for o in res.items if o["metadata"]["name"] == name_pin]
                else:
                    res = await self.store.list(prefix, revision=revision, limit=want, start_after=start_after)
            except RevisionCompacted:
                if not cont:  # resourceVersionMatch=Exact at a compacted revision
                    raise errors.Gone(f"too old resource version: {revision} "
                                      f"({self.store.compacted_revision()})") from None
                raise errors.Gone("The provided continue parameter is too old to display a consistent list "
                                  "result. You can start a new list without the continue parameter.") from None
            except RevisionTooLarge as e:
                if cont:  # this server never handed out that revision: a forged token
                    raise errors.BadRequest("continue key is not valid: incorrect encoded start "
                                            "resourceVersion (version meta.k8s.io/v1)") from None
                raise too_large(e.requested, e.current) from None
            revision = res.revision
            for o in res.items:
                if ls.matches(o.get("metadata", {}).get("labels")) and fs.matches(o):
                    items.append(o)
            if res.continue_key is None:
                next_key = None
                break
            start_after = res.continue_key
            if limit and len(items) >= limit:
                next_key = res.continue_key
                remaining = res.remaining
                break
        token = encode_continue(revision, next_key) if next_key else ""
        rv_s = str(revision)
        if wants_table(req.headers.get("accept", "")):
            return Resp.json(200, table(info, items, resource_version=rv_s, cont=token,
                                        include=req.query.get("includeObject", "Metadata"),
                                        remaining=remaining if (ls.empty() and fs.empty()) else None))
        md: dict[str, Any] = {"resourceVersion": rv_s}
        if token:
            md["continue"] = token
            if remaining is not None and ls.empty() and fs.empty():
                md["remainingItemCount"] = remaining
        body = {"kind": info.list_kind, "apiVersion": info.api_version, "metadata": md, "items": items}
        return Resp.json(200, body)

    # ------------------------------------------------------------------- write
    async def create(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        handler = self.create_subresources.get((info.group, info.plural, route.subresource))
        if handler is not None and route.name is not None:
            return await handler(info, route, req, user)
        if route.name is not None:
            raise errors.MethodNotAllowed(f"POST is not supported on a named {info.kind}")
        decoded = decode_request(req)
        obj = self.check_type(info, decoded.value)
        warnings = self.field_validation(info, obj, req, decoded.duplicates)
        # Types first, as kube-apiserver decodes before anything else: the namespace
        # checks, defaulting and admission read the object as the schema says it is.
        self.type_check(info, obj)
        md = obj["metadata"]
        if info.namespaced:
            ns = md.get("namespace") or route.namespace
            if route.namespace and md.get("namespace") and md["namespace"] != route.namespace:
                raise errors.BadRequest("the namespace of the provided object does not match the namespace "
                                        "sent on the request")
            if not ns:
                raise errors.BadRequest("the namespace of the object is required")
            md["namespace"] = ns
            route.namespace = ns
        else:
            md.pop("namespace", None)
        for f in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink"):
            md.pop(f, None)
        if not md.get("name") and md.get("generateName"):
            md["name"] = str(md["generateName"]) + random_suffix()
        # Assigned before defaulting: some defaults derive from it (a Job's selector).
        md["uid"] = str(uuid.uuid4())
        if info.has_status and not info.status_on_create:
            obj.pop("status", None)
        if info.default is not None:
            info.default(obj)
        if info.namespaced:
            await self.check_namespace(route.namespace or "")
        # kube-apiserver's order: mutating admission, then validation of what it
        # produced, then validating admission (see fleet/admission/__init__.py).
        attrs = Attributes("create", info.group, info.version, info.plural, "", route.namespace or "",
                           md.get("name") or "", is_dry_run(req))
        obj = await self.admission.mutate(attrs, user, obj, None)
        md = obj["metadata"]
        self.validate(info, obj, None)
        await self.admission.validate(attrs, user, obj, None)
        if is_dry_run(req):
            md.setdefault("creationTimestamp", meta.now_rfc3339())
            md.setdefault("generation", 1)
            return Resp.json(201, obj, warning_headers(warnings))
        try:
            stored = await self.store.create(info.key(route.namespace, md["name"]), obj)
        except KeyExists:
            raise errors.AlreadyExists(f'{qualified(info)} "{md["name"]}" already exists', name=md["name"],
                                       group=info.group, kind=info.plural) from None
        return Resp.json(201, stored, warning_headers(warnings))

    async def bind(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        """POST pods/{name}/binding: assign an unbound pod to a node (what the scheduler calls).

        As kube-apiserver's BindingREST: the Binding's name must be the pod's;
        a pod that already has a node, or is being deleted, is a 409; otherwise
        spec.nodeName, the Binding's annotations and PodScheduled=True are
        written in one update, and the answer is a Status Success (201).
        """
        assert route.name is not None
        body = decode_body(req)
        if not isinstance(body, dict) or body.get("kind") != "Binding" or body.get("apiVersion") != "v1":
            raise errors.BadRequest("the body must be a v1 Binding")
        md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if md.get("name", route.name) != route.name or md.get("namespace", route.namespace) != route.namespace:
            raise errors.BadRequest("name in URL does not match name in Binding object")
        target = body.get("target") if isinstance(body.get("target"), dict) else {}
        node = target.get("name")
        if not node or not isinstance(node, str):
            raise errors.Invalid.for_object("Binding", "", route.name, [
                errors.cause("target.name", "Required value", "FieldValueRequired")])
        if target.get("kind", "Node") != "Node":
            raise errors.Invalid.for_object("Binding", "", route.name, [
                errors.cause("target.kind", f'Unsupported value: "{target.get("kind")}": supported values: "Node"',
                             "FieldValueNotSupported")])
        attrs = Attributes("create", info.group, info.version, info.plural, "binding", route.namespace or "",
                           route.name, is_dry_run(req))
        await self.admission.admit(attrs, user, body, None)
        key = info.key(route.namespace, route.name)
        for _attempt in range(PATCH_RETRIES):
            old = await self.get_current(info, route)
            pod = copy.deepcopy(old)
            why = ""
            if pod["metadata"].get("deletionTimestamp"):
                why = f"pod {route.name} is being deleted, cannot be assigned to a host"
            elif (pod.get("spec") or {}).get("nodeName"):
                why = f'pod {route.name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            if md.get("uid") and md["uid"] != pod["metadata"].get("uid"):
                why = f"the UID in the Binding ({md['uid']}) does not match the pod's"
            if why:
                raise errors.Conflict(f'Operation cannot be fulfilled on pods/binding "{route.name}": {why}',
                                      name=route.name, kind="pods/binding")
            pod.setdefault("spec", {})["nodeName"] = node
            if isinstance(md.get("annotations"), dict) and md["annotations"]:
                pod["metadata"].setdefault("annotations", {}).update(md["annotations"])
            conditions = [c for c in pod.setdefault("status", {}).get("conditions") or []
                          if isinstance(c, dict) and c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                               "lastTransitionTime": meta.now_rfc3339()})
            pod["status"]["conditions"] = conditions
            # As create, not update: binding is the one writer allowed to set spec.nodeName.
            self.validate(info, pod, None)
            if is_dry_run(req):
                break
            try:
                await self.store.update(key, pod, expected_revision=int(old["metadata"]["resourceVersion"]))
            except RevisionConflict:
                continue  # a concurrent status write; re-check against the fresh pod
            except KeyNotFound:
                raise not_found(info, route.name) from None
            break
        else:
            raise conflict(info, route.name, "too many concurrent writers; try again")
        return Resp.json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "code": 201})

    async def evict(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        """POST pods/{name}/eviction: check the Eviction, admit it, evict (see evict_pod).

        Answers a Status Success (201) as kube-apiserver does; 429 when a
        disruption budget forbids it, 404 when the pod does not exist.
        """
        assert route.name is not None
        body = decode_body(req)
        if not isinstance(body, dict):
            raise errors.BadRequest("the body must be a policy/v1 Eviction")
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if (api_version, kind) != (None, None) and (
                kind != "Eviction" or api_version not in eviction.EVICTION_API_VERSIONS):
            raise errors.BadRequest(f"the body must be a policy/v1 Eviction (got {kind} in {api_version})")
        md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if md.get("name") != route.name:
            raise errors.BadRequest("name in URL does not match name in Eviction object")
        if md.get("namespace") not in (None, "", route.namespace):
            raise errors.BadRequest("the namespace of the provided object does not match the namespace "
                                    "sent on the request")
        opts = body.get("deleteOptions")
        if opts is None:
            opts = {}
        if not isinstance(opts, dict):
            raise errors.BadRequest("deleteOptions must be an object")
        opts = check_delete_options(dict(opts))
        # propagateDryRun: the request's dryRun and the Eviction's must agree.
        query_dry = ["All"] if is_dry_run(req) else []
        body_dry = opts.get("dryRun") or []
        if query_dry and body_dry and query_dry != body_dry:
            raise errors.BadRequest(f"DryRun in DeleteOptions ({body_dry}) and CreateOptions ({query_dry}) "
                                    "do not match")
        dry_run = bool(query_dry or body_dry)
        attrs = Attributes("create", info.group, info.version, info.plural, "eviction", route.namespace or "",
                           route.name, dry_run)
        await self.admission.admit(attrs, user, body, None)
        await self.evict_pod(route.namespace or "", route.name, opts, dry_run=dry_run)
        return Resp.json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "code": 201})

    async def evict_pod(self, namespace: str, name: str, opts: dict[str, Any], *, dry_run: bool = False) -> None:
        """Evict one pod: EvictionREST.Create without the HTTP.  Used by the eviction
        subresource and by Fleet's server-side drain.

        A pod that is finished, pending or already terminating is deleted right
        away; any other must first pass its disruption budget
        (`self.budgets.admit_eviction`, 429 when it would break the budget).  The
        pod then gets the DisruptionTarget condition and is deleted per `opts`
        (gracefully for a pod on a node).  Conflicts with concurrent writers are
        retried unless the caller pinned a resourceVersion.
        """
        info = self.registry.get("", "v1", "pods")
        assert info is not None
        route = Route("", "v1", "pods", namespace, name)
        pinned = parse_rv((opts.get("preconditions") or {}).get("resourceVersion")) is not None
        admitted = False  # a budget is used up once, however often the delete is retried
        for _attempt in range(PATCH_RETRIES):
            pod = await self.get_current(info, route)
            if not admitted and not eviction.can_ignore_budgets(pod):
                await self.budgets.admit_eviction(pod, dry_run=dry_run)
                admitted = True
            try:
                await self.delete_object(info, route, pod, opts, dry_run=dry_run,
                                         mark=eviction.add_disruption_target)
            except errors.Conflict:
                if pinned:
                    raise
                continue
            return
        raise conflict(info, name, "too many concurrent writers; try again")

    async def update(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        assert route.name is not None
        decoded = decode_request(req)
        body = decoded.value
        if route.subresource == "scale":
            scale_body = _check_scale_body(body)
            return await self._write_scale(info, route, req, user, lambda scale: scale_body, put_body=scale_body)
        obj = self.check_type(info, body)
        md = obj["metadata"]
        if md.get("name") and md["name"] != route.name:
            raise errors.BadRequest(f"the name of the object ({md['name']}) does not match the name on "
                                    f"the URL ({route.name})")
        if info.namespaced and md.get("namespace") and md["namespace"] != route.namespace:
            raise errors.BadRequest("the namespace of the provided object does not match the namespace "
                                    "sent on the request")
        warnings = self.field_validation(info, obj, req, decoded.duplicates)
        precondition = parse_rv(md.get("resourceVersion"))
        return await self._write(info, route, req, user, lambda old: copy.deepcopy(obj), precondition,
                                 warnings, verb="update")

    async def patch(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        assert route.name is not None
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == APPLY_PATCH:
            raise errors.UnsupportedMediaType("server-side apply is not supported yet: use client-side "
                                              "kubectl apply (the default)")
        if ctype not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH):
            raise errors.UnsupportedMediaType(
                f'the body of the request was in an unknown format - accepted media types include: '
                f'{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}')
        if ctype == STRATEGIC_PATCH and not info.strategic_merge:
            raise errors.UnsupportedMediaType(f"strategic merge patch is not supported for {info.kind}; "
                                              "use a merge or JSON patch")
        body = decode_body(req, allow_patch=True)
        if ctype == JSON_PATCH and not isinstance(body, list):
            raise errors.BadRequest("json patch must be a list of operations")
        if ctype != JSON_PATCH and not isinstance(body, dict):
            raise errors.BadRequest("a merge patch must be a JSON object")

        def apply(doc: dict[str, Any], smp_schema: dict[str, Any]) -> dict[str, Any]:
            if ctype == JSON_PATCH:
                out = patch.json_patch(doc, body)
            elif ctype == MERGE_PATCH:
                out = patch.json_merge_patch(doc, body)
            else:
                out = patch.strategic_merge_patch(doc, body, smp_schema)
            if not isinstance(out, dict):
                raise errors.BadRequest("the patch produced something that is not an object")
            return out

        if route.subresource == "scale":
            return await self._write_scale(info, route, req, user, lambda scale: apply(scale, {}))
        precondition = None
        if isinstance(body, dict):
            precondition = parse_rv((body.get("metadata") or {}).get("resourceVersion")
                                    if isinstance(body.get("metadata"), dict) else None)
        schema_root = info.strategic_schema() if ctype == STRATEGIC_PATCH else {}

        def build(old: dict[str, Any]) -> dict[str, Any]:
            new = apply(old, schema_root)
            self.check_type(info, new)
            return new

        return await self._write(info, route, req, user, build, precondition, None, verb="patch",
                                 validate_fields=True)

    async def _write(self, info: KindInfo, route: Route, req: Req, user: UserInfo, build: Any,
                     precondition: int | None, warnings: list[str] | None, *, verb: str,
                     validate_fields: bool = False) -> Resp:
        """Read-modify-write with optimistic concurrency.  Without a client precondition a
        conflict with a concurrent writer is retried on the fresh object (as kube-apiserver
        does for patches and unconditional updates)."""
        assert route.name is not None
        key = info.key(route.namespace, route.name)
        for _attempt in range(PATCH_RETRIES):
            old = await self.get_current(info, route)
            old_rv = int(old["metadata"]["resourceVersion"])
            if precondition is not None and precondition != old_rv:
                raise conflict(info, route.name)
            new = build(copy.deepcopy(old))
            md = new.setdefault("metadata", {})
            if md.get("name") not in (None, route.name):
                raise errors.BadRequest("metadata.name cannot be changed")
            md["name"] = route.name
            if info.namespaced:
                if md.get("namespace") not in (None, route.namespace):
                    raise errors.BadRequest("metadata.namespace cannot be changed")
                md["namespace"] = route.namespace
            if validate_fields:
                warnings = self.field_validation(info, new, req)
            self.type_check(info, new)
            if route.subresource == "status":
                status = new.get("status")
                new = copy.deepcopy(old)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
            elif info.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            # Server-managed metadata is not the client's to change.
            for f in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "generation"):
                if f in old["metadata"]:
                    md_new = new["metadata"]
                    md_new[f] = old["metadata"][f]
                else:
                    new["metadata"].pop(f, None)
            new["metadata"]["resourceVersion"] = str(old_rv)
            if info.default is not None:
                info.default(new)
            attrs = Attributes(verb, info.group, info.version, info.plural, route.subresource,
                               route.namespace or "", route.name, is_dry_run(req))
            new = await self.admission.mutate(attrs, user, new, old)
            self.validate(info, new, old)
            await self.admission.validate(attrs, user, new, old)
            if is_dry_run(req):
                return Resp.json(200, new, warning_headers(warnings or []))
            try:
                stored = await self.store.update(key, new, expected_revision=old_rv)
            except RevisionConflict:
                if precondition is not None:
                    raise conflict(info, route.name) from None
                continue
            except KeyNotFound:
                raise not_found(info, route.name) from None
            if route.subresource == "scale":
                return Resp.json(200, to_scale(info, stored))
            return Resp.json(200, stored, warning_headers(warnings or []))
        raise conflict(info, route.name, "too many concurrent writers; try again")

    async def _write_scale(self, info: KindInfo, route: Route, req: Req, user: UserInfo, change: Any, *,
                           put_body: dict[str, Any] | None = None) -> Resp:
        scale_info = info.scale
        assert scale_info is not None and route.name is not None
        holder: dict[str, Any] = {}

        def build(old: dict[str, Any]) -> dict[str, Any]:
            new_scale = change(to_scale(info, old))
            holder["scale"] = new_scale
            spec = new_scale.get("spec")
            if spec is not None and not isinstance(spec, dict):
                raise errors.Invalid.for_object("Scale", "autoscaling", route.name or "", [
                    typecheck.type_invalid("spec", spec, "object")])
            replicas = (spec or {}).get("replicas")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise errors.Invalid.for_object("Scale", "autoscaling", route.name or "", [
                    errors.cause("spec.replicas", f"Invalid value: {json.dumps(replicas)}: must be greater "
                                 "than or equal to 0")])
            meta.set_path(old, scale_info.spec_replicas, replicas)
            return old

        # The Scale's own resourceVersion is a precondition when the client sent one.
        precondition = None
        if put_body is not None:  # the body of a PUT, decoded once by `update`
            md = put_body.get("metadata")
            if md is not None and not isinstance(md, dict):
                raise errors.BadRequest("metadata must be an object")
            precondition = parse_rv((md or {}).get("resourceVersion"))
        sub_route = Route(route.group, route.version, route.plural, route.namespace, route.name, "scale")
        return await self._write(info, sub_route, req, user, build, precondition, None, verb="update")

    # ------------------------------------------------------------------ delete
    async def delete(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        assert route.name is not None
        opts = delete_options(req)
        dry_run = is_dry_run(req)
        old = await self.get_current(info, route)
        attrs = Attributes("delete", info.group, info.version, info.plural, "", route.namespace or "",
                           route.name, dry_run)
        await self.admission.admit(attrs, user, None, old)
        strategy = self.delete_strategies.get((info.group, info.plural))
        if strategy is not None:
            return await strategy(info, route, old, opts, dry_run=dry_run)
        obj, code = await self.delete_object(info, route, old, opts, dry_run=dry_run)
        return Resp.json(code, obj, warning_headers(deletion.warnings_for(info, opts)))

    async def delete_object(self, info: KindInfo, route: Route, old: dict[str, Any], opts: dict[str, Any],
                            *, dry_run: bool,
                            mark: Any = None) -> tuple[dict[str, Any], int]:
        """Delete `old` (already read, already admitted) per DeleteOptions `opts`;
        returns (object, HTTP code).  Shared by DELETE and the eviction subresource.

        The propagation policy becomes GC finalizers and pods on a node are only
        marked (see fleet/server/deletion.py).  `mark(obj)`, if given, is applied
        in the write that starts the deletion (eviction's DisruptionTarget
        condition).  The code is 200, or 202 when the object stays and the client
        asked for cascading with the legacy `orphanDependents: false` — the one
        case kube-apiserver answers 202."""
        assert route.name is not None
        try:
            obj, removed = await deletion.delete_stored(self.store, info, info.key(route.namespace, route.name),
                                                        opts, current=old, dry_run=dry_run, mark=mark)
        except KeyNotFound:
            raise not_found(info, route.name) from None
        except deletion.PreconditionFailed as e:
            raise conflict(info, route.name, str(e)) from None
        except deletion.TooManyConflicts:
            raise conflict(info, route.name, "too many concurrent writers; try again") from None
        return obj, 202 if not removed and opts.get("orphanDependents") is False else 200

    async def _delete_namespace(self, info: KindInfo, route: Route, old: dict[str, Any], opts: dict[str, Any],
                                *, dry_run: bool) -> Resp:
        """Start a namespace's finalization: deletionTimestamp, phase Terminating and
        the GC finalizers the options ask for, in one write; the namespace
        lifecycle task (nslifecycle.py) then empties it and removes it.  A repeated
        DELETE only rewrites the GC finalizers, as for any object."""
        assert route.name is not None
        if route.name in PROTECTED_NAMESPACES:
            raise errors.Forbidden(f'namespaces "{route.name}" is forbidden: this namespace may not be deleted',
                                   name=route.name, kind="namespaces")
        pre = opts.get("preconditions") or {}
        expected_rv = parse_rv(pre.get("resourceVersion"))
        if pre.get("uid") and old["metadata"].get("uid") != pre["uid"]:
            raise conflict(info, route.name, "the UID precondition did not match")
        if expected_rv is not None and int(old["metadata"]["resourceVersion"]) != expected_rv:
            raise conflict(info, route.name)
        code = 202 if opts.get("orphanDependents") is False else 200
        old_fins = list(old["metadata"].get("finalizers") or [])
        fins = deletion.gc_finalizers(info, old_fins, opts)
        if old["metadata"].get("deletionTimestamp") and fins is old_fins:
            return Resp.json(code, old)
        new = copy.deepcopy(old)
        if fins:
            new["metadata"]["finalizers"] = fins
        else:
            new["metadata"].pop("finalizers", None)
        if not old["metadata"].get("deletionTimestamp"):
            new["metadata"]["deletionTimestamp"] = meta.now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
        new.setdefault("status", {})["phase"] = "Terminating"
        if dry_run:
            return Resp.json(200, new)
        try:
            stored = await self.store.update(info.key(None, route.name), new,
                                             expected_revision=int(old["metadata"]["resourceVersion"]))
        except RevisionConflict:
            raise conflict(info, route.name) from None
        except KeyNotFound:
            raise not_found(info, route.name) from None
        if self._ns_finalizer is not None:
            self._ns_finalizer.send_nowait(route.name)
        return Resp.json(code, stored)

    async def delete_collection(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        ls, fs = self.selectors(info, req)
        res = await self.store.list(info.key(route.namespace))
        deleted = []
        for o in res.items:
            if not (ls.matches(o["metadata"].get("labels")) and fs.matches(o)):
                continue
            r = Route(route.group, route.version, route.plural, o["metadata"].get("namespace"),
                      o["metadata"]["name"])
            try:
                # The body is the collection's DeleteOptions (propagationPolicy...), for every item.
                resp = await self.delete(info, r, Req("DELETE", req.path, dict(req.query), req.headers, req.body),
                                         user)
            except errors.NotFound:
                continue
            deleted.append(json.loads(resp.body))  # type: ignore[arg-type]
        return Resp.json(200, {"kind": info.list_kind, "apiVersion": info.api_version,
                               "metadata": {"resourceVersion": str(self.store.current_revision())},
                               "items": deleted})

# Subresources served by the generic handlers (and drain.py for nodes), with
# their verbs; the agent-relayed ones (log, exec, attach) are in proxy.py.
SUBRESOURCE_VERBS: dict[str, tuple[str, ...]] = {
    "status": ("get", "patch", "update"),
    "scale": ("get", "patch", "update"),
    "binding": ("create",),
    "eviction": ("create",),
    "drain": ("create", "get"),
    "schedulable": ("create",),
}
SUPPORTED_SUBRESOURCES = frozenset(SUBRESOURCE_VERBS)


# Kept importable from here: the pod deletion strategy lives in deletion.py.
pod_grace_period = deletion.pod_grace_period


def is_dry_run(req: Req) -> bool:
    v = req.query.get("dryRun", "")
    if v and v != "All":
        raise errors.BadRequest(f'dryRun: Unsupported value: "{v}": supported values: "All"')
    return v == "All"


_MAX_INT64 = 2**63 - 1  # the query integers are Go int64s; SQLite binds no larger either


def _int_param(req: Req, name: str, default: int) -> int:
    v = req.query.get(name)
    if v in (None, ""):
        return default
    # What Go's strconv.ParseInt(v, 10, 64) accepts; Python's int() also takes
    # spaces, "1_000" and non-ASCII digits, and any size (limit=2**63 was a 500).
    digits = v[1:] if v[:1] in ("+", "-") else v
    if not (digits.isascii() and digits.isdigit()):
        raise errors.BadRequest(f'{name}: invalid value "{v}": must be an integer')
    # Length first: int() itself refuses more than 4300 digits (a ValueError, so a 500).
    if len(digits) > 19 or int(v) > _MAX_INT64:
        raise errors.BadRequest(f'{name}: invalid value "{v}": value out of range')
    n = int(v)
    if n < 0:
        raise errors.BadRequest(f"{name}: must be non-negative")
    return n


def check_field_manager(req: Req) -> None:
    """ValidateFieldManager: at most 128 bytes of printable characters (422 otherwise)."""
    fm = req.query.get("fieldManager")
    if fm is None:
        return
    opts = {"POST": "CreateOptions", "PUT": "UpdateOptions"}.get(req.method, "PatchOptions")
    if len(fm.encode()) > 128:
        raise errors.Invalid.for_object(opts, "meta.k8s.io", "", [errors.cause(
            "fieldManager", "Too long: may not be more than 128 bytes", "FieldValueTooLong")])
    if not fm.isprintable():
        raise errors.Invalid.for_object(opts, "meta.k8s.io", "", [errors.cause(
            "fieldManager", f"Invalid value: {json.dumps(fm)}: may only contain printable characters")])


def warning_headers(warnings: list[str]) -> dict[str, str]:
    if not warnings:
        return {}
    # One Warning header per message; joined with ", " (HTTP allows folding repeated headers).
    return {"Warning": ", ".join('299 - "' + w.replace('"', '\\"') + '"' for w in warnings)}


def delete_options(req: Req) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if req.body.strip():
        body = decode_body(req)
        if not isinstance(body, dict):
            raise errors.BadRequest("DeleteOptions must be an object")
        opts = body
    if "gracePeriodSeconds" in req.query:
        opts["gracePeriodSeconds"] = _int_param(req, "gracePeriodSeconds", 0)
    if "propagationPolicy" in req.query:
        opts["propagationPolicy"] = req.query["propagationPolicy"]
    if "orphanDependents" in req.query:
        # The legacy option, as query parameter too (client-go encodes DeleteOptions both ways).
        opts["orphanDependents"] = {"true": True, "false": False}.get(req.query["orphanDependents"],
                                                                     req.query["orphanDependents"])
    if "dryRun" in req.query:
        opts["dryRun"] = [req.query["dryRun"]]
    opts = check_delete_options(opts, invalid_status=True)
    if opts.get("dryRun") == ["All"]:
        req.query.setdefault("dryRun", "All")
    return opts


def check_delete_options(opts: dict[str, Any], *, invalid_status: bool = False) -> dict[str, Any]:
    """Refuse DeleteOptions values kube-apiserver refuses; returns `opts`.

    Malformed values are 400.  With `invalid_status` (a DELETE request) an
    unsupported propagationPolicy, or one given together with the legacy
    orphanDependents, is 422 Invalid on `DeleteOptions.meta.k8s.io` as
    kube-apiserver's ValidateDeleteOptions answers."""
    grace = opts.get("gracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool)):
        raise errors.BadRequest(f"gracePeriodSeconds: Invalid value: {json.dumps(grace)}: must be an integer")
    orphan = opts.get("orphanDependents")
    if orphan is not None and not isinstance(orphan, bool):
        raise errors.BadRequest(f"orphanDependents: Invalid value: {json.dumps(orphan)}: must be a boolean")
    pp = opts.get("propagationPolicy")
    if pp not in (None, "Background", "Foreground", "Orphan"):
        if invalid_status:
            raise errors.Invalid.for_object("DeleteOptions", "meta.k8s.io", "", [errors.cause(
                "propagationPolicy", f'Unsupported value: "{pp}": supported values: "Foreground", '
                '"Background", "Orphan", "nil"', "FieldValueNotSupported")])
        raise errors.BadRequest(f'propagationPolicy: Unsupported value: "{pp}": supported values: '
                                f'"Background", "Foreground", "Orphan"')
    if pp is not None and orphan is not None:
        raise errors.Invalid.for_object("DeleteOptions", "meta.k8s.io", "", [errors.cause(
            "propagationPolicy", f'Invalid value: "{pp}": orphanDependents and deletionPropagation '
            "cannot be both set", "FieldValueInvalid")])
    pre = opts.get("preconditions")
    if pre is not None and not isinstance(pre, dict):
        raise errors.BadRequest("preconditions must be an object")
    dry = opts.get("dryRun")
    if dry and dry != ["All"]:
        raise errors.BadRequest(f"dryRun: Unsupported value: {dry}")
    return opts


def to_scale(info: KindInfo, obj: dict[str, Any]) -> dict[str, Any]:
    s = info.scale
    assert s is not None
    md = obj["metadata"]
    sel = meta.get_path(obj, s.label_selector)
    if isinstance(sel, dict) and ("matchLabels" in sel or "matchExpressions" in sel):
        sel_s = selectors.label_selector_to_string(sel)
    elif isinstance(sel, dict):
        sel_s = ",".join(f"{k}={v}" for k, v in sorted(sel.items()))
    else:
        sel_s = ""
    scale_md = {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in md}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": scale_md,
        "spec": {"replicas": meta.get_path(obj, s.spec_replicas, 0)},
        "status": {"replicas": meta.get_path(obj, s.status_replicas, 0) or 0, "selector": sel_s},
    }


def _check_scale_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("kind", "Scale") != "Scale":
        raise errors.BadRequest("the body must be an autoscaling/v1 Scale")
    return body


__all__ = ["ResourceAPI", "Route", "parse_route"]
