"""`policy/v1` PodDisruptionBudget: how many of an application's pods may be away at once.

A budget selects pods by label and says either how many must stay available
(`minAvailable`) or how many may be missing (`maxUnavailable`), each an
integer or a percentage.  The disruption controller
(fleet/controllers/disruption.py) keeps `status` current — healthy pods,
how many must be healthy, how many disruptions are allowed — and the eviction
subresource (fleet/server/eviction.py) spends `disruptionsAllowed` one
eviction at a time, answering 429 when none is left.  Voluntary disruptions
(`kubectl drain`, Fleet's server-side drain) go through evictions, so this is
what keeps a drain from taking down a whole application.

Validation follows kube-apiserver (pkg/apis/policy/validation): minAvailable
and maxUnavailable may not both be set (a budget with neither is accepted, as
there), percentages are `<digits>%` and at most 100%, integers are not
negative, and `unhealthyPodEvictionPolicy` is IfHealthyBudget or AlwaysAllow.
The spec is mutable, as in policy/v1; each change bumps `metadata.generation`,
and evictions wait (429) until the controller's `status.observedGeneration`
caught up with it.
"""

from __future__ import annotations

from typing import Any

from fleet.api import validation as v
from fleet.api.kinds._common import col, d, num, set_default, table
from fleet.api.kinds.apps import int_or_percent
from fleet.api.registry import KindInfo

Cause = dict[str, str]

IF_HEALTHY_BUDGET, ALWAYS_ALLOW = "IfHealthyBudget", "AlwaysAllow"
UNHEALTHY_POD_EVICTION_POLICIES = (IF_HEALTHY_BUDGET, ALWAYS_ALLOW)

# The DisruptionAllowed condition and its reasons (policy/v1 types.go).
DISRUPTION_ALLOWED = "DisruptionAllowed"
SUFFICIENT_PODS, INSUFFICIENT_PODS, SYNC_FAILED = "SufficientPods", "InsufficientPods", "SyncFailed"

STATUS_COUNTS = ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods")


def default_pdb(obj: dict[str, Any]) -> None:
    """A budget's status counts are plain int32s in Go: a new budget shows zeros (so
    `kubectl get pdb` prints ALLOWED DISRUPTIONS 0 until the controller has looked)."""
    status = obj.get("status")
    if status is None:
        status = obj["status"] = {}
    if isinstance(status, dict):
        for key in STATUS_COUNTS:
            set_default(status, key, 0)


def _int_or_percent(spec: dict[str, Any], key: str, out: list[Cause]) -> None:
    value = spec.get(key)
    path = f"spec.{key}"
    n = int_or_percent(value, path, out)
    if isinstance(value, str) and n is not None and n > 100:
        out.append(v.invalid(path, value, "must not be greater than 100%"))


def validate_pdb(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        return out + [v.type_invalid("spec", spec, "object")]
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        out.append(v.invalid("spec", {k: spec[k] for k in ("minAvailable", "maxUnavailable")},
                             "minAvailable and maxUnavailable cannot be both set"))
    _int_or_percent(spec, "minAvailable", out)
    _int_or_percent(spec, "maxUnavailable", out)
    out += v.validate_label_selector(spec.get("selector"), "spec.selector")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in UNHEALTHY_POD_EVICTION_POLICIES:
        out.append(v.not_supported("spec.unhealthyPodEvictionPolicy", policy, UNHEALTHY_POD_EVICTION_POLICIES))
    status = obj.get("status")
    if isinstance(status, dict):
        for key in (*STATUS_COUNTS, "observedGeneration"):
            v.nonnegative(status, key, f"status.{key}", out)
        pods = status.get("disruptedPods")
        if pods is not None and not isinstance(pods, dict):
            out.append(v.type_invalid("status.disruptedPods", pods, "object"))
    elif status is not None:
        out.append(v.type_invalid("status", status, "object"))
    return out


def _limit_cell(obj: dict[str, Any], key: str) -> str:
    value = d(obj, "spec").get(key)
    return "N/A" if value is None else str(value)


POD_DISRUPTION_BUDGET = KindInfo(
    zero_status={"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0,
                 "expectedPods": 0},
    group="policy", version="v1", kind="PodDisruptionBudget", plural="poddisruptionbudgets",
    singular="poddisruptionbudget", short_names=("pdb",), subresources=("status",),
    # kubectl's printPodDisruptionBudget: NAME MIN AVAILABLE MAX UNAVAILABLE ALLOWED DISRUPTIONS AGE.
    columns_override=table(
        col("Min Available", lambda o: _limit_cell(o, "minAvailable"),
            description="The minimum number of pods that must be available."),
        col("Max Unavailable", lambda o: _limit_cell(o, "maxUnavailable"),
            description="The maximum number of pods that may be unavailable."),
        col("Allowed Disruptions", lambda o: num(d(o, "status").get("disruptionsAllowed")), type="integer",
            description="Calculated number of pods that may be disrupted at this time."),
    ),
    default=default_pdb, validate=validate_pdb,
)

KINDS = (POD_DISRUPTION_BUDGET,)
