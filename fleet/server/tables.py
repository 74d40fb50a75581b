"""`meta.k8s.io/v1 Table` responses, built from each kind's column declarations.

kubectl asks for tables (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`)
for human output; a row's `object` is the object, its metadata only
(`PartialObjectMetadata`, the default — enough for -A and --show-labels) or
nothing, per the `includeObject` query parameter.  Which answer a request gets
(a Table, PartialObjectMetadata, the object) is negotiate.py's job.
"""

from __future__ import annotations

from typing import Any

from fleet.api.registry import KindInfo


def wants_table(accept: str) -> bool:
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip()
                  for p in part.split(";")[1:] if "=" in p}
        if params.get("as") == "Table" and params.get("g", "meta.k8s.io") == "meta.k8s.io":
            return True
    return False


def _row_object(obj: dict[str, Any], include: str, api_version: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": api_version,
        "metadata": obj.get("metadata", {}),
    }


def _cell(col: Any, obj: dict[str, Any]) -> Any:
    try:
        return col.value(obj)
    except Exception:  # a malformed object must not break listing; show what kubectl shows
        return "<unknown>"


def row(info: KindInfo, obj: dict[str, Any], include: str = "Metadata",
        api_version: str = "meta.k8s.io/v1") -> dict[str, Any]:
    r: dict[str, Any] = {"cells": [_cell(c, obj) for c in info.table_columns()]}
    o = _row_object(obj, include, api_version)
    if o is not None:
        r["object"] = o
    return r


def column_definitions(info: KindInfo) -> list[dict[str, Any]]:
    return [c.definition() for c in info.table_columns()]


def table(info: KindInfo, objs: list[dict[str, Any]], *, resource_version: str = "",
          cont: str = "", include: str = "Metadata", with_columns: bool = True,
          remaining: int | None = None, api_version: str = "meta.k8s.io/v1") -> dict[str, Any]:
    """A Table of `objs`; `api_version`: meta.k8s.io/v1 or v1beta1, as the client asked."""
    meta: dict[str, Any] = {}
    if resource_version:
        meta["resourceVersion"] = resource_version
    if cont:
        meta["continue"] = cont
    if remaining:
        meta["remainingItemCount"] = remaining
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": meta,
        "columnDefinitions": column_definitions(info) if with_columns else [],
        "rows": [row(info, o, include, api_version) for o in objs],
    }
