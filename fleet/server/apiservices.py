"""The Local APIServices: one per group-version the server serves, and the order
discovery lists groups in.

kube-apiserver's `kube-apiserver-autoregistration` hook creates an APIService
with no `spec.service` ("Local") for each group-version it serves itself, with the
group and version priorities of a fixed table (cmd/kube-apiserver/app/aggregator.go
and pkg/controlplane/apiserver's DefaultGenericAPIServicePriorities), labelled
`kube-aggregator.kubernetes.io/automanaged: onstart`.  The aggregator then lists
groups in discovery by those priorities: highest group priority first, the
aggregator's own `apiregistration.k8s.io` always at the top, then by name.

Fleet does the same at every start (`reconcile`, beside the RBAC bootstrap):

* `desired(registry)` — pure: the APIServices for the registry's group-versions;
* `plan(desired, existing)` — pure, kube's autoregister rules for on-start
  objects: create what is missing, put back the spec of an automanaged one that
  drifted, delete automanaged ones for group-versions no longer served, and leave
  alone any APIService a user created without the label (e.g. metrics-server's
  own registration applied from its manifest).

Priorities for groups kube-apiserver does not serve itself: `metrics.k8s.io`
gets metrics-server's (100/100), so discovery lists it last as a cluster with
metrics-server does; the Gateway API and `fleet.dev` get what kube gives CRD
groups (1000/100).  `apiregistration.k8s.io` has no APIService (kube gives it
none either; discovery puts it first regardless).
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from fleet.api.kinds import apiregistration
from fleet.api.registry import Registry
from fleet.store.base import KeyExists, KeyNotFound, RevisionConflict, Store

log = logging.getLogger(__name__)

AUTOMANAGED = "kube-aggregator.kubernetes.io/automanaged"
ON_START = "onstart"
# kube-aggregator's APIRegistrationGroupPriority: above any APIService's (max 20000).
APIREGISTRATION_PRIORITY = 20001

# (group, version) -> (groupPriorityMinimum, versionPriority): kube-apiserver 1.32's table.
KUBE_PRIORITIES: dict[tuple[str, str], tuple[int, int]] = {
    ("", "v1"): (18000, 1),
    ("apps", "v1"): (17800, 15),
    ("events.k8s.io", "v1"): (17750, 15),
    ("authentication.k8s.io", "v1"): (17700, 15),
    ("authorization.k8s.io", "v1"): (17600, 15),
    ("autoscaling", "v1"): (17500, 15),
    ("autoscaling", "v2"): (17500, 30),
    ("batch", "v1"): (17400, 15),
    ("certificates.k8s.io", "v1"): (17300, 15),
    ("networking.k8s.io", "v1"): (17200, 15),
    ("policy", "v1"): (17100, 15),
    ("rbac.authorization.k8s.io", "v1"): (17000, 15),
    ("storage.k8s.io", "v1"): (16800, 15),
    ("apiextensions.k8s.io", "v1"): (16700, 15),
    ("admissionregistration.k8s.io", "v1"): (16700, 15),
    ("scheduling.k8s.io", "v1"): (16600, 15),
    ("coordination.k8s.io", "v1"): (16500, 15),
    ("node.k8s.io", "v1"): (16300, 15),
    ("discovery.k8s.io", "v1"): (16200, 15),
    ("flowcontrol.apiserver.k8s.io", "v1"): (16100, 21),
}
# Groups kube-apiserver does not serve itself: metrics-server's registration, and
# what kube's CRD registration gives custom resource groups.
METRICS_PRIORITY = (100, 100)
CRD_LIKE_PRIORITY = (1000, 100)
EXTRA_PRIORITIES: dict[str, tuple[int, int]] = {"metrics.k8s.io": METRICS_PRIORITY}


def priority(group: str, version: str) -> tuple[int, int]:
    """(groupPriorityMinimum, versionPriority) of a group-version Fleet serves."""
    if (group, version) in KUBE_PRIORITIES:
        return KUBE_PRIORITIES[(group, version)]
    return EXTRA_PRIORITIES.get(group, CRD_LIKE_PRIORITY)


_KUBE_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def _version_key(version: str) -> tuple[int, int, int, str]:
    """version.CompareKubeAwareVersionStrings as a sort key: GA, then beta, then alpha,
    higher numbers first; versions that are not kube-like last, alphabetically."""
    m = _KUBE_VERSION.match(version)
    if m is None:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)


def ordered_group_versions(registry: Registry) -> dict[str, list[str]]:
    """The registry's groups and versions in the order kube-aggregator's discovery lists
    them: groups by highest groupPriorityMinimum (apiregistration first), then name;
    versions by versionPriority, then kube-aware version order (first = preferred)."""
    gvs = registry.group_versions()

    def group_key(group: str) -> tuple[int, str]:
        if group == apiregistration.GROUP:
            return (-APIREGISTRATION_PRIORITY, group)
        return (-max(priority(group, v)[0] for v in gvs[group]), group)

    return {g: sorted(gvs[g], key=lambda v, g=g: (-priority(g, v)[1], _version_key(v)))
            for g in sorted(gvs, key=group_key)}


def desired(registry: Registry) -> list[dict[str, Any]]:
    """The Local APIService of every group-version `registry` serves (by name)."""
    out = []
    for group, versions in ordered_group_versions(registry).items():
        if group == apiregistration.GROUP:
            continue
        for version in versions:
            gpm, vp = priority(group, version)
            out.append({
                "apiVersion": apiregistration.API_VERSION, "kind": "APIService",
                "metadata": {"name": f"{version}.{group}", "labels": {AUTOMANAGED: ON_START}},
                "spec": {"group": group, "version": version, "groupPriorityMinimum": gpm,
                         "versionPriority": vp},
            })
    return sorted(out, key=lambda o: o["metadata"]["name"])


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)  # existing objects with the spec put back
    delete: list[dict[str, Any]] = field(default_factory=list)


def _automanaged(obj: dict[str, Any]) -> bool:
    return bool(((obj.get("metadata") or {}).get("labels") or {}).get(AUTOMANAGED))


def plan(want: list[dict[str, Any]], existing: list[dict[str, Any]]) -> Plan:
    """kube's autoregister decision for on-start APIServices (see the module docstring)."""
    out = Plan()
    have = {(o.get("metadata") or {}).get("name"): o for o in existing}
    wanted = {o["metadata"]["name"] for o in want}
    for obj in want:
        cur = have.get(obj["metadata"]["name"])
        if cur is None:
            out.create.append(copy.deepcopy(obj))
        elif _automanaged(cur) and cur.get("spec") != obj["spec"]:
            new = copy.deepcopy(cur)
            new["spec"] = copy.deepcopy(obj["spec"])
            out.update.append(new)
    for name, cur in have.items():
        if name not in wanted and _automanaged(cur):
            out.delete.append(cur)
    return out


async def reconcile(store: Store, registry: Registry) -> list[str]:
    """Carry out `plan` against the store; -> "apiservice/<name> <action>" per change."""
    info = registry.get(apiregistration.GROUP, apiregistration.VERSION, "apiservices")
    if info is None:
        return []
    existing = (await store.list(info.key(None))).items
    p = plan(desired(registry), existing)
    done: list[str] = []
    for obj in p.create:
        if info.default is not None:
            info.default(obj)
        apiregistration.set_availability(obj)
        try:
            await store.create(info.key(None, obj["metadata"]["name"]), obj)
            done.append(f"apiservice/{obj['metadata']['name']} created")
        except KeyExists:
            pass
    for obj in p.update:
        apiregistration.set_availability(obj, obj)
        try:
            await store.update(info.key(None, obj["metadata"]["name"]), obj,
                               expected_revision=int(obj["metadata"]["resourceVersion"]))
            done.append(f"apiservice/{obj['metadata']['name']} updated")
        except (KeyNotFound, RevisionConflict):
            pass  # changed meanwhile: the next start looks again
    for obj in p.delete:
        try:
            await store.delete(info.key(None, obj["metadata"]["name"]),
                               expected_revision=int(obj["metadata"]["resourceVersion"]))
            done.append(f"apiservice/{obj['metadata']['name']} deleted")
        except (KeyNotFound, RevisionConflict):
            pass
    if done:
        log.info("apiservice autoregistration: %s", ", ".join(done))
    return done


__all__ = ["AUTOMANAGED", "KUBE_PRIORITIES", "Plan", "desired", "ordered_group_versions", "plan",
           "priority", "reconcile"]
