"""Dynamic admission webhooks: the two plugins, their configuration cache and the HTTPS call.

`MutatingWebhooks` and `ValidatingWebhooks` join the admission chain after the
built-in plugins of their half (kube-apiserver's order: MutatingAdmissionWebhook
after the built-in mutating plugins, ValidatingAdmissionWebhook after the
built-in validating ones).  Each reads its configurations from a watch-fed
`WebhookConfigCache`, so a request with no matching webhook costs a few dict
lookups and never touches the store; with no configurations at all the plugins
do nothing.

Decisions live beside this module: which webhooks a request calls in
webhook_match.py, the AdmissionReview and the meaning of an answer in
webhook_review.py.  This module is the I/O around them: the timeout
(`timeoutSeconds`, default 10) and the call, made with the HTTPS client shared with CRD
conversion webhooks (webhook_client.py: pooled clients per caBundle, `service`
references resolved to a ready endpoint and verified as `<service>.<namespace>.svc`).

Mutating webhooks run one after the other, each seeing the previous one's
result; with `reinvocationPolicy: IfNeeded` a webhook is called once more if a
later webhook changed the object after it ran.  Validating webhooks run in
parallel and the first refusal (in configuration order) is the answer.
A webhook's `matchConditions` (CEL over `object`, `oldObject`, `request`, `authorizer`; fleet/cel)
are evaluated after its rules and selectors matched: any false, it is not called;
all true, it is; an evaluation error (and no false) fails the call — refused with
failurePolicy Fail, skipped with Ignore — as kube-apiserver's matchconditions
matcher decides.
"""

from __future__ import annotations

import copy
import functools
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import trio

from fleet import cel
from fleet.admission import add_warning
from fleet.admission.policy_eval import authorizer_for, match_conditions_hold, request_variable
from fleet.admission.webhook_client import WebhookClients, post, resolve_service
from fleet.admission.webhook_match import OPERATION_OF_VERB, Request, hooks_of, webhook_matches
from fleet.admission.webhook_review import (
    CallError,
    Outcome,
    build_review,
    call_failed,
    denied,
    dry_run_unsupported,
    ignored_warning,
    parse_response,
    supports_dry_run,
)
from fleet.api import meta
from fleet.api.kinds.admissionregistration import WEBHOOK_VARIABLES
from fleet.auth import Attributes, UserInfo
from fleet.store import Store
from fleet.store.watchcache import WatchCache

log = logging.getLogger(__name__)

GROUP = "admissionregistration.k8s.io"
MUTATING_PREFIX = meta.store_key(GROUP, "mutatingwebhookconfigurations", None, None)
VALIDATING_PREFIX = meta.store_key(GROUP, "validatingwebhookconfigurations", None, None)
DEFAULT_TIMEOUT = 10


class WebhookConfigCache(WatchCache):
    """The webhook configurations of one kind (mutating or validating), watch-fed."""

    def hooks(self) -> list[tuple[str, dict[str, Any]]]:
        return hooks_of(list(self.values()))


# --------------------------------------------------------------------------- the call

async def call_webhook(store: Store, hook: dict[str, Any], review: dict[str, Any], *,
                       clients: WebhookClients | None = None) -> bytes:
    """POST the review to the webhook; the raw answer body.  Raises CallError.  With
    `clients`, the call reuses that pool's client for the webhook's caBundle (and its
    open connections); without, it opens and closes a client of its own."""
    resp = await post(hook.get("clientConfig") or {}, review,
                      timeout=hook.get("timeoutSeconds") or DEFAULT_TIMEOUT,
                      resolve=functools.partial(resolve_service, store), clients=clients)
    if resp.status_code < 200 or resp.status_code >= 300:
        raise CallError(f"expected webhook response status 200, got {resp.status_code}")
    return resp.content


# --------------------------------------------------------------------------- plugins

# The kind of the object a subresource request carries (what the AdmissionReview's
# `kind` names, as kube-apiserver sends it): (resource or "*", subresource) → GVK.
# Not `scale`: Fleet's admission chain sees the parent object of a scale write (a
# Deployment, not an autoscaling/v1 Scale), so the review names the parent's kind.
SUBRESOURCE_KINDS: dict[tuple[str, str], tuple[str, str, str]] = {
    ("pods", "binding"): ("", "v1", "Binding"),
    ("pods", "eviction"): ("policy", "v1", "Eviction"),
}



def _kind(registry: Any, attrs: Attributes) -> tuple[dict[str, str], bool]:
    """The request's GroupVersionKind (as the AdmissionReview names it) and its scope."""
    sub_kind = SUBRESOURCE_KINDS.get((attrs.resource, attrs.subresource)) or \
        SUBRESOURCE_KINDS.get(("*", attrs.subresource))
    info = None
    try:
        info = registry.get(attrs.group, attrs.version, attrs.resource) if registry else None
    except Exception:  # noqa: BLE001 - an unknown resource is sent with its resource name only
        info = None
    kind = info.kind if info is not None else ""
    namespaced = bool(info.namespaced) if info is not None else bool(attrs.namespace)
    if sub_kind is not None:
        return {"group": sub_kind[0], "version": sub_kind[1], "kind": sub_kind[2]}, namespaced
    return {"group": attrs.group, "version": attrs.version, "kind": kind}, namespaced


def _served_versions(registry: Any, group: str, resource: str) -> frozenset[str]:
    # Asked afresh (a scan of ~100 kinds, only when some webhook or policy is configured):
    # CRDs add and change versions at run time.
    infos = registry.all() if registry is not None else ()
    return frozenset(i.version for i in infos if i.group == group and i.plural == resource)


def admission_request(registry: Any, namespaces: Mapping[str, dict[str, Any]] | None, attrs: Attributes,
                      obj: dict[str, Any] | None, old: dict[str, Any] | None,
                      ) -> tuple[dict[str, str], Request | None]:
    """(kind, matcher Request) of an admission request; Request None for verbs admission
    never intercepts.  Shared by the webhook and the ValidatingAdmissionPolicy plugins."""
    kind, namespaced = _kind(registry, attrs)
    op = OPERATION_OF_VERB.get(attrs.verb)
    if op is None:
        return kind, None
    ns_labels = None
    if attrs.namespace and namespaces is not None:
        ns = namespaces.get(attrs.namespace)
        ns_labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
    return kind, Request(op, attrs.group, attrs.version, attrs.resource, attrs.subresource, attrs.namespace,
                         namespaced, obj, old, ns_labels, _served_versions(registry, attrs.group, attrs.resource))


class _WebhookPlugin:
    mutating = False

    def __init__(self, store: Store, registry: Any, cache: WebhookConfigCache,
                 namespaces: Mapping[str, dict[str, Any]] | None = None, *, call: Any = None,
                 clients: WebhookClients | None = None, authorizer: Any = None) -> None:
        self.store = store
        self.registry = registry
        self.cache = cache
        self.namespaces = namespaces
        # async (store, hook, review) -> body; tests substitute the transport.
        self.call = call or functools.partial(call_webhook, clients=clients or WebhookClients())
        # The server's Authorizer, for matchConditions' `authorizer` (None: its checks error).
        self.authorizer = authorizer

    def matching(self, attrs: Attributes, obj: dict[str, Any] | None,
                 old: dict[str, Any] | None) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, str], Request | None]:
        if not self.cache:
            return [], {}, None
        kind, req = admission_request(self.registry, self.namespaces, attrs, obj, old)
        if req is None:
            return [], kind, None
        out = []
        for c, h in self.cache.hooks():
            try:
                if webhook_matches(h, req):
                    out.append((c, h))
            except Exception:  # noqa: BLE001 - a stored object that validation never saw
                log.warning("webhook configuration %s: webhook %r is malformed; skipped", c, h.get("name"),
                            exc_info=True)
        return out, kind, req

    async def _call(self, name: str, hook: dict[str, Any], attrs: Attributes, user: UserInfo,
                    kind: dict[str, str], req: Request, obj: dict[str, Any] | None,
                    old: dict[str, Any] | None) -> Outcome | None:
        """One call; None when it was not made (a false matchCondition) or failed with
        failurePolicy Ignore.  Raises on refusal."""
        if hook.get("matchConditions") and not self._conditions_hold(name, hook, attrs, user, kind, req, obj, old):
            return None
        if attrs.dry_run and not supports_dry_run(hook):
            raise dry_run_unsupported(name)
        uid = str(uuid.uuid4())
        review = build_review(uid=uid, kind=kind, resource={"group": attrs.group, "version": attrs.version,
                                                          "resource": attrs.resource},
                              subresource=attrs.subresource, name=attrs.name or _name(obj, old),
                              namespace=attrs.namespace, operation=req.operation, user=user,
                              obj=obj, old=old, dry_run=attrs.dry_run)
        try:
            body = await self.call(self.store, hook, review)
            outcome = parse_response(body, uid, mutating=self.mutating, obj=obj)
            if outcome.patched is not None:
                check_identity(obj, outcome.patched)
        except (CallError, AttributeError, TypeError, ValueError) as e:
            # (The latter three: a malformed clientConfig in a stored object.)
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("failed calling webhook \"%s\" (ignored): %s", name, e)
                add_warning(ignored_warning(name, str(e)))
                return None
            raise call_failed(name, str(e)) from None
        for w in outcome.warnings:
            add_warning(w)
        _record_audit_annotations(name, outcome.audit_annotations)
        if not outcome.allowed:
            raise denied(name, outcome.status)
        return outcome


    def _conditions_hold(self, name: str, hook: dict[str, Any], attrs: Attributes, user: UserInfo,
                         kind: dict[str, str], req: Request, obj: dict[str, Any] | None,
                         old: dict[str, Any] | None) -> bool:
        """The webhook's matchConditions (raises the call failure for an error under Fail)."""
        act = cel.to_activation({"object": obj, "oldObject": old,
                                 "request": request_variable(attrs, user, kind, req, obj, old)})
        act["authorizer"] = authorizer_for(self.authorizer.authorize if self.authorizer is not None else None,
                                           user, attrs)
        try:
            return match_conditions_hold(hook["matchConditions"], act, WEBHOOK_VARIABLES)
        except cel.EvalError as e:
            why = f"failed to evaluate match conditions: {e}"
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("webhook \"%s\" skipped (failurePolicy Ignore): %s", name, why)
                return False
            raise call_failed(name, why) from None


IDENTITY_FIELDS = ("name", "namespace", "uid", "generateName")


def check_identity(before: dict[str, Any] | None, after: dict[str, Any]) -> None:
    """A mutating webhook may not rename or move the object it was asked about (the request
    names it; the store key is derived from it)."""
    md0 = (before or {}).get("metadata") if isinstance((before or {}).get("metadata"), dict) else {}
    md1 = after.get("metadata") if isinstance(after.get("metadata"), dict) else {}
    for f in IDENTITY_FIELDS:
        if (md0 or {}).get(f) != (md1 or {}).get(f):
            raise CallError(f"the patch may not change metadata.{f}")


def _name(obj: dict[str, Any] | None, old: dict[str, Any] | None) -> str:
    for o in (obj, old):
        md = o.get("metadata") if isinstance(o, dict) else None
        if isinstance(md, dict) and isinstance(md.get("name"), str):
            return md["name"]
    return ""


def _record_audit_annotations(hook_name: str, annotations: dict[str, str]) -> None:
    """A webhook's auditAnnotations, keyed `<webhook name>/<key>` as kube-apiserver does."""
    from fleet.auth.audit import record_annotation

    for k, val in annotations.items():
        record_annotation(f"{hook_name}/{k}", val)


class MutatingWebhooks(_WebhookPlugin):
    """MutatingAdmissionWebhook."""

    name = "MutatingAdmissionWebhook"
    mutating = True

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        hooks, kind, req = self.matching(attrs, obj, old)
        if not hooks or req is None:
            return obj
        # (position, object after it ran) per webhook, for reinvocationPolicy IfNeeded.
        after: dict[int, dict[str, Any]] = {}
        for i, (_cfg, hook) in enumerate(hooks):
            obj = await self._mutate_once(hook, attrs, user, kind, req, obj, old)
            after[i] = copy.deepcopy(obj)
        # Reinvoke (once) the IfNeeded webhooks whose output a later webhook changed.
        for i, (_cfg, hook) in enumerate(hooks):
            if hook.get("reinvocationPolicy") == "IfNeeded" and after[i] != obj:
                obj = await self._mutate_once(hook, attrs, user, kind, req, obj, old)
        return obj

    async def _mutate_once(self, hook: dict[str, Any], attrs: Attributes, user: UserInfo,
                           kind: dict[str, str], req: Request, obj: dict[str, Any],
                           old: dict[str, Any] | None) -> dict[str, Any]:
        name = str(hook.get("name", ""))
        outcome = await self._call(name, hook, attrs, user, kind, req, obj, old)
        if outcome is not None and outcome.patched is not None:
            return outcome.patched
        return obj


class ValidatingWebhooks(_WebhookPlugin):
    """ValidatingAdmissionWebhook: the matching webhooks in parallel."""

    name = "ValidatingAdmissionWebhook"

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        hooks, kind, req = self.matching(attrs, obj, old)
        if not hooks or req is None:
            return
        results: list[BaseException | None] = [None] * len(hooks)

        async def one(i: int, hook: dict[str, Any]) -> None:
            try:
                await self._call(str(hook.get("name", "")), hook, attrs, user, kind, req, obj, old)
            except Exception as e:  # noqa: BLE001 - collected; the first in order is raised
                results[i] = e

        async with trio.open_nursery() as nursery:
            for i, (_cfg, hook) in enumerate(hooks):
                nursery.start_soon(one, i, hook)
        for e in results:
            if e is not None:
                raise e


def webhook_plugins(store: Store, registry: Any, mutating_cache: WebhookConfigCache,
                    validating_cache: WebhookConfigCache,
                    namespaces: Mapping[str, dict[str, Any]] | None = None, authorizer: Any = None,
                    ) -> tuple[MutatingWebhooks, ValidatingWebhooks]:
    """The (MutatingAdmissionWebhook, ValidatingAdmissionWebhook) pair for `builtin_chain`, sharing
    one pool of webhook clients; `authorizer` answers matchConditions' CEL `authorizer`."""
    clients = WebhookClients()
    return (MutatingWebhooks(store, registry, mutating_cache, namespaces, clients=clients, authorizer=authorizer),
            ValidatingWebhooks(store, registry, validating_cache, namespaces, clients=clients,
                               authorizer=authorizer))
