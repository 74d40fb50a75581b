"""ClusterRole aggregation: a ClusterRole with `aggregationRule.clusterRoleSelectors`
holds the union of the rules of every ClusterRole those selectors match.

As kube-controller-manager's clusterrole-aggregation controller: `admin`, `edit` and
`view` are empty shells filled from `system:aggregate-to-*` — and from any
ClusterRole a user labels `rbac.authorization.k8s.io/aggregate-to-view: "true"`, which
is how an extension (a CRD's author) grants its kinds to the standard roles.

Any ClusterRole changing re-queues every aggregated one (a label change can move a
role into or out of a selector).  `aggregate_rules` is the pure decision: the matched
roles in name order, skipping the aggregated role itself, each rule once (first
occurrence wins), so the result is stable and a no-op write never happens.  The
write is a merge patch of `rules` under the revision it was computed from; a
conflict re-queues.  The controller manager's role carries `escalate` on
clusterroles, since it writes rules it need not hold itself.
"""

from __future__ import annotations

from typing import Any

from fleet.api.errors import BadRequest
from fleet.api.selectors import label_selector_from_dict
from fleet.client import MERGE_PATCH, ApiException
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer

API_VERSION = "rbac.authorization.k8s.io/v1"
PLURAL = "clusterroles"


def _rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    rules = role.get("rules")
    return [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []


def aggregate_rules(role: dict[str, Any], roles: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The rules `role` should hold, or None when it is not aggregated (or its
    selectors do not parse)."""
    agg = role.get("aggregationRule")
    if not isinstance(agg, dict):
        return None
    name = (role.get("metadata") or {}).get("name")
    ordered = sorted(roles, key=lambda r: str((r.get("metadata") or {}).get("name", "")))
    out: list[dict[str, Any]] = []
    for sel in agg.get("clusterRoleSelectors") or []:
        try:
            selector = label_selector_from_dict(sel)
        except BadRequest:
            return None
        for other in ordered:
            md = other.get("metadata") or {}
            if md.get("name") == name or not selector.matches(md.get("labels")):
                continue
            for r in _rules(other):
                if r not in out:
                    out.append(r)
    return out


class ClusterRoleAggregationController(QueueWorker):
    name = "clusterrole-aggregation"
    kind = "ClusterRole"
    workers = 1

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.roles: SharedInformer = ctx.informers.informer(API_VERSION, PLURAL)
        self.roles.add_handler(lambda t, old, new: self.enqueue_aggregated())

    def enqueue_aggregated(self) -> None:
        for r in self.roles.list():
            if isinstance(r.get("aggregationRule"), dict):
                self.enqueue(r)

    async def reconcile(self, key: str) -> float | None:
        role = self.roles.get(key)
        if role is None:
            return None
        want = aggregate_rules(role, self.roles.list())
        if want is None or want == _rules(role):
            return None
        md = role["metadata"]
        try:
            await self.ctx.client.patch(API_VERSION, PLURAL, md["name"],
                                        {"metadata": {"resourceVersion": md.get("resourceVersion")},
                                         "rules": want}, MERGE_PATCH)
        except ApiException as e:
            if e.code == 404:
                return None
            if e.code == 409:
                return 0.1  # our cache was behind; it catches up
            raise
        return None


__all__ = ["ClusterRoleAggregationController", "aggregate_rules"]
