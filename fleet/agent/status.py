"""Pod status as the kubelet reports it, computed from what the pod worker observed (pure).

The pod worker keeps, per container, the Kubernetes-shaped `state` / `lastState`
dicts, restart count, readiness and ids (`ContainerView`).  Everything derived from
those — the pod phase, the four conditions, QoS class, the `containerStatuses` lists
— is computed here with no I/O and no clock of its own (`now` is passed in), so the
rules can be tested table by table.

The phase follows the kubelet's `getPhase`:

* an init container still to finish → Pending (Failed if it failed and the pod's
  restartPolicy is Never);
* any app container waiting for its first run → Pending;
* any running → Running;
* all stopped → Always: Running (they will be restarted); all succeeded: Succeeded;
  OnFailure: Running; else Failed.

A container waiting to be *re*started (CrashLoopBackOff, with a terminated
`lastState`) counts as stopped, not waiting — that is why a crash-looping pod is
Running, as in Kubernetes.

`status_changed` compares two statuses without their timestamps, so the worker
writes to the API only when something a reader cares about changed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.api.quantity import milli_value

PENDING, RUNNING, SUCCEEDED, FAILED, UNKNOWN = "Pending", "Running", "Succeeded", "Failed", "Unknown"

# Keys whose values are times: ignored when deciding whether a status changed.
_TIME_KEYS = frozenset({"lastTransitionTime", "lastProbeTime", "startedAt", "finishedAt",
                        "startTime", "lastHeartbeatTime"})


@dataclass
class ContainerView:
    """What the worker knows about one container, in the API's vocabulary."""

    name: str
    image: str
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    image_id: str = ""
    container_id: str = ""

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "image": self.image, "imageID": self.image_id,
            "ready": self.ready, "restartCount": self.restart_count,
            "started": self.started, "state": copy.deepcopy(self.state),
            "lastState": copy.deepcopy(self.last_state),
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def _terminated(c: ContainerView) -> dict[str, Any] | None:
    t = c.state.get("terminated")
    return t if isinstance(t, dict) else None


def init_done(init: Sequence[ContainerView]) -> bool:
    """True when every init container has terminated with exit code 0."""
    return all((t := _terminated(c)) is not None and t.get("exitCode") == 0 for c in init)


def pod_phase(restart_policy: str, init: Sequence[ContainerView],
              containers: Sequence[ContainerView]) -> str:
    """The pod phase by the kubelet's rules (see the module docstring)."""
    policy = restart_policy or "Always"
    if not init_done(init):
        for c in init:
            t = _terminated(c)
            if t is not None and t.get("exitCode") != 0 and policy == "Never":
                return FAILED
        return PENDING
    running = waiting = stopped = succeeded = 0
    for c in containers:
        if "running" in c.state:
            running += 1
        elif (t := _terminated(c)) is not None:
            stopped += 1
            if t.get("exitCode") == 0:
                succeeded += 1
        elif "terminated" in c.last_state:
            # Waiting to be restarted: it has run before.
            stopped += 1
        else:
            waiting += 1
    if waiting:
        return PENDING
    if running:
        return RUNNING
    if stopped:
        if policy == "Always":
            return RUNNING
        if stopped == succeeded:
            return SUCCEEDED
        if policy == "OnFailure":
            return RUNNING
        return FAILED
    return PENDING


def _condition(ctype: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    c: dict[str, Any] = {"type": ctype, "status": "True" if ok else "False"}
    if not ok and reason:
        c["reason"] = reason
    if not ok and message:
        c["message"] = message
    return c


def pod_conditions(phase: str, scheduled: bool, init: Sequence[ContainerView],
                   containers: Sequence[ContainerView]) -> list[dict[str, Any]]:
    """PodScheduled, Initialized, ContainersReady, Ready (without timestamps)."""
    finished = phase in (SUCCEEDED, FAILED)
    if init_done(init) or (finished and init_done(init)):
        initialized = _condition("Initialized", True)
    else:
        pending = [c.name for c in init if not ((t := _terminated(c)) and t.get("exitCode") == 0)]
        initialized = _condition("Initialized", False, "ContainersNotInitialized",
                                 f"containers with incomplete status: [{' '.join(pending)}]")
    unready = [c.name for c in containers if not c.ready]
    if finished:
        ready_c = _condition("ContainersReady", False, "PodCompleted")
        ready = _condition("Ready", False, "PodCompleted")
    elif unready:
        msg = f"containers with unready status: [{' '.join(unready)}]"
        ready_c = _condition("ContainersReady", False, "ContainersNotReady", msg)
        ready = _condition("Ready", False, "ContainersNotReady", msg)
    else:
        ready_c = _condition("ContainersReady", True)
        ready = _condition("Ready", True)
    return [_condition("PodScheduled", scheduled), initialized, ready_c, ready]


def carry_transition_times(new: list[dict[str, Any]], old: Sequence[Mapping[str, Any]] | None,
                           now: str) -> list[dict[str, Any]]:
    """Give each condition a lastTransitionTime: the old one when its status is unchanged."""
    prev = {c.get("type"): c for c in (old or [])}
    out = []
    for c in new:
        c = dict(c)
        p = prev.get(c["type"])
        if p is not None and p.get("status") == c["status"] and p.get("lastTransitionTime"):
            c["lastTransitionTime"] = p["lastTransitionTime"]
        else:
            c["lastTransitionTime"] = now
        c["lastProbeTime"] = None
        out.append(c)
    return out


def _millis(q: Any) -> int:
    try:
        return milli_value(str(q))
    except (ValueError, TypeError, ArithmeticError):
        return 0


def qos_class(spec: Mapping[str, Any]) -> str:
    """Guaranteed / Burstable / BestEffort from the containers' requests and limits."""
    cs = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set = False
    guaranteed = True
    for c in cs:
        res = c.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim:
                guaranteed = False
            elif r in req and _millis(req[r]) != _millis(lim[r]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def build_pod_status(pod: Mapping[str, Any], init: Sequence[ContainerView],
                     containers: Sequence[ContainerView], *, pod_ips: Sequence[str],
                     host_ip: str, start_time: str | None, now: str,
                     phase_override: str | None = None, message: str = "",
                     reason: str = "") -> dict[str, Any]:
    """The whole `status` the agent reports for `pod`."""
    spec = pod.get("spec") or {}
    old = pod.get("status") or {}
    phase = phase_override or pod_phase(spec.get("restartPolicy", "Always"), init, containers)
    conds = pod_conditions(phase, bool(spec.get("nodeName")), init, containers)
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": carry_transition_times(conds, old.get("conditions"), now),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}] if host_ip else [],
        "podIP": pod_ips[0] if pod_ips else None,
        "podIPs": [{"ip": ip} for ip in pod_ips],
        "startTime": start_time,
        "qosClass": qos_class(spec),
        "containerStatuses": [c.to_status() for c in containers],
    }
    if init:
        status["initContainerStatuses"] = [c.to_status() for c in init]
    # Always present: the status is sent as a merge patch, where a missing key
    # would leave a stale message (say, a volume that was missing) in place; None
    # removes it.
    status["message"] = message or None
    status["reason"] = reason or None
    return status


def _strip_times(v: Any) -> Any:
    # Timestamps never count as a change, and a None value is the same as an
    # absent key (that is what it becomes once merged).
    if isinstance(v, dict):
        return {k: _strip_times(x) for k, x in v.items() if k not in _TIME_KEYS and x is not None}
    if isinstance(v, list):
        return [_strip_times(x) for x in v]
    return v


def status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """True when `new` differs from `old` in anything but timestamps."""
    return _strip_times(dict(old or {})) != _strip_times(dict(new))


__all__ = [
    "FAILED", "PENDING", "RUNNING", "SUCCEEDED", "UNKNOWN", "ContainerView",
    "build_pod_status", "carry_transition_times", "init_done", "pod_conditions",
    "pod_phase", "qos_class", "status_changed",
]
