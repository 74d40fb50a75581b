"""Core `v1` ResourceQuota and LimitRange: a namespace's budget and its per-object bounds.

**ResourceQuota** caps what a namespace may hold: compute (`requests.cpu`,
`limits.memory`, plain `cpu`/`memory` meaning requests), object counts
(`pods`, `count/deployments.apps`, the legacy `services`, `secrets`, ...),
optionally only for pods in some scopes (Terminating, BestEffort,
PriorityClass...).  `spec.hard` is what the administrator asks for;
`status.hard` and `status.used` are kept by the quota controller
(fleet/controllers/resourcequota.py) and charged by the ResourceQuota
admission plugin (fleet/admission/resourcequota.py), which is why a new
quota takes effect only once the controller has filled its status — as in
Kubernetes.

**LimitRange** gives containers defaults (`default` limits, `defaultRequest`)
and bounds (`min`, `max`, `maxLimitRequestRatio`) per Container, per Pod and
per PersistentVolumeClaim; the LimitRanger admission plugin
(fleet/admission/limitranger.py) applies them to new pods.

Validation is kube-apiserver's (pkg/apis/core/validation ValidateResourceQuota
and ValidateLimitRange), with its messages.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fleet.api import quota as q
from fleet.api import validation as v
from fleet.api.kinds._common import NONE, col, d, dicts, lst
from fleet.api.quantity import QUANTITY_ERROR, QuantityError, parse_quantity
from fleet.api.registry import AGE_COLUMN, NAME_COLUMN, Column, KindInfo

Cause = dict[str, str]

# ---------------------------------------------------------------------------
# ResourceQuota
# ---------------------------------------------------------------------------


def _resource_name(name: Any, path: str, out: list[Cause]) -> bool:
    """validateResourceName: a qualified name (domain allowed)."""
    if not isinstance(name, str):
        out.append(v.type_invalid(path, name, "string"))
        return False
    msgs = v.is_qualified_name(name)
    for msg in msgs:
        out.append(v.invalid(path, name, msg))
    return not msgs


def _quota_resource_list(rl: Any, path: str, out: list[Cause]) -> dict[str, Decimal]:
    if rl is None:
        return {}
    if not isinstance(rl, dict):
        out.append(v.type_invalid(path, rl, "object"))
        return {}
    values: dict[str, Decimal] = {}
    for name, raw in rl.items():
        rp = f"{path}[{name}]"
        if not _resource_name(name, rp, out):
            continue
        if "/" not in name and not q.is_standard_quota_resource(name):
            out.append(v.invalid(rp, name, "must be a standard resource for quota"))
            continue
        try:
            value = parse_quantity(raw)
        except QuantityError:
            out.append(v.invalid(rp, raw, QUANTITY_ERROR))
            continue
        if value < 0:
            out.append(v.invalid(rp, raw, "must be greater than or equal to 0"))
        elif q.is_integer_resource(name) and value != value.to_integral_value():
            out.append(v.invalid(rp, raw, "must be an integer"))
        values[name] = value
    return values


def _validate_scopes(spec: dict[str, Any], hard: dict[str, Decimal], out: list[Cause]) -> None:
    scopes = spec.get("scopes")
    names: list[str] = []
    if scopes is not None:
        if not isinstance(scopes, list):
            out.append(v.type_invalid("spec.scopes", scopes, "array"))
        else:
            for i, s in enumerate(scopes):
                if s not in q.SCOPES:
                    out.append(v.not_supported(f"spec.scopes[{i}]", s, q.SCOPES))
                else:
                    names.append(s)
    sel = spec.get("scopeSelector")
    if sel is not None:
        if not isinstance(sel, dict):
            out.append(v.type_invalid("spec.scopeSelector", sel, "object"))
        else:
            for i, e in enumerate(lst(sel, "matchExpressions")):
                ep = f"spec.scopeSelector.matchExpressions[{i}]"
                if not isinstance(e, dict):
                    out.append(v.type_invalid(ep, e, "object"))
                    continue
                scope, op, values = e.get("scopeName"), e.get("operator"), e.get("values") or []
                if scope not in q.SCOPES:
                    out.append(v.not_supported(f"{ep}.scopeName", scope, q.SCOPES))
                    continue
                names.append(scope)
                if op not in q.SCOPE_OPERATORS:
                    out.append(v.not_supported(f"{ep}.operator", op, q.SCOPE_OPERATORS))
                elif scope != q.PRIORITY_CLASS and op != "Exists":
                    out.append(v.invalid(f"{ep}.operator", op,
                                         "must be 'Exist' when scope is any of ResourceQuotaScopeTerminating, "
                                         "ResourceQuotaScopeNotTerminating, ResourceQuotaScopeBestEffort, "
                                         "ResourceQuotaScopeNotBestEffort or "
                                         "ResourceQuotaScopeCrossNamespacePodAffinity"))
                elif op in ("In", "NotIn") and not values:
                    out.append(v.required(f"{ep}.values",
                                          "must be at least one value when `operator` is 'In' or 'NotIn' for "
                                          "scope selector"))
                elif op in ("Exists", "DoesNotExist") and values:
                    out.append(v.invalid(f"{ep}.values", values,
                                         "must be no value when `operator` is 'Exist' or 'DoesNotExist' for "
                                         "scope selector"))
    if not names:
        return
    for name in hard:
        for scope in names:
            if name not in q.SCOPE_RESOURCES[scope]:
                out.append(v.invalid(f"spec.hard[{name}]", name, "unsupported scope applied to resource"))
                break
    pairs = ((q.TERMINATING, q.NOT_TERMINATING), (q.BEST_EFFORT, q.NOT_BEST_EFFORT))
    for a, b in pairs:
        if a in names and b in names:
            out.append(v.invalid("spec.scopes", names, "conflicting scopes"))


def validate_resource_quota(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        return out + [v.type_invalid("spec", spec, "object")]
    hard = _quota_resource_list(spec.get("hard"), "spec.hard", out)
    _validate_scopes(spec, hard, out)
    status = obj.get("status")
    if isinstance(status, dict):
        _quota_resource_list(status.get("hard"), "status.hard", out)
        _quota_resource_list(status.get("used"), "status.used", out)
    elif status is not None:
        out.append(v.type_invalid("status", status, "object"))
    if old is not None:
        # Scopes decide which pods were charged; changing them would make usage lie.
        old_spec = old.get("spec") if isinstance(old.get("spec"), dict) else {}
        out += v.immutable(spec.get("scopes"), old_spec.get("scopes"), "spec.scopes")
        out += v.immutable(spec.get("scopeSelector"), old_spec.get("scopeSelector"), "spec.scopeSelector")
    return out


def _usage_cell(obj: dict[str, Any], limits: bool) -> str:
    """kubectl's printResourceQuota: `name: used/hard` per status.hard resource, split
    between the REQUEST and LIMIT columns by a `limits.` prefix."""
    status = d(obj, "status")
    hard, used = d(status, "hard"), d(status, "used")
    cells = []
    for name in sorted(hard):
        if name.split(".")[0] == "limits" and "." in name:
            if not limits:
                continue
        elif limits:
            continue
        cells.append(f"{name}: {_quantity_str(used.get(name, '0'))}/{_quantity_str(hard[name])}")
    return ", ".join(cells)


def _quantity_str(raw: Any) -> str:
    try:
        return str(q.Quantity.parse(raw))
    except QuantityError:
        return str(raw)


RESOURCE_QUOTA = KindInfo(
    zero_status={},
    group="", version="v1", kind="ResourceQuota", plural="resourcequotas", singular="resourcequota",
    short_names=("quota",), subresources=("status",),
    # kubectl prints NAME AGE REQUEST LIMIT (AGE second).
    columns_override=(
        NAME_COLUMN, AGE_COLUMN,
        col("Request", lambda o: _usage_cell(o, False),
            description="Request represents a minimum amount of cpu/memory that a container may consume."),
        col("Limit", lambda o: _usage_cell(o, True),
            description="Limits control the maximum amount of cpu/memory that a container may use independent "
                        "of contention on the node."),
    ),
    validate=validate_resource_quota,
)

# ---------------------------------------------------------------------------
# LimitRange
# ---------------------------------------------------------------------------

LIMIT_TYPE_POD, LIMIT_TYPE_CONTAINER, LIMIT_TYPE_PVC = "Pod", "Container", "PersistentVolumeClaim"
LIMIT_TYPES = (LIMIT_TYPE_POD, LIMIT_TYPE_CONTAINER, LIMIT_TYPE_PVC)
LIMIT_FIELDS = ("max", "min", "default", "defaultRequest", "maxLimitRequestRatio")


def _limit_list(item: dict[str, Any], key: str, path: str, out: list[Cause]) -> dict[str, Decimal]:
    rl = item.get(key)
    if rl is None:
        return {}
    if not isinstance(rl, dict):
        out.append(v.type_invalid(f"{path}.{key}", rl, "object"))
        return {}
    values: dict[str, Decimal] = {}
    for name, raw in rl.items():
        rp = f"{path}.{key}[{name}]"
        if not _resource_name(name, rp, out):
            continue
        value, errs = v.validate_quantity(raw, rp)
        out.extend(errs)
        if value is not None:
            values[name] = value
    return values


def _qs(value: Decimal, raw: Any) -> str:
    return str(q.Quantity(value, q.format_of(raw)))


def validate_limit_item(item: Any, path: str, seen: set[str], out: list[Cause]) -> None:
    if not isinstance(item, dict):
        out.append(v.type_invalid(path, item, "object"))
        return
    kind = item.get("type")
    if not isinstance(kind, str) or not kind:
        out.append(v.required(f"{path}.type"))
    elif kind in seen:
        out.append(v.duplicate(f"{path}.type", kind))
    else:
        seen.add(kind)
    lists = {key: _limit_list(item, key, path, out) for key in LIMIT_FIELDS}
    raw = {key: item.get(key) if isinstance(item.get(key), dict) else {} for key in LIMIT_FIELDS}
    mx, mn, df, dr, ratio = (lists[k] for k in LIMIT_FIELDS)
    if kind == LIMIT_TYPE_POD:
        for key in ("default", "defaultRequest"):
            if item.get(key):
                out.append(v.forbidden(f"{path}.{key}", "may not be specified when `type` is 'Pod'"))
    if kind == LIMIT_TYPE_PVC and "storage" not in mn and "storage" not in mx:
        out.append(v.required(f"{path}.limits",
                              "either minimum or maximum storage value is required, but neither was provided"))
    for name in sorted(set(mx) | set(mn) | set(df) | set(dr) | set(ratio)):
        s = {key: _qs(lists[key][name], raw[key][name]) for key in LIMIT_FIELDS if name in lists[key]}
        if name in mn and name in mx and mn[name] > mx[name]:
            out.append(v.invalid(f"{path}.min[{name}]", s["min"],
                                 f"min value {s['min']} is greater than max value {s['max']}"))
        if name in dr:
            if name in mn and mn[name] > dr[name]:
                out.append(v.invalid(f"{path}.defaultRequest[{name}]", s["defaultRequest"],
                                     f"min value {s['min']} is greater than default request value "
                                     f"{s['defaultRequest']}"))
            if name in mx and dr[name] > mx[name]:
                out.append(v.invalid(f"{path}.defaultRequest[{name}]", s["defaultRequest"],
                                     f"default request value {s['defaultRequest']} is greater than max value "
                                     f"{s['max']}"))
            if name in df and dr[name] > df[name]:
                out.append(v.invalid(f"{path}.defaultRequest[{name}]", s["defaultRequest"],
                                     f"default request value {s['defaultRequest']} is greater than default "
                                     f"limit value {s['default']}"))
        if name in df:
            if name in mn and mn[name] > df[name]:
                out.append(v.invalid(f"{path}.default[{name}]", s["default"],
                                     f"min value {s['min']} is greater than default value {s['default']}"))
            if name in mx and df[name] > mx[name]:
                out.append(v.invalid(f"{path}.default[{name}]", s["default"],
                                     f"default value {s['default']} is greater than max value {s['max']}"))
        if name in ratio:
            if ratio[name] < 1:
                out.append(v.invalid(f"{path}.maxLimitRequestRatio[{name}]", s["maxLimitRequestRatio"],
                                     f"ratio {s['maxLimitRequestRatio']} is less than 1"))
            if name in mn and name in mx and mn[name] > 0:
                most = mx[name] / mn[name]
                if ratio[name] > most:
                    out.append(v.invalid(f"{path}.maxLimitRequestRatio[{name}]", s["maxLimitRequestRatio"],
                                         f"ratio {s['maxLimitRequestRatio']} is greater than max/min = "
                                         f"{float(most):f}"))


def validate_limit_range(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out + [v.required("spec") if spec is None else v.type_invalid("spec", spec, "object")]
    limits = spec.get("limits")
    if not isinstance(limits, list):
        out.append(v.required("spec.limits") if limits is None else v.type_invalid("spec.limits", limits, "array"))
        return out
    seen: set[str] = set()
    for i, item in enumerate(limits):
        validate_limit_item(item, f"spec.limits[{i}]", seen, out)
    return out


def default_limit_range(obj: dict[str, Any]) -> None:
    """SetDefaults_LimitRangeItem, for Container items: a `max` without a `default` is the
    default limit, a `default` without a `defaultRequest` is the default request, and
    failing that `min` is.  So a LimitRange with only bounds still gives containers
    values inside them (and `kubectl get limitrange -o yaml` shows what will be applied)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for item in lst(spec, "limits"):
        if not isinstance(item, dict) or item.get("type") != LIMIT_TYPE_CONTAINER:
            continue
        lists = [item.get(k) for k in ("max", "min", "default", "defaultRequest")]
        if any(x is not None and not isinstance(x, dict) for x in lists):
            continue  # a type error: validation reports it
        default = item.get("default") or {}
        request = item.get("defaultRequest") or {}
        for name, value in (item.get("max") or {}).items():
            default.setdefault(name, value)
        for name, value in default.items():
            request.setdefault(name, value)
        for name, value in (item.get("min") or {}).items():
            request.setdefault(name, value)
        # Empty maps are omitted, as Go's omitempty would.
        for key, value in (("default", default), ("defaultRequest", request)):
            if value:
                item[key] = value


def _created_at(obj: dict[str, Any]) -> str:
    ts = d(obj, "metadata").get("creationTimestamp")
    return ts if isinstance(ts, str) and ts else NONE


LIMIT_RANGE = KindInfo(
    group="", version="v1", kind="LimitRange", plural="limitranges", singular="limitrange",
    short_names=("limits",),
    # kubectl's printLimitRange: NAME CREATED AT.
    columns_override=(
        NAME_COLUMN,
        Column("Created At", _created_at, type="date",
               description="CreationTimestamp is a timestamp representing the server time when this object "
                           "was created."),
    ),
    default=default_limit_range, validate=validate_limit_range,
)


def limit_items(limit_range: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec.limits entries of a (valid) LimitRange."""
    return dicts(lst(d(limit_range, "spec"), "limits"))


KINDS = (RESOURCE_QUOTA, LIMIT_RANGE)
