"""The type information server-side apply needs, per place in an object.

Structured merge only has to know, at each node, one of four things:

* a **scalar** (a leaf: replaced whole);
* a **map** — *granular* (each field owned separately; a struct with known
  fields, or a `map[string]X`), or *atomic* (owned and replaced as one value,
  `x-kubernetes-map-type: atomic` / Go's `+structType=atomic`);
* a **list** — `atomic` (replaced whole), `set` (scalars, owned per value),
  or `map` (objects, owned per item by the `x-kubernetes-list-map-keys`,
  with the key fields' defaults filling in missing keys);
* **deduced** — no schema: the value decides (maps granular, lists atomic,
  the rest scalars), as structured-merge-diff's "deduced" type does for
  `x-kubernetes-preserve-unknown-fields` and kinds without a schema.

`SchemaType` is that node.  Children are computed lazily (schemas recurse:
a CRD's `JSONSchemaProps`, a Pod template inside a Job inside a CronJob).

Two sources feed it:

* `for_kind(group, version, kind)`: the built-in kinds, from
  `fleet/api/k8s_schema.json` (field names and shapes, generated from the
  official client's models, which lost the `+listType` tags) plus the
  strategic-merge metadata of `fleet.api.schema.patch_metadata()`, defaulted
  the way Kubernetes' `schemaconv` does for a list with no list type: a
  `merge` patch strategy with a merge key is a map keyed by it, `merge`
  without a key is a set, anything else is atomic.  `_LIST_OVERRIDES` and
  `_ATOMIC_MAPS` restore the k8s.io/api tags where they say more than the
  patch tags (ports keyed by port *and* protocol, atomic selectors, ...).
* `from_openapi(schema)`: an OpenAPI v3 schema as a CRD's
  `openAPIV3Schema` carries it (`properties`, `additionalProperties`,
  `items`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
  `x-kubernetes-map-type`, `x-kubernetes-preserve-unknown-fields`,
  `x-kubernetes-embedded-resource`, `x-kubernetes-int-or-string`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

SCALAR, MAP, LIST, DEDUCED = "scalar", "map", "list", "deduced"


class SchemaType:
    """One node of the type tree (see the module docstring)."""

    __slots__ = ("kind", "atomic", "list_type", "keys", "key_defaults", "implicit", "_field", "_elem", "_fields")

    def __init__(
        self,
        kind: str,
        *,
        atomic: bool = False,
        list_type: str = "atomic",
        keys: tuple[str, ...] = (),
        key_defaults: dict[str, Any] | None = None,
        field: Callable[[str], SchemaType | None] | None = None,
        elem: Callable[[], SchemaType] | None = None,
        fields: Callable[[], frozenset[str]] | None = None,
        implicit: bool = False,
    ) -> None:
        self.kind = kind
        # A struct that is always there (a Go value struct: `spec`, `metadata`, a pod
        # template), so adding or removing its contents never adds or removes the
        # struct itself, and it is never owned as a whole.
        self.implicit = implicit
        self.atomic = atomic
        self.list_type = list_type
        self.keys = keys
        self.key_defaults = key_defaults or {}
        self._field = field
        self._elem = elem
        self._fields = fields

    def field(self, name: str) -> SchemaType:
        """The type of map field `name` (deduced when the schema does not know it)."""
        if self._field is not None:
            t = self._field(name)
            if t is not None:
                return t
        if self._elem is not None:
            return self._elem()
        return DEDUCED_TYPE

    def declared(self, name: str) -> bool:
        """Whether `name` is a declared struct field (not a map-of entry)."""
        return self._fields is not None and name in self._fields()

    def elem(self) -> SchemaType:
        return self._elem() if self._elem is not None else DEDUCED_TYPE

    def __repr__(self) -> str:
        if self.kind == LIST:
            return f"SchemaType(list {self.list_type} keys={self.keys})"
        return f"SchemaType({self.kind}{' atomic' if self.atomic else ''})"


SCALAR_TYPE = SchemaType(SCALAR)
DEDUCED_TYPE = SchemaType(DEDUCED)


def resolve(t: SchemaType, v: Any) -> SchemaType:
    """A deduced type made concrete by the value at hand."""
    if t.kind != DEDUCED:
        return t
    if isinstance(v, dict):
        return _DEDUCED_MAP
    if isinstance(v, list):
        return _DEDUCED_LIST
    return SCALAR_TYPE


_DEDUCED_MAP = SchemaType(MAP, elem=lambda: DEDUCED_TYPE)
_DEDUCED_LIST = SchemaType(LIST, list_type="atomic", elem=lambda: DEDUCED_TYPE)


def map_type(fields: dict[str, SchemaType] | None = None, *, elem: SchemaType | None = None,
             atomic: bool = False) -> SchemaType:
    """A hand-built map node (tests, small schemas)."""
    fs = dict(fields or {})
    return SchemaType(MAP, atomic=atomic, field=fs.get,
                      elem=(lambda: elem) if elem is not None else None,
                      fields=lambda: frozenset(fs))


def list_type(elem: SchemaType, kind: str = "atomic", keys: tuple[str, ...] = (),
              key_defaults: dict[str, Any] | None = None) -> SchemaType:
    """A hand-built list node: kind is `atomic`, `set` or `map`."""
    return SchemaType(LIST, list_type=kind, keys=tuple(keys), key_defaults=key_defaults,
                      elem=lambda: elem)


# -- built-in kinds ----------------------------------------------------------------------------

# (type, field) -> (list type, keys, key defaults): the k8s.io/api `+listType` tags where they
# differ from what the patch strategy implies.  A list absent here and from the patch metadata
# is atomic, which is also what upstream's explicit `+listType=atomic` tags say.
_LIST_OVERRIDES: dict[tuple[str, str], tuple[str, tuple[str, ...], dict[str, Any]]] = {
    ("V1Container", "ports"): ("map", ("containerPort", "protocol"), {"protocol": "TCP"}),
    ("V1EphemeralContainer", "ports"): ("map", ("containerPort", "protocol"), {"protocol": "TCP"}),
    ("V1ServiceSpec", "ports"): ("map", ("port", "protocol"), {"protocol": "TCP"}),
    ("V1PodSpec", "topologySpreadConstraints"): ("map", ("topologyKey", "whenUnsatisfiable"), {}),
    ("V1ObjectMeta", "finalizers"): ("set", (), {}),
    ("V1NodeSpec", "podCIDRs"): ("set", (), {}),
    ("V1PodSpec", "readinessGates"): ("atomic", (), {}),
    ("V1PodSpec", "tolerations"): ("atomic", (), {}),
    ("V1EndpointSubset", "addresses"): ("atomic", (), {}),
    ("V1PolicyRule", "verbs"): ("atomic", (), {}),
    ("V1ServiceSpec", "clusterIPs"): ("atomic", (), {}),
    ("V1ServiceSpec", "ipFamilies"): ("atomic", (), {}),
    ("V1DeploymentStatus", "conditions"): ("map", ("type",), {}),
    ("V1ContainerStatus", "volumeMounts"): ("map", ("mountPath",), {}),
    ("V1PodStatus", "containerStatuses"): ("atomic", (), {}),
    ("V1PodStatus", "initContainerStatuses"): ("atomic", (), {}),
    ("V1PodStatus", "ephemeralContainerStatuses"): ("atomic", (), {}),
}

# Struct types tagged `+structType=atomic` upstream (owned and replaced whole).
_ATOMIC_TYPES = frozenset({
    "V1LabelSelector", "V1NodeSelector", "V1NodeSelectorTerm", "V1TopologySelectorTerm",
    "V1ObjectReference", "V1LocalObjectReference", "V1TypedLocalObjectReference",
    "V1TypedObjectReference", "V1SecretKeySelector", "V1ConfigMapKeySelector",
    "V1ObjectFieldSelector", "V1ResourceFieldSelector", "V1OwnerReference",
    "V1SecretReference",
})

# (type, field) of `map[string]string` fields tagged `+mapType=atomic`.  (Add
# V1ReplicationControllerSpec.selector when ReplicationController joins k8s_schema.json.)
_ATOMIC_MAPS = frozenset({
    ("V1ServiceSpec", "selector"), ("V1PodSpec", "nodeSelector"),
})


def _fleet_types() -> dict[str, Any]:
    from fleet.api import schema as fleet_schema

    return fleet_schema.types()


@functools.cache
def _struct(type_name: str) -> SchemaType:
    t = _fleet_types().get(type_name)
    if t is None:
        return DEDUCED_TYPE
    fields: dict[str, Any] = t.get("fields", {})

    @functools.cache
    def child(name: str) -> SchemaType | None:
        f = fields.get(name)
        if f is None:
            return None
        return _expr(f["type"], type_name, name)

    return SchemaType(MAP, atomic=type_name in _ATOMIC_TYPES, field=child,
                      fields=lambda: frozenset(fields), implicit=True)


def _expr(expr: Any, owner: str, fname: str) -> SchemaType:
    if isinstance(expr, str):
        return DEDUCED_TYPE if expr == "any" else SCALAR_TYPE
    if "ref" in expr:
        return _struct(expr["ref"])
    if "map" in expr:
        inner = expr["map"]
        return SchemaType(MAP, atomic=(owner, fname) in _ATOMIC_MAPS,
                          elem=lambda: _expr(inner, owner, fname + "[]"))
    inner = expr["list"]
    elem_fn = functools.cache(lambda: _expr(inner, owner, fname + "[]"))
    override = _LIST_OVERRIDES.get((owner, fname))
    if override is not None:
        kind, keys, defaults = override
        return SchemaType(LIST, list_type=kind, keys=keys, key_defaults=defaults, elem=elem_fn)
    from fleet.api import schema as fleet_schema

    merge_key, strategy = fleet_schema.patch_metadata().get(owner, {}).get(fname, (None, "replace"))
    if strategy.startswith("merge"):
        if merge_key:
            return SchemaType(LIST, list_type="map", keys=(merge_key,), elem=elem_fn)
        return SchemaType(LIST, list_type="set", elem=elem_fn)
    return SchemaType(LIST, list_type="atomic", elem=elem_fn)


@functools.cache
def for_kind(group: str, version: str, kind: str) -> SchemaType:
    """The type tree of a built-in kind (deduced for a kind Fleet has no schema of)."""
    from fleet.api import schema as fleet_schema

    root = fleet_schema.root_type(group, version, kind)
    if root is None:
        return DEDUCED_TYPE
    return _struct(root)


# -- OpenAPI v3 (CRDs) ---------------------------------------------------------------------------

def from_openapi(schema: dict[str, Any] | None) -> SchemaType:
    """The type tree of a structural OpenAPI v3 schema (a CRD version's `openAPIV3Schema`).

    The object's `apiVersion`, `kind` and `metadata` are typed as for every
    object even when the schema does not spell them out, as kube-apiserver
    does for custom resources.
    """
    root = _openapi(schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    meta = _struct("V1ObjectMeta")
    builtin = {"apiVersion": SCALAR_TYPE, "kind": SCALAR_TYPE, "metadata": meta}

    def child(name: str) -> SchemaType | None:
        if name in builtin:
            return builtin[name]
        return root.field(name) if root.kind == MAP else None

    return SchemaType(MAP, field=child, elem=root._elem if root.kind == MAP else None,
                      fields=lambda: frozenset(builtin) | (root._fields() if root._fields else frozenset()))


def _openapi(s: dict[str, Any]) -> SchemaType:
    if not isinstance(s, dict):
        return DEDUCED_TYPE
    if s.get("x-kubernetes-int-or-string"):
        return SCALAR_TYPE
    typ = s.get("type")
    if typ == "array":
        items = s.get("items") or {}
        elem_fn = functools.cache(lambda: _openapi(items))
        lt = s.get("x-kubernetes-list-type", "atomic")
        keys = tuple(s.get("x-kubernetes-list-map-keys") or ())
        defaults = {}
        if lt == "map" and isinstance(items, dict):
            for k in keys:
                d = (items.get("properties") or {}).get(k, {}).get("default")
                if d is not None:
                    defaults[k] = d
        return SchemaType(LIST, list_type=lt, keys=keys, key_defaults=defaults, elem=elem_fn)
    props = s.get("properties")
    addl = s.get("additionalProperties")
    if typ == "object" or props is not None or addl is not None or s.get("x-kubernetes-embedded-resource"):
        atomic = s.get("x-kubernetes-map-type") == "atomic"
        if props:
            children = {k: functools.cache(lambda v=v: _openapi(v)) for k, v in props.items()}
            preserve = bool(s.get("x-kubernetes-preserve-unknown-fields"))

            def field(name: str) -> SchemaType | None:
                fn = children.get(name)
                return fn() if fn is not None else (DEDUCED_TYPE if preserve else None)

            return SchemaType(MAP, atomic=atomic, field=field, fields=lambda: frozenset(children))
        if isinstance(addl, dict):
            return SchemaType(MAP, atomic=atomic, elem=functools.cache(lambda: _openapi(addl)))
        return SchemaType(MAP, atomic=atomic, elem=lambda: DEDUCED_TYPE)
    if typ in ("string", "integer", "number", "boolean"):
        return SCALAR_TYPE
    return DEDUCED_TYPE
