"""Ownership bookkeeping for Update and Apply operations (structured-merge-diff's
`merge.Updater`, in our own words).

The state is `ManagedFields`: manager identifier -> `VersionedSet` (a field
set, the apiVersion it is expressed in, and whether it came from an Apply).

* `update(live, new, ...)` — a write that is not an apply (create, update,
  any patch but apply-patch).  Every field the write added or changed moves
  to the writer (taken from whoever had it; an Update never conflicts);
  every removed field leaves every owner.
* `apply(live, config, ...)` — server-side apply.  The configuration is
  merged over the live object; fields this manager applied last time and has
  now left out are removed unless another manager owns them; the manager's
  set becomes exactly the configuration's fields.  Fields the apply *changes*
  that someone else owns are conflicts (`Conflicts`), unless `force`, which
  takes them.  Setting a field to the value it already has is not a change,
  so two appliers agreeing on a value share it.

Identifiers are opaque strings here; `managedfields.py` builds them from
(manager, operation, apiVersion, subresource) as kube-apiserver does.
Versions are recorded but not converted: Fleet serves each kind at one
version, and a CRD's versions share field paths (None conversion).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.api.ssa import typed
from fleet.api.ssa.fieldpath import FieldSet, Path, path_string
from fleet.api.ssa.schema import SchemaType


@dataclass(frozen=True)
class VersionedSet:
    set: FieldSet
    api_version: str
    applied: bool


ManagedFields = dict[str, VersionedSet]


@dataclass(frozen=True)
class Conflict:
    """Manager `manager` owns `path`, which the apply would change."""

    manager: str
    path: Path

    def __str__(self) -> str:
        return f"conflict with {self.manager}: {path_string(self.path)}"


class Conflicts(Exception):
    """The apply would change fields other managers own."""

    def __init__(self, conflicts: list[Conflict]) -> None:
        self.conflicts = conflicts
        super().__init__(f"{len(conflicts)} conflict(s)")

    def by_manager(self) -> dict[str, list[Path]]:
        out: dict[str, list[Path]] = {}
        for c in self.conflicts:
            out.setdefault(c.manager, []).append(c.path)
        return out

    def to_set(self) -> FieldSet:
        return FieldSet(c.path for c in self.conflicts)


def conflicts_from(sets: ManagedFields) -> Conflicts:
    return Conflicts([Conflict(m, p) for m in sorted(sets) for p in sets[m].set])


def _filter(cmp: typed.Comparison, ignored: list[Path]) -> typed.Comparison:
    if not ignored:
        return cmp
    return typed.Comparison(cmp.added.without_prefixes(ignored), cmp.modified.without_prefixes(ignored),
                            cmp.removed.without_prefixes(ignored))


def _settle(old: Any, new: Any, t: SchemaType, managers: ManagedFields, workflow: str, force: bool,
            ignored: list[Path]) -> tuple[ManagedFields, typed.Comparison]:
    """Take changed fields from, and drop removed fields of, everyone but `workflow`."""
    cmp = _filter(typed.compare(old, new, t), ignored)
    changed = cmp.changed()
    conflicts: ManagedFields = {}
    for manager, vs in managers.items():
        if manager == workflow:
            continue
        taken = vs.set.intersection(changed)
        if not taken.empty():
            conflicts[manager] = VersionedSet(taken, vs.api_version, False)
    if conflicts and not force:
        raise conflicts_from(conflicts)
    out: ManagedFields = {}
    for manager, vs in managers.items():
        s = vs.set
        if manager != workflow:
            if manager in conflicts:
                s = s.difference(conflicts[manager].set)
            s = s.difference(cmp.removed)
        if not s.empty():
            out[manager] = VersionedSet(s, vs.api_version, vs.applied)
    return out, cmp


def update(live: Any, new: Any, t: SchemaType, managers: ManagedFields, manager: str, api_version: str,
           *, ignored: list[Path] | None = None) -> ManagedFields:
    """Managed fields after `manager` wrote `new` over `live` (an Update operation)."""
    out, cmp = _settle(live, new, t, dict(managers), manager, True, ignored or [])
    prev = out.get(manager)
    s = (prev.set if prev else FieldSet()).difference(cmp.removed).union(cmp.changed())
    if ignored:
        s = s.without_prefixes(ignored)
    if s.empty():
        out.pop(manager, None)
    else:
        out[manager] = VersionedSet(s, api_version, False)
    return out


def apply(live: Any, config: Any, t: SchemaType, managers: ManagedFields, manager: str, api_version: str,
          *, force: bool = False, ignored: list[Path] | None = None) -> tuple[Any, ManagedFields]:
    """(new object, managed fields) after `manager` applied `config` over `live`.

    The object is returned even when unchanged (compare it with `live` to tell).
    Raises `Conflicts` (unless `force`) and `typed.SchemaViolation`.
    """
    ignored = ignored or []
    config_set = typed.to_field_set(config, t)  # validates the config (no duplicate keys)
    if ignored:
        config_set = config_set.without_prefixes(ignored)
    merged = typed.merge(live, config, t)
    managers = dict(managers)
    last = managers.get(manager)
    managers[manager] = VersionedSet(config_set, api_version, True)
    new = _prune(merged, t, managers, last)
    if new is not merged:
        # Pruning drops a map or list it empties; one the configuration itself
        # spells out (`labels: {}`, `finalizers: []`) comes back.
        new = typed.merge(new, config, t)
    out, _ = _settle(live, new, t, managers, manager, force, ignored)
    return new, out


def _prune(merged: Any, t: SchemaType, managers: ManagedFields, last: VersionedSet | None) -> Any:
    """Remove what the applier applied last time and no longer applies, unless someone owns it.

    Same outcome as structured-merge-diff's prune / add back owned items / add back
    dangling items: a path goes when the applier owned it last time, it is still in
    the object, and it (or the applied item or entry it sits in) is owned by nobody now
    (the applier's new set included).  A whole list item goes with everything in it.
    """
    if last is None or last.set.empty():
        return merged
    owned = FieldSet()
    for vs in managers.values():
        owned = owned.union(vs.set)
    merged_set = typed.to_field_set(merged, t, allow_duplicates=True)

    def under_last(p: Path) -> bool:
        return any(last.set.has(p[:i]) for i in range(1, len(p) + 1))

    unowned = FieldSet(p for p in merged_set if not owned.has(p) and under_last(p))
    doomed = FieldSet(q for q in last.set if merged_set.has(q)
                      and any(unowned.has(q[:i]) for i in range(1, len(q) + 1)))
    if doomed.empty():
        return merged
    return typed.remove_items(merged, doomed, t)
