"""Pod defaulting, validation and printing, shared by Pod and every pod template.

Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs and CronJobs all
embed a PodTemplateSpec; kube-apiserver defaults and validates those templates
with the same code it uses for Pods, so they live here once.  The STATUS
column logic is kubectl's `printPod`, line for line, because users read
`CrashLoopBackOff`, `Init:0/1` and `Terminating` as API, not decoration.
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api import validation as v
from fleet.api.conditions import condition_status
from fleet.api.kinds._common import NONE, col, d, dicts, lst, num, set_default, since
from fleet.api.kinds.pod_validation import validate_pod_spec

# ---------------------------------------------------------------------------
# Defaulting (k8s.io/kubernetes/pkg/apis/core/v1/defaults.go).
# ---------------------------------------------------------------------------


def image_tag(image: str) -> str:
    """The tag of an image reference; "latest" when it has neither tag nor digest."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]  # a registry "host:port/" prefix is not a tag
    tag = last.partition(":")[2]
    if not tag and not digest:
        return "latest"
    return tag


def _default_http_get(h: Any) -> None:
    if isinstance(h, dict):
        set_default(h, "path", "/")
        set_default(h, "scheme", "HTTP")


def _default_probe(p: Any) -> None:
    if not isinstance(p, dict):
        return
    set_default(p, "timeoutSeconds", 1)
    set_default(p, "periodSeconds", 10)
    set_default(p, "successThreshold", 1)
    set_default(p, "failureThreshold", 3)
    _default_http_get(p.get("httpGet"))


def default_container(c: Any) -> None:
    if not isinstance(c, dict):
        return
    image = c.get("image")
    if c.get("imagePullPolicy") is None and isinstance(image, str) and image:
        # A moving tag must be re-pulled to mean anything; a pinned one need not be.
        c["imagePullPolicy"] = "Always" if image_tag(image) == "latest" else "IfNotPresent"
    set_default(c, "terminationMessagePath", "/dev/termination-log")
    set_default(c, "terminationMessagePolicy", "File")
    set_default(c, "resources", {})
    for p in dicts(lst(c, "ports")):
        set_default(p, "protocol", "TCP")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        _default_probe(c.get(probe))
    for hook in d(c, "lifecycle").values():
        if isinstance(hook, dict):
            _default_http_get(hook.get("httpGet"))
    for e in dicts(lst(c, "env")):
        fr = d(e, "valueFrom", "fieldRef")
        if fr:
            set_default(fr, "apiVersion", "v1")


def default_pod_spec(spec: Any, *, restart_policy: bool = True) -> None:
    """Fill a PodSpec's defaults in place.

    `restart_policy=False` is for Job templates: Kubernetes would default
    Always and then reject it, so Fleet leaves it unset and validation asks
    for OnFailure or Never instead.
    """
    if not isinstance(spec, dict):
        return
    set_default(spec, "dnsPolicy", "ClusterFirst")
    if restart_policy:
        set_default(spec, "restartPolicy", "Always")
    set_default(spec, "terminationGracePeriodSeconds", 30)
    set_default(spec, "securityContext", {})
    set_default(spec, "schedulerName", "default-scheduler")
    set_default(spec, "enableServiceLinks", True)
    # The deprecated `serviceAccount` mirrors `serviceAccountName`.
    if not spec.get("serviceAccountName") and isinstance(spec.get("serviceAccount"), str):
        spec["serviceAccountName"] = spec["serviceAccount"]
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for c in lst(spec, key):
            default_container(c)
    for vol in dicts(lst(spec, "volumes")):
        for src in ("secret", "configMap", "downwardAPI", "projected"):
            body = vol.get(src)
            if isinstance(body, dict):
                set_default(body, "defaultMode", 0o644)


def default_pod_template(template: Any, *, restart_policy: bool = True) -> None:
    if isinstance(template, dict):
        default_pod_spec(template.get("spec"), restart_policy=restart_policy)


def default_pod(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    default_pod_spec(spec)
    if isinstance(spec, dict):
        # What the ServiceAccount admission plugin does for every Pod (but not
        # for templates, nor mirror pods, which may not name an account): run as
        # the namespace's "default" account.
        annotations = (obj.get("metadata") or {}).get("annotations")
        if not (isinstance(annotations, dict) and "kubernetes.io/config.mirror" in annotations):
            if not spec.get("serviceAccountName"):
                spec["serviceAccountName"] = "default"
            spec["serviceAccount"] = spec["serviceAccountName"]
        # A pod without any status is being created (the server drops a
        # client's status on create, and updates keep the stored one): give it
        # what kube-apiserver's PrepareForCreate does, Pending and its QoS class.
        if not obj.get("status"):
            obj["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


# ---------------------------------------------------------------------------
# Validation.
# ---------------------------------------------------------------------------

POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def _mutable_masked(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """`new` with the fields a pod update may change overwritten by `old`'s values."""
    m = copy.deepcopy(new)
    for key in ("containers", "initContainers"):
        new_cs, old_cs = lst(m, key), lst(old, key)
        for i, c in enumerate(new_cs):
            if isinstance(c, dict) and i < len(old_cs) and isinstance(old_cs[i], dict):
                if "image" in old_cs[i]:
                    c["image"] = old_cs[i]["image"]
    for key in ("activeDeadlineSeconds",):
        if key in old:
            m[key] = old[key]
        else:
            m.pop(key, None)
    # Tolerations may only grow: if every old toleration is still there, treat as unchanged.
    old_tols, new_tols = lst(old, "tolerations"), lst(m, "tolerations")
    if all(t in new_tols for t in old_tols):
        if "tolerations" in old:
            m["tolerations"] = old["tolerations"]
        else:
            m.pop("tolerations", None)
    old_grace = old.get("terminationGracePeriodSeconds")
    if isinstance(old_grace, int) and old_grace < 0 and m.get("terminationGracePeriodSeconds") == 1:
        m["terminationGracePeriodSeconds"] = old_grace
    # spec.nodeName is not changed by an update: binding (pods/binding, which
    # checks the pod is unbound and not terminating) is the one way to set it.
    # Scheduling gates may be removed (that is how a gated pod is released).
    if all(g in lst(old, "schedulingGates") for g in lst(m, "schedulingGates")):
        if "schedulingGates" in old:
            m["schedulingGates"] = old["schedulingGates"]
        else:
            m.pop("schedulingGates", None)
    return m


def validate_pod(obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, str]]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    out += validate_pod_spec(obj.get("spec"))
    if old is not None and isinstance(obj.get("spec"), dict):
        new_spec, old_spec = obj["spec"], d(old, "spec")
        if _mutable_masked(new_spec, old_spec) != old_spec:
            out.append(v.forbidden("spec", POD_UPDATE_FORBIDDEN))
    return out


# ---------------------------------------------------------------------------
# Printing (kubectl's printPod).
# ---------------------------------------------------------------------------


def _is_restartable_init(c: dict[str, Any] | None) -> bool:
    return bool(c) and c.get("restartPolicy") == "Always"  # type: ignore[union-attr]


def _later(a: str, b: Any) -> str:
    # RFC 3339 "Z" timestamps of equal precision compare correctly as strings.
    return b if isinstance(b, str) and b > a else a


def pod_summary(pod: dict[str, Any]) -> tuple[str, str, str]:
    """(READY, STATUS, RESTARTS) cells exactly as kubectl computes them."""
    spec, status = d(pod, "spec"), d(pod, "status")
    containers = lst(spec, "containers")
    init_specs = {c.get("name"): c for c in dicts(lst(spec, "initContainers"))}
    total = len(containers) + sum(1 for c in init_specs.values() if _is_restartable_init(c))
    ready = 0
    restarts = 0
    sidecar_restarts = 0
    last_restart = ""
    last_sidecar_restart = ""

    phase = status.get("phase") or "Pending"
    reason = status.get("reason") or phase
    for c in dicts(lst(status, "conditions")):
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    init_statuses = dicts(lst(status, "initContainerStatuses"))
    initializing = False
    for i, cs in enumerate(init_statuses):
        restarts += num(cs.get("restartCount"))
        finished = d(cs, "lastState", "terminated").get("finishedAt")
        last_restart = _later(last_restart, finished)
        sidecar = _is_restartable_init(init_specs.get(cs.get("name")))
        if sidecar:
            sidecar_restarts += num(cs.get("restartCount"))
            last_sidecar_restart = _later(last_sidecar_restart, finished)
        state = d(cs, "state")
        term, waiting = state.get("terminated"), state.get("waiting")
        if isinstance(term, dict) and num(term.get("exitCode")) == 0:
            continue
        if sidecar and cs.get("started") is True:
            if cs.get("ready"):
                ready += 1
            continue
        if isinstance(term, dict):
            if not term.get("reason"):
                if num(term.get("signal")):
                    reason = f"Init:Signal:{num(term.get('signal'))}"
                else:
                    reason = f"Init:ExitCode:{num(term.get('exitCode'))}"
            else:
                reason = "Init:" + str(term["reason"])
        elif isinstance(waiting, dict) and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = "Init:" + str(waiting["reason"])
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break

    if not initializing or condition_status(status.get("conditions"), "Initialized") == "True":
        restarts = sidecar_restarts
        last_restart = last_sidecar_restart
        has_running = False
        for cs in reversed(dicts(lst(status, "containerStatuses"))):
            restarts += num(cs.get("restartCount"))
            last_restart = _later(last_restart, d(cs, "lastState", "terminated").get("finishedAt"))
            state = d(cs, "state")
            term, waiting = state.get("terminated"), state.get("waiting")
            if isinstance(waiting, dict) and waiting.get("reason"):
                reason = str(waiting["reason"])
            elif isinstance(term, dict) and term.get("reason"):
                reason = str(term["reason"])
            elif isinstance(term, dict):
                if num(term.get("signal")):
                    reason = f"Signal:{num(term.get('signal'))}"
                else:
                    reason = f"ExitCode:{num(term.get('exitCode'))}"
            elif cs.get("ready") and isinstance(state.get("running"), dict):
                has_running = True
                ready += 1
        # A "Completed" container next to a running one is not a completed pod.
        if reason == "Completed" and has_running:
            reason = "Running" if condition_status(status.get("conditions"), "Ready") == "True" else "NotReady"

    deleting = bool(d(pod, "metadata").get("deletionTimestamp"))
    if deleting and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif deleting and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"

    restarts_cell = str(restarts)
    if restarts and last_restart:
        restarts_cell = f"{restarts} ({since(last_restart)} ago)"
    return f"{ready}/{total}", reason, restarts_cell


def _pod_ip(pod: dict[str, Any]) -> str:
    ips = dicts(lst(pod, "status", "podIPs"))
    ip = ips[0].get("ip") if ips else d(pod, "status").get("podIP")
    return ip or NONE


def _readiness_gates(pod: dict[str, Any]) -> str:
    gates = dicts(lst(pod, "spec", "readinessGates"))
    if not gates:
        return NONE
    conds = {c.get("type"): c.get("status") for c in dicts(lst(pod, "status", "conditions"))}
    ok = sum(1 for g in gates if conds.get(g.get("conditionType")) == "True")
    return f"{ok}/{len(gates)}"


POD_COLUMNS = (
    col("Ready", lambda p: pod_summary(p)[0],
        description="The aggregate readiness state of this pod for accepting traffic."),
    col("Status", lambda p: pod_summary(p)[1],
        description="The aggregate status of the containers in this pod."),
    # kube-apiserver types RESTARTS as a string because it reads "3 (5m ago)".
    col("Restarts", lambda p: pod_summary(p)[2],
        description="The number of times the containers in this pod have been restarted and "
                    "when the last container in this pod has restarted."),
)
POD_WIDE_COLUMNS = (
    col("IP", _pod_ip, priority=1, description="IP address allocated to the pod."),
    col("Node", lambda p: d(p, "spec").get("nodeName") or NONE, priority=1,
        description="NodeName is a request to schedule this pod onto a specific node."),
    col("Nominated Node", lambda p: d(p, "status").get("nominatedNodeName") or NONE, priority=1,
        description="nominatedNodeName is set only when this pod preempts other pods on the node."),
    col("Readiness Gates", _readiness_gates, priority=1,
        description="If specified, all readiness gates will be evaluated for pod readiness."),
)


def qos_class(spec: dict[str, Any]) -> str:
    """The pod's QoS class (Guaranteed, Burstable or BestEffort), as the kubelet derives it."""
    from fleet.api.quantity import QuantityError, parse_quantity

    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    guaranteed = True
    cs = dicts(lst(spec, "containers")) + dicts(lst(spec, "initContainers"))
    for c in cs:
        res = d(c, "resources")
        c_req, c_lim = d(res, "requests"), d(res, "limits")
        for src, dst in ((c_req, requests), (c_lim, limits)):
            for name, q in src.items():
                if name not in ("cpu", "memory"):
                    continue
                try:
                    if parse_quantity(q) != 0:
                        dst[name] = q
                except QuantityError:
                    continue
        has = {n for n in ("cpu", "memory") if n in c_lim}
        if has != {"cpu", "memory"}:
            guaranteed = False
        for name in ("cpu", "memory"):
            if name in c_req and name in c_lim:
                try:
                    if parse_quantity(c_req[name]) != parse_quantity(c_lim[name]):
                        guaranteed = False
                except QuantityError:
                    guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and cs:
        return "Guaranteed"
    return "Burstable"


def pod_delete_grace(pod: dict[str, Any], requested: Any) -> int:
    """Seconds a pod gets to terminate, per Kubernetes' pod deletion strategy.

    A pod no node has taken (no nodeName) or one that already finished has
    nothing to stop, so it goes at once; otherwise the DeleteOptions' period,
    else the pod's terminationGracePeriodSeconds (default 30).
    """
    # A stored pod whose spec or status is not an object (written before validation
    # existed) must still be deletable: with no readable node it has nothing to stop.
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    if not spec.get("nodeName"):
        return 0
    if status.get("phase") in ("Succeeded", "Failed"):
        return 0
    if isinstance(requested, int) and not isinstance(requested, bool):
        return max(requested, 0)
    g = spec.get("terminationGracePeriodSeconds", 30)
    return g if isinstance(g, int) and g >= 0 else 30
