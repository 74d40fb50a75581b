"""`apps/v1` ControllerRevision: an immutable snapshot of a workload's pod template.

StatefulSets and DaemonSets record every template they have run as a
ControllerRevision (`data` holds a strategic merge patch that restores the
template, `revision` its number).  The controllers compare the live template
with these snapshots to tell old pods from new ones, and `kubectl rollout
history|undo statefulset/daemonset` read and re-apply them.  As in
kube-apiserver, `data` never changes once written — a rollback re-numbers an
old revision instead — while `revision` may.
"""

from __future__ import annotations

from typing import Any

from fleet.api import validation as v
from fleet.api.kinds._common import col, num
from fleet.api.owners import controller_of
from fleet.api.registry import KindInfo

Cause = dict[str, str]


def validate_controller_revision(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    if obj.get("data") is None:
        out.append(v.required("data", "data is mandatory"))
    rev = obj.get("revision")
    if rev is not None and v.as_int(rev) is None:
        out.append(v.type_invalid("revision", rev, "integer"))
    elif isinstance(rev, int) and rev < 0:
        out.append(v.invalid("revision", rev, "must be greater than or equal to 0"))
    if old is not None:
        out += v.immutable(obj.get("data"), old.get("data"), "data")
    return out


def controller_cell(obj: dict[str, Any]) -> str:
    """`statefulset.apps/web`: kubectl's formatResourceName of the controller reference."""
    ref = controller_of(obj)
    if ref is None:
        return "<none>"
    group = str(ref.get("apiVersion") or "").rpartition("/")[0]
    kind = str(ref.get("kind") or "")
    qualified = f"{kind}.{group}" if group else kind
    return f"{qualified.lower()}/{ref.get('name', '')}" if kind else str(ref.get("name", ""))


CONTROLLER_REVISION = KindInfo(
    group="apps", version="v1", kind="ControllerRevision", plural="controllerrevisions",
    singular="controllerrevision",
    columns=(
        col("Controller", controller_cell, description="The controller that owns this revision."),
        col("Revision", lambda o: num(o.get("revision")), type="integer",
            description="Revision indicates the revision of the state represented by Data."),
    ),
    validate=validate_controller_revision,
)

KINDS = (CONTROLLER_REVISION,)
