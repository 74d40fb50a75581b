"""Generic REST over the kind registry: one handler for every kind.

A request path is parsed into a `Route` (group, version, namespace, plural,
name, subresource); the kind's `KindInfo` then drives everything: defaulting,
validation, tables, scale, status.  What differs per kind is a strategy, never
a branch on a kind's name: fields of the `KindInfo` (`status_on_create`,
`delete_grace` — the Pod's graceful deletion —, `prepare_update`), the
allocation strategies (`allocators`, see allocation.py), and three tables on
`ResourceAPI` — the POSTed subresources (`pods/binding`, `pods/eviction`) and
collections (`bindings`), the
PUT ones (`namespaces/finalize`) and the kinds whose DELETE is their own (a
namespace starts finalization instead of being removed at once).  Resources
served by a handler of their own
(nodes' `drain`/`schedulable`, metrics.k8s.io, autoscaling/v1) are a table in
app.py.

The handlers are split by job: `routes.py` (paths → `Route`, the subresource
table), `request_params.py` (body decoding, query parameters, continue
tokens, DeleteOptions), `rest_base.py` (the shared pipeline steps),
`rest_write.py` (create, update, patch, delete), `rest_subresources.py`
(binding, eviction, scale); this module composes them into `ResourceAPI`
and holds the read verbs (get, list; watch is watch.py), whose answer's shape
— the object, a Table, PartialObjectMetadata(List) — negotiate.py chooses.

Every handler follows the pipeline order of kube-apiserver: decode → default
→ mutating admission → validate → validating admission → store.
Authentication and authorization happened before (see access.py), and anything
that goes wrong raises an `APIError`, rendered as a Status by the caller.
"""
from __future__ import annotations

import json
from typing import Any

import trio

from fleet.admission import AdmissionChain
from fleet.api import errors, selectors
from fleet.api.registry import KindInfo, Registry
from fleet.server import crd_conversion, eviction
from fleet.server.allocation import AllocationStrategy
from fleet.server.http import Req, Resp
from fleet.server.negotiate import negotiate, render_list, render_object
from fleet.server.nscache import NamespaceCache
from fleet.server.request_params import (
    _MAX_INT64,
    _int_param,
    decode_continue,
    encode_continue,
    parse_rv,
)
from fleet.server.rest_subresources import SubresourceVerbs, to_scale
from fleet.server.rest_write import WriteVerbs
from fleet.server.routes import Route
from fleet.store import RevisionCompacted, RevisionTooLarge, Store


class ResourceAPI(WriteVerbs, SubresourceVerbs):
    """The generic handlers.  One instance per server."""

    def __init__(self, store: Store, registry: Registry, admission: AdmissionChain,
                 namespaces: NamespaceCache | None = None) -> None:
        self.store = store
        self.namespaces = namespaces
        self.registry = registry
        self.admission = admission
        # The disruption-budget seam of the eviction subresource (see eviction.py).
        self.budgets = eviction.DisruptionBudgets(store, registry)
        # Per-kind strategies as tables (Kubernetes' rest.Storage per resource), so
        # the generic handlers below never branch on a kind's name: the POSTed
        # and PUT subresources by (group, plural, subresource), and the kinds whose
        # DELETE is not the generic one (a namespace starts finalization).
        self.create_subresources: dict[tuple[str, str, str], Any] = {
            ("", "pods", "binding"): self.bind,
            ("", "pods", "eviction"): self.evict,
        }
        # Collections whose POST is a verb of another resource rather than a stored
        # create: `bindings` binds the pod its Binding names (pods/{name}/binding).
        self.create_strategies: dict[tuple[str, str], Any] = {
            ("", "bindings"): self._create_binding,
        }
        self.update_subresources: dict[tuple[str, str, str], Any] = {
            ("", "namespaces", "finalize"): self._finalize_namespace,
        }
        self.delete_strategies: dict[tuple[str, str], Any] = {
            ("", "namespaces"): self._delete_namespace,
        }
        # Allocation strategies by (group, plural) (fleet/server/allocation.py):
        # cluster-unique values a kind takes outside its object.  Registered by
        # the server (run.py: the Service's ClusterIP/NodePort allocator).
        self.allocators: dict[tuple[str, str], AllocationStrategy] = {}


    # -------------------------------------------------------------------- read
    async def get(self, info: KindInfo, route: Route, req: Req) -> Resp:
        target = negotiate(req.headers.get("accept", ""))
        obj = await self.get_current(info, route)
        if route.subresource == "scale":
            return Resp.json(200, to_scale(info, obj))
        return Resp.json(200, render_object(info, obj, target, req.query))

    def selectors(self, info: KindInfo, req: Req) -> tuple[selectors.LabelSelector, selectors.FieldSelector]:
        ls = selectors.parse_label_selector(req.query.get("labelSelector", ""))
        fs = selectors.parse_field_selector(req.query.get("fieldSelector", ""), info.field_selectable)
        return ls, fs

    async def list(self, info: KindInfo, route: Route, req: Req) -> Resp:
        target = negotiate(req.headers.get("accept", ""))
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
        items = await crd_conversion.to_version(info, items)
        return Resp.json(200, render_list(info, items, target, req.query, resource_version=str(revision),
                                          cont=token, remaining=remaining if (ls.empty() and fs.empty()) else None))


__all__ = ["ResourceAPI"]
