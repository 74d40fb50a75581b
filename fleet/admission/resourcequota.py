"""ResourceQuota admission: charge each new object to its namespace's quotas, or refuse it.

kube-apiserver's plugin (apiserver/pkg/admission/plugin/resourcequota), last
in the validating chain so it charges exactly what will be stored:

1. The object's evaluator (fleet/api/quota.py) says whether this request can
   change usage at all — pod, object-count and claim creates; service and
   claim updates — and what the object uses.
2. Each quota of the namespace whose `status.hard` names something the
   evaluator counts, and whose scopes select the object, applies.  A quota
   applying to cpu or memory makes every container state them ("failed quota:
   q: must specify cpu for: app"); a quota whose usage the controller has not
   computed yet refuses ("status unknown for quota: q, resources: pods").
3. Usage + request must stay within `status.hard` for every resource
   requested, else 403 Forbidden, worded as kube-apiserver words it:

       pods "p3" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2

4. The new usage is written to the quota's `status.used` *before* the object
   is stored, with the quota's resourceVersion as a precondition.

**Why two creates can never both take the last unit.**  Within one server,
quota charges of a namespace are serialized (a lock per namespace, where
kube-apiserver batches a namespace's requests on one worker), and each charge
re-reads the quotas from the store.  Against any other writer — the quota
controller recomputing usage, another API server — the revision precondition
decides: a stale charge fails with a conflict, is re-evaluated against the
fresh quota (3 retries, as in Kubernetes) and refused if it no longer fits.

A charge is never given back by admission: if the object then fails to be
stored, or when it is deleted, the quota controller recomputes usage from the
objects (on deletions at once, otherwise at its periodic resync), exactly as
in Kubernetes.  Dry-run requests are checked but charge nothing.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from fleet.admission.objcache import NamespacedCache
from fleet.admission.priority import forbidden
from fleet.api import errors, meta
from fleet.api import quota as q
from fleet.auth import Attributes, UserInfo
from fleet.store import KeyNotFound, RevisionConflict, Store

PREFIX = meta.store_key("", "resourcequotas", None)
# Charging usage conflicts with a concurrent writer at most this many times before the
# request fails (kube-apiserver's checkQuotas retries 3 times).
RETRIES = 3
# Events are never charged (kube-apiserver ignores them: they are the system's own record).
IGNORED = frozenset({("", "events"), ("events.k8s.io", "events")})


def quotas_prefix(namespace: str) -> str:
    return meta.store_key("", "resourcequotas", namespace)


class QuotaRefused(Exception):
    """The request does not fit; the message is the part after `is forbidden: `."""


@dataclass(frozen=True)
class Request:
    """What check_request needs to know about the request."""

    verb: str  # create, update or patch
    subresource: str = ""


def _status_list(quota: dict[str, Any], key: str) -> q.ResourceList:
    return q.parse_list(((quota.get("status") or {}).get(key)) or {})


def check_request(quotas: Sequence[dict[str, Any]], evaluator: q.Evaluator, req: Request,
                  obj: dict[str, Any], old: dict[str, Any] | None, now: float) -> list[dict[str, Any]]:
    """CheckRequest: the quotas as they would be with this request charged (copies of the
    ones that change); raises QuotaRefused when the request does not fit.

    Pure: the plugin decides what to write.
    """
    interesting: list[int] = []
    for i, quota in enumerate(quotas):
        if not q.matches(evaluator, quota, obj):
            continue
        name = quota["metadata"]["name"]
        hard = _status_list(quota, "hard")
        restricted = evaluator.matching_resources(hard)
        problem = evaluator.constraints(restricted, obj)
        if problem:
            raise QuotaRefused(f"failed quota: {name}: {problem}")
        used = _status_list(quota, "used")
        unknown = sorted(r for r in restricted if r in hard and r not in used)
        if unknown:
            raise QuotaRefused(f"status unknown for quota: {name}, resources: {','.join(sorted(restricted))}")
        interesting.append(i)
    if not interesting:
        return list(quotas)
    usage = evaluator.usage(obj, now)
    bad = q.negative(usage)
    if bad:
        raise QuotaRefused(f"quota usage is negative for resource(s): {','.join(bad)}")
    deltas = {i: usage for i in interesting}
    if req.verb in ("update", "patch") and old is not None and (old.get("metadata") or {}).get("resourceVersion"):
        # An update is charged only what it adds (never negative), to the quotas the
        # old object was already charged to; others pay for the whole object.
        delta = q.subtract_non_negative(usage, evaluator.usage(old, now))
        for i in interesting:
            if q.matches(evaluator, quotas[i], old):
                deltas[i] = delta
    deltas = {i: d for i, d in ((i, q.remove_zeros(d)) for i, d in deltas.items()) if d}
    if not deltas:
        return list(quotas)
    out = list(quotas)
    for i, delta in deltas.items():
        quota = quotas[i]
        hard = _status_list(quota, "hard")
        used = _status_list(quota, "used")
        requested = q.mask(delta, hard)
        new_used = q.add(used, requested)
        if req.subresource != "status":
            ok, exceeded = q.less_than_or_equal(q.mask(new_used, requested), hard)
            if not ok:
                raise QuotaRefused(
                    f"exceeded quota: {quota['metadata']['name']}, "
                    f"requested: {q.pretty(q.mask(requested, exceeded))}, "
                    f"used: {q.pretty(q.mask(used, exceeded))}, "
                    f"limited: {q.pretty(q.mask(hard, exceeded))}")
        changed = copy.deepcopy(quota)
        changed.setdefault("status", {})["used"] = q.to_json(new_used)
        out[i] = changed
    return out


class ResourceQuota:
    """The validating plugin (see the module docstring)."""

    name = "ResourceQuota"

    def __init__(self, store: Store, cache: NamespacedCache | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.cache = cache
        self.clock = clock
        self._locks: dict[str, trio.Lock] = {}
        self._waiters: dict[str, int] = {}

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if obj is None or not attrs.namespace or attrs.verb not in ("create", "update", "patch"):
            return
        if (attrs.group, attrs.resource) in IGNORED:
            return
        evaluator = q.evaluator_for(attrs.group, attrs.resource)
        if not evaluator.handles(attrs.verb, attrs.subresource):
            return
        # The hot path: no quota in this namespace (asked of the cache when one runs).
        if self.cache is not None and self.cache.synced:
            if not self.cache.in_namespace(attrs.namespace):
                return
        elif not (await self.store.list(quotas_prefix(attrs.namespace))).items:
            return
        ns = attrs.namespace
        self._waiters[ns] = self._waiters.get(ns, 0) + 1
        lock = self._locks.setdefault(ns, trio.Lock())
        try:
            async with lock:
                await self._charge(attrs, evaluator, obj, old)
        finally:
            self._waiters[ns] -= 1
            if not self._waiters[ns]:
                del self._waiters[ns]
                del self._locks[ns]

    async def _charge(self, attrs: Attributes, evaluator: q.Evaluator, obj: dict[str, Any],
                      old: dict[str, Any] | None) -> None:
        req = Request(attrs.verb, attrs.subresource)
        quotas = (await self.store.list(quotas_prefix(attrs.namespace))).items
        conflicted = ""
        for _attempt in range(RETRIES + 1):
            if not quotas:
                return
            try:
                charged = check_request(quotas, evaluator, req, obj, old, self.clock())
            except QuotaRefused as e:
                raise forbidden(attrs.resource, attrs.group, attrs.name, str(e)) from None
            if attrs.dry_run:
                return
            failed: list[str] = []
            for before, after in zip(quotas, charged, strict=True):
                if after is before:
                    continue
                name = before["metadata"]["name"]
                try:
                    await self.store.update(meta.store_key("", "resourcequotas", attrs.namespace, name), after,
                                            expected_revision=int(before["metadata"]["resourceVersion"]))
                except RevisionConflict:
                    failed.append(name)
                except KeyNotFound:
                    pass  # deleted meanwhile: nothing to charge
            if not failed:
                return
            conflicted = failed[0]
            # Re-evaluate only the quotas whose charge lost a race, at their fresh state;
            # the others are charged already.
            fresh = (await self.store.list(quotas_prefix(attrs.namespace))).items
            quotas = [o for o in fresh if o["metadata"]["name"] in failed]
        raise errors.Conflict(f'Operation cannot be fulfilled on resourcequotas "{conflicted}": the object has '
                              "been modified; please apply your changes to the latest version and try again",
                              name=conflicted, kind="resourcequotas")
