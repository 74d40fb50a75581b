"""The ValidatingAdmissionPolicy admission plugin: its caches and the per-request loop.

kube-apiserver runs ValidatingAdmissionPolicy after MutatingAdmissionWebhook and
before ValidatingAdmissionWebhook; so does Fleet's chain (fleet/admission/__init__.py).
Every decision is in policy_eval.py; this module finds the objects:

- policies and bindings from two watch-fed `WatchCache`s — a request when no
  binding exists costs one length check;
- params (a policy's `paramKind`, any kind the registry serves) from a watch-fed
  cache per kind, started the first time a binding needs that kind and read from
  the store until it has synced;
- the namespace (`namespaceObject`, namespaceSelector) from the server's namespace
  cache.

For every binding whose policy matches the request, and for every param it
selects (a binding with a selector judges the request once per param), the
policy is evaluated and the binding's validationActions applied; then the first
denial refuses the request (with its validation's reason and code, kube's
`<resource> "<name>" is forbidden: ValidatingAdmissionPolicy ...` message),
warnings go to the response and audit annotations to the audit event.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio

from fleet.admission import add_warning
from fleet.admission import policy_eval as pe
from fleet.admission.webhook import admission_request
from fleet.admission.webhook_match import Request
from fleet.api import errors, meta
from fleet.auth import Attributes, UserInfo
from fleet.store import KeyNotFound, Store
from fleet.store.watchcache import WatchCache, by_namespace

log = logging.getLogger(__name__)

GROUP = "admissionregistration.k8s.io"
POLICIES_PREFIX = meta.store_key(GROUP, "validatingadmissionpolicies", None, None)
BINDINGS_PREFIX = meta.store_key(GROUP, "validatingadmissionpolicybindings", None, None)


class ParamCaches:
    """Watch-fed caches of param kinds, one per store prefix, started on first use
    inside the nursery `run` opens (without one running: read from the store)."""

    def __init__(self) -> None:
        self._caches: dict[str, WatchCache] = {}
        self._nursery: trio.Nursery | None = None
        self._store: Store | None = None

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery, self._store = nursery, store
            # (Re)start the caches of a previous run (a supervised restart).
            for prefix in list(self._caches):
                self._caches[prefix] = WatchCache(prefix, indexes={"namespace": by_namespace})
                nursery.start_soon(self._caches[prefix].run, store)
            task_status.started()
            await trio.sleep_forever()

    def cache(self, prefix: str) -> WatchCache | None:
        """The synced cache of `prefix`, starting one when there is none (None until synced)."""
        c = self._caches.get(prefix)
        if c is None:
            c = self._caches[prefix] = WatchCache(prefix, indexes={"namespace": by_namespace})
            if self._nursery is not None and self._store is not None:
                self._nursery.start_soon(c.run, self._store)
        return c if c.synced else None


class ValidatingAdmissionPolicy:
    """The ValidatingAdmissionPolicy plugin."""

    name = "ValidatingAdmissionPolicy"

    def __init__(self, store: Store, registry: Any, policies: Mapping[str, dict[str, Any]],
                 bindings: Mapping[str, dict[str, Any]], namespaces: Mapping[str, dict[str, Any]] | None = None,
                 params: ParamCaches | None = None, authorizer: Any = None) -> None:
        self.store = store
        self.registry = registry
        self.policies = policies
        self.bindings = bindings
        self.namespaces = namespaces
        self.params = params if params is not None else ParamCaches()
        # The server's Authorizer, for CEL's `authorizer` (None: its checks error).
        self.authorizer = authorizer

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if not self.bindings:
            return
        kind, req = admission_request(self.registry, self.namespaces, attrs, obj, old)
        if req is None:
            return
        pairs = []
        for bname in sorted(self.bindings):
            binding = self.bindings[bname]
            spec = binding.get("spec") if isinstance(binding.get("spec"), dict) else {}
            policy = self.policies.get(str(spec.get("policyName") or ""))
            if policy is None:
                continue  # a binding of a missing policy is ignored, as in kube-apiserver
            try:
                if pe.binding_applies(policy, binding, req):
                    pairs.append((policy, binding))
            except Exception:  # noqa: BLE001 - a stored object validation never saw
                log.warning("policy binding %s is malformed; skipped", bname, exc_info=True)
        if not pairs:
            return
        # kube-apiserver's order: policy by policy, each policy's bindings in turn.
        pairs.sort(key=lambda pb: (_name(pb[0]), _name(pb[1])))
        request = pe.request_variable(attrs, user, kind, req, obj, old)
        authz = pe.authorizer_for(self.authorizer.authorize, user, attrs) if self.authorizer is not None else None
        base = pe.request_activation(obj=obj, old=old, request=request, namespace_object=self._namespace_object(req),
                                     authorizer=authz)
        verdict = pe.Verdict()
        for policy, binding in pairs:
            pname = str((policy.get("metadata") or {}).get("name", ""))
            spec = policy.get("spec") if isinstance(policy.get("spec"), dict) else {}
            fail = spec.get("failurePolicy", "Fail") != "Ignore"
            try:
                params_list: list[dict[str, Any] | None] = await self._params(spec.get("paramKind"), binding, req)
            except pe.ConfigError as e:
                if fail:
                    verdict.deny(pname, _name(binding), str(e))
                else:
                    log.info("policy %s binding %s: %s (failurePolicy Ignore)", pname, _name(binding), e)
                continue
            for params in params_list:
                act = pe.policy_activation(base, params, list(spec.get("variables") or []))
                result = pe.evaluate(policy, act)
                if result is None:
                    continue
                pe.apply_actions(verdict, pname, binding, result.failures)
                for err in result.errors:
                    verdict.deny(pname, _name(binding), err)
                verdict.add_annotations(result.annotations)
        _publish(verdict)
        if verdict.denial is not None:
            message, reason = verdict.denial
            qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
            name = attrs.name or _name(obj) or _name(old)
            text = f'{qualified} "{name}" is forbidden: {message}' if name else f"{qualified} is forbidden: {message}"
            raise errors.APIError(text, code=pe.reason_code(reason), reason=reason, name=name, group=attrs.group,
                                  kind=attrs.resource, causes=[{"message": message}])

    def _namespace_object(self, req: Request) -> dict[str, Any] | None:
        # A Namespace itself has no namespaceObject (kube-apiserver unsets it).
        if not req.namespace or self.namespaces is None or (req.group == "" and req.resource == "namespaces"):
            return None
        return self.namespaces.get(req.namespace)

    async def _params(self, param_kind: Any, binding: dict[str, Any], req: Request) -> list[dict[str, Any] | None]:
        """The params to evaluate with ([None] when the policy has no paramKind)."""
        if not isinstance(param_kind, dict):
            return [None]
        info = self.registry.by_kind(str(param_kind.get("apiVersion", "")), str(param_kind.get("kind", ""))) \
            if self.registry is not None else None
        if info is None:
            raise pe.ConfigError(f"failed to configure policy: failed to find resource referenced by paramKind: "
                                 f"'{param_kind.get('apiVersion', '')}, Kind={param_kind.get('kind', '')}'")
        lookup = pe.param_lookup(binding, req, bool(info.namespaced))
        found = pe.select_params(lookup, await self._candidates(info, lookup))
        return list(found)

    async def _candidates(self, info: Any, lookup: pe.ParamLookup) -> list[dict[str, Any]]:
        prefix = meta.store_key(info.group, info.plural, None, None)
        cache = self.params.cache(prefix)
        if cache is not None:
            if lookup.name is not None:
                key = f"{lookup.namespace}/{lookup.name}" if lookup.namespace else lookup.name
                o = cache.get(key)
                return [o] if o is not None else []
            if lookup.namespace:
                return cache.by_index("namespace", lookup.namespace)
            return list(cache.values())
        if lookup.name is not None:
            try:
                return [await self.store.get(meta.store_key(info.group, info.plural, lookup.namespace,
                                                            lookup.name))]
            except KeyNotFound:
                return []
        res = await self.store.list(meta.store_key(info.group, info.plural, lookup.namespace, None))
        return list(res.items)


def _name(obj: dict[str, Any] | None) -> str:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return str(md.get("name") or "") if isinstance(md, dict) else ""


def _publish(verdict: pe.Verdict) -> None:
    from fleet.auth.audit import record_annotation

    for w in verdict.warnings:
        add_warning(w)
    for k, val in verdict.annotation_values().items():
        record_annotation(k, val)
    audit = verdict.audit_value()
    if audit is not None:
        record_annotation(pe.VALIDATION_FAILURE_ANNOTATION, audit)


class PolicyCache(WatchCache):
    """ValidatingAdmissionPolicies (or their bindings), by name, watch-fed."""


def policy_caches() -> tuple[PolicyCache, PolicyCache]:
    """The (policies, bindings) caches `fleet server` runs."""
    return PolicyCache(POLICIES_PREFIX), PolicyCache(BINDINGS_PREFIX)
