"""Walks over plain JSON objects guided by a `SchemaType`: the typed-value half of
structured-merge-diff, in our own words.

* `to_field_set(obj, t)` — the set of fields an object (or an applied
  configuration) *sets*: every scalar, every atomic list or map as one leaf,
  every associative/set list item as a member of its own, every empty map or
  null as a leaf, and every entry of a `map[string]X` (an undeclared field).
* `compare(old, new, t)` — which paths were added, modified and removed.
* `merge(live, config, t)` — the applied configuration laid over the live
  object: the configuration wins on scalars and atomic values, maps merge
  field by field, associative lists and sets merge item by item, keeping the
  live items the configuration does not mention in their place.
* `remove_items(obj, paths, t)` — the object without the given fields and
  list items (used to prune what an applier stopped applying).

Errors that make an object unusable for field tracking (a keyed list item
without its key, duplicate keys in an applied configuration) raise
`SchemaViolation` with the path and structured-merge-diff's wording.
Pure functions; inputs are never mutated.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from fleet.api.ssa import fieldpath as fp
from fleet.api.ssa.fieldpath import FieldSet, Path, PathElement
from fleet.api.ssa.schema import LIST, MAP, SchemaType, resolve


class SchemaViolation(ValueError):
    """An object that does not fit its schema's list and map semantics."""

    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        self.detail = message
        where = fp.path_string(path)
        super().__init__(f"{where}: {message}" if where else message)


_MISSING = object()


# -- list items ------------------------------------------------------------------------------

def item_element(t: SchemaType, item: Any, pos: int, path: Path) -> PathElement:
    """The path element naming list item `item` of list type `t`."""
    if t.list_type == "map" and t.keys:
        if item is None:
            raise SchemaViolation(path, "associative list with keys may not have a null element")
        if not isinstance(item, dict):
            raise SchemaViolation(path, "associative list with keys may not have non-map elements")
        keys: dict[str, Any] = {}
        for k in t.keys:
            if k in item:
                keys[k] = item[k]
            elif k in t.key_defaults:
                keys[k] = t.key_defaults[k]
            else:
                raise SchemaViolation(path, "associative list with keys has an element that omits key "
                                            f"field {json.dumps(k)} (and doesn't have default value)")
        return fp.key(keys)
    if t.list_type in ("set", "map"):
        if isinstance(item, dict):
            raise SchemaViolation(path, "associative list without keys has an element that's a map type")
        if isinstance(item, list):
            raise SchemaViolation(path, "not supported: associative list with lists as elements")
        return fp.value(item)
    return fp.index(pos)


def _index_items(t: SchemaType, items: list[Any], path: Path, *, allow_duplicates: bool
                 ) -> tuple[list[PathElement], dict[PathElement, Any]]:
    pes: list[PathElement] = []
    seen: dict[PathElement, Any] = {}
    for i, item in enumerate(items):
        pe = item_element(t, item, i, path)
        if pe in seen:
            if not allow_duplicates:
                raise SchemaViolation(path, f"duplicate entries for key {fp.element_string(pe)}")
        else:
            seen[pe] = item
        pes.append(pe)
    return pes, seen


def _granular_list(t: SchemaType) -> bool:
    return t.kind == LIST and t.list_type in ("set", "map")


# -- to_field_set --------------------------------------------------------------------------------

def to_field_set(obj: Any, t: SchemaType, *, allow_duplicates: bool = False) -> FieldSet:
    """The fields `obj` sets (see the module docstring)."""
    out = FieldSet()
    _collect(obj, t, (), out, allow_duplicates)
    return out


def _collect(v: Any, t: SchemaType, path: Path, out: FieldSet, dup: bool) -> None:
    t = resolve(t, v)
    if t.kind == MAP and isinstance(v, dict) and not t.atomic:
        for k, sub in v.items():
            p = path + (fp.field(k),)
            _collect(sub, t.field(k), p, out, dup)
            if sub is None or sub == {} or not t.declared(k):
                out.insert(p)
        return
    if t.kind == LIST and isinstance(v, list) and _granular_list(t):
        pes, _ = _index_items(t, v, path, allow_duplicates=dup)
        for pe, item in zip(pes, v, strict=True):
            p = path + (pe,)
            _collect(item, t.elem(), p, out, dup)
            out.insert(p)
        return
    out.insert(path)


# -- compare ---------------------------------------------------------------------------------------

@dataclass
class Comparison:
    added: FieldSet = field(default_factory=FieldSet)
    modified: FieldSet = field(default_factory=FieldSet)
    removed: FieldSet = field(default_factory=FieldSet)

    def is_same(self) -> bool:
        return self.added.empty() and self.modified.empty() and self.removed.empty()

    def changed(self) -> FieldSet:
        """Added or modified paths."""
        return self.added.union(self.modified)


def compare(old: Any, new: Any, t: SchemaType) -> Comparison:
    """Paths `new` adds, modifies and removes relative to `old`."""
    c = Comparison()
    _cmp(old, new, t, (), c)
    return c


def _leafish(v: Any) -> bool:
    return v is _MISSING or v is None or v == {} or v == []


def _cmp(a: Any, b: Any, t: SchemaType, path: Path, c: Comparison) -> None:
    ta, tb = resolve(t, a if a is not _MISSING else b), resolve(t, b if b is not _MISSING else a)
    granular_map = ta.kind == MAP and not ta.atomic and tb.kind == MAP
    granular_list = _granular_list(ta) and _granular_list(tb)
    both_containers = (granular_map and isinstance(a, dict) and isinstance(b, dict)) or \
        (granular_list and isinstance(a, list) and isinstance(b, list))
    if both_containers and not (_leafish(a) and _leafish(b)):
        if isinstance(a, dict):
            for k in list(a) + [k for k in b if k not in a]:
                _cmp(a.get(k, _MISSING), b.get(k, _MISSING), ta.field(k), path + (fp.field(k),), c)
        else:
            _, ia = _index_items(ta, a, path, allow_duplicates=True)
            pes_b, ib = _index_items(ta, b, path, allow_duplicates=True)
            order = list(ia) + [pe for pe in pes_b if pe not in ia]
            for pe in order:
                _cmp(ia.get(pe, _MISSING), ib.get(pe, _MISSING), ta.elem(), path + (pe,), c)
        return
    if a is _MISSING:
        _mark(b, tb, path, c.added)
    elif b is _MISSING:
        _mark(a, ta, path, c.removed)
    elif a != b or type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                                  and not isinstance(a, bool) and not isinstance(b, bool)):
        if path:
            c.modified.insert(path)
        # A container that changed shape: its old parts are gone, its new parts are new.
        if isinstance(a, (dict, list)) and not _leafish(a):
            _mark_children(a, ta, path, c.removed)
        if isinstance(b, (dict, list)) and not _leafish(b):
            _mark_children(b, tb, path, c.added)


def _mark(v: Any, t: SchemaType, path: Path, into: FieldSet) -> None:
    """`path` and everything below it (as granularly as the type allows) into `into`.

    The path itself is skipped for a non-empty implicit struct field (see `SchemaType.implicit`;
    a list item is always an item of its own):
    kube-apiserver compares typed Go objects, where such a struct is never absent.
    """
    rt = resolve(t, v)
    if path and not (path[-1][0] == "f" and rt.kind == MAP and rt.implicit and isinstance(v, dict) and v):
        into.insert(path)
    _mark_children(v, t, path, into)


def _mark_children(v: Any, t: SchemaType, path: Path, into: FieldSet) -> None:
    t = resolve(t, v)
    if t.kind == MAP and not t.atomic and isinstance(v, dict):
        for k, sub in v.items():
            _mark(sub, t.field(k), path + (fp.field(k),), into)
    elif _granular_list(t) and isinstance(v, list):
        pes, _ = _index_items(t, v, path, allow_duplicates=True)
        for pe, item in zip(pes, v, strict=True):
            _mark(item, t.elem(), path + (pe,), into)


# -- merge -----------------------------------------------------------------------------------------

def merge(live: Any, config: Any, t: SchemaType) -> Any:
    """`config` applied over `live` (see the module docstring); returns a new value."""
    return _merge(live, config, t, ())


def _merge(a: Any, b: Any, t: SchemaType, path: Path) -> Any:
    if b is _MISSING:
        return copy.deepcopy(a)
    if a is _MISSING:
        return copy.deepcopy(b)
    t = resolve(t, b)
    if t.kind == MAP and not t.atomic and isinstance(a, dict) and isinstance(b, dict):
        out = {k: copy.deepcopy(v) for k, v in a.items()}
        for k, v in b.items():
            out[k] = _merge(a.get(k, _MISSING), v, t.field(k), path + (fp.field(k),))
        return out
    if _granular_list(t) and isinstance(a, list) and isinstance(b, list):
        return _merge_list(a, b, t, path)
    return copy.deepcopy(b)


def _merge_list(lhs: list[Any], rhs: list[Any], t: SchemaType, path: Path) -> list[Any]:
    """Item-by-item merge: the configuration's order, live-only items kept in place.

    Items follow the configuration's order (merged with their live twin when
    there is one).  A live item the configuration does not mention stays just
    before the next live item that the configuration does mention (so it keeps
    its neighbour), or at the end when no such item follows it.  This is the
    order structured-merge-diff's set tests expect (`apply_update_apply_no_overlap`:
    live [a b c d] + config [a aprime c cprime] -> [a aprime b c cprime d]).
    """
    lpes, lidx = _index_items(t, lhs, path, allow_duplicates=True)
    rpes, ridx = _index_items(t, rhs, path, allow_duplicates=False)
    before: dict[PathElement, list[Any]] = {}
    waiting: list[Any] = []
    for pe, item in zip(lpes, lhs, strict=True):
        if pe in ridx:
            if pe not in before:
                before[pe] = waiting
                waiting = []
        else:
            waiting.append(copy.deepcopy(item))
    out: list[Any] = []
    elem = t.elem()
    for pe in rpes:
        out.extend(before.pop(pe, ()))
        out.append(_merge(lidx.get(pe, _MISSING), ridx[pe], elem, path + (pe,)))
    out.extend(waiting)
    return out


# -- remove ----------------------------------------------------------------------------------------

def remove_items(obj: Any, paths: FieldSet, t: SchemaType) -> Any:
    """`obj` without the fields and list items in `paths`.

    A map or list that this removal empties is dropped from its parent (rather
    than left as `null`), as kube-apiserver's typed decoding would for a
    built-in kind.
    """
    out = _remove(obj, paths, t)
    return out if out is not _MISSING else ({} if isinstance(obj, dict) else obj)


def _remove(v: Any, paths: FieldSet, t: SchemaType) -> Any:
    t = resolve(t, v)
    if t.kind == MAP and not t.atomic and isinstance(v, dict):
        out: dict[str, Any] = {}
        for k, sub in v.items():
            pe = fp.field(k)
            if pe in paths.members:
                continue
            child = paths.children.get(pe)
            if child is not None and not child.empty():
                r = _remove(sub, child, t.field(k))
                if r is _MISSING:
                    continue
                out[k] = r
            else:
                out[k] = copy.deepcopy(sub)
        return out if out or not v else _MISSING
    if _granular_list(t) and isinstance(v, list):
        items: list[Any] = []
        for i, item in enumerate(v):
            pe = item_element(t, item, i, ())
            if pe in paths.members:
                continue
            child = paths.children.get(pe)
            if child is not None and not child.empty():
                r = _remove(item, child, t.elem())
                if r is _MISSING:
                    continue
                items.append(r)
            else:
                items.append(copy.deepcopy(item))
        return items if items or not v else _MISSING
    return copy.deepcopy(v)
