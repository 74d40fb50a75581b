"""What the three endpoints controllers share (Kubernetes' endpointslice/util and
pkg/controller/util/endpoint), all pure:

* which pods back a Service (`selects`, `should_pod_be_in_endpoints`, `find_port`,
  `should_set_hostname`, `pod_ips_of_family`), and which Services a pod event concerns
  (`pod_endpoint_view`: the part of a pod an endpoint is made of — a change elsewhere,
  a container restart count, a new annotation, does not wake the controllers);
* `TriggerTimeTracker` — the `endpoints.kubernetes.io/last-change-trigger-time`
  annotation: the earliest pod or Service change a write reflects (the Ready
  transition time of pods that changed since the last sync, the Service's creation
  for a Service seen for the first time), nothing for a Service the tracker did not
  know yet (a restarted controller does not claim changes it did not see);
* `SliceTracker` — the EndpointSlice controllers' expectations (client-go's
  EndpointSliceTracker): the resourceVersion of every slice each controller wrote and
  the slices it deleted, so a sync against an informer that has not caught up with
  the controller's own writes waits instead of creating duplicates, and an event
  carrying a controller's own write does not make it sync again.  Kubernetes keys
  this by generation; our store's resourceVersions are increasing integers and also
  move when only the labels change, so they are used instead.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleet.api import meta
from fleet.api.conditions import is_pod_ready, pod_ready_condition
from fleet.api.kinds.discovery import LABEL_MANAGED_BY, LABEL_SERVICE_NAME
from fleet.api.selectors import set_selector_matches

#: Service label/annotation names (core/v1 well-known labels).
LABEL_HEADLESS = "service.kubernetes.io/headless"
LAST_CHANGE_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
OVER_CAPACITY = "endpoints.kubernetes.io/over-capacity"
LEADER_ANNOTATION = "control-plane.alpha.kubernetes.io/leader"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
LABEL_SKIP_MIRROR = "endpointslice.kubernetes.io/skip-mirror"
LABEL_ZONE = "topology.kubernetes.io/zone"

ENDPOINTSLICE_CONTROLLER = "endpointslice-controller.k8s.io"
MIRRORING_CONTROLLER = "endpointslicemirroring-controller.k8s.io"

Obj = Mapping[str, Any]


def meta_of(obj: Obj | None) -> Mapping[str, Any]:
    md = (obj or {}).get("metadata")
    return md if isinstance(md, Mapping) else {}


def spec_of(obj: Obj | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(obj: Obj | None) -> Mapping[str, Any]:
    st = (obj or {}).get("status")
    return st if isinstance(st, Mapping) else {}


# ---------------------------------------------------------------------------------------
# Services


def service_selector(service: Obj) -> dict[str, str] | None:
    """The Service's selector, None for a selector-less one (an empty map is stored as
    none by Kubernetes, so it is none here too)."""
    sel = spec_of(service).get("selector")
    if not isinstance(sel, Mapping) or not sel:
        return None
    return {str(k): str(v) for k, v in sel.items()}


def manages_endpoints(service: Obj) -> bool:
    """Whether the endpoints controllers build this Service's endpoints from pods: it
    has a selector and is not an ExternalName (issues.k8s.io/105986)."""
    return spec_of(service).get("type") != "ExternalName" and service_selector(service) is not None


def selects(service: Obj, pod: Obj) -> bool:
    """The Service selects the pod: same namespace, every selector label matches."""
    sel = service_selector(service)
    if sel is None or meta_of(service).get("namespace") != meta_of(pod).get("namespace"):
        return False
    return set_selector_matches(sel, meta_of(pod).get("labels"))


def is_service_ip_set(service: Obj) -> bool:
    """helper.IsServiceIPSet: a cluster IP other than None (headless) or unset."""
    ip = spec_of(service).get("clusterIP") or ""
    return ip not in ("", "None")


def is_ipv6(ip: Any) -> bool:
    try:
        return ipaddress.ip_address(str(ip)).version == 6
    except ValueError:
        return False


def address_family(ip: Any) -> str | None:
    """"IPv4" / "IPv6" for an IP address, None for anything else."""
    try:
        return "IPv6" if ipaddress.ip_address(str(ip)).version == 6 else "IPv4"
    except ValueError:
        return None


def service_address_type(service: Obj) -> str:
    """The address family of the Service's endpoints (single stack): its first
    ipFamily, else its cluster IP's family, else IPv4."""
    fams = spec_of(service).get("ipFamilies")
    if isinstance(fams, list) and fams and fams[0] in ("IPv4", "IPv6"):
        return str(fams[0])
    if is_service_ip_set(service) and is_ipv6(spec_of(service).get("clusterIP")):
        return "IPv6"
    return "IPv4"


# ---------------------------------------------------------------------------------------
# Pods


def pod_ips(pod: Obj) -> list[str]:
    """status.podIPs, or status.podIP when the list is absent."""
    st = _status(pod)
    ips = [str(p.get("ip")) for p in st.get("podIPs") or [] if isinstance(p, Mapping) and p.get("ip")]
    if not ips and st.get("podIP"):
        ips = [str(st["podIP"])]
    return ips


def pod_ips_of_family(pod: Obj, family: str) -> list[str]:
    return [ip for ip in pod_ips(pod) if address_family(ip) == family]


def is_terminal(pod: Obj) -> bool:
    return _status(pod).get("phase") in ("Succeeded", "Failed")


def should_pod_be_in_endpoints(pod: Obj, include_terminating: bool) -> bool:
    """ShouldPodBeInEndpoints: not finished, has an address, and — unless
    `include_terminating` — not being deleted."""
    if is_terminal(pod) or not pod_ips(pod):
        return False
    return include_terminating or not meta_of(pod).get("deletionTimestamp")


def should_set_hostname(pod: Obj, service: Obj) -> bool:
    """A pod's hostname is published when its subdomain is the Service (StatefulSets)."""
    spec = spec_of(pod)
    return (bool(spec.get("hostname")) and spec.get("subdomain") == meta_of(service).get("name")
            and meta_of(pod).get("namespace") == meta_of(service).get("namespace"))


def find_port(pod: Obj, service_port: Mapping[str, Any]) -> int | None:
    """podutil.FindPort: the pod's port a Service port targets — a number as is, a name
    looked up in the containers' (and restartable init containers') ports of the
    same protocol; None when the pod has no such port."""
    target = service_port.get("targetPort")
    if target is None or target == "" or target == 0:
        target = service_port.get("port")
    if isinstance(target, bool):
        return None
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    proto = service_port.get("protocol") or "TCP"
    spec = spec_of(pod)
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    containers += [c for c in spec.get("initContainers") or []
                   if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"]
    for c in containers:
        for p in c.get("ports") or []:
            if (isinstance(p, Mapping) and p.get("name") == target
                    and (p.get("protocol") or "TCP") == proto and isinstance(p.get("containerPort"), int)):
                return int(p["containerPort"])
    return None


def pod_endpoint_view(pod: Obj | None) -> tuple[Any, ...] | None:
    """What of a pod its endpoints are made of (podEndpointsChanged): a pod update
    that leaves this and the labels alone concerns no Service."""
    if pod is None:
        return None
    md, spec = meta_of(pod), spec_of(pod)
    ports = [(c.get("name"), repr(c.get("ports"))) for c in spec.get("containers") or []
             if isinstance(c, Mapping)]
    ready = pod_ready_condition(pod) or {}
    return (tuple(pod_ips(pod)), _status(pod).get("phase"), is_pod_ready(pod), ready.get("lastTransitionTime"),
            bool(md.get("deletionTimestamp")), spec.get("nodeName"), spec.get("hostname"),
            spec.get("subdomain"), tuple(ports), md.get("uid"))


def services_for_pod_change(services: Iterable[Obj], old: Obj | None, new: Obj | None) -> list[Obj]:
    """GetServicesToUpdateOnPodChange: the Services (of the pod's namespace) to sync for
    a pod event — those selecting its old or new labels, when something an endpoint is
    made of changed; on a label change only, the Services whose membership changed."""
    if old is not None and new is not None:
        labels_changed = meta_of(old).get("labels") != meta_of(new).get("labels")
        if not labels_changed and pod_endpoint_view(old) == pod_endpoint_view(new):
            return []
        if labels_changed and pod_endpoint_view(old) == pod_endpoint_view(new):
            return [s for s in services if selects(s, old) != selects(s, new)]
    return [s for s in services if any(p is not None and selects(s, p) for p in (old, new))]


# ---------------------------------------------------------------------------------------
# EndpointSlices


def slice_service_key(slice_: Obj) -> str | None:
    """"ns/service" of a slice, from its service-name label."""
    name = (meta_of(slice_).get("labels") or {}).get(LABEL_SERVICE_NAME)
    return f"{meta_of(slice_).get('namespace') or ''}/{name}" if name else None


def managed_by(slice_: Obj) -> str | None:
    return (meta_of(slice_).get("labels") or {}).get(LABEL_MANAGED_BY)


def slice_index(controller: str) -> Callable[[dict[str, Any]], list[str]]:
    """An informer index function: "ns/service" of the slices `controller` manages."""
    def index(obj: dict[str, Any]) -> list[str]:
        if managed_by(obj) != controller:
            return []
        key = slice_service_key(obj)
        return [key] if key else []
    return index


def _rv(obj: Obj) -> int | None:
    try:
        return int(str(meta_of(obj).get("resourceVersion")))
    except ValueError:
        return None


_DELETION_EXPECTED = -1


class SliceTracker:
    """Which slices a controller wrote (at which resourceVersion) or deleted, per
    Service key ("ns/name").  See the module docstring."""

    def __init__(self) -> None:
        self._by_service: dict[str, dict[str, int]] = {}

    def update(self, slice_: Obj) -> None:
        """The controller wrote `slice_` (the server's answer)."""
        key, uid, rv = slice_service_key(slice_), str(meta_of(slice_).get("uid") or ""), _rv(slice_)
        if key and uid and rv is not None:
            self._by_service.setdefault(key, {})[uid] = rv

    def expect_deletion(self, slice_: Obj) -> None:
        key, uid = slice_service_key(slice_), str(meta_of(slice_).get("uid") or "")
        if key and uid:
            self._by_service.setdefault(key, {})[uid] = _DELETION_EXPECTED

    def has(self, slice_: Obj) -> bool:
        key = slice_service_key(slice_)
        return key is not None and str(meta_of(slice_).get("uid") or "") in self._by_service.get(key, {})

    def should_sync(self, slice_: Obj) -> bool:
        """An informer event about `slice_` is news: a slice the controller did not
        write, or a version newer than its own write."""
        key = slice_service_key(slice_)
        known = self._by_service.get(key or "")
        if known is None:
            return True
        mine = known.get(str(meta_of(slice_).get("uid") or ""))
        rv = _rv(slice_)
        return mine is None or rv is None or rv > mine

    def handle_deletion(self, slice_: Obj) -> bool:
        """A slice was deleted; True when that was the controller's own deletion."""
        key = slice_service_key(slice_)
        known = self._by_service.get(key or "")
        uid = str(meta_of(slice_).get("uid") or "")
        if known is None or uid not in known:
            return False
        expected = known.pop(uid) == _DELETION_EXPECTED
        return expected

    def stale(self, service_key: str, slices: Iterable[Obj]) -> bool:
        """StaleSlices: the informer's `slices` of the Service lag behind the
        controller's own writes (an older version, a slice it deleted still listed, or
        one it created not listed yet)."""
        known = self._by_service.get(service_key)
        if not known:
            return False
        seen: set[str] = set()
        for s in slices:
            uid = str(meta_of(s).get("uid") or "")
            seen.add(uid)
            mine = known.get(uid)
            if mine is None:
                continue
            rv = _rv(s)
            if mine == _DELETION_EXPECTED or (rv is not None and mine > rv):
                return True
        return any(rv != _DELETION_EXPECTED and uid not in seen for uid, rv in known.items())

    def delete_service(self, service_key: str) -> None:
        self._by_service.pop(service_key, None)

    def keys_to_sync(self, manager: str, old: Obj | None, new: Obj | None) -> list[str]:
        """The Service keys a slice event should queue, for the controller whose slices
        carry `managed-by: manager` (both slice-writing controllers' onEndpointSlice
        handlers): its own slice deleted by someone else, a slice moved between
        Services, a slice changing hands, or news about one of its slices."""
        if new is None:
            if (old is not None and managed_by(old) == manager and self.has(old)
                    and not self.handle_deletion(old)):
                return _keys(old)
            return []
        if old is not None and slice_service_key(old) != slice_service_key(new):
            return _keys(old, new)
        changed_hands = old is not None and (managed_by(old) == manager) != (managed_by(new) == manager)
        if changed_hands or (managed_by(new) == manager and self.should_sync(new)):
            return _keys(new)
        return []


def _keys(*slices: Obj) -> list[str]:
    return [k for k in (slice_service_key(s) for s in slices) if k]


# ---------------------------------------------------------------------------------------
# The last-change trigger time


def _parse(value: Any) -> dt.datetime | None:
    return meta.parse_time(value)


class TriggerTimeTracker:
    """ComputeEndpointLastChangeTriggerTime, per Service key.  See the module docstring."""

    def __init__(self) -> None:
        self._state: dict[str, tuple[dict[str, dt.datetime], dt.datetime | None]] = {}

    def compute(self, key: str, service: Obj, pods: Iterable[Obj]) -> str | None:
        """The annotation's value for a write made now (None: no annotation), and the
        new state remembered for the next sync."""
        known = key in self._state
        last_pods, last_service = self._state.get(key, ({}, None))
        earliest: dt.datetime | None = None
        now_pods: dict[str, dt.datetime] = {}
        for pod in pods:
            t = _parse((pod_ready_condition(pod) or {}).get("lastTransitionTime"))
            if t is None:
                continue
            name = str(meta_of(pod).get("name") or "")
            now_pods[name] = t
            before = last_pods.get(name)
            if before is None or t > before:
                earliest = t if earliest is None else min(earliest, t)
        service_time = _parse(meta_of(service).get("creationTimestamp"))
        if service_time is not None and (last_service is None or service_time > last_service):
            earliest = service_time if earliest is None else min(earliest, service_time)
        self._state[key] = (now_pods, service_time)
        if not known or earliest is None:
            return None
        return meta.format_time(earliest)

    def delete_service(self, key: str) -> None:
        self._state.pop(key, None)
