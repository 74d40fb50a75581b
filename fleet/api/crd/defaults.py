"""Apply a CRD schema's defaults to a custom resource (kube's structural defaulting,
pkg/apiserver/schema/defaulting/algorithm.go, and pruning's
PruneNonNullableNullsWithoutDefaults).

- A property missing from an object gets its schema's `default` (a deep copy), and the
  defaulted value is itself defaulted further down (`spec: {default: {}}` with
  `spec.replicas: {default: 1}` yields `spec: {replicas: 1}`).
- A `null` where the schema is not `nullable` is replaced by the default when there is
  one (object properties, additionalProperties values, list items), and dropped from
  its object when there is none, so that validation does not refuse a null the client
  meant as "unset".  A `null` under `nullable: true` stays.
- Defaults are not applied under additionalProperties' missing keys (there are none to
  miss) and never to the root's metadata (CRD validation forbids such defaults).

Run after pruning and before validation, on create and update, as kube-apiserver does.
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api.crd._util import properties, schema_dict


def apply_defaults(obj: Any, schema: dict[str, Any] | None) -> Any:
    """Default `obj` in place by `schema`; returns `obj`."""
    _default(obj, schema if isinstance(schema, dict) else None)
    return obj


def _non_nullable_null(v: Any, s: dict[str, Any] | None) -> bool:
    return v is None and s is not None and s.get("nullable") is not True


def _default(x: Any, s: dict[str, Any] | None) -> None:
    if s is None:
        return
    if isinstance(x, dict):
        props = properties(s)
        for k in sorted(props):
            prop = schema_dict(props[k])
            if prop is None or prop.get("default") is None:
                continue
            if k not in x or _non_nullable_null(x[k], prop):
                x[k] = copy.deepcopy(prop["default"])
        addl = schema_dict(s.get("additionalProperties"))
        for k in list(x):
            v = x[k]
            sub = schema_dict(props[k]) if k in props else addl
            if sub is None:
                continue
            if _non_nullable_null(v, sub):
                if sub.get("default") is not None:
                    x[k] = copy.deepcopy(sub["default"])
                else:
                    del x[k]
                    continue
            _default(x[k], sub)
    elif isinstance(x, list):
        items = schema_dict(s.get("items"))
        for i, v in enumerate(x):
            if _non_nullable_null(v, items) and items is not None and items.get("default") is not None:
                x[i] = copy.deepcopy(items["default"])
            _default(x[i], items)


def needs_defaults(obj: Any, schema: dict[str, Any] | None) -> bool:
    """Whether `apply_defaults(obj, schema)` would change `obj` — a read-only walk, so the
    read path (kube defaults objects read from storage) copies only objects it must change;
    objects written through the API were defaulted then and almost never need it."""
    return _needs(obj, schema if isinstance(schema, dict) else None)


def _needs(x: Any, s: dict[str, Any] | None) -> bool:
    if s is None:
        return False
    if isinstance(x, dict):
        props = properties(s)
        for k, p in props.items():
            prop = schema_dict(p)
            if prop is not None and prop.get("default") is not None and (
                    k not in x or _non_nullable_null(x[k], prop)):
                return True
        addl = schema_dict(s.get("additionalProperties"))
        for k, v in x.items():
            sub = schema_dict(props[k]) if k in props else addl
            if sub is not None and (_non_nullable_null(v, sub) or _needs(v, sub)):
                return True
    elif isinstance(x, list):
        items = schema_dict(s.get("items"))
        if items is None:
            return False
        for v in x:
            if (_non_nullable_null(v, items) and items.get("default") is not None) or _needs(v, items):
                return True
    return False
