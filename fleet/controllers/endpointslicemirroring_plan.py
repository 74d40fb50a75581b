"""The EndpointSlice mirroring controller's decision, pure (Kubernetes'
pkg/controller/endpointslicemirroring): hand-made `v1 Endpoints` of a Service without
a selector, copied into EndpointSlices every consumer reads.

* Mirrored when the Service exists without a selector and the Endpoints are not
  labelled `endpointslice.kubernetes.io/skip-mirror: "true"` nor carry a leader
  election annotation (`should_mirror`).
* The subsets are repacked first; each subset gives one slice per address family
  (its ports copied; `addresses` → ready true, `notReadyAddresses` → ready false;
  `hostname`, `nodeName`, `targetRef` copied), at most `max_per_subset` addresses of
  a subset (default 1000: the rest are skipped and reported), addresses that are
  not IPs skipped and reported.
* Slices carry the Endpoints' labels plus `kubernetes.io/service-name` and
  `endpointslice.kubernetes.io/managed-by: endpointslice-mirroring-controller.k8s.io`,
  its annotations but the last-applied configuration and the trigger time, and a
  controller reference to the Endpoints.
* Per (address type, port set) the first existing slice is kept and rewritten when
  it differs, the others deleted; a slice to create takes over the name of one to
  delete.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api.kinds.discovery import LABEL_MANAGED_BY, LABEL_SERVICE_NAME
from fleet.api.owners import controller_ref
from fleet.controllers.endpoints_plan import repack_subsets
from fleet.controllers.endpoints_util import (
    LABEL_SKIP_MIRROR,
    LAST_APPLIED,
    LAST_CHANGE_TRIGGER_TIME,
    LEADER_ANNOTATION,
    MIRRORING_CONTROLLER,
    address_family,
    meta_of,
)
from fleet.controllers.endpointslice_plan import PortKey, SlicePlan, endpoint_key, port_key

DEFAULT_MAX_ENDPOINTS_PER_SUBSET = 1000

Obj = Mapping[str, Any]
Key = tuple[str, PortKey]


def _name(obj: Obj) -> str:
    return str(meta_of(obj).get("name") or "")


def should_mirror(endpoints: Obj | None) -> bool:
    """shouldMirror: not skipped by label, not a leader-election lock."""
    if endpoints is None:
        return False
    labels = meta_of(endpoints).get("labels") or {}
    annotations = meta_of(endpoints).get("annotations") or {}
    return labels.get(LABEL_SKIP_MIRROR) != "true" and LEADER_ANNOTATION not in annotations


def mirrored_labels(endpoints: Obj) -> dict[str, str]:
    labels = dict(meta_of(endpoints).get("labels") or {})
    labels[LABEL_SERVICE_NAME] = _name(endpoints)
    labels[LABEL_MANAGED_BY] = MIRRORING_CONTROLLER
    return labels


def mirrored_annotations(endpoints: Obj) -> dict[str, str]:
    return {k: v for k, v in (meta_of(endpoints).get("annotations") or {}).items()
            if k not in (LAST_CHANGE_TRIGGER_TIME, LAST_APPLIED)}


def address_to_endpoint(address: Mapping[str, Any], ready: bool) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [address.get("ip")], "conditions": {"ready": ready}}
    if address.get("hostname"):
        ep["hostname"] = address["hostname"]
    if address.get("nodeName"):
        ep["nodeName"] = address["nodeName"]
    if isinstance(address.get("targetRef"), Mapping):
        ep["targetRef"] = copy.deepcopy(dict(address["targetRef"]))
    return ep


def _slice_ports(ports: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for p in ports:
        if not isinstance(p, Mapping):
            continue
        sp: dict[str, Any] = {"name": str(p.get("name") or ""), "port": p.get("port"),
                              "protocol": str(p.get("protocol") or "TCP")}
        if p.get("appProtocol"):
            sp["appProtocol"] = p["appProtocol"]
        out.append(sp)
    return out


@dataclass
class MirrorPlan(SlicePlan):
    invalid_addresses: int = 0  # not IPs: skipped
    skipped_addresses: int = 0  # all skipped, the invalid ones and those past the limit
    events: list[tuple[str, str]] = field(default_factory=list)  # (reason, message) on the Endpoints


def _new_slice(endpoints: Obj, ports: list[dict[str, Any]], address_type: str) -> dict[str, Any]:
    md = meta_of(endpoints)
    out: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"generateName": f"{md.get('name')}-", "namespace": md.get("namespace"),
                     "labels": mirrored_labels(endpoints),
                     "ownerReferences": [controller_ref(endpoints, api_version="v1", kind="Endpoints")]},
        "addressType": address_type, "ports": copy.deepcopy(ports), "endpoints": [],
    }
    annotations = mirrored_annotations(endpoints)
    if annotations:
        out["metadata"]["annotations"] = annotations
    return out


def plan_mirror(endpoints: Obj, existing: Iterable[Obj], *,
                max_per_subset: int = DEFAULT_MAX_ENDPOINTS_PER_SUBSET) -> MirrorPlan:
    """The writes that make `existing` (this controller's slices for the Endpoints)
    mirror `endpoints`.  See the module docstring."""
    plan = MirrorPlan()
    wanted: dict[Key, dict[Any, dict[str, Any]]] = {}
    ports_by_key: dict[Key, list[dict[str, Any]]] = {}
    for ss in repack_subsets(endpoints.get("subsets") or []):
        ports = _slice_ports(ss.get("ports") or [])
        pkey = port_key(ports)
        for fam in ("IPv4", "IPv6"):
            wanted.setdefault((fam, pkey), {})
            ports_by_key[(fam, pkey)] = ports
        total = len(ss.get("addresses") or []) + len(ss.get("notReadyAddresses") or [])
        added = 0
        for field_name, ready in (("addresses", True), ("notReadyAddresses", False)):
            for addr in ss.get(field_name) or []:
                if added >= max_per_subset:
                    break
                fam = address_family(addr.get("ip"))
                if fam is None:
                    plan.invalid_addresses += 1
                    continue
                ep = address_to_endpoint(addr, ready)
                wanted[(fam, pkey)].setdefault(endpoint_key(ep), ep)
                added += 1
        plan.skipped_addresses += total - added
    if plan.invalid_addresses:
        plan.events.append(("InvalidIPAddress",
                            f"Skipped {plan.invalid_addresses} invalid IP addresses when mirroring to EndpointSlices"))
    if plan.skipped_addresses > plan.invalid_addresses:
        plan.events.append(("TooManyAddressesToMirror",
                            f"A max of {max_per_subset} addresses can be mirrored to EndpointSlices per "
                            f"Endpoints subset. {plan.skipped_addresses} addresses were skipped"))
    by_key: dict[Key, list[dict[str, Any]]] = {}
    for s in sorted((dict(s) for s in existing if not meta_of(s).get("deletionTimestamp")), key=_name):
        by_key.setdefault((str(s.get("addressType") or ""), port_key(s.get("ports"))), []).append(s)
    labels, annotations = mirrored_labels(endpoints), mirrored_annotations(endpoints)
    for key, eps in wanted.items():
        slices = by_key.get(key, [])
        if not eps:
            plan.delete.extend(slices)
            continue
        plan.delete.extend(slices[1:])
        desired = list(eps.values())
        if slices:
            first = slices[0]
            have = {endpoint_key(e): e for e in first.get("endpoints") or [] if isinstance(e, Mapping)}
            if (have == eps and len(first.get("endpoints") or []) == len(have)
                    and (meta_of(first).get("labels") or {}) == labels
                    and (meta_of(first).get("annotations") or {}) == annotations):
                continue
            body = _new_slice(endpoints, ports_by_key[key], key[0])
            body["metadata"].pop("generateName")
            body["metadata"]["name"] = _name(first)
            body["metadata"]["resourceVersion"] = meta_of(first).get("resourceVersion")
            body["endpoints"] = desired
            plan.update.append(body)
        else:
            body = _new_slice(endpoints, ports_by_key[key], key[0])
            body["endpoints"] = desired
            plan.create.append(body)
    for key, slices in by_key.items():
        if key not in wanted:
            plan.delete.extend(slices)
    # recycleSlices: a slice to create takes the name of one to delete of its type.
    i = 0
    while i < len(plan.delete) and plan.create:
        old, new = plan.delete[i], plan.create[-1]
        if old.get("addressType") == new.get("addressType"):
            plan.create.pop()
            new["metadata"].pop("generateName", None)
            new["metadata"]["name"] = _name(old)
            new["metadata"]["resourceVersion"] = meta_of(old).get("resourceVersion")
            plan.update.append(new)
            plan.delete.pop(i)
        else:
            i += 1
    if meta_of(endpoints).get("deletionTimestamp"):
        plan.create.clear()
    return plan
