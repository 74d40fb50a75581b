"""The legacy core (`v1`) pod-template kinds: PodTemplate and ReplicationController.

Both predate `apps/v1` and are still what a stock client expects of a
kube-apiserver: kubectl's default `apply --prune` allowlist names
`/v1/ReplicationController` (prune fails when the server lacks it), old
manifests create RCs, and PodTemplate is a plain stored template.

What differs from the apps/v1 workloads (fleet/api/kinds/apps.py), as in
kube-apiserver (pkg/apis/core/validation and core/v1 defaults):

* an RC's selector is an equality-based **map**, not a LabelSelector; it is
  defaulted from the template's labels, and so are the RC's own labels
  (SetDefaults_ReplicationController); it must not be empty, is mutable, and
  must match the template's labels;
* the RC's template must have restartPolicy Always and no activeDeadlineSeconds;
* a PodTemplate's template takes any restart policy (it is only stored).

The controller that keeps an RC's pods is the ReplicaSet controller with the RC's
strategy (fleet/controllers/replicaset.py, `REPLICATION_CONTROLLER`).
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds import pods
from fleet.api.kinds._common import (
    col,
    container_cells,
    d,
    format_labels,
    num,
    set_default,
    table,
    template_spec,
    wide_container_columns,
)
from fleet.api.kinds.pod_validation import validate_pod_template
from fleet.api.registry import NAME_COLUMN, KindInfo, ScaleInfo

Cause = dict[str, str]

# ---------------------------------------------------------------------------
# PodTemplate
# ---------------------------------------------------------------------------


def default_pod_template_kind(obj: dict[str, Any]) -> None:
    pods.default_pod_template(obj.get("template"))


def validate_pod_template_kind(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """ValidatePodTemplate (and ...Update: the template stays mutable)."""
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    template = obj.get("template")
    # `template` is a value, not a pointer, in the Go type: a missing one is an empty
    # template whose spec then lacks its containers.
    out += validate_pod_template({"spec": {}} if template is None else template, "template",
                                 selector=None)
    return out


def _pod_template_labels(o: dict[str, Any]) -> str:
    return format_labels(d(o, "template", "metadata").get("labels"))


POD_TEMPLATE = KindInfo(
    group="", version="v1", kind="PodTemplate", plural="podtemplates", singular="podtemplate",
    # kubectl's printPodTemplate: no AGE column.
    columns_override=(
        NAME_COLUMN,
        col("Containers", lambda o: container_cells(d(o, "template", "spec"))[0],
            description="Names of each container in the template."),
        col("Images", lambda o: container_cells(d(o, "template", "spec"))[1],
            description="Images referenced by each container in the template."),
        col("Pod Labels", _pod_template_labels, description="The labels for the pod template."),
    ),
    default=default_pod_template_kind, validate=validate_pod_template_kind,
    # The template is all there is: a change to it is a change of the object.
    non_spec_fields=("metadata",),
)

# ---------------------------------------------------------------------------
# ReplicationController
# ---------------------------------------------------------------------------


def default_replication_controller(obj: dict[str, Any]) -> None:
    """SetDefaults_ReplicationController: selector and labels from the template's labels,
    one replica; then the template's pod spec defaults."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    template = spec.get("template")
    labels = d(template, "metadata").get("labels") if isinstance(template, dict) else None
    if isinstance(labels, dict) and labels:
        if not spec.get("selector"):
            spec["selector"] = copy.deepcopy(labels)
        md = obj.get("metadata")
        if isinstance(md, dict) and not md.get("labels"):
            md["labels"] = copy.deepcopy(labels)
    set_default(spec, "replicas", 1)
    pods.default_pod_template(template)


def _string_map(value: Any, path: str, out: list[Cause]) -> dict[str, str] | None:
    if value is None:
        return {}
    if not isinstance(value, dict):
        out.append(v.type_invalid(path, value, "object"))
        return None
    for k, val in value.items():
        if not isinstance(val, str):
            out.append(v.type_invalid(f"{path}.{k}", val, "string"))
            return None
    return value


def validate_replication_controller(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """ValidateReplicationController(Update): kube-apiserver's checks and messages."""
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        out.append(v.required("spec") if spec is None else v.type_invalid("spec", spec, "object"))
        return out
    v.nonnegative(spec, "minReadySeconds", "spec.minReadySeconds", out)
    selector = _string_map(spec.get("selector"), "spec.selector", out)
    if selector is not None and not selector:
        out.append(v.required("spec.selector"))  # ValidateNonEmptySelector
    v.nonnegative(spec, "replicas", "spec.replicas", out)
    template = spec.get("template")
    if template is None:
        out.append(v.required("spec.template"))
        return out
    # ValidatePodTemplateSpecForRC: the selector must match the template's labels, the
    # template must be a valid pod template whose pods are restarted, never rerun.
    out += validate_pod_template(template, "spec.template",
                                 selector={"matchLabels": selector} if selector else None)
    tspec = d(template, "spec")
    policy = tspec.get("restartPolicy")
    if isinstance(template, dict) and policy != "Always":
        out.append(v.not_supported("spec.template.spec.restartPolicy", policy, ("Always",)))
    if tspec.get("activeDeadlineSeconds") is not None:
        out.append(v.forbidden("spec.template.spec.activeDeadlineSeconds",
                               "activeDeadlineSeconds in ReplicationController is not Supported"))
    out += validate_replication_controller_status(obj.get("status"))
    return out


def validate_replication_controller_status(status: Any) -> list[Cause]:
    """ValidateReplicationControllerStatus (what the controller writes to /status)."""
    if not isinstance(status, dict):
        return []
    out: list[Cause] = []
    for key in ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas",
                "observedGeneration"):
        v.nonnegative(status, key, f"status.{key}", out)
    n = {k: v.as_int(status.get(k)) or 0
         for k in ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas")}
    for key in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
        if n[key] > n["replicas"]:
            out.append(v.invalid(f"status.{key}", n[key], "cannot be greater than status.replicas"))
    if n["availableReplicas"] > n["readyReplicas"]:
        out.append(v.invalid("status.availableReplicas", n["availableReplicas"],
                             "cannot be greater than readyReplicas"))
    return out


REPLICATION_CONTROLLER = KindInfo(
    zero_status={"replicas": 0},
    group="", version="v1", kind="ReplicationController", plural="replicationcontrollers",
    singular="replicationcontroller", short_names=("rc",), categories=("all",),
    subresources=("status", "scale"),
    columns_override=table(
        col("Desired", lambda o: num(d(o, "spec").get("replicas")), type="integer",
            description="Replicas is the number of desired replicas. This is a pointer to distinguish "
                        "between explicit zero and unspecified. Defaults to 1."),
        col("Current", lambda o: num(d(o, "status").get("replicas")), type="integer",
            description="Replicas is the most recently observed number of replicas."),
        col("Ready", lambda o: num(d(o, "status").get("readyReplicas")), type="integer",
            description="The number of ready replicas for this replication controller."),
        wide=(*wide_container_columns(template_spec),
              col("Selector", lambda o: format_labels(d(o, "spec").get("selector")), priority=1,
                  description="Selector is a label query over pods that should match the Replicas count. "
                              "If Selector is empty, it is defaulted to the labels present on the Pod "
                              "template. Label keys and values that must match in order to be controlled "
                              "by this replication controller, if empty defaulted to labels on Pod template.")),
    ),
    default=default_replication_controller, validate=validate_replication_controller,
    scale=ScaleInfo(), selectable_fields=("status.replicas",),
)

KINDS = (POD_TEMPLATE, REPLICATION_CONTROLLER)

__all__ = ["KINDS", "POD_TEMPLATE", "REPLICATION_CONTROLLER", "default_replication_controller",
           "validate_pod_template_kind", "validate_replication_controller",
           "validate_replication_controller_status"]
