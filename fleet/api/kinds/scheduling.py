"""`scheduling.k8s.io/v1` PriorityClass: the named priorities pods refer to.

A PriorityClass maps a name to an integer `value`; the Priority admission
plugin (fleet/admission/priority.py) copies that value into a pod's
`spec.priority` at creation, and the scheduler orders and preempts by it.
Because pods keep the value they were admitted with, kube-apiserver forbids
changing `value` (and `preemptionPolicy`) once a class exists; Fleet does the
same.  The two built-in classes (`system-cluster-critical`,
`system-node-critical`) are created at server start, and names starting with
`system-` are reserved for them, exactly as in Kubernetes
(k8s.io/kubernetes/pkg/apis/scheduling/validation).
"""

from __future__ import annotations

from typing import Any

from fleet.api import validation as v
from fleet.api.kinds._common import NONE, col, set_default, table
from fleet.api.registry import KindInfo

Cause = dict[str, str]

# k8s.io/kubernetes/pkg/apis/scheduling/types.go
HIGHEST_USER_DEFINABLE_PRIORITY = 1_000_000_000
SYSTEM_CRITICAL_PRIORITY = 2 * HIGHEST_USER_DEFINABLE_PRIORITY
SYSTEM_PRIORITY_CLASS_PREFIX = "system-"
SYSTEM_CLUSTER_CRITICAL = "system-cluster-critical"
SYSTEM_NODE_CRITICAL = "system-node-critical"
# The priority of a pod that names no class when no class is the global default.
DEFAULT_PRIORITY_WHEN_NO_DEFAULT_CLASS_EXISTS = 0

PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER = v.PREEMPTION_POLICIES

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def system_priority_classes() -> list[dict[str, Any]]:
    """The built-in classes kube-apiserver bootstraps (fresh dicts; callers may mutate them)."""
    return [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": SYSTEM_CLUSTER_CRITICAL},
         "value": SYSTEM_CRITICAL_PRIORITY,
         "description": "Used for system critical pods that must run in the cluster, but can be moved "
                        "to another node if necessary."},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": SYSTEM_NODE_CRITICAL},
         "value": SYSTEM_CRITICAL_PRIORITY + 1000,
         "description": "Used for system critical pods that must not be moved from their current node."},
    ]


def _known_system_class_problem(name: str, value: Any, global_default: Any) -> str | None:
    """scheduling.IsKnownSystemPriorityClass: None when (name, value, globalDefault) is a built-in."""
    for spc in system_priority_classes():
        if spc["metadata"]["name"] == name:
            if value != spc["value"]:
                return f"value of {name} PriorityClass must be {spc['value']}"
            if bool(global_default) is not False:
                return f"globalDefault of {name} PriorityClass must be false"
            return None
    return f"{name} is not a known system priority class"


def default_priority_class(obj: dict[str, Any]) -> None:
    # `value` is a plain int32 in Go (no omitempty): absent means 0, and it is always returned.
    set_default(obj, "value", 0)
    set_default(obj, "preemptionPolicy", PREEMPT_LOWER_PRIORITY)


def validate_priority_class(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    value = obj.get("value", 0)
    value_ok = v.as_int(value) is not None and INT32_MIN <= value <= INT32_MAX
    if not value_ok:
        out.append(v.type_invalid("value", value, "int32"))
    gd = obj.get("globalDefault")
    if gd is not None and not isinstance(gd, bool):
        out.append(v.type_invalid("globalDefault", gd, "boolean"))
    desc = obj.get("description")
    if desc is not None and not isinstance(desc, str):
        out.append(v.type_invalid("description", desc, "string"))
    if isinstance(name, str) and name.startswith(SYSTEM_PRIORITY_CLASS_PREFIX):
        problem = _known_system_class_problem(name, value, gd)
        if problem:
            out.append(v.forbidden("metadata.name", "priority class names with 'system-' prefix are "
                                   "reserved for system use only. error: " + problem))
    elif value_ok and value > HIGHEST_USER_DEFINABLE_PRIORITY:
        out.append(v.forbidden("value", "maximum allowed value of a user defined priority is "
                               f"{HIGHEST_USER_DEFINABLE_PRIORITY}"))
    out += v.validate_preemption_policy(obj.get("preemptionPolicy"), "preemptionPolicy")
    if old is not None:
        # Pods carry the value they were admitted with; a changed value would silently
        # make old and new pods of "the same" class differ.
        if value != old.get("value", 0):
            out.append(v.forbidden("value", "may not be changed in an update."))
        out += v.immutable(obj.get("preemptionPolicy"), old.get("preemptionPolicy"), "preemptionPolicy")
    return out


PRIORITY_CLASS = KindInfo(
    group="scheduling.k8s.io", version="v1", kind="PriorityClass", plural="priorityclasses",
    singular="priorityclass", namespaced=False, short_names=("pc",),
    # kubectl's printPriorityClass: NAME VALUE GLOBAL-DEFAULT AGE PREEMPTIONPOLICY.
    columns_override=table(
        col("Value", lambda o: o.get("value", 0), type="integer",
            description="value represents the integer value of this priority class. This is the actual "
                        "priority that pods receive when they have the name of this class in their pod spec."),
        col("Global-Default", lambda o: o.get("globalDefault") is True, type="boolean",
            description="globalDefault specifies whether this PriorityClass should be considered as the "
                        "default priority for pods that do not have any priority class."),
        # After AGE but shown without -o wide (priority 0), as kube-apiserver prints it.
        wide=(col("PreemptionPolicy", lambda o: o.get("preemptionPolicy") or NONE,
                  description="preemptionPolicy is the Policy for preempting pods with lower priority."),),
    ),
    default=default_priority_class, validate=validate_priority_class,
)

KINDS = (PRIORITY_CLASS,)
