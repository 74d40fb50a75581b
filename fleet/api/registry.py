"""The kind registry: one declaration per kind drives REST, discovery, tables and watch.

A `KindInfo` says everything the generic machinery needs to serve a kind:
identity (group/version/kind/plural/...), scope, verbs, subresources, how to
default and validate an object, how to print it as a table, which fields can
be used in a field selector, and where the replica count lives for the scale
subresource.  CRDs (a later issue) add entries at run time through the same
`Registry.register`, so nothing downstream special-cases built-in kinds.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet.api import meta

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

Cause = dict[str, str]
Defaulter = Callable[[dict[str, Any]], None]
Validator = Callable[[dict[str, Any], dict[str, Any] | None], list[Cause]]


@dataclass(frozen=True)
class Column:
    """A table column: `value(obj)` gives the cell; `priority > 0` shows only with -o wide."""

    name: str
    value: Callable[[dict[str, Any]], Any]
    type: str = "string"
    priority: int = 0
    format: str = ""
    description: str = ""

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description or self.name,
            "priority": self.priority,
        }


def path_column(name: str, path: str, *, type: str = "string", priority: int = 0,
                default: Any = "<none>", description: str = "") -> Column:
    """A column that shows the value at a dotted path (or `default` when absent)."""

    def value(obj: dict[str, Any]) -> Any:
        v = meta.get_path(obj, path)
        return default if v is None else v

    return Column(name, value, type=type, priority=priority, description=description or path)


NAME_COLUMN = Column("Name", lambda o: o["metadata"]["name"], format="name",
                     description="Name must be unique within a namespace.")
AGE_COLUMN = Column("Age", meta.age, description="CreationTimestamp is a timestamp representing the server time when this object was created.")


@dataclass(frozen=True)
class ScaleInfo:
    """Where the scale subresource reads and writes replicas."""

    spec_replicas: str = "spec.replicas"
    status_replicas: str = "status.replicas"
    label_selector: str = "spec.selector"  # a LabelSelector dict (or a map for legacy kinds)


@dataclass
class KindInfo:
    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    # Real subresources served for this kind, e.g. ("status", "scale").
    subresources: tuple[str, ...] = ()
    # Extra columns between NAME and AGE (NAME is first and AGE last unless
    # `columns_override` is given).
    columns: tuple[Column, ...] = ()
    columns_override: tuple[Column, ...] | None = None
    default: Defaulter | None = None
    validate: Validator | None = None
    # Field paths accepted by fieldSelector (metadata.name/namespace are always accepted).
    selectable_fields: tuple[str, ...] = ()
    scale: ScaleInfo | None = None
    # Root of the strategic-merge schema; None means "look it up by kind in
    # fleet.api.smp_schema" (built-in kinds), {} means generic (maps merge, lists replace).
    patch_schema: dict[str, Any] | None = None
    # Whether strategic merge patch is allowed (Kubernetes refuses it for custom resources).
    strategic_merge: bool = True
    # Top-level fields whose change does not bump metadata.generation.
    non_spec_fields: tuple[str, ...] = ("metadata", "status")
    # For kinds served at several versions (events.k8s.io/v1 Event vs v1 Event)
    # the storage plural/group the objects live under, if different.
    storage_group: str | None = None
    # Strategy: whether a create keeps the client's `status` (kube-apiserver's
    # nodeStrategy does; every other kind's PrepareForCreate drops it).
    status_on_create: bool = False
    # Strategy: graceful deletion (rest.RESTGracefulDeleteStrategy).  Given the stored
    # object and DeleteOptions.gracePeriodSeconds, the seconds a DELETE leaves it to
    # terminate (> 0 only marks it; its node finishes the job); None: deleted at once.
    delete_grace: Callable[[dict[str, Any], Any], int] | None = None
    # Strategy: kube's PrepareForUpdate — `prepare_update(new, old)` mutates the new
    # object from the stored one after defaulting, before admission and validation
    # (a Service keeps its allocated ClusterIP and NodePorts when the client leaves
    # them out, and drops the fields its new type no longer has).
    prepare_update: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    # Strategy: the status strategy's PrepareForUpdate — `prepare_status_update(new, old)`
    # runs on `/status` writes at the same point (a PersistentVolume restamps
    # status.lastPhaseTransitionTime when its phase changes).
    prepare_status_update: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    # Strategy: kube's PrepareForCreate with the request's user — `prepare_create(obj,
    # user)` runs after defaulting, before admission (a CertificateSigningRequest
    # gets its requester's username, uid, groups and extra stamped into its spec).
    prepare_create: Callable[[dict[str, Any], Any], None] | None = None
    # Strategy: PrepareForUpdate of the `approval` subresource (CSRs): like a status
    # write, the body's status is taken, then `prepare_approval_update(new, old)`
    # keeps what the approver may not change.
    prepare_approval_update: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    # The kind's OpenAPI v3 schema when fleet/api/k8s_schema.json has none (a custom
    # resource's `openAPIV3Schema`): /openapi/v2 publishes it under the kind's own definition.
    openapi_schema: dict[str, Any] | None = None
    # The status every stored object of this kind carries at least: what Go's
    # encoding/json writes for the kind's zero status struct — its fields without
    # `omitempty` and its nested structs (`omitempty` never drops a struct): a
    # Service's `status.loadBalancer: {}`, a StatefulSet's `replicas: 0`.  Clients
    # rely on them (the Python client's models refuse a DaemonSetStatus without
    # `numberReady`).  None: the kind has no status struct, or its defaulter sets it.
    zero_status: dict[str, Any] | None = None
    # Strategy: kube's pruning at decode (custom resources): removes, in place, the fields
    # the kind's schema does not know and returns their paths (`spec.foo`), which
    # fieldValidation turns into warnings (Warn) or a 400 (Strict).  None: the built-in
    # kinds' unknown-field check from k8s_schema.json.
    prune_unknown: Callable[[dict[str, Any]], list[str]] | None = None
    # Objects of a kind served at several versions are stored once: the version they
    # are stored at when it is not this entry's own (a CRD's storage version), and the
    # server converts between the two (fleet/server/crd_conversion.py).  None: stored as served.
    storage_version: str | None = None
    # The list kind when it is not `<Kind>List` (a CRD's `names.listKind`).
    list_kind_name: str | None = None
    # The object that declared this kind at run time (a CRD), for the conversion seam.
    source: dict[str, Any] | None = None
    # Strategy: `await convert(objects, api_version)` gives objects of this kind stored at
    # another version at `api_version` (a CRD's conversion, fleet/server/crd_conversion.py).
    convert: Callable[[list[dict[str, Any]], str], Awaitable[list[dict[str, Any]]]] | None = None

    def fill_zero_status(self, obj: dict[str, Any]) -> None:
        """Give `obj` the fields of `zero_status` it lacks (after defaulting, on every write)."""
        if self.zero_status is None:
            return
        _fill(obj, "status", self.zero_status)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_api_version(self) -> str:
        """The apiVersion objects of this kind are stored at."""
        if self.storage_version is None:
            return self.api_version
        return f"{self.group}/{self.storage_version}" if self.group else self.storage_version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return self.list_kind_name or self.kind + "List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def table_columns(self) -> tuple[Column, ...]:
        if self.columns_override is not None:
            return self.columns_override
        return (NAME_COLUMN, *self.columns, AGE_COLUMN)

    def field_selectable(self, path: str) -> bool:
        return path in ("metadata.name", "metadata.namespace") or path in self.selectable_fields

    def key(self, namespace: str | None, name: str | None = None) -> str:
        """Store key (or prefix when name is None) for objects of this kind."""
        return meta.store_key(self.storage_group if self.storage_group is not None else self.group,
                              self.plural, namespace if self.namespaced else None, name)

    def ssa_type(self) -> Any:
        """The server-side apply type tree of this kind (`fleet.api.ssa.SchemaType`): a
        custom resource's from its `openapi_schema`, a built-in kind's from Fleet's
        schema.  Built once per entry (a CRD's new version is a new entry)."""
        t = self.__dict__.get("_ssa_type")
        if t is None:
            from fleet.api.ssa import schema as ssa_schema

            t = (ssa_schema.from_openapi(self.openapi_schema) if self.openapi_schema is not None
                 else ssa_schema.for_kind(self.group, self.version, self.kind))
            self.__dict__["_ssa_type"] = t
        return t

    def strategic_schema(self) -> dict[str, Any]:
        if self.patch_schema is not None:
            return self.patch_schema
        from fleet.api import smp_schema

        return smp_schema.schema_for(self.kind)


def _fill(parent: dict[str, Any], key: str, zero: dict[str, Any]) -> None:
    """parent[key] given every field of `zero` it lacks, nested structs included."""
    have = parent.get(key)
    if not isinstance(have, dict):
        parent[key] = copy.deepcopy(zero)
        return
    for k, v in zero.items():
        if isinstance(v, dict) and v:
            _fill(have, k, v)
        elif k not in have:
            have[k] = copy.deepcopy(v)


@dataclass
class Registry:
    """All kinds the server knows, indexed the ways clients look them up."""

    _by_gvr: dict[tuple[str, str, str], KindInfo] = field(default_factory=dict)
    _by_gvk: dict[tuple[str, str, str], KindInfo] = field(default_factory=dict)

    def register(self, info: KindInfo) -> None:
        self._by_gvr[(info.group, info.version, info.plural)] = info
        self._by_gvk[(info.group, info.version, info.kind)] = info

    def unregister(self, group: str, version: str, plural: str) -> None:
        info = self._by_gvr.pop((group, version, plural), None)
        if info is not None:
            self._by_gvk.pop((group, version, info.kind), None)

    def get(self, group: str, version: str, plural: str) -> KindInfo | None:
        return self._by_gvr.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> KindInfo | None:
        group, _, version = api_version.rpartition("/")
        return self._by_gvk.get((group, version, kind))

    def kinds_named(self, kind: str) -> list[KindInfo]:
        return [i for i in self._by_gvk.values() if i.kind == kind]

    def resolve(self, name: str) -> KindInfo | None:
        """Resolve what a user typed (`deploy`, `deployments`, `Deployment`,
        `deployments.apps`) to a kind, preferring the core group and the first
        registered version."""
        name_l = name.lower()
        resource, _, group = name_l.partition(".")
        matches: list[KindInfo] = []
        for info in self._by_gvr.values():
            if group and info.group != group and not info.group.startswith(group):
                continue
            if resource in (info.plural, info.singular, info.kind.lower()) or resource in info.short_names:
                matches.append(info)
        if not matches:
            return None
        matches.sort(key=lambda i: (i.group != "", i.group == "events.k8s.io"))
        return matches[0]

    def all(self) -> Iterable[KindInfo]:
        return list(self._by_gvr.values())

    def group_versions(self) -> dict[str, list[str]]:
        """group -> versions, in registration order (first is preferred)."""
        out: dict[str, list[str]] = {}
        for info in self._by_gvr.values():
            versions = out.setdefault(info.group, [])
            if info.version not in versions:
                versions.append(info.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[KindInfo]:
        return [i for i in self._by_gvr.values() if i.group == group and i.version == version]


def default_registry() -> Registry:
    """A registry holding every built-in kind."""
    from fleet.api.kinds import register_builtin

    reg = Registry()
    register_builtin(reg)
    return reg
