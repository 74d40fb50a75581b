"""Field paths and field sets: the vocabulary of server-side apply ownership.

A *path* names one place in an object: a tuple of path elements, each one of

* `("f", name)`   a field of a map or struct             (`f:spec` in FieldsV1)
* `("k", keys)`   an item of an associative list, by key (`k:{"name":"c"}`)
* `("v", value)`  an item of a set list, by its value     (`v:"a"`)
* `("i", index)`  an item of a list, by position           (`i:0`; only untyped data)

Key values and set values are stored as canonical JSON text (compact, sorted
keys), so elements hash and compare without caring about Python's `1 == True`.

A `FieldSet` is a trie of such paths, the same shape as Kubernetes'
`fieldpath.Set` (sigs.k8s.io/structured-merge-diff): at every node, the set of
*members* (paths that end here) and the *children* (sub-tries by element).  A
path can be a member and have children at once — an associative list item is
owned as a whole (`.`) and field by field.  This is exactly what the FieldsV1
JSON encodes, which `to_fields_v1` / `from_fields_v1` read and write:

    {"f:metadata": {"f:labels": {"f:app": {}}},
     "f:spec": {"f:containers": {"k:{\\"name\\":\\"c\\"}": {".": {}, "f:image": {}}}}}

`path_string` prints a path the way kube-apiserver prints it in conflict
messages: `.spec.containers[name="c"].image`, `.metadata.finalizers[="x"]`.
Pure data, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

PathElement = tuple[str, Any]
Path = tuple[PathElement, ...]

_KIND_ORDER = {"f": 0, "k": 1, "v": 2, "i": 3}


class FieldPathError(ValueError):
    """A FieldsV1 document or path element that cannot be parsed."""


def canonical_json(value: Any) -> str:
    """Compact JSON with Go's HTML escaping, as the apiserver's encoder writes it."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


# -- path element constructors -------------------------------------------------------------

def field(name: str) -> PathElement:
    return ("f", name)


def key(keys: dict[str, Any]) -> PathElement:
    """The element of an associative-list item whose key fields are `keys`."""
    return ("k", tuple(sorted((k, canonical_json(v)) for k, v in keys.items())))


def value(v: Any) -> PathElement:
    return ("v", canonical_json(v))


def index(i: int) -> PathElement:
    return ("i", i)


def make_path(*parts: str | int | PathElement) -> Path:
    """`make_path("spec", "replicas")`; ints become indexes, tuples pass through."""
    out: list[PathElement] = []
    for p in parts:
        if isinstance(p, tuple):
            out.append(p)
        elif isinstance(p, int):
            out.append(index(p))
        else:
            out.append(field(p))
    return tuple(out)


# -- ordering, serialization and printing of elements ----------------------------------------

def _json_rank(text: str) -> tuple[int, Any]:
    v = json.loads(text)
    if v is None:
        return (0, 0)
    if isinstance(v, bool):
        return (3, v)
    if isinstance(v, (int, float)):
        return (1, v)
    if isinstance(v, str):
        return (2, v)
    return (4, text)


def element_sort_key(pe: PathElement) -> tuple[Any, ...]:
    """Field < Key < Value < Index, then by content (structured-merge-diff's order)."""
    kind, data = pe
    if kind == "f":
        return (0, data)
    if kind == "k":
        return (1, tuple((name, _json_rank(v)) for name, v in data))
    if kind == "v":
        return (2, _json_rank(data))
    return (3, data)


def serialize_element(pe: PathElement) -> str:
    kind, data = pe
    if kind == "f":
        return "f:" + data
    if kind == "k":
        return "k:{" + ",".join(f"{canonical_json(n)}:{v}" for n, v in data) + "}"
    if kind == "v":
        return "v:" + data
    if kind == "i":
        return f"i:{data}"
    raise FieldPathError(f"invalid path element {pe!r}")


def parse_element(s: str) -> PathElement:
    if len(s) < 2:
        raise FieldPathError("key must be 2 characters long:")
    if s[1] != ":":
        raise FieldPathError(f"missing colon: {s}")
    kind, rest = s[0], s[2:]
    if kind == "f":
        return ("f", rest)
    try:
        if kind == "v":
            return ("v", canonical_json(json.loads(rest)))
        if kind == "k":
            keys = json.loads(rest)
            if not isinstance(keys, dict):
                raise FieldPathError(f"key element is not an object: {s}")
            return key(keys)
        if kind == "i":
            return ("i", int(rest))
    except (json.JSONDecodeError, ValueError) as e:
        if isinstance(e, FieldPathError):
            raise
        raise FieldPathError(f"parsing {s!r}: {e}") from None
    raise FieldPathError("unknown path element type")


def _go_string(v: Any) -> str:
    """Go's value.ToString: `%q` strings, `%v` numbers and booleans."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if not v.is_integer() or abs(v) >= 1e21 else str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ",".join(_go_string(x) for x in v) + "]"
    return "{" + ",".join(f"{k}={_go_string(x)}" for k, x in sorted(v.items())) + "}"


def element_string(pe: PathElement) -> str:
    kind, data = pe
    if kind == "f":
        return "." + data
    if kind == "k":
        return "[" + ",".join(f"{n}={_go_string(json.loads(v))}" for n, v in data) + "]"
    if kind == "v":
        return f"[={_go_string(json.loads(data))}]"
    return f"[{data}]"


def path_string(path: Path) -> str:
    """`.spec.containers[name="c"].image`, as kube-apiserver prints field paths."""
    return "".join(element_string(pe) for pe in path)


# -- the set ------------------------------------------------------------------------------

class FieldSet:
    """A set of paths, stored as a trie (see the module docstring).

    Treat it as immutable: the algebra returns new sets.  `insert` exists for
    builders that own a fresh set.
    """

    __slots__ = ("members", "children")

    def __init__(self, paths: Iterable[Path] = ()) -> None:
        self.members: set[PathElement] = set()
        self.children: dict[PathElement, FieldSet] = {}
        for p in paths:
            self.insert(p)

    # building
    def insert(self, path: Path) -> None:
        if not path:
            return  # the root is never a member
        node = self
        for pe in path[:-1]:
            child = node.children.get(pe)
            if child is None:
                child = node.children[pe] = FieldSet()
            node = child
        node.members.add(path[-1])

    # queries
    def empty(self) -> bool:
        return not self.members and all(c.empty() for c in self.children.values())

    def has(self, path: Path) -> bool:
        if not path:
            return False
        node: FieldSet | None = self
        for pe in path[:-1]:
            node = node.children.get(pe) if node is not None else None
            if node is None:
                return False
        return node is not None and path[-1] in node.members

    def with_prefix(self, pe: PathElement) -> FieldSet:
        """The paths below element `pe`, relative to it (empty when none)."""
        return self.children.get(pe) or FieldSet()

    def __iter__(self) -> Iterator[Path]:
        """Every member path, in structured-merge-diff's order (members before children)."""
        yield from self._iter(())

    def _iter(self, prefix: Path) -> Iterator[Path]:
        for pe in sorted(self.members, key=element_sort_key):
            yield prefix + (pe,)
        for pe in sorted(self.children, key=element_sort_key):
            yield from self.children[pe]._iter(prefix + (pe,))

    def __len__(self) -> int:
        return len(self.members) + sum(len(c) for c in self.children.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldSet):
            return NotImplemented
        return set(self) == set(other)

    def __hash__(self) -> int:  # pragma: no cover - sets are not meant as dict keys
        raise TypeError("FieldSet is unhashable")

    def __repr__(self) -> str:
        return "FieldSet({" + ", ".join(path_string(p) for p in self) + "})"

    # algebra
    def copy(self) -> FieldSet:
        out = FieldSet()
        out.members = set(self.members)
        out.children = {pe: c.copy() for pe, c in self.children.items()}
        return out

    def union(self, other: FieldSet) -> FieldSet:
        out = FieldSet()
        out.members = self.members | other.members
        for pe in self.children.keys() | other.children.keys():
            a, b = self.children.get(pe), other.children.get(pe)
            out.children[pe] = a.union(b) if a is not None and b is not None else (a or b).copy()  # type: ignore[union-attr]
        return out

    def intersection(self, other: FieldSet) -> FieldSet:
        out = FieldSet()
        out.members = self.members & other.members
        for pe in self.children.keys() & other.children.keys():
            c = self.children[pe].intersection(other.children[pe])
            if not c.empty():
                out.children[pe] = c
        return out

    def difference(self, other: FieldSet) -> FieldSet:
        out = FieldSet()
        out.members = self.members - other.members
        for pe, a in self.children.items():
            b = other.children.get(pe)
            c = a.copy() if b is None else a.difference(b)
            if not c.empty():
                out.children[pe] = c
        return out

    def leaves(self) -> FieldSet:
        """Members that are not a prefix of another member."""
        out = FieldSet()
        out.members = {pe for pe in self.members if pe not in self.children or self.children[pe].empty()}
        for pe, c in self.children.items():
            sub = c.leaves()
            if not sub.empty():
                out.children[pe] = sub
        return out

    def prefixed(self, prefix: Path) -> FieldSet:
        """This set moved under `prefix`."""
        if not prefix:
            return self.copy()
        out = FieldSet()
        node = out
        for pe in prefix[:-1]:
            node = node.children.setdefault(pe, FieldSet())
        node.children[prefix[-1]] = self.copy()
        return out

    def without_prefixes(self, prefixes: Iterable[Path]) -> FieldSet:
        """This set minus every path equal to or below one of `prefixes`."""
        out = self.copy()
        for p in prefixes:
            node: FieldSet | None = out
            for pe in p[:-1]:
                node = node.children.get(pe) if node is not None else None
            if node is not None and p:
                node.members.discard(p[-1])
                node.children.pop(p[-1], None)
        return out

    # FieldsV1
    def to_fields_v1(self) -> dict[str, Any]:
        """The FieldsV1 JSON object (members as `{}`; `"."` when also a parent)."""
        out: dict[str, Any] = {}
        keys = sorted(self.members | {pe for pe, c in self.children.items() if not c.empty()},
                      key=element_sort_key)
        for pe in keys:
            child = self.children.get(pe)
            sub: dict[str, Any] = {}
            if child is not None and not child.empty():
                sub = child.to_fields_v1()
                if pe in self.members:
                    sub = {".": {}, **sub}
            out[serialize_element(pe)] = sub
        return out

    @classmethod
    def from_fields_v1(cls, doc: Any) -> FieldSet:
        if isinstance(doc, (bytes, str)):
            try:
                doc = json.loads(doc)
            except json.JSONDecodeError as e:
                raise FieldPathError(f"invalid FieldsV1 JSON: {e}") from None
        if doc is None:
            return cls()
        if not isinstance(doc, dict):
            raise FieldPathError("FieldsV1 must be a JSON object")
        out = cls()
        out._read(doc)
        return out

    def _read(self, doc: dict[str, Any]) -> bool:
        """Fill from a FieldsV1 node; returns whether the node had a `"."` marker."""
        dot = False
        for k, sub in doc.items():
            if k == ".":
                dot = True
                continue
            if not isinstance(sub, dict):
                raise FieldPathError(f"FieldsV1 value for {k!r} must be an object")
            pe = parse_element(k)
            if not sub:
                self.members.add(pe)
                continue
            child = FieldSet()
            if child._read(sub):
                self.members.add(pe)
            if not child.empty():
                self.children[pe] = child
        return dot


def paths_of(paths: Iterable[Path]) -> FieldSet:
    return FieldSet(paths)
