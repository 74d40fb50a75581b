"""The EndpointSlice controller's decision, pure (Kubernetes' staging endpointslice
reconciler): from a Service, its pods, the nodes and the slices that exist, which
slices to create, update and delete.

* **Endpoints.**  Every selected pod with an address that has not finished becomes
  one endpoint: `addresses [podIP]` of the Service's family, `conditions` — `serving`
  is the pod's Ready condition, `terminating` its deletionTimestamp, `ready` serving
  and not terminating, or always with `publishNotReadyAddresses` —, `nodeName`, the
  node's `topology.kubernetes.io/zone`, `hostname` when the pod's subdomain is the
  Service, `targetRef` to the pod.  A pod whose node is unknown is left out (and the
  sync is retried) unless the Service publishes not-ready addresses.
* **Ports.**  Resolved per pod (`find_port`: a number, or a named container port);
  pods that resolve the ports differently go to different slices — each slice has
  one port set, the "port map".
* **Minimal churn.**  Per port map, existing slices keep the endpoints still wanted
  (updated in place when one changed) and drop the others; a slice left empty is
  deleted; the new endpoints first fill the slices being updated anyway (fullest
  first), then the unchanged slice they fit in best, and only then new slices of at
  most `max_per_slice`.  A slice to create takes over the name of one to delete
  (an update instead of a delete and a create).  A Service with no endpoints keeps
  one empty "placeholder" slice.  Only what changed is written; labels follow the
  Service's (reserved ones aside) plus `kubernetes.io/service-name`,
  `endpointslice.kubernetes.io/managed-by` and, for a Service without a cluster IP,
  `service.kubernetes.io/headless`.
* Slices of another address type, or controlled by another object (a Service of the
  same name deleted and created again), are deleted.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api.conditions import is_pod_ready
from fleet.api.kinds.discovery import LABEL_MANAGED_BY, LABEL_SERVICE_NAME
from fleet.api.owners import controller_of, controller_ref
from fleet.controllers.endpoints_util import (
    ENDPOINTSLICE_CONTROLLER,
    LABEL_HEADLESS,
    LABEL_ZONE,
    LAST_CHANGE_TRIGGER_TIME,
    find_port,
    is_service_ip_set,
    meta_of,
    pod_ips_of_family,
    selects,
    service_address_type,
    should_pod_be_in_endpoints,
    should_set_hostname,
    spec_of,
)

DEFAULT_MAX_ENDPOINTS_PER_SLICE = 100
RESERVED_LABELS = (LABEL_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_HEADLESS)

Obj = Mapping[str, Any]
PortKey = tuple[tuple[str, int, str, str], ...]
EndpointKey = tuple[tuple[str, ...], str, str, str]


# ---------------------------------------------------------------------------------------
# Ports and endpoints


def endpoint_ports(service: Obj, pod: Obj) -> list[dict[str, Any]]:
    """getEndpointPorts: the Service's ports as this pod serves them (ports the pod has
    no match for are left out; a headless Service may have none)."""
    out: list[dict[str, Any]] = []
    for sp in spec_of(service).get("ports") or []:
        if not isinstance(sp, Mapping):
            continue
        num = find_port(pod, sp)
        if num is None:
            continue
        port: dict[str, Any] = {"name": str(sp.get("name") or ""), "port": num,
                                "protocol": str(sp.get("protocol") or "TCP")}
        if sp.get("appProtocol"):
            port["appProtocol"] = sp["appProtocol"]
        out.append(port)
    return out


def port_key(ports: Iterable[Mapping[str, Any]] | None) -> PortKey:
    """NewPortMapKey: a port set, whatever its order."""
    return tuple(sorted((str(p.get("name") or ""), int(p.get("port") or 0), str(p.get("protocol") or "TCP"),
                         str(p.get("appProtocol") or "")) for p in ports or [] if isinstance(p, Mapping)))


def endpoint_key(ep: Mapping[str, Any]) -> EndpointKey:
    """hashEndpoint: an endpoint's identity — its addresses, hostname and target."""
    ref = ep.get("targetRef") if isinstance(ep.get("targetRef"), Mapping) else {}
    return (tuple(sorted(str(a) for a in ep.get("addresses") or [])), str(ep.get("hostname") or ""),
            str(ref.get("namespace") or ""), str(ref.get("name") or ""))


def pod_to_endpoint(pod: Obj, node: Obj | None, service: Obj, address_type: str) -> dict[str, Any]:
    """podToEndpoint (see the module docstring)."""
    serving = is_pod_ready(pod)
    terminating = bool(meta_of(pod).get("deletionTimestamp"))
    ready = bool(spec_of(service).get("publishNotReadyAddresses")) or (serving and not terminating)
    md = meta_of(pod)
    ep: dict[str, Any] = {
        "addresses": pod_ips_of_family(pod, address_type)[:1],
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
        "targetRef": {"kind": "Pod", "namespace": md.get("namespace"), "name": md.get("name"),
                      "uid": md.get("uid")},
    }
    node_name = spec_of(pod).get("nodeName")
    if node_name:
        ep["nodeName"] = node_name
    zone = (meta_of(node).get("labels") or {}).get(LABEL_ZONE) if node else None
    if zone:
        ep["zone"] = zone
    if should_set_hostname(pod, service):
        ep["hostname"] = spec_of(pod)["hostname"]
    return ep


def slice_labels(service: Obj, controller: str = ENDPOINTSLICE_CONTROLLER) -> dict[str, str]:
    """setEndpointSliceLabels: the Service's labels but the reserved ones, its name,
    the managing controller, and the headless mark for a Service without a cluster IP."""
    labels = {k: v for k, v in (meta_of(service).get("labels") or {}).items() if k not in RESERVED_LABELS}
    if not is_service_ip_set(service):
        labels[LABEL_HEADLESS] = ""
    labels[LABEL_SERVICE_NAME] = str(meta_of(service).get("name") or "")
    labels[LABEL_MANAGED_BY] = controller
    return labels


def new_slice(service: Obj, ports: list[dict[str, Any]], address_type: str,
              controller: str = ENDPOINTSLICE_CONTROLLER) -> dict[str, Any]:
    """newEndpointSlice: a slice to create, named `<service>-<random>` by the server."""
    md = meta_of(service)
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"generateName": f"{md.get('name')}-", "namespace": md.get("namespace"),
                     "labels": slice_labels(service, controller),
                     "ownerReferences": [controller_ref(service, api_version="v1", kind="Service")]},
        "addressType": address_type, "ports": copy.deepcopy(ports), "endpoints": [],
    }


# ---------------------------------------------------------------------------------------
# The plan


@dataclass
class SlicePlan:
    """What to write: bodies to create (generateName), full slices to update (name and
    resourceVersion of the stored one), stored slices to delete."""

    create: list[dict[str, Any]] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)
    delete: list[dict[str, Any]] = field(default_factory=list)
    # Pods left out because their node is not known (yet): sync again later.
    skipped_pods: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def _name(obj: Obj) -> str:
    return str(meta_of(obj).get("name") or "")


def desired_endpoints(service: Obj, pods: Iterable[Obj], nodes: Mapping[str, Obj], address_type: str,
                      ) -> tuple[dict[PortKey, list[dict[str, Any]]], dict[PortKey, dict[EndpointKey, dict[str, Any]]],
                                 list[str]]:
    """The endpoints wanted, grouped by port map (ports, endpoints by identity), and the
    pods skipped for an unknown node.  Pods are taken in name order, so slices fill
    in a stable order."""
    ports_by_key: dict[PortKey, list[dict[str, Any]]] = {}
    wanted: dict[PortKey, dict[EndpointKey, dict[str, Any]]] = {}
    skipped: list[str] = []
    publish = bool(spec_of(service).get("publishNotReadyAddresses"))
    for pod in sorted(pods, key=_name):
        if not selects(service, pod) or not should_pod_be_in_endpoints(pod, True):
            continue
        ports = endpoint_ports(service, pod)
        key = port_key(ports)
        node_name = str(spec_of(pod).get("nodeName") or "")
        node = nodes.get(node_name) if node_name else None
        if node_name and node is None and not publish:
            skipped.append(_name(pod))
            continue
        ep = pod_to_endpoint(pod, node, service, address_type)
        if not ep["addresses"]:
            continue
        ports_by_key.setdefault(key, ports)
        wanted.setdefault(key, {})[endpoint_key(ep)] = ep
    return ports_by_key, wanted, skipped


def _slice_to_fill(slices: list[dict[str, Any]], n: int, max_n: int) -> dict[str, Any] | None:
    """getSliceToFill: the slice `n` more endpoints fit in most tightly."""
    best, best_diff = None, max_n
    for s in slices:
        diff = max_n - (n + len(s.get("endpoints") or []))
        if 0 <= diff < best_diff:
            best, best_diff = s, diff
            if diff == 0:
                break
    return best


def _reconcile_port_map(service: Obj, existing: list[dict[str, Any]], wanted: dict[EndpointKey, dict[str, Any]],
                        ports: list[dict[str, Any]], address_type: str, labels: dict[str, str],
                        max_n: int, plan: SlicePlan) -> None:
    """reconcileByPortMapping, for the slices of one port map."""
    wanted = dict(wanted)  # popped as endpoints are placed
    by_name: dict[str, dict[str, Any]] = {}
    to_update: list[str] = []
    unchanged: list[str] = []
    for s in sorted(existing, key=_name):
        old_eps = [e for e in s.get("endpoints") or [] if isinstance(e, Mapping)]
        kept: list[dict[str, Any]] = []
        changed = False
        for ep in old_eps:
            got = wanted.pop(endpoint_key(ep), None)
            if got is None:
                continue
            kept.append(got)
            changed = changed or got != ep
        labels_changed = (meta_of(s).get("labels") or {}) != labels
        if changed or len(kept) != len(old_eps) or len(old_eps) != len(s.get("endpoints") or []):
            if not kept:
                plan.delete.append(s)
                continue
            new = copy.deepcopy(dict(s))
            new["endpoints"] = kept
            new["metadata"]["labels"] = dict(labels)
            by_name[_name(s)] = new
            to_update.append(_name(s))
        elif labels_changed:
            new = copy.deepcopy(dict(s))
            new["metadata"]["labels"] = dict(labels)
            by_name[_name(s)] = new
            to_update.append(_name(s))
        else:
            by_name[_name(s)] = dict(s)
            unchanged.append(_name(s))
    pending = list(wanted.values())
    # 2. Fill the slices being written anyway, the fullest first.
    if pending and to_update:
        for name in sorted(to_update, key=lambda n: -len(by_name[n]["endpoints"])):
            s = by_name[name]
            while pending and len(s["endpoints"]) < max_n:
                s["endpoints"].append(pending.pop(0))
    # 3. Then the unchanged slice the rest fits in best, else new slices.
    while pending:
        target: dict[str, Any] | None = None
        if len(pending) < max_n and unchanged:
            found = _slice_to_fill([by_name[n] for n in unchanged], len(pending), max_n)
            if found is not None:
                target = copy.deepcopy(found)
                target["endpoints"] = list(target.get("endpoints") or [])
                by_name[_name(found)] = target
                unchanged.remove(_name(found))
                to_update.append(_name(found))
        if target is None:
            target = new_slice(service, ports, address_type)
            plan.create.append(target)
        while pending and len(target["endpoints"]) < max_n:
            target["endpoints"].append(pending.pop(0))
    # A slice left empty (only ever made by hand: ours never are) goes.
    for n in to_update + unchanged:
        s = by_name[n]
        if not s.get("endpoints"):
            plan.delete.append(s)
        elif n in to_update:
            plan.update.append(s)


def _is_placeholder_of(stored: Obj, placeholder: Obj) -> bool:
    """placeholderSliceCompare: the stored slice is the placeholder we would create."""
    return (not stored.get("endpoints") and not stored.get("ports")
            and stored.get("addressType") == placeholder.get("addressType")
            and (meta_of(stored).get("labels") or {}) == meta_of(placeholder).get("labels"))


def _recycle(plan: SlicePlan, service_uid: str) -> None:
    """A slice to create takes the name of one to delete of the same address type this
    Service controls: one update instead of a delete and a create."""
    i = 0
    while i < len(plan.delete) and plan.create:
        old = plan.delete[i]
        new = plan.create[-1]
        ref = controller_of(old)
        if (old.get("addressType") == new.get("addressType") and ref is not None
                and str(ref.get("uid")) == service_uid):
            plan.create.pop()
            body = copy.deepcopy(new)
            md = body["metadata"]
            md.pop("generateName", None)
            md["name"] = _name(old)
            md["resourceVersion"] = meta_of(old).get("resourceVersion")
            plan.update.append(body)
            plan.delete.pop(i)
        else:
            i += 1


def _set_trigger_time(slice_: dict[str, Any], trigger_time: str | None) -> None:
    md = slice_.setdefault("metadata", {})
    annotations = dict(md.get("annotations") or {})
    if trigger_time:
        annotations[LAST_CHANGE_TRIGGER_TIME] = trigger_time
    else:
        annotations.pop(LAST_CHANGE_TRIGGER_TIME, None)
    if annotations:
        md["annotations"] = annotations
    else:
        md.pop("annotations", None)


def plan_slices(service: Obj, pods: Iterable[Obj], nodes: Mapping[str, Obj], existing: Iterable[Obj], *,
                max_per_slice: int = DEFAULT_MAX_ENDPOINTS_PER_SLICE,
                trigger_time: str | None = None) -> SlicePlan:
    """The writes that make `existing` (this controller's slices of the Service) what
    the Service and its pods call for.  See the module docstring."""
    plan = SlicePlan()
    address_type = service_address_type(service)
    uid = str(meta_of(service).get("uid") or "")
    labels = slice_labels(service)
    ports_by_key, wanted, plan.skipped_pods = desired_endpoints(service, pods, nodes, address_type)
    mine: dict[PortKey, list[dict[str, Any]]] = {}
    all_existing = [dict(s) for s in existing if not meta_of(s).get("deletionTimestamp")]
    for s in all_existing:
        ref = controller_of(s)
        if s.get("addressType") != address_type or ref is None or str(ref.get("uid")) != uid:
            plan.delete.append(s)
            continue
        mine.setdefault(port_key(s.get("ports")), []).append(s)
    for key, eps in wanted.items():
        _reconcile_port_map(service, mine.get(key, []), eps, ports_by_key[key], address_type, labels,
                            max_per_slice, plan)
    for key, slices in mine.items():
        if key not in wanted:
            plan.delete.extend(slices)
    # A Service with no endpoint keeps one empty slice.
    if len(plan.delete) == len(all_existing) and not plan.create:
        placeholder = new_slice(service, [], address_type)
        if len(plan.delete) == 1 and _is_placeholder_of(plan.delete[0], placeholder):
            plan.delete.clear()
        else:
            plan.create.append(placeholder)
    _recycle(plan, uid)
    if meta_of(service).get("deletionTimestamp"):
        plan.create.clear()  # no new slices for a Service on its way out
    for s in plan.create + plan.update:
        _set_trigger_time(s, trigger_time)
    plan.delete.sort(key=_name)
    return plan
