"""`autoscaling/v2` HorizontalPodAutoscaler: the object the HPA controller reconciles.

The spec names a target with a scale subresource (`scaleTargetRef`), the
replica bounds, the metrics to track and, optionally, how fast to move
(`behavior`).  Defaulting and validation follow kube-apiserver
(k8s.io/kubernetes/pkg/apis/autoscaling/v2/defaults.go and
pkg/apis/autoscaling/validation):

* `minReplicas` defaults to 1 and `metrics` to cpu at 80% utilization;
* a `behavior` that is present gets every unset field of both directions
  filled: scale up with no stabilization and the larger of +4 pods or +100%
  per 15 s, scale down with at most -100% per 15 s.  The scale-down
  stabilization window is deliberately left unset, so the controller's own
  default (300 s, `--horizontal-pod-autoscaler-downscale-stabilization` in
  Kubernetes) applies — the same split Kubernetes makes.

The table is kubectl's: NAME REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE,
with TARGETS formatted like `printHorizontalPodAutoscaler` ("cpu: 45%/50%").

autoscaling/v1 is the same object in an older shape (one cpu target): it is
registered here for discovery, and the server converts v1 requests to the
stored v2 form and back (fleet/server/hpa_v1.py).
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api import quantity
from fleet.api import validation as v
from fleet.api.kinds._common import NONE, col, d, dicts, lst, num, set_default, table
from fleet.api.kinds.metrics import canonical_quantity
from fleet.api.registry import KindInfo

Cause = dict[str, str]

DEFAULT_CPU_UTILIZATION = 80
MAX_STABILIZATION_WINDOW = 3600  # one hour
MAX_POLICY_PERIOD = 1800  # half an hour

METRIC_TYPES = ("ContainerResource", "External", "Object", "Pods", "Resource")
TARGET_TYPES = ("AverageValue", "Utilization", "Value")
POLICY_TYPES = ("Percent", "Pods")
SELECT_POLICIES = ("Disabled", "Max", "Min")

DEFAULT_SCALE_UP_RULES: dict[str, Any] = {
    "stabilizationWindowSeconds": 0,
    "selectPolicy": "Max",
    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                 {"type": "Percent", "value": 100, "periodSeconds": 15}],
}
# No stabilizationWindowSeconds: the controller's default applies (see the docstring).
DEFAULT_SCALE_DOWN_RULES: dict[str, Any] = {
    "selectPolicy": "Max",
    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
}


# ---------------------------------------------------------------------------
# Defaults
# ---------------------------------------------------------------------------


def scaling_rules(rules: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """`rules` with every unset field taken from `defaults` (GenerateHPAScale{Up,Down}Rules)."""
    out = copy.deepcopy(defaults)
    if isinstance(rules, dict):
        for key in ("selectPolicy", "stabilizationWindowSeconds", "policies"):
            if rules.get(key) is not None:
                out[key] = copy.deepcopy(rules[key])
    return out


SPEC_FIELDS = ("scaleTargetRef", "minReplicas", "maxReplicas", "metrics", "behavior")


def default_hpa(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    # kube-apiserver decodes into typed structs, so unknown spec fields are dropped (its
    # Ignore/Warn field validation); Fleet has no schema for this kind to do it for it.
    for key in [k for k in spec if k not in SPEC_FIELDS]:
        del spec[key]
    set_default(spec, "minReplicas", 1)
    if not spec.get("metrics"):
        spec["metrics"] = [{"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization",
                                      "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]
    for m in dicts(lst(spec, "metrics")):
        # kube-apiserver stores quantities in canonical form ("0.5" comes back as "500m").
        for field in ("resource", "containerResource", "pods", "object", "external"):
            target = d(m, field, "target")
            for key in ("value", "averageValue"):
                if isinstance(target.get(key), (str, int, float)) and \
                        quantity.is_quantity(target[key]):
                    target[key] = canonical_quantity(target[key])
    behavior = spec.get("behavior")
    if isinstance(behavior, dict):
        behavior["scaleUp"] = scaling_rules(behavior.get("scaleUp"), DEFAULT_SCALE_UP_RULES)
        behavior["scaleDown"] = scaling_rules(behavior.get("scaleDown"), DEFAULT_SCALE_DOWN_RULES)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _path_segment_problems(name: str) -> list[str]:
    """path.IsValidPathSegmentName: the name ends up in a URL path."""
    if name in (".", ".."):
        return [f'may not be "{name}"']
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def _validate_ref(ref: Any, path: str, out: list[Cause]) -> None:
    if not isinstance(ref, dict):
        out.append(v.required(path) if ref is None else v.type_invalid(path, ref, "object"))
        return
    for key in ("kind", "name"):
        value = ref.get(key)
        if not value:
            out.append(v.required(f"{path}.{key}"))
        elif not isinstance(value, str):
            out.append(v.type_invalid(f"{path}.{key}", value, "string"))
        else:
            for msg in _path_segment_problems(value):
                out.append(v.invalid(f"{path}.{key}", value, msg))
    api_version = ref.get("apiVersion")
    if api_version is not None and not isinstance(api_version, str):
        out.append(v.type_invalid(f"{path}.apiVersion", api_version, "string"))


def _positive_quantity(value: Any, path: str, out: list[Cause]) -> None:
    q, errs = v.validate_quantity(value, path)
    out.extend(errs)
    if q is not None and q <= 0:
        out.append(v.invalid(path, value, "must be positive"))


def _validate_target(target: Any, path: str, out: list[Cause]) -> None:
    """validateMetricTarget: a type, and the one value that type reads, positive."""
    if not isinstance(target, dict):
        out.append(v.required(path) if target is None else v.type_invalid(path, target, "object"))
        return
    ttype = target.get("type")
    if not ttype:
        out.append(v.required(f"{path}.type", "must specify a metric target type"))
    elif ttype not in TARGET_TYPES:
        out.append(v.not_supported(f"{path}.type", ttype, TARGET_TYPES))
    if target.get("value") is not None:
        _positive_quantity(target["value"], f"{path}.value", out)
    if target.get("averageValue") is not None:
        _positive_quantity(target["averageValue"], f"{path}.averageValue", out)
    util = target.get("averageUtilization")
    if util is not None:
        if v.as_int(util) is None:
            out.append(v.type_invalid(f"{path}.averageUtilization", util, "integer"))
        elif util <= 0:
            out.append(v.invalid(f"{path}.averageUtilization", util, "must be greater than 0"))
    wanted = {"Utilization": "averageUtilization", "Value": "value",
              "AverageValue": "averageValue"}.get(ttype or "")
    if wanted is not None and target.get(wanted) is None:
        out.append(v.required(f"{path}.{wanted}",
                              f"must set {wanted} when the target type is {ttype}"))


def _validate_resource_source(src: Any, path: str, out: list[Cause], *, container: bool) -> None:
    if not isinstance(src, dict):
        out.append(v.required(path) if src is None else v.type_invalid(path, src, "object"))
        return
    if not src.get("name"):
        out.append(v.required(f"{path}.name", "must specify a resource name"))
    if container:
        cname = src.get("container")
        if not cname:
            out.append(v.required(f"{path}.container", "must specify a container"))
        elif not isinstance(cname, str) or v.is_dns1123_label(cname):
            out.append(v.invalid(f"{path}.container", cname, "must be a valid container name"))
    target = src.get("target")
    _validate_target(target, f"{path}.target", out)
    if isinstance(target, dict):
        has_util = target.get("averageUtilization") is not None
        has_avg = target.get("averageValue") is not None
        if not has_util and not has_avg:
            out.append(v.required(f"{path}.target.averageUtilization",
                                  "must set either a target raw value or a target utilization"))
        elif has_util and has_avg:
            out.append(v.forbidden(f"{path}.target.averageValue",
                                   "may not set both a target raw value and a target utilization"))
        if target.get("type") == "Value":
            out.append(v.invalid(f"{path}.target.type", "Value",
                                 "must be Utilization or AverageValue for a resource metric"))


def _validate_metric_identifier(src: Any, path: str, out: list[Cause]) -> None:
    if not isinstance(src, dict):
        out.append(v.required(path) if src is None else v.type_invalid(path, src, "object"))
        return
    metric = src.get("metric")
    if not isinstance(metric, dict) or not metric.get("name"):
        out.append(v.required(f"{path}.metric.name", "must specify a metric name"))
    elif metric.get("selector") is not None:
        out.extend(v.validate_label_selector(metric["selector"], f"{path}.metric.selector"))
    _validate_target(src.get("target"), f"{path}.target", out)


def _validate_metric(m: Any, path: str, out: list[Cause]) -> None:
    if not isinstance(m, dict):
        out.append(v.type_invalid(path, m, "object"))
        return
    mtype = m.get("type")
    if not mtype:
        out.append(v.required(f"{path}.type", "must specify a metric source type"))
        return
    if mtype not in METRIC_TYPES:
        out.append(v.not_supported(f"{path}.type", mtype, METRIC_TYPES))
        return
    field = mtype[0].lower() + mtype[1:]  # Resource -> resource, ContainerResource -> containerResource
    for other in ("resource", "containerResource", "pods", "object", "external"):
        if other != field and m.get(other) is not None:
            out.append(v.forbidden(f"{path}.{other}",
                                   "must populate the given metric source only"))
    if mtype in ("Resource", "ContainerResource"):
        _validate_resource_source(m.get(field), f"{path}.{field}", out,
                                  container=mtype == "ContainerResource")
    else:
        _validate_metric_identifier(m.get(field), f"{path}.{field}", out)
        if mtype == "Object":
            _validate_ref(d(m, "object").get("describedObject"), f"{path}.object.describedObject",
                          out)


def _validate_rules(rules: Any, path: str, out: list[Cause]) -> None:
    if rules is None:
        return
    if not isinstance(rules, dict):
        out.append(v.type_invalid(path, rules, "object"))
        return
    window = rules.get("stabilizationWindowSeconds")
    if window is not None:
        if v.as_int(window) is None:
            out.append(v.type_invalid(f"{path}.stabilizationWindowSeconds", window, "integer"))
        elif window < 0:
            out.append(v.invalid(f"{path}.stabilizationWindowSeconds", window,
                                 "must be greater than or equal to zero"))
        elif window > MAX_STABILIZATION_WINDOW:
            out.append(v.invalid(f"{path}.stabilizationWindowSeconds", window,
                                 f"must be less than or equal to {MAX_STABILIZATION_WINDOW}"))
    select = rules.get("selectPolicy")
    if select is not None and select not in SELECT_POLICIES:
        out.append(v.not_supported(f"{path}.selectPolicy", select, SELECT_POLICIES))
    policies = rules.get("policies")
    if policies is None:
        return
    if not isinstance(policies, list):
        out.append(v.type_invalid(f"{path}.policies", policies, "array"))
        return
    if not policies:
        out.append(v.required(f"{path}.policies", "must specify at least one Policy"))
    for i, p in enumerate(policies):
        pp = f"{path}.policies[{i}]"
        if not isinstance(p, dict):
            out.append(v.type_invalid(pp, p, "object"))
            continue
        if p.get("type") not in POLICY_TYPES:
            out.append(v.not_supported(f"{pp}.type", p.get("type"), POLICY_TYPES))
        value = p.get("value")
        if v.as_int(value) is None or value <= 0:
            out.append(v.invalid(f"{pp}.value", value, "must be greater than zero"))
        period = p.get("periodSeconds")
        if v.as_int(period) is None or period <= 0:
            out.append(v.invalid(f"{pp}.periodSeconds", period, "must be greater than zero"))
        elif period > MAX_POLICY_PERIOD:
            out.append(v.invalid(f"{pp}.periodSeconds", period,
                                 f"must be less than or equal to {MAX_POLICY_PERIOD}"))


def validate_hpa(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        out.append(v.required("spec") if spec is None else v.type_invalid("spec", spec, "object"))
        return out
    _validate_ref(spec.get("scaleTargetRef"), "spec.scaleTargetRef", out)
    min_r = spec.get("minReplicas")
    if min_r is not None:
        if v.as_int(min_r) is None:
            out.append(v.type_invalid("spec.minReplicas", min_r, "integer"))
            min_r = None
        elif min_r < 1:
            # Scaling to zero is behind the HPAScaleToZero feature gate in Kubernetes.
            out.append(v.invalid("spec.minReplicas", min_r, "must be greater than or equal to 1"))
    max_r = spec.get("maxReplicas")
    if max_r is None:
        out.append(v.required("spec.maxReplicas"))
    elif v.as_int(max_r) is None:
        out.append(v.type_invalid("spec.maxReplicas", max_r, "integer"))
    elif max_r < 1:
        out.append(v.invalid("spec.maxReplicas", max_r, "must be greater than 0"))
    elif isinstance(min_r, int) and max_r < min_r:
        out.append(v.invalid("spec.maxReplicas", max_r,
                             "must be greater than or equal to `minReplicas`"))
    metrics = spec.get("metrics")
    if metrics is not None and not isinstance(metrics, list):
        out.append(v.type_invalid("spec.metrics", metrics, "array"))
    else:
        for i, m in enumerate(metrics or []):
            _validate_metric(m, f"spec.metrics[{i}]", out)
    behavior = spec.get("behavior")
    if behavior is not None:
        if not isinstance(behavior, dict):
            out.append(v.type_invalid("spec.behavior", behavior, "object"))
        else:
            _validate_rules(behavior.get("scaleUp"), "spec.behavior.scaleUp", out)
            _validate_rules(behavior.get("scaleDown"), "spec.behavior.scaleDown", out)
    return out


# ---------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------


def _quantity_text(value: Any) -> str:
    """A quantity from the object as Go prints it (canonical form), or as given."""
    return canonical_quantity(value) if value is not None else "<unknown>"


def format_targets(obj: dict[str, Any]) -> str:
    """kubectl's formatHPAMetrics: "cpu: 45%/50%, memory: 52428800/100Mi + 1 more..."."""
    specs = dicts(lst(obj, "spec", "metrics"))
    if not specs:
        return NONE
    statuses = lst(obj, "status", "currentMetrics")
    out: list[str] = []
    for i, spec in enumerate(specs):
        status = statuses[i] if i < len(statuses) and isinstance(statuses[i], dict) else {}
        mtype = spec.get("type")
        if mtype in ("Resource", "ContainerResource"):
            field = "resource" if mtype == "Resource" else "containerResource"
            src, cur = d(spec, field), d(status, field, "current")
            has_status = bool(d(status, field))
            target = d(src, "target")
            name = src.get("name", "")
            if target.get("averageValue") is not None:
                current = _quantity_text(cur["averageValue"]) if has_status and \
                    cur.get("averageValue") is not None else "<unknown>"
                out.append(f"{name}: {current}/{_quantity_text(target['averageValue'])}")
            else:
                current = f"{cur['averageUtilization']}%" if has_status and \
                    cur.get("averageUtilization") is not None else "<unknown>"
                util = target.get("averageUtilization")
                out.append(f"{name}: {current}/{f'{util}%' if util is not None else '<auto>'}")
        elif mtype == "Pods":
            cur = d(status, "pods", "current")
            current = _quantity_text(cur["averageValue"]) if cur.get("averageValue") is not None \
                else "<unknown>"
            out.append(f"{current}/{_quantity_text(d(spec, 'pods', 'target').get('averageValue'))}")
        elif mtype in ("Object", "External"):
            field = mtype.lower()
            target, cur = d(spec, field, "target"), d(status, field, "current")
            if target.get("averageValue") is not None:
                current = _quantity_text(cur["averageValue"]) if cur.get("averageValue") is not None \
                    else "<unknown>"
                out.append(f"{current}/{_quantity_text(target['averageValue'])} (avg)")
            else:
                current = _quantity_text(cur["value"]) if cur.get("value") is not None \
                    else "<unknown>"
                out.append(f"{current}/{_quantity_text(target.get('value'))}")
        else:
            out.append("<unknown type>")
    if len(out) > 2:
        return f"{', '.join(out[:2])} + {len(out) - 2} more..."
    return ", ".join(out)


def _reference(o: dict[str, Any]) -> str:
    ref = d(o, "spec", "scaleTargetRef")
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


def _min_pods(o: dict[str, Any]) -> str:
    m = d(o, "spec").get("minReplicas")
    return "<unset>" if m is None else str(m)


HORIZONTAL_POD_AUTOSCALER = KindInfo(
    zero_status={"desiredReplicas": 0},
    group="autoscaling", version="v2", kind="HorizontalPodAutoscaler",
    plural="horizontalpodautoscalers", singular="horizontalpodautoscaler",
    short_names=("hpa",), categories=("all",), subresources=("status",),
    columns_override=table(
        col("Reference", _reference, description="Reference of the target resource to scale."),
        col("Targets", format_targets, description="Current and target values of the metrics."),
        col("MinPods", _min_pods, description="Lower limit for the number of pods."),
        col("MaxPods", lambda o: num(d(o, "spec").get("maxReplicas")), type="integer",
            description="Upper limit for the number of pods."),
        col("Replicas", lambda o: num(d(o, "status").get("currentReplicas")), type="integer",
            description="Current number of replicas of pods managed by this autoscaler."),
    ),
    default=default_hpa, validate=validate_hpa,
)



def validate_hpa_v1(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """The autoscaling/v1 shape (one cpu target).  Requests at v1 are converted to v2 and
    validated as such by the server (fleet/server/hpa_v1.py); this covers direct use."""
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out + [v.required("spec")]
    _validate_ref(spec.get("scaleTargetRef"), "spec.scaleTargetRef", out)
    v.positive(spec, "maxReplicas", "spec.maxReplicas", out)
    v.positive(spec, "minReplicas", "spec.minReplicas", out)
    v.positive(spec, "targetCPUUtilizationPercentage", "spec.targetCPUUtilizationPercentage", out)
    return out


# Stored once, as v2; served at v1 too (kubectl autoscale creates v1 objects).  Registered
# after v2, so v2 is the group's preferred version, as in Kubernetes.
HORIZONTAL_POD_AUTOSCALER_V1 = KindInfo(
    group="autoscaling", version="v1", kind="HorizontalPodAutoscaler",
    plural="horizontalpodautoscalers", singular="horizontalpodautoscaler",
    short_names=("hpa",), categories=("all",), subresources=("status",),
    columns_override=HORIZONTAL_POD_AUTOSCALER.columns_override, validate=validate_hpa_v1,
)

KINDS = (HORIZONTAL_POD_AUTOSCALER, HORIZONTAL_POD_AUTOSCALER_V1)
