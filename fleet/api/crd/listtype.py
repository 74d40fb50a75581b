"""Sets and map lists hold no duplicates (kube's pkg/apiserver/schema/listtype).

A custom resource's arrays marked `x-kubernetes-list-type: set` may not repeat an item,
and `map` lists may not repeat a key (the `x-kubernetes-list-map-keys` values):

- `spec.ports[1]: Duplicate value: map[string]interface {}{"name":"http"}` (the key, as
  Go prints a map with %#v);
- `spec.tags[2]: Duplicate value: "a"`;
- `spec.ports[0]: Invalid value: "x": must be an object for an array of list-type map`.

Paths are field paths (properties `.child`, additionalProperties keys `[key]`).
"""

from __future__ import annotations

import json
from typing import Any

from fleet.api.crd._util import child, index, key, properties, schema_dict
from fleet.api.errors import cause
from fleet.api.validation import Cause


def go_sharp_v(v: Any) -> str:
    """Go's %#v of a decoded JSON value (unstructured: map[string]interface {}, []interface {})."""
    if v is None:
        return "interface {}(nil)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e21 else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "map[string]interface {}{" + ", ".join(f"{json.dumps(k)}:{go_sharp_v(v[k])}" for k in sorted(v)) + "}"
    if isinstance(v, list):
        return "[]interface {}{" + ", ".join(go_sharp_v(x) for x in v) + "}"
    return str(v)


def _duplicate(path: str, value: Any) -> Cause:
    shown = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else go_sharp_v(value)
    return cause(path, f"Duplicate value: {shown}", "FieldValueDuplicate")


def list_violations(obj: Any, schema: dict[str, Any] | None, path: str = "") -> list[Cause]:
    """Duplicate items of sets and keys of map lists anywhere in `obj`."""
    out: list[Cause] = []
    _walk(obj, schema, path, out)
    return out


def _walk(x: Any, s: dict[str, Any] | None, path: str, out: list[Cause]) -> None:
    if s is None:
        return
    if isinstance(x, list):
        lt = s.get("x-kubernetes-list-type")
        if lt == "set":
            seen: set[str] = set()
            for i, v in enumerate(x):
                k = json.dumps(v, sort_keys=True)
                if k in seen:
                    out.append(_duplicate(index(path, i), v))
                seen.add(k)
        elif lt == "map":
            out.extend(_map_list(x, s, path))
        items = schema_dict(s.get("items"))
        for i, v in enumerate(x):
            _walk(v, items, index(path, i), out)
    elif isinstance(x, dict):
        props = properties(s)
        addl = schema_dict(s.get("additionalProperties"))
        for k in sorted(x):
            if k in props:
                _walk(x[k], schema_dict(props[k]), child(path, k), out)
            elif addl is not None:
                _walk(x[k], addl, key(path, k), out)


def _map_list(x: list[Any], s: dict[str, Any], path: str) -> list[Cause]:
    bad = [invalid_item(index(path, i), v) for i, v in enumerate(x) if v is not None and not isinstance(v, dict)]
    if bad:
        return bad
    keys = [k for k in s.get("x-kubernetes-list-map-keys") or [] if isinstance(k, str)]
    out: list[Cause] = []
    seen: set[str] = set()
    for i, v in enumerate(x):
        if v is None:
            continue
        kv = {k: v[k] for k in keys if k in v}
        ident = json.dumps([[k, v.get(k, "\0unset")] for k in keys], sort_keys=True)
        if ident in seen:
            out.append(_duplicate(index(path, i), kv))
        seen.add(ident)
    return out


def invalid_item(path: str, v: Any) -> Cause:
    shown = json.dumps(v, ensure_ascii=False) if isinstance(v, str) else go_sharp_v(v)
    return cause(path, f"Invalid value: {shown}: must be an object for an array of list-type map", "FieldValueInvalid")
