"""Drop the fields a CRD's schema does not know (kube's pruning, pkg/apiserver/schema/pruning).

Unknown fields are removed from custom resources before they are defaulted,
validated and stored, except:

- under `x-kubernetes-preserve-unknown-fields: true`, where unknown fields stay
  (fields the schema does specify below are still pruned by their own schemas);
- `apiVersion`, `kind` (when strings) and `metadata` of the resource root and of every
  `x-kubernetes-embedded-resource` are never pruned by the schema; an embedded
  resource's metadata keeps only ObjectMeta's fields (kube round-trips it through
  ObjectMeta), the root's metadata is the server's business.

`prune` returns the pruned paths (`spec.foo`, `spec.items[0].bar`, map keys joined with
dots) so that the server can warn `unknown field "spec.foo"` (fieldValidation=Warn) or
refuse (Strict), as kube-apiserver does.
"""

from __future__ import annotations

from typing import Any

from fleet.api.crd._util import child, index, is_true, properties, schema_dict

OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields",
})


def prune(obj: Any, schema: dict[str, Any] | None, *, is_resource_root: bool = True) -> list[str]:
    """Remove, in place, what `schema` does not specify; the removed fields' paths."""
    pruned: list[str] = []
    s = schema if isinstance(schema, dict) else {}
    if is_resource_root and not is_true(s, "x-kubernetes-embedded-resource"):
        s = {**s, "x-kubernetes-embedded-resource": True}
    _prune(obj, s, "", pruned, root=is_resource_root)
    return pruned


def _prune(x: Any, s: dict[str, Any] | None, path: str, pruned: list[str], *, root: bool = False) -> None:
    if s is not None and is_true(s, "x-kubernetes-preserve-unknown-fields"):
        _skip(x, s, path, pruned, root=root)
        return
    if isinstance(x, dict):
        if s is None:
            for k in sorted(x):
                pruned.append(child(path, k))
            x.clear()
            return
        embedded = is_true(s, "x-kubernetes-embedded-resource")
        props = properties(s)
        addl = s.get("additionalProperties")
        for k in sorted(x):
            v = x[k]
            if embedded and _meta(k, v, root, x):
                continue
            sub = child(path, k)
            if k in props:
                _prune(v, schema_dict(props[k]), sub, pruned)
            elif addl is not None and addl is not False:
                _prune(v, schema_dict(addl) if isinstance(addl, dict) else _ANY, sub, pruned)
            else:
                pruned.append(sub)
                del x[k]
    elif isinstance(x, list):
        items = schema_dict(s.get("items")) if s is not None else None
        for i, v in enumerate(x):
            _prune(v, items, index(path, i), pruned)


# additionalProperties: true — any value, nothing pruned below.
_ANY: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}


def _meta(k: str, v: Any, root: bool, parent: dict[str, Any]) -> bool:
    """apiVersion/kind/metadata of a resource: kept out of pruning (True: skip the key)."""
    if k in ("apiVersion", "kind"):
        return isinstance(v, str)
    if k == "metadata" and isinstance(v, dict):
        if not root:
            for mk in [mk for mk in v if mk not in OBJECT_META_FIELDS]:
                del v[mk]
        return True
    return False


def _skip(x: Any, s: dict[str, Any], path: str, pruned: list[str], *, root: bool = False) -> None:
    """Under preserve-unknown-fields: keep unknown keys, prune what the schema specifies."""
    if isinstance(x, dict):
        embedded = is_true(s, "x-kubernetes-embedded-resource")
        props = properties(s)
        addl = schema_dict(s.get("additionalProperties"))
        for k in sorted(x):
            v = x[k]
            if embedded and _meta(k, v, root, x):
                continue
            if k in props:
                _prune(v, schema_dict(props[k]), child(path, k), pruned)
            elif addl is not None:
                _prune(v, addl, child(path, k), pruned)
    elif isinstance(x, list):
        items = schema_dict(s.get("items"))
        if items is not None:
            for i, v in enumerate(x):
                _prune(v, items, index(path, i), pruned)


def unknown_field_warnings(pruned: list[str]) -> list[str]:
    """fieldValidation=Warn: one `Warning` header text per pruned field, as kube-apiserver sends."""
    return [f'unknown field "{p}"' for p in pruned]


def strict_decoding_message(kind: str, version: str, pruned: list[str]) -> str:
    """fieldValidation=Strict: the 400 BadRequest message kube-apiserver answers with."""
    fields = ", ".join(unknown_field_warnings(pruned))
    return f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {fields}'
