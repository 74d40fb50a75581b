"""`metadata.managedFields`: its encoding, and the field manager every write goes through.

This is kube-apiserver's `fieldmanager` (k8s.io/apimachinery
`pkg/util/managedfields/internal`) in our own words, over `updater.py`:

* **Encoding.**  Each `ManagedFieldsEntry` is `{manager, operation
  (Apply|Update), apiVersion, time (RFC 3339, seconds), fieldsType: FieldsV1,
  fieldsV1, subresource?}`.  Entries are keyed by an *identifier*: the JSON of
  (manager, operation, apiVersion, subresource) — apiVersion left out for
  Apply, so an applier is one entry whatever version it applied at; entries
  with the same identifier are one entry (duplicates a client sends are
  united).  Empty sets are dropped; entries
  are written sorted (operation, time, manager, apiVersion).
* **Update** (every create, update and non-apply patch): ownership of added
  and changed fields moves to the writer; the entry's time moves only when
  the write changed something the writer now owns (a no-op write leaves
  managedFields as they were).  A client may replace managedFields by
  sending them; sending none (or garbage) keeps the live ones.  An object
  that has no managedFields at all (written before tracking) is not
  tracked on update, only from its next apply.
* **Apply** (`application/apply-patch+yaml`): see `updater.apply`.  An
  object with no managedFields first gets an Update entry named
  `before-first-apply` owning everything it has, so the first applier
  conflicts with the object's existing values instead of silently taking them.
* **Client-side apply upgrade.**  For the manager `kubectl` only (as
  kube-apiserver): conflicts on fields that are in the object's
  `kubectl.kubernetes.io/last-applied-configuration` with their last-applied
  value unchanged are not conflicts (the apply is retried with force), and
  when that annotation exists the apply rewrites it to the new configuration,
  so `kubectl apply` and `kubectl apply --server-side` can alternate.
* **Capping.**  More than 10 Update entries: the oldest are merged into
  `ancient-changes` entries, one per apiVersion.
* The object's identity fields (apiVersion, kind, metadata name, namespace,
  uid, resourceVersion, generation, creationTimestamp, selfLink, managedFields)
  are never owned.
* **Conflicts** print as kube-apiserver prints them:
  `Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using apps/v1: .spec.replicas`.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any

from fleet.api import errors
from fleet.api.meta import format_time, parse_time
from fleet.api.ssa import updater
from fleet.api.ssa.fieldpath import FieldPathError, FieldSet, Path, make_path, path_string
from fleet.api.ssa.schema import SchemaType
from fleet.api.ssa.updater import Conflict, Conflicts, ManagedFields, VersionedSet

APPLY, UPDATE = "Apply", "Update"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
BEFORE_FIRST_APPLY = "before-first-apply"
ANCIENT_CHANGES = "ancient-changes"
MAX_UPDATE_MANAGERS = 10
CSA_UPGRADE_MANAGER = "kubectl"  # the only applier whose last-applied annotation is honoured
_LAST_APPLIED_LIMIT = 256 * 1024  # kube's total annotation size limit

# Paths nobody owns (k8s stripMetaManager).
STRIPPED: FieldSet = FieldSet(make_path(*p) for p in (
    ("apiVersion",), ("kind",), ("metadata",), ("metadata", "name"), ("metadata", "namespace"),
    ("metadata", "creationTimestamp"), ("metadata", "selfLink"), ("metadata", "uid"),
    ("metadata", "clusterName"), ("metadata", "generation"), ("metadata", "managedFields"),
    ("metadata", "resourceVersion"),
))


class ManagedFieldsError(ValueError):
    """managedFields that cannot be decoded (kube's wording)."""


# -- identifiers and entries -------------------------------------------------------------------

def manager_identifier(manager: str, operation: str, api_version: str = "", subresource: str = "") -> str:
    """The key kube-apiserver files an entry under (JSON of the entry minus fields and time)."""
    ident: dict[str, str] = {}
    if manager:
        ident["manager"] = manager
    if operation:
        ident["operation"] = operation
    if api_version and operation != APPLY:
        ident["apiVersion"] = api_version
    if subresource:
        ident["subresource"] = subresource
    return json.dumps(ident, separators=(",", ":"), ensure_ascii=False)


def parse_identifier(ident: str) -> dict[str, str]:
    try:
        out = json.loads(ident)
        return out if isinstance(out, dict) else {"manager": ident}
    except json.JSONDecodeError:
        return {"manager": ident}


def print_manager(ident: str) -> str:
    """`"kubectl" with subresource "status" using apps/v1 at 2024-01-01T00:00:00Z` style."""
    e = parse_identifier(ident)
    out = json.dumps(e.get("manager", ""), ensure_ascii=False)
    if e.get("subresource"):
        out += f" with subresource {json.dumps(e['subresource'], ensure_ascii=False)}"
    if e.get("operation") == UPDATE:
        out += f" using {e.get('apiVersion', '')}"
        if e.get("time"):
            out += f" at {e['time']}"
    return out


@dataclass
class Managed:
    """Decoded managedFields: identifier -> set, and identifier -> time (or None)."""

    fields: ManagedFields = field(default_factory=dict)
    times: dict[str, str | None] = field(default_factory=dict)

    def copy(self) -> Managed:
        return Managed(dict(self.fields), dict(self.times))


def decode(entries: Any) -> Managed:
    """managedFields (the list on the object) -> `Managed`; `ManagedFieldsError` if invalid."""
    out = Managed()
    if entries is None:
        return out
    if not isinstance(entries, list):
        raise ManagedFieldsError("managedFields must be a list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ManagedFieldsError(f"managed fields entry {i} must be an object")
        op = e.get("operation")
        if op not in (APPLY, UPDATE):
            raise ManagedFieldsError("operation must be `Apply` or `Update`")
        if not e.get("apiVersion"):
            raise ManagedFieldsError("apiVersion must not be empty")
        ftype = e.get("fieldsType")
        if not ftype:
            raise ManagedFieldsError(f"missing fieldsType in managed fields entry {i}")
        if ftype != "FieldsV1":
            raise ManagedFieldsError(f"invalid fieldsType {json.dumps(ftype)} in managed fields entry {i}")
        ident = manager_identifier(str(e.get("manager", "")), op, str(e["apiVersion"]),
                                   str(e.get("subresource", "")))
        try:
            s = FieldSet.from_fields_v1(e.get("fieldsV1") or {})
        except FieldPathError as err:
            raise ManagedFieldsError(f"error decoding versioned set from entry {i}: error decoding set: {err}") \
                from None
        t = e.get("time")
        if t is not None and parse_time(t) is None:
            raise ManagedFieldsError(f"managed fields entry {i}: invalid time {json.dumps(t)}")
        prev = out.fields.get(ident)
        if prev is not None:
            # Two entries for one identifier (a client wrote them): one entry owning both
            # sets, stamped with the later time.  (kube-apiserver keeps the last one only.)
            s = prev.set.union(s)
            pt = parse_time(out.times.get(ident))
            if pt is not None and (t is None or pt > parse_time(t)):  # type: ignore[operator]
                t = out.times[ident]
        out.fields[ident] = VersionedSet(s, str(e["apiVersion"]), op == APPLY)
        out.times[ident] = t
    return out


def encode(managed: Managed) -> list[dict[str, Any]]:
    """`Managed` -> the managedFields list (sorted like kube-apiserver sorts it)."""
    out: list[dict[str, Any]] = []
    for ident, vs in managed.fields.items():
        if vs.set.empty():
            continue
        e = parse_identifier(ident)
        entry: dict[str, Any] = {"manager": e.get("manager", ""),
                                 "operation": APPLY if vs.applied else e.get("operation", UPDATE),
                                 "apiVersion": vs.api_version}
        t = managed.times.get(ident)
        if t:
            entry["time"] = t
        entry["fieldsType"] = "FieldsV1"
        entry["fieldsV1"] = vs.set.to_fields_v1()
        if e.get("subresource"):
            entry["subresource"] = e["subresource"]
        out.append(entry)

    def order(x: dict[str, Any]) -> tuple[Any, ...]:
        t = parse_time(x.get("time"))
        return (x["operation"], int(t.timestamp()) if t else 0, x["manager"], x["apiVersion"])

    out.sort(key=order)
    return out


def validate(entries: Any, path: str = "metadata.managedFields") -> list[dict[str, str]]:
    """Status causes for managedFields a client sent (kube's ValidateManagedFields wording)."""
    out: list[dict[str, str]] = []
    if not isinstance(entries, list):
        return out
    for i, e in enumerate(entries):
        p = f"{path}[{i}]"
        if not isinstance(e, dict):
            out.append(errors.cause(p, "Invalid value: must be an object"))
            continue
        op = e.get("operation")
        if op not in (APPLY, UPDATE):
            out.append(errors.cause(f"{p}.operation", f"Invalid value: {json.dumps(op)}: must be `Apply` or `Update`"))
        ftype = e.get("fieldsType")
        if ftype and ftype != "FieldsV1":
            out.append(errors.cause(f"{p}.fieldsType", f"Invalid value: {json.dumps(ftype)}: must be `FieldsV1`"))
        manager = e.get("manager", "")
        if isinstance(manager, str):
            if len(manager) > 128:
                out.append(errors.cause(f"{p}.manager", "Too long: may not be more than 128 bytes",
                                        "FieldValueTooLong"))
            bad = next(((j, c) for j, c in enumerate(manager) if not c.isprintable()), None)
            if bad is not None:
                out.append(errors.cause(f"{p}.manager", f"Invalid value: {json.dumps(manager)}: invalid character "
                                        f"U+{ord(bad[1]):04X} (at position {bad[0]})"))
        if len(str(e.get("subresource", ""))) > 256:
            out.append(errors.cause(f"{p}.subresource", "Too long: may not be more than 256 bytes",
                                    "FieldValueTooLong"))
        t = e.get("time")
        if t is not None and parse_time(t) is None:
            out.append(errors.cause(f"{p}.time", f"Invalid value: {json.dumps(t)}: must be an RFC 3339 time"))
        try:
            FieldSet.from_fields_v1(e.get("fieldsV1") or {})
        except FieldPathError as err:
            out.append(errors.cause(f"{p}.fieldsV1", f"Invalid value: {err}"))
    return out


# -- conflicts ---------------------------------------------------------------------------------------

def conflict_message(conflicts: Conflicts) -> str:
    cs = conflicts.conflicts
    if len(cs) == 1:
        return (f"Apply failed with 1 conflict: conflict with {print_manager(cs[0].manager)}: "
                f"{path_string(cs[0].path)}")
    lines: list[str] = []
    by = conflicts.by_manager()
    for m in sorted(by):
        lines.append(f"conflicts with {print_manager(m)}:")
        lines.extend(f"- {path_string(p)}" for p in by[m])
    return f"Apply failed with {len(cs)} conflicts: " + "\n".join(lines)


def conflict_error(conflicts: Conflicts) -> errors.Conflict:
    """The 409 Status kube-apiserver answers (reason Conflict, one FieldManagerConflict cause per path)."""
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {print_manager(c.manager)}",
               "field": path_string(c.path)} for c in conflicts.conflicts]
    err = errors.Conflict(conflict_message(conflicts), causes=causes)
    err.conflicts = conflicts  # type: ignore[attr-defined]  # the (manager, path) pairs, for callers
    return err


# -- the field manager -------------------------------------------------------------------------------

def _gvk_string(api_version: str, kind: str) -> str:
    group, _, version = api_version.rpartition("/")
    return f"{group}/{version}, Kind={kind}"


@dataclass
class FieldManager:
    """Tracks managedFields for one kind at one version (and one subresource, if any).

    `type` is the kind's schema (`schema.for_kind` / `schema.from_openapi`);
    `ignored` are path prefixes the endpoint resets (`.status` on the main
    resource of a kind with a status subresource; everything else on
    `/status`), which nobody can own through this endpoint.
    """

    type: SchemaType
    api_version: str
    kind: str
    subresource: str = ""
    ignored: list[Path] = field(default_factory=list)
    max_update_managers: int = MAX_UPDATE_MANAGERS

    # Update ------------------------------------------------------------------------------------
    def update(self, live: dict[str, Any] | None, new: dict[str, Any], manager: str,
               *, now: _dt.datetime | None = None) -> dict[str, Any]:
        """`new` with its managedFields after `manager` wrote it over `live` (None on create).

        managedFields sent in `new` replace the live ones (not on a subresource);
        `[]` or `[{}]` resets them (the object is then untracked until applied,
        unless this is a create); absent or undecodable ones keep the live ones.
        Never raises for bad managedFields: a write is not refused over them.
        The result shares nested values with `new` (the caller hands `new` over).
        """
        live = live or {}
        managed: Managed | None = None
        sent = _meta(new).get("managedFields")
        if not self.subresource:
            if sent == [] or sent == [{}]:
                managed = Managed()  # kube's reset request: start tracking afresh
            else:
                try:
                    managed = decode(sent)
                except ManagedFieldsError:
                    managed = None
        out = _shallow_without_managed_fields(new)
        if managed is None or (not managed.fields and not (sent == [] or sent == [{}])):
            try:
                managed = decode(_meta(live).get("managedFields"))
            except ManagedFieldsError:
                return out  # undecodable live entries: the write goes through untracked
        if not managed.fields and _meta(live).get("uid"):
            return out  # an object never tracked stays untracked until it is applied
        managed = self._update(_shallow_without_managed_fields(live), out, managed, manager, now)
        return _with_managed_fields(out, managed)

    def _update(self, live: dict[str, Any], new: dict[str, Any], managed: Managed, manager: str,
                now: _dt.datetime | None) -> Managed:
        ident = manager_identifier(manager or "unknown", UPDATE, self.api_version, self.subresource)
        op = "\x00current-operation"
        fields = updater.update(live, new, self.type, managed.fields, op, self.api_version,
                                ignored=self.ignored)
        out = Managed(_strip(fields), dict(managed.times))
        mine = out.fields.pop(op, None)
        if mine is not None:
            prev = out.fields.get(ident)
            s = mine.set.union(prev.set) if prev is not None else mine.set
            out.fields[ident] = VersionedSet(s, self.api_version, False)
            out.times[ident] = format_time(now)
        return self._cap(out)

    def _cap(self, managed: Managed) -> Managed:
        updaters = [m for m, vs in managed.fields.items() if not vs.applied]
        if len(updaters) <= self.max_update_managers:
            return managed

        def age(m: str) -> tuple[int, str]:
            t = parse_time(managed.times.get(m))
            return (int(t.timestamp()) if t else 0, m)

        updaters.sort(key=age)
        first_by_version: dict[str, str] = {}
        length = len(updaters)
        for m in updaters:
            if length <= self.max_update_managers:
                break
            vs = managed.fields[m]
            bucket = manager_identifier(ANCIENT_CHANGES, UPDATE, vs.api_version)
            first = first_by_version.get(vs.api_version)
            if first is None:
                first_by_version[vs.api_version] = m
                continue
            if m == bucket:
                continue  # the bucket is never folded into itself (kube would drop it here)
            if bucket not in managed.fields:
                managed.fields[bucket] = managed.fields.pop(first)
                managed.times.pop(first, None)
            managed.fields[bucket] = VersionedSet(vs.set.union(managed.fields[bucket].set), vs.api_version, False)
            managed.fields.pop(m)
            managed.times[bucket] = managed.times.pop(m, None)
            length -= 1
        return managed

    # Apply -------------------------------------------------------------------------------------
    def apply(self, live: dict[str, Any] | None, config: dict[str, Any], manager: str, *, force: bool = False,
              now: _dt.datetime | None = None) -> dict[str, Any]:
        """The object after `manager` applied `config` over `live` (None: create), with managedFields.

        Raises `errors.BadRequest` for a configuration of the wrong kind or
        carrying managedFields, `errors.Conflict` (kube's apply-conflict Status)
        for conflicts, `ManagedFieldsError` for undecodable live managedFields and
        `typed.SchemaViolation` for a configuration that breaks its list semantics.
        """
        if not isinstance(config, dict):
            raise errors.BadRequest("invalid object type: /, Kind=")
        gvk = (str(config.get("apiVersion", "")), str(config.get("kind", "")))
        if gvk != (self.api_version, self.kind):
            raise errors.BadRequest(f"invalid object type: {_gvk_string(*gvk)}")
        if _meta(config).get("managedFields") is not None:
            raise errors.BadRequest("metadata.managedFields must be nil")
        live = live or {}
        try:
            managed = decode(_meta(live).get("managedFields"))
        except ManagedFieldsError as e:
            raise ManagedFieldsError(f"failed to decode managed fields: {e}") from None
        live_plain = _without_managed_fields(live)
        try:
            obj, managed = self._apply(live_plain, config, managed, manager, force, now)
        except Conflicts as c:
            if manager != CSA_UPGRADE_MANAGER or force:
                raise conflict_error(c) from None
            allowed = self._allowed_by_last_applied(live_plain)
            rest = [x for x in c.conflicts if not allowed.has(x.path)]
            if rest:
                raise conflict_error(Conflicts(rest)) from None
            obj, managed = self._apply(live_plain, config, managed, manager, True, now)
        if manager == CSA_UPGRADE_MANAGER and _annotations(obj).get(LAST_APPLIED):
            _set_last_applied(obj, config)
        return _with_managed_fields(obj, managed)

    def _apply(self, live: dict[str, Any], config: dict[str, Any], managed: Managed, manager: str,
               force: bool, now: _dt.datetime | None) -> tuple[dict[str, Any], Managed]:
        if not managed.fields:
            managed = self._update({}, live, managed, BEFORE_FIRST_APPLY, now)
        ident = manager_identifier(manager or "unknown", APPLY, self.api_version, self.subresource)
        new, fields = updater.apply(live, config, self.type, managed.fields, ident, self.api_version,
                                    force=force, ignored=self.ignored)
        out = Managed(_strip(fields), dict(managed.times))
        if new != live:
            out.times[ident] = format_time(now)
        return new, out

    def _allowed_by_last_applied(self, live: dict[str, Any]) -> FieldSet:
        """Fields of last-applied-configuration still holding their last-applied value."""
        from fleet.api.ssa import typed

        text = _annotations(live).get(LAST_APPLIED)
        if not text:
            return FieldSet()
        try:
            last = json.loads(text)
            if not isinstance(last, dict):
                return FieldSet()
            last_set = typed.to_field_set(last, self.type)
            cmp = typed.compare(last, live, self.type)
        except (ValueError, TypeError):
            return FieldSet()
        return last_set.difference(cmp.modified).difference(cmp.removed)


# -- helpers -------------------------------------------------------------------------------------

def _meta(obj: Any) -> dict[str, Any]:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return md if isinstance(md, dict) else {}


def _annotations(obj: Any) -> dict[str, Any]:
    a = _meta(obj).get("annotations")
    return a if isinstance(a, dict) else {}


def _shallow_without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` minus managedFields, sharing everything but the top level and metadata with it.

    The update path only reads the objects and sets the result's managedFields, so
    a deep copy (a third of a tracked write's cost) buys nothing there; the result
    shares `new`'s nested values, which its caller hands over."""
    out = dict(obj)
    md = out.get("metadata")
    if isinstance(md, dict) and "managedFields" in md:
        out["metadata"] = {k: v for k, v in md.items() if k != "managedFields"}
    elif isinstance(md, dict):
        out["metadata"] = dict(md)
    return out


def _without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    md = out.get("metadata")
    if isinstance(md, dict):
        md.pop("managedFields", None)
    return out


def _with_managed_fields(obj: dict[str, Any], managed: Managed) -> dict[str, Any]:
    entries = encode(managed)
    md = obj.setdefault("metadata", {})
    if entries:
        md["managedFields"] = entries
    else:
        md.pop("managedFields", None)
    return obj


def _strip(fields: ManagedFields) -> ManagedFields:
    out: ManagedFields = {}
    for m, vs in fields.items():
        s = vs.set.difference(STRIPPED)
        if not s.empty():
            out[m] = VersionedSet(s, vs.api_version, vs.applied)
    return out


def _set_last_applied(obj: dict[str, Any], config: dict[str, Any]) -> None:
    cfg = copy.deepcopy(config)
    ann = _meta(cfg).get("annotations")
    if isinstance(ann, dict):
        ann.pop(LAST_APPLIED, None)
        if not ann:
            cfg["metadata"].pop("annotations")
    text = json.dumps(cfg, separators=(",", ":"), sort_keys=True)
    anns = obj.setdefault("metadata", {}).setdefault("annotations", {})
    if len(text) > _LAST_APPLIED_LIMIT:
        anns.pop(LAST_APPLIED, None)
    else:
        anns[LAST_APPLIED] = text


__all__ = [
    "APPLY", "UPDATE", "LAST_APPLIED", "BEFORE_FIRST_APPLY", "ANCIENT_CHANGES", "STRIPPED",
    "Conflict", "Conflicts", "FieldManager", "Managed", "ManagedFieldsError",
    "conflict_error", "conflict_message", "decode", "encode", "manager_identifier", "print_manager", "validate",
]
