"""What the scheduler reads from one pod or node object, as pure functions:
resource requests in the unit Kubernetes compares them in (millicores for
`cpu`, plain units for everything else; kube-scheduler's non-zero defaults
for scoring), pod keys, labels and phase, host ports, a node's images and
whether it carries hard or PreferNoSchedule taints.  `snapshot.py` keeps
these per node; the plugins read them.
"""


from __future__ import annotations

from typing import Any

from fleet.api import images
from fleet.api.quantity import QuantityError, int_value, milli_value

Resources = dict[str, int]

# What a container without requests counts as when *scoring* (kube-scheduler's
# non-zero defaults), so a node full of BestEffort pods does not look empty.
# Filtering still uses the real requests.
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

TERMINAL_PHASES = ("Succeeded", "Failed")


def quantity(resource: str, value: Any) -> int:
    """A quantity in the resource's comparison unit (millicores for cpu); 0 if malformed."""
    try:
        return milli_value(value) if resource == "cpu" else int_value(value)
    except (QuantityError, TypeError, ValueError):
        return 0


def resource_list(raw: Any) -> Resources:
    if not isinstance(raw, dict):
        return {}
    return {str(k): quantity(str(k), v) for k, v in raw.items()}


def _add(into: Resources, other: Resources, sign: int = 1) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + sign * v


def _max(into: Resources, other: Resources) -> None:
    for k, v in other.items():
        if v > into.get(k, 0):
            into[k] = v


def _container_requests(c: Any, *, non_zero: bool) -> Resources:
    res = c.get("resources") if isinstance(c, dict) else None
    req = resource_list(res.get("requests") if isinstance(res, dict) else None)
    if non_zero:
        req.setdefault("cpu", 0)
        req.setdefault("memory", 0)
        if req["cpu"] == 0:
            req["cpu"] = DEFAULT_MILLI_CPU_REQUEST
        if req["memory"] == 0:
            req["memory"] = DEFAULT_MEMORY_REQUEST
    return req


def pod_requests(pod: dict[str, Any], *, non_zero: bool = False) -> Resources:
    """The resources the pod asks of a node, as kube-scheduler computes them.

    App containers run together, so their requests add up; init containers run
    one at a time before them, so the pod needs the larger of the two phases.
    Sidecars (init containers with restartPolicy Always) keep running, so they
    add to every later init container and to the app phase.  Pod overhead
    (RuntimeClass) is added on top.
    """
    spec = pod.get("spec") or {}
    app: Resources = {}
    for c in spec.get("containers") or []:
        _add(app, _container_requests(c, non_zero=non_zero))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for c in spec.get("initContainers") or []:
        req = _container_requests(c, non_zero=non_zero)
        if isinstance(c, dict) and c.get("restartPolicy") == "Always":
            _add(sidecars, req)
            _max(init_peak, sidecars)
        else:
            step = dict(sidecars)
            _add(step, req)
            _max(init_peak, step)
    total = dict(app)
    _add(total, sidecars)
    _max(total, init_peak)
    _add(total, resource_list(spec.get("overhead")))
    return {k: v for k, v in total.items() if v}


def pod_key(pod: dict[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def pod_labels(pod: dict[str, Any]) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def is_terminated(pod: dict[str, Any]) -> bool:
    """Succeeded and Failed pods hold no resources on their node any more."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def is_terminating(pod: dict[str, Any]) -> bool:
    """Being deleted: PodTopologySpread no longer counts it (kubernetes#87621)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


# ---------------------------------------------------------------------------
# Host ports and images, the per-node facts NodePorts and ImageLocality read.
# ---------------------------------------------------------------------------

WILDCARD_HOST_IP = "0.0.0.0"
HostPort = tuple[str, str, int]  # (host IP, protocol, port)


def _running_containers(pod: dict[str, Any]) -> list[Any]:
    """App containers plus sidecars (restartable init containers): what holds ports while the pod runs."""
    spec = pod.get("spec") or {}
    out = list(spec.get("containers") or [])
    out += [c for c in spec.get("initContainers") or []
            if isinstance(c, dict) and c.get("restartPolicy") == "Always"]
    return out


def pod_host_ports(pod: dict[str, Any]) -> list[HostPort]:
    """The host ports the pod binds: (hostIP or 0.0.0.0, protocol or TCP, hostPort > 0)."""
    out: list[HostPort] = []
    for c in _running_containers(pod):
        if not isinstance(c, dict):
            continue
        for p in c.get("ports") or []:
            if not isinstance(p, dict):
                continue
            try:
                port = int(p.get("hostPort") or 0)
            except (TypeError, ValueError):
                continue
            if port > 0:
                out.append((str(p.get("hostIP") or WILDCARD_HOST_IP), str(p.get("protocol") or "TCP"), port))
    return out


def normalize_image_name(name: str) -> str:
    """A container image reference in its fully qualified form, so spellings compare equal.

    `nginx`, `nginx:latest`, `library/nginx` and `docker.io/library/nginx:latest`
    all name the same image; the kubelet reports the long form in
    `node.status.images` while pods usually use the short one.  kube-scheduler
    only appends `:latest` (and misses the other spellings, as its own comments
    note); this uses the agent's own rule (`fleet.api.images`), so what a node
    reports and what a pod asks for normalize alike.  A name that is not a valid
    reference is only stripped: it matches nothing but itself.
    """
    try:
        return images.normalize(name.strip())
    except images.InvalidReference:
        return name.strip()


def node_images(node: dict[str, Any]) -> dict[str, int]:
    """normalized image name -> size in bytes, from `node.status.images`."""
    out: dict[str, int] = {}
    for img in (node.get("status") or {}).get("images") or []:
        if not isinstance(img, dict):
            continue
        try:
            size = int(img.get("sizeBytes") or 0)
        except (TypeError, ValueError):
            size = 0
        for n in img.get("names") or []:
            if isinstance(n, str) and n:
                out[normalize_image_name(n)] = size
    return out


HARD_TAINT_EFFECTS = ("NoSchedule", "NoExecute")


def _taint_flags(node: dict[str, Any]) -> tuple[bool, bool]:
    """(has a NoSchedule/NoExecute taint, has a PreferNoSchedule taint)."""
    hard = soft = False
    for t in (node.get("spec") or {}).get("taints") or []:
        if isinstance(t, dict):
            effect = t.get("effect")
            hard = hard or effect in HARD_TAINT_EFFECTS
            soft = soft or effect == "PreferNoSchedule"
    return hard, soft
