"""Server-side apply: field ownership (managedFields), apply merges and conflicts.

A pure library (no I/O), Kubernetes' structured-merge-diff and apiserver field
manager in our own words.  Modules, bottom up:

* `fieldpath` — paths, `FieldSet` (the trie of owned paths), FieldsV1 JSON,
  kube's path printing (`.spec.containers[name="c"].image`).
* `schema` — `SchemaType`: per place in an object, scalar / granular or atomic
  map / atomic, set or keyed list; built from Fleet's built-in kind schemas
  (`for_kind`) or a CRD's OpenAPI v3 schema (`from_openapi`).
* `typed` — `to_field_set`, `compare`, `merge`, `remove_items` over plain JSON.
* `updater` — ownership for Update and Apply operations, `Conflicts`.
* `managedfields` — the `metadata.managedFields` encoding and `FieldManager`,
  the entry point a REST handler calls on every write.

Typical use (what the REST layer will do):

    fm = FieldManager(schema.for_kind("apps", "v1", "Deployment"), "apps/v1", "Deployment")
    stored = fm.update(old, new, "kubectl-edit")          # every create/update/patch
    stored = fm.apply(live, config, "helm", force=False)   # application/apply-patch+yaml
"""

from __future__ import annotations

from typing import Any

from fleet.api.ssa import schema
from fleet.api.ssa.fieldpath import FieldPathError, FieldSet, Path, make_path, path_string
from fleet.api.ssa.managedfields import (
    APPLY,
    BEFORE_FIRST_APPLY,
    LAST_APPLIED,
    UPDATE,
    FieldManager,
    Managed,
    ManagedFieldsError,
    conflict_error,
    conflict_message,
    decode,
    encode,
    manager_identifier,
    validate,
)
from fleet.api.ssa.schema import SchemaType, for_kind, from_openapi
from fleet.api.ssa.typed import (
    Comparison,
    SchemaViolation,
    compare,
    merge,
    remove_items,
    to_field_set,
)
from fleet.api.ssa.updater import Conflict, Conflicts, ManagedFields, VersionedSet


def merge_apply(live: Any, config: Any, t: SchemaType, *, managed: ManagedFields | None = None,
                manager: str = "apply", api_version: str = "v1", force: bool = True) -> Any:
    """The object after applying `config` over `live` with apply semantics.

    With `managed` (identifier -> VersionedSet), fields `manager` applied before
    and now omits are removed unless another manager owns them; conflicts are
    forced by default (this is the merge alone; use `FieldManager.apply` for
    conflict checks and managedFields).
    """
    from fleet.api.ssa import updater

    obj, _ = updater.apply(live, config, t, managed or {}, manager, api_version, force=force)
    return obj


def apply(managed: list[dict[str, Any]] | None, manager: str, live: dict[str, Any] | None,
          config: dict[str, Any], *, t: SchemaType, api_version: str, kind: str, force: bool = False,
          subresource: str = "") -> tuple[dict[str, Any], list[dict[str, Any]]] | Conflicts:
    """(new object, new managedFields) after `manager` applied `config`, or the `Conflicts`.

    `managed` is the live object's managedFields list (it replaces whatever
    `live` carries).  A thin convenience over `FieldManager.apply`.
    """
    from fleet.api import errors
    from fleet.api.ssa.managedfields import FieldManager

    base: dict[str, Any] | None = None
    if live is not None or managed:
        base = dict(live or {})
        base["metadata"] = {**(base.get("metadata") or {}), "managedFields": managed}
        if not managed:
            base["metadata"].pop("managedFields")
    fm = FieldManager(t, api_version, kind, subresource=subresource)
    try:
        obj = fm.apply(base, config, manager, force=force)
    except errors.Conflict as e:
        return e.conflicts  # type: ignore[attr-defined,no-any-return]
    return obj, obj.get("metadata", {}).get("managedFields", [])


def update_managers(managed: ManagedFields, manager: str, operation: str, old: Any, new: Any, t: SchemaType,
                    *, api_version: str = "v1", force: bool = False) -> ManagedFields:
    """Managed fields after `manager` wrote `new` over `old` with `operation` (Update or Apply).

    For Apply, `new` is the applied configuration and `old` the live object;
    raises `Conflicts` unless `force`.
    """
    from fleet.api.ssa import updater

    if operation == UPDATE:
        return updater.update(old, new, t, managed, manager, api_version)
    _, out = updater.apply(old, new, t, managed, manager, api_version, force=force)
    return out


__all__ = [
    "APPLY", "BEFORE_FIRST_APPLY", "LAST_APPLIED", "UPDATE", "apply",
    "Comparison", "Conflict", "Conflicts", "FieldManager", "FieldPathError", "FieldSet", "Managed",
    "ManagedFields", "ManagedFieldsError", "Path", "SchemaType", "SchemaViolation", "VersionedSet",
    "compare", "conflict_error", "conflict_message", "decode", "encode", "for_kind", "from_openapi",
    "make_path", "manager_identifier", "merge", "merge_apply", "path_string", "remove_items", "schema",
    "to_field_set", "update_managers", "validate",
]
