"""The `apps/v1` workload kinds: Deployment, ReplicaSet, StatefulSet, DaemonSet.

All four own pods through a label selector and a pod template, so they share
one validation core: the selector is required, non-empty, immutable and must
select the template's own labels (otherwise the controller would create pods
it cannot see and create them forever), and the template is a PodSpec whose
restartPolicy must be Always (these controllers replace pods, never rerun them).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds import pods
from fleet.api.kinds._common import (
    col,
    d,
    ensure_dict,
    format_label_selector,
    format_labels,
    num,
    selector_string,
    set_default,
    table,
    template_spec,
    wide_container_columns,
)
from fleet.api.kinds.pod_validation import validate_pod_template
from fleet.api.registry import KindInfo, ScaleInfo

Cause = dict[str, str]

PERCENT_FMT = "[0-9]+%"
_PERCENT_RE = re.compile(PERCENT_FMT)
PERCENT_ERR = ("a valid percent string must be a numeric string followed by an ending '%' "
               f"(e.g. '1%',  or '93%', regex used for validation is '{PERCENT_FMT}')")


def int_or_percent(value: Any, path: str, out: list[Cause]) -> int | None:
    """Validate an IntOrString like maxSurge; return its integer or percent number."""
    if value is None:
        return None
    if isinstance(value, str):
        if not _PERCENT_RE.fullmatch(value):
            out.append(v.invalid(path, value, PERCENT_ERR))
            return None
        return int(value[:-1])
    if v.as_int(value) is None:
        out.append(v.type_invalid(path, value, "integer or string"))
        return None
    if value < 0:
        out.append(v.invalid(path, value, "must be greater than or equal to 0"))
        return None
    return value


def validate_workload(obj: dict[str, Any], old: dict[str, Any] | None, *, what: str,
                      selector_required: bool = True) -> tuple[list[Cause], dict[str, Any]]:
    """Metadata, selector, replicas and template — common to every apps/v1 kind.

    Returns the causes and the spec (possibly {}) for kind-specific checks.
    """
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        out.append(v.required("spec") if spec is None else v.type_invalid("spec", spec, "object"))
        return out, {}
    sel = spec.get("selector")
    selector: dict[str, Any] | None = None
    if sel is None:
        if selector_required:
            out.append(v.required("spec.selector"))
    else:
        errs = v.validate_label_selector(sel, "spec.selector")
        out.extend(errs)
        if not errs:
            selector = sel
            if v.selector_is_empty(sel):
                out.append(v.invalid("spec.selector", sel, f"empty selector is invalid for {what}"))
                selector = None
    v.nonnegative(spec, "replicas", "spec.replicas", out)
    v.nonnegative(spec, "minReadySeconds", "spec.minReadySeconds", out)
    v.nonnegative(spec, "revisionHistoryLimit", "spec.revisionHistoryLimit", out)
    out += validate_pod_template(spec.get("template"), "spec.template", selector=selector,
                                   restart_policies=("Always",))
    if old is not None:
        out += v.immutable(sel, d(old, "spec").get("selector"), "spec.selector")
    return out, spec


# ---------------------------------------------------------------------------
# Deployment
# ---------------------------------------------------------------------------


def default_deployment(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    set_default(spec, "replicas", 1)
    strategy = ensure_dict(spec, "strategy")
    if strategy is not None:
        set_default(strategy, "type", "RollingUpdate")
        if strategy.get("type") == "RollingUpdate":
            ru = ensure_dict(strategy, "rollingUpdate")
            if ru is not None:
                set_default(ru, "maxUnavailable", "25%")
                set_default(ru, "maxSurge", "25%")
    set_default(spec, "revisionHistoryLimit", 10)
    set_default(spec, "progressDeadlineSeconds", 600)
    pods.default_pod_template(spec.get("template"))


def validate_deployment(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out, spec = validate_workload(obj, old, what="deployment")
    strategy = spec.get("strategy")
    if isinstance(strategy, dict):
        stype = strategy.get("type")
        if stype not in (None, "Recreate", "RollingUpdate"):
            out.append(v.not_supported("spec.strategy.type", stype, ("Recreate", "RollingUpdate")))
        ru = strategy.get("rollingUpdate")
        if stype == "Recreate" and ru is not None:
            out.append(v.forbidden("spec.strategy.rollingUpdate",
                                   "may not be specified when strategy `type` is 'Recreate'"))
        elif isinstance(ru, dict):
            _validate_rolling(ru, "spec.strategy.rollingUpdate", out)
    elif strategy is not None:
        out.append(v.type_invalid("spec.strategy", strategy, "object"))
    pds = spec.get("progressDeadlineSeconds")
    v.positive(spec, "progressDeadlineSeconds", "spec.progressDeadlineSeconds", out)
    mrs = spec.get("minReadySeconds")
    if v.as_int(pds) is not None and v.as_int(mrs) is not None and pds <= mrs:
        out.append(v.invalid("spec.progressDeadlineSeconds", pds, "must be greater than minReadySeconds"))
    return out


def _validate_rolling(ru: dict[str, Any], path: str, out: list[Cause]) -> None:
    surge = int_or_percent(ru.get("maxSurge"), f"{path}.maxSurge", out)
    unavail = int_or_percent(ru.get("maxUnavailable"), f"{path}.maxUnavailable", out)
    if surge == 0 and unavail == 0:
        # Neither new pods above nor old pods below the target: the rollout could never move.
        out.append(v.invalid(f"{path}.maxUnavailable", ru.get("maxUnavailable"),
                             "may not be 0 when `maxSurge` is 0"))
    mu = ru.get("maxUnavailable")
    if isinstance(mu, str) and unavail is not None and unavail > 100:
        out.append(v.invalid(f"{path}.maxUnavailable", mu, "must not be greater than 100%"))


DEPLOYMENT = KindInfo(
    zero_status={},
    group="apps", version="v1", kind="Deployment", plural="deployments", singular="deployment",
    short_names=("deploy",), categories=("all",), subresources=("status", "scale"),
    columns_override=table(
        col("Ready", lambda o: f"{num(d(o, 'status').get('readyReplicas'))}/{num(d(o, 'spec').get('replicas'))}",
            description="Number of the pod with ready state"),
        col("Up-to-date", lambda o: num(d(o, "status").get("updatedReplicas")),
            description="Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
        col("Available", lambda o: num(d(o, "status").get("availableReplicas")),
            description="Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
        wide=(*wide_container_columns(template_spec),
              col("Selector", lambda o: selector_string(d(o, "spec").get("selector")), priority=1,
                  description="Label selector for pods.")),
    ),
    default=default_deployment, validate=validate_deployment, scale=ScaleInfo(),
)

# ---------------------------------------------------------------------------
# ReplicaSet
# ---------------------------------------------------------------------------


def default_replica_set(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    set_default(spec, "replicas", 1)
    pods.default_pod_template(spec.get("template"))


def validate_replica_set(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    return validate_workload(obj, old, what="replicaset")[0]


def _selector_column() -> Any:
    return col("Selector", lambda o: format_label_selector(d(o, "spec").get("selector")), priority=1,
               description="Label selector for pods.")


REPLICA_SET = KindInfo(
    zero_status={"replicas": 0},
    group="apps", version="v1", kind="ReplicaSet", plural="replicasets", singular="replicaset",
    short_names=("rs",), categories=("all",), subresources=("status", "scale"),
    columns_override=table(
        col("Desired", lambda o: num(d(o, "spec").get("replicas")), type="integer",
            description="Replicas is the number of desired pods."),
        col("Current", lambda o: num(d(o, "status").get("replicas")), type="integer",
            description="Replicas is the most recently observed number of non-terminating pods."),
        col("Ready", lambda o: num(d(o, "status").get("readyReplicas")), type="integer",
            description="The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition."),
        wide=(*wide_container_columns(template_spec), _selector_column()),
    ),
    default=default_replica_set, validate=validate_replica_set, scale=ScaleInfo(),
    selectable_fields=("status.replicas",),
)

# ---------------------------------------------------------------------------
# StatefulSet
# ---------------------------------------------------------------------------

STS_MUTABLE_SPEC = ("replicas", "ordinals", "template", "updateStrategy", "revisionHistoryLimit",
                    "persistentVolumeClaimRetentionPolicy", "minReadySeconds")


def default_stateful_set(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    set_default(spec, "replicas", 1)
    set_default(spec, "podManagementPolicy", "OrderedReady")
    us = ensure_dict(spec, "updateStrategy")
    if us is not None:
        set_default(us, "type", "RollingUpdate")
        if us.get("type") == "RollingUpdate":
            ru = ensure_dict(us, "rollingUpdate")
            if ru is not None:
                set_default(ru, "partition", 0)
    set_default(spec, "revisionHistoryLimit", 10)
    set_default(spec, "serviceName", "")
    ret = ensure_dict(spec, "persistentVolumeClaimRetentionPolicy")
    if ret is not None:
        set_default(ret, "whenDeleted", "Retain")
        set_default(ret, "whenScaled", "Retain")
    pods.default_pod_template(spec.get("template"))


def _with_claim_volumes(obj: dict[str, Any]) -> dict[str, Any]:
    """The StatefulSet as its pods will see it: each volumeClaimTemplate becomes a volume.

    Containers mount claim templates by name although the template lists no such
    volume (the controller adds one per pod); validating the template alone would
    refuse every StatefulSet with storage.  Kubernetes skips pod-spec validation
    here altogether; checking the union keeps the rest of the validation.
    """
    spec = obj.get("spec")
    tspec = template_spec(obj)
    claims = [t.get("metadata", {}).get("name") for t in (spec or {}).get("volumeClaimTemplates") or []
              if isinstance(t, dict) and isinstance(t.get("metadata"), dict)] if isinstance(spec, dict) else []
    if not claims or not tspec:
        return obj
    vols = tspec.get("volumes")
    if vols is not None and not isinstance(vols, list):
        return obj
    have = {vol.get("name") for vol in vols or [] if isinstance(vol, dict)}
    extra = [{"name": n, "persistentVolumeClaim": {"claimName": n}}
             for n in claims if isinstance(n, str) and n and n not in have]
    if not extra:
        return obj
    patched = copy.deepcopy(obj)
    patched["spec"]["template"]["spec"]["volumes"] = [*(vols or []), *extra]
    return patched


def validate_stateful_set(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out, _ = validate_workload(_with_claim_volumes(obj), old, what="statefulset")
    spec = d(obj, "spec")
    pmp = spec.get("podManagementPolicy")
    if pmp is not None and pmp not in ("OrderedReady", "Parallel"):
        out.append(v.not_supported("spec.podManagementPolicy", pmp, ("OrderedReady", "Parallel")))
    us = spec.get("updateStrategy")
    if isinstance(us, dict):
        utype = us.get("type")
        if utype not in (None, "RollingUpdate", "OnDelete"):
            out.append(v.not_supported("spec.updateStrategy.type", utype, ("RollingUpdate", "OnDelete")))
        ru = us.get("rollingUpdate")
        if utype == "OnDelete" and ru is not None:
            out.append(v.forbidden("spec.updateStrategy.rollingUpdate",
                                   "only allowed for updateStrategy 'RollingUpdate'"))
        elif isinstance(ru, dict):
            v.nonnegative(ru, "partition", "spec.updateStrategy.rollingUpdate.partition", out)
            mu = int_or_percent(ru.get("maxUnavailable"), "spec.updateStrategy.rollingUpdate.maxUnavailable", out)
            if mu == 0:
                out.append(v.invalid("spec.updateStrategy.rollingUpdate.maxUnavailable", 0,
                                     "must be greater than 0"))
    for key in ("whenDeleted", "whenScaled"):
        val = d(spec, "persistentVolumeClaimRetentionPolicy").get(key)
        if val is not None and val not in ("Retain", "Delete"):
            out.append(v.not_supported(f"spec.persistentVolumeClaimRetentionPolicy.{key}", val,
                                       ("Retain", "Delete")))
    for i, t in enumerate(spec.get("volumeClaimTemplates") or []):
        name = d(t, "metadata").get("name") if isinstance(t, dict) else None
        if not name:
            out.append(v.required(f"spec.volumeClaimTemplates[{i}].metadata.name"))
        else:
            for msg in v.is_dns1123_subdomain(str(name)):
                out.append(v.invalid(f"spec.volumeClaimTemplates[{i}].metadata.name", name, msg))
    if old is not None:
        old_spec = d(old, "spec")
        frozen = {k: val for k, val in spec.items() if k not in STS_MUTABLE_SPEC and k != "selector"}
        old_frozen = {k: val for k, val in old_spec.items() if k not in STS_MUTABLE_SPEC and k != "selector"}
        if frozen != old_frozen:
            out.append(v.forbidden("spec", "updates to statefulset spec for fields other than 'replicas', "
                                   "'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', "
                                   "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"))
    return out


STATEFUL_SET = KindInfo(
    zero_status={"replicas": 0, "availableReplicas": 0},
    group="apps", version="v1", kind="StatefulSet", plural="statefulsets", singular="statefulset",
    short_names=("sts",), categories=("all",), subresources=("status", "scale"),
    columns_override=table(
        col("Ready", lambda o: f"{num(d(o, 'status').get('readyReplicas'))}/{num(d(o, 'spec').get('replicas'))}",
            description="Number of the pod with ready state"),
        wide=wide_container_columns(template_spec),
    ),
    default=default_stateful_set, validate=validate_stateful_set, scale=ScaleInfo(),
)

# ---------------------------------------------------------------------------
# DaemonSet
# ---------------------------------------------------------------------------


def default_daemon_set(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    us = ensure_dict(spec, "updateStrategy")
    if us is not None:
        set_default(us, "type", "RollingUpdate")
        if us.get("type") == "RollingUpdate":
            ru = ensure_dict(us, "rollingUpdate")
            if ru is not None:
                set_default(ru, "maxUnavailable", 1)
                set_default(ru, "maxSurge", 0)
    set_default(spec, "revisionHistoryLimit", 10)
    pods.default_pod_template(spec.get("template"))


def validate_daemon_set(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out, spec = validate_workload(obj, old, what="daemonset")
    us = spec.get("updateStrategy")
    if isinstance(us, dict):
        utype = us.get("type")
        if utype not in (None, "RollingUpdate", "OnDelete"):
            out.append(v.not_supported("spec.updateStrategy.type", utype, ("OnDelete", "RollingUpdate")))
        ru = us.get("rollingUpdate")
        if isinstance(ru, dict) and utype == "RollingUpdate":
            _validate_rolling(ru, "spec.updateStrategy.rollingUpdate", out)
    return out


def _ds_status(key: str):
    return lambda o: num(d(o, "status").get(key))


DAEMON_SET = KindInfo(
    zero_status={"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0,
                 "numberReady": 0},
    group="apps", version="v1", kind="DaemonSet", plural="daemonsets", singular="daemonset",
    short_names=("ds",), categories=("all",), subresources=("status",),
    columns_override=table(
        col("Desired", _ds_status("desiredNumberScheduled"), type="integer",
            description="The total number of nodes that should be running the daemon pod."),
        col("Current", _ds_status("currentNumberScheduled"), type="integer",
            description="The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod."),
        col("Ready", _ds_status("numberReady"), type="integer",
            description="The number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition."),
        col("Up-to-date", _ds_status("updatedNumberScheduled"), type="integer",
            description="The total number of nodes that are running updated daemon pod"),
        col("Available", _ds_status("numberAvailable"), type="integer",
            description="The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available"),
        col("Node Selector", lambda o: format_labels(template_spec(o).get("nodeSelector")),
            description="NodeSelector is a selector which must be true for the pod to fit on a node."),
        wide=(*wide_container_columns(template_spec), _selector_column()),
    ),
    default=default_daemon_set, validate=validate_daemon_set,
)

KINDS = (DEPLOYMENT, REPLICA_SET, STATEFUL_SET, DAEMON_SET)
