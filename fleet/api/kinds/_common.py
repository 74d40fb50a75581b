"""Helpers shared by the built-in kind modules: safe access to untrusted JSON,
kubectl's cell formatting (label maps, selectors, container lists, ages) and
the table-column constructors.

The formatting functions reproduce `k8s.io/kubernetes/pkg/printers/internalversion`
so that a Table served by Fleet prints exactly like one served by kube-apiserver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleet.api import meta
from fleet.api.errors import BadRequest
from fleet.api.registry import AGE_COLUMN, NAME_COLUMN, Column
from fleet.api.selectors import label_selector_to_string

NONE = "<none>"


def d(obj: Any, *keys: str) -> dict[str, Any]:
    """The dict at obj[k1][k2]..., or {} when any step is missing or not a dict."""
    cur = obj
    for k in keys:
        if not isinstance(cur, dict):
            return {}
        cur = cur.get(k)
    return cur if isinstance(cur, dict) else {}


def lst(obj: Any, *keys: str) -> list[Any]:
    """The list at obj[k1][k2]..., or [] when missing or not a list."""
    if not keys:
        return obj if isinstance(obj, list) else []
    parent = d(obj, *keys[:-1]) if len(keys) > 1 else (obj if isinstance(obj, dict) else {})
    v = parent.get(keys[-1])
    return v if isinstance(v, list) else []


def dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [i for i in items if isinstance(i, dict)]


def num(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def set_default(obj: dict[str, Any], key: str, value: Any) -> None:
    """Fill `key` when absent or null (Kubernetes treats JSON null as unset)."""
    if obj.get(key) is None:
        obj[key] = value


def ensure_dict(obj: dict[str, Any], key: str) -> dict[str, Any] | None:
    """obj[key], created as {} when absent or null; None when it has another type."""
    cur = obj.get(key)
    if cur is None:
        cur = obj[key] = {}
    return cur if isinstance(cur, dict) else None


def since(ts: Any) -> str:
    """kubectl's translateTimestampSince: a human duration, `<unknown>` for no time."""
    if not isinstance(ts, str) or not ts:
        return "<unknown>"
    try:
        t = meta.parse_rfc3339(ts)
    except ValueError:
        return "<unknown>"
    return meta.human_duration((meta.utcnow() - t).total_seconds())


def format_labels(labels: Any) -> str:
    """labels.FormatLabels: `k=v,k2=v2` sorted by key, `<none>` when empty."""
    if not isinstance(labels, dict) or not labels:
        return NONE
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selector_string(sel: Any) -> str:
    """labels.Selector.String() of a LabelSelector ("" for an empty or missing one,
    `<error>` for one that does not parse, as metav1.FormatLabelSelector prints it)."""
    if not isinstance(sel, dict):
        return ""
    try:
        return label_selector_to_string(sel)
    except BadRequest:
        return "<error>"


def format_label_selector(sel: Any) -> str:
    """metav1.FormatLabelSelector: like selector_string but `<none>` when empty."""
    return selector_string(sel) or NONE


def container_cells(pod_spec: Any) -> tuple[str, str]:
    """(names, images) of a pod spec's containers, comma-joined (layoutContainerCells)."""
    cs = dicts(lst(pod_spec, "containers"))
    return ",".join(str(c.get("name", "")) for c in cs), ",".join(str(c.get("image", "")) for c in cs)


def col(name: str, fn: Callable[[dict[str, Any]], Any], *, type: str = "string", priority: int = 0,
        description: str = "") -> Column:
    return Column(name, fn, type=type, priority=priority, description=description or name)


def table(*columns: Column, wide: tuple[Column, ...] = ()) -> tuple[Column, ...]:
    """NAME, columns..., AGE, then the -o wide columns — kubectl's order.

    Used as `columns_override` whenever a kind has wide columns, because
    kube-apiserver lists wide columns after AGE and `kubectl get -o wide`
    prints them in definition order.
    """
    return (NAME_COLUMN, *columns, AGE_COLUMN, *wide)


def template_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return d(obj, "spec", "template", "spec")


def wide_container_columns(spec_of: Callable[[dict[str, Any]], Any]) -> tuple[Column, Column]:
    return (
        col("Containers", lambda o: container_cells(spec_of(o))[0], priority=1,
            description="Names of each container in the template."),
        col("Images", lambda o: container_cells(spec_of(o))[1], priority=1,
            description="Images referenced by each container in the template."),
    )
