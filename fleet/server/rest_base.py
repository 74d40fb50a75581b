"""The state and shared steps of the generic REST handlers: `ResourceBase` holds
what `ResourceAPI` (rest.py) is built with and the pipeline steps every verb
uses — the kind of a route, authorization attributes, apiVersion/kind and
field checks (fieldValidation), type checking, validation, the namespace
check and reading the current object.  The verbs live in rest.py (read),
rest_write.py and rest_subresources.py, as mixins over this class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleet.admission import AdmissionChain
from fleet.api import crd, errors, meta, schema, typecheck
from fleet.api.registry import KindInfo, Registry
from fleet.auth import Attributes, UserInfo
from fleet.server import crd_conversion, eviction
from fleet.server.allocation import AllocationStrategy
from fleet.server.http import Req
from fleet.server.nscache import NamespaceCache
from fleet.server.request_params import check_field_manager, is_dry_run
from fleet.server.routes import SUPPORTED_SUBRESOURCES, Route, not_found, resource_not_found
from fleet.store import KeyNotFound, Store

PATCH_RETRIES = 8


class ResourceBase:
    """What every verb mixin reads; `ResourceAPI.__init__` sets it."""

    store: Store
    namespaces: NamespaceCache | None
    registry: Registry
    admission: AdmissionChain
    budgets: eviction.DisruptionBudgets
    create_subresources: dict[tuple[str, str, str], Any]
    create_strategies: dict[tuple[str, str], Any]
    update_subresources: dict[tuple[str, str, str], Any]
    delete_strategies: dict[tuple[str, str], Any]
    allocators: dict[tuple[str, str], AllocationStrategy]
    # Authorizes `create` of `route`'s object for `user` (raising Forbidden), for writes that
    # create although their verb is not create (an apply to a missing object).  The API
    # server sets it; None (a bare ResourceAPI in tests): allowed.
    authorize_create: Callable[[UserInfo, Route, KindInfo], None] | None = None

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
        if info.prune_unknown is not None:
            # A custom resource: kube prunes at decode in every mode; Strict refuses instead.
            pruned = info.prune_unknown(obj)
            if mode == "Ignore":
                return []
            dup = [f'duplicate field "{d}"' for d in duplicates or []]
            if mode == "Strict" and (pruned or dup):
                if pruned and not dup:
                    raise errors.BadRequest(crd.strict_decoding_message(info.kind, info.version, pruned))
                raise errors.BadRequest("strict decoding error: " + ", ".join(
                    dup + crd.unknown_field_warnings(pruned)))
            return dup + crd.unknown_field_warnings(pruned)
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
            if md.get("managedFields") != [{}]:  # `[{}]` is kube's request to reset them (apply.py)
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
            obj = await self.store.get(info.key(route.namespace, route.name))
        except KeyNotFound:
            raise not_found(info, route.name) from None
        return await crd_conversion.one(info, obj)
