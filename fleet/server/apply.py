"""Server-side apply and managedFields in the generic REST handlers.

The field-ownership logic is the pure library `fleet.api.ssa`; this module is
the seam between it and a request, as kube-apiserver's handlers are around its
`FieldManager`:

* **Who writes.**  `manager_for(req)`: the `fieldManager` query parameter, or
  else the User-Agent up to its first `/` (printable characters, at most 128
  bytes) — kube-apiserver's `managerOrUserAgent`.  kubectl names itself
  (`kubectl-client-side-apply`, `kubectl-edit`, `kubectl-create`...); Fleet's
  controllers are `fleet-controller-manager`, agents `fleet-agent`.
* **Update tracking.**  `track_update(...)` on every create, update, non-apply
  patch and subresource write (rest_write.py calls it after defaulting, before
  admission): the writer gets an `Update` entry for what it added or changed.
* **Which fields an endpoint can own** (kube's reset fields): the main
  resource of a kind with a status subresource cannot own `.status`; `/status`
  (and a CSR's `/approval`) can own nothing but `.status`.  Entries written
  through a subresource record it (`subresource: status`, `scale`).
* **Apply** (`PATCH` with `application/apply-patch+yaml`, YAML or JSON body):
  `ApplyVerbs.apply_patch` — PatchOptions checked as kube-apiserver checks
  them (`fieldManager` required, `force` only for apply), the configuration
  applied over the live object through the ordinary write loop (`_write`:
  defaulting, admission, validation, optimistic concurrency, dryRun), or, when
  the object does not exist, as a create (apply creates; 201).  Conflicts are
  kube's 409 (`FieldManagerConflict` causes) unless `force=true`.  An apply to
  `/scale` is an `autoscaling/v1` Scale whose `spec.replicas` is applied to
  the parent's replicas field under the subresource `scale`.

The kubectl client-side-apply upgrade path (`last-applied-configuration`) and
`before-first-apply` are the library's (`FieldManager.apply`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleet.api import decode, errors
from fleet.api.registry import KindInfo
from fleet.api.ssa import FieldManager, ManagedFieldsError, SchemaViolation, make_path
from fleet.api.ssa.fieldpath import Path
from fleet.auth import UserInfo
from fleet.server.http import Req, Resp
from fleet.server.request_params import MAX_BODY, check_field_manager, parse_rv
from fleet.server.rest_base import PATCH_RETRIES, ResourceBase
from fleet.server.routes import Route

FIELD_MANAGER_MAX_LENGTH = 128  # kube's validation.FieldManagerMaxLength
SCALE_API_VERSION, SCALE_KIND = "autoscaling/v1", "Scale"
_STATUS_LIKE = ("status", "approval")
_NEVER_IGNORED = frozenset({"status", "apiVersion", "kind"})


# -- who writes ------------------------------------------------------------------------------------

def prefix_from_user_agent(user_agent: str) -> str:
    """kube-apiserver's prefixFromUserAgent: up to the first `/`, printable, ≤ 128 bytes."""
    out: list[str] = []
    size = 0
    for ch in user_agent.split("/", 1)[0]:
        if not ch.isprintable():
            continue
        n = len(ch.encode())
        if size + n > FIELD_MANAGER_MAX_LENGTH:
            break
        out.append(ch)
        size += n
    return "".join(out)


def manager_for(req: Req) -> str:
    """The field manager of a write: `fieldManager`, else the User-Agent's prefix."""
    return req.query.get("fieldManager") or prefix_from_user_agent(req.headers.get("user-agent", ""))


# -- which fields an endpoint owns -----------------------------------------------------------------

def ignored_paths(info: KindInfo, subresource: str, *objs: dict[str, Any] | None) -> list[Path]:
    """Kube's reset fields of an endpoint, as path prefixes nobody can own through it.

    For a status-like subresource, everything but `.status`: the top-level
    fields of the objects at hand (the REST layer keeps all of them from the
    stored object on such a write) plus `metadata` and `spec`."""
    if subresource in _STATUS_LIKE:
        names = {"metadata", "spec"}
        for o in objs:
            if isinstance(o, dict):
                names.update(o)
        return [make_path(n) for n in sorted(names - _NEVER_IGNORED)]
    if info.has_status:
        return [make_path("status")]
    return []


def field_manager(info: KindInfo, subresource: str, *objs: dict[str, Any] | None) -> FieldManager:
    return FieldManager(info.ssa_type(), info.api_version, info.kind, subresource=subresource,
                        ignored=ignored_paths(info, subresource, *objs))


def track_update(info: KindInfo, subresource: str, req: Req, old: dict[str, Any] | None,
                 new: dict[str, Any]) -> dict[str, Any]:
    """`new` with managedFields after the request's manager wrote it over `old` (None: create).

    Never fails a write: bad managedFields the client sent were refused by
    validation already, and undecodable stored ones leave the write untracked."""
    fm = field_manager(info, subresource, old, new)
    try:
        return fm.update(old, new, manager_for(req))
    except SchemaViolation:
        # A live list with a duplicate key the schema forbids: Kubernetes logs
        # and writes on untracked; so does Fleet.
        return new


# -- apply -----------------------------------------------------------------------------------------

def apply_options(req: Req) -> bool:
    """PatchOptions of an apply patch, checked as kube's ValidatePatchOptions: the force flag."""
    causes: list[dict[str, str]] = []
    if not req.query.get("fieldManager"):
        # kubectl defaults it to "kubectl"; controllers must set it.
        causes.append(errors.cause("fieldManager", "Required value: is required for apply patch",
                                   "FieldValueRequired"))
    force = req.query.get("force")
    if force not in (None, "", "true", "false", "True", "False", "1", "0", "t", "f", "T", "F", "TRUE", "FALSE"):
        raise errors.BadRequest(f'force: invalid value "{force}": must be a boolean')
    if causes:
        raise errors.Invalid.for_object("PatchOptions", "meta.k8s.io", "", causes)
    check_field_manager(req)
    return force in ("true", "True", "1", "t", "T", "TRUE")


def refuse_force_on_patch(req: Req) -> None:
    """`force` is an apply option: kube answers 422 for it on any other patch."""
    if "force" in req.query:
        raise errors.Invalid.for_object("PatchOptions", "meta.k8s.io", "", [errors.cause(
            "force", "Forbidden: may not be specified for non-apply patch", "FieldValueForbidden")])


def decode_apply_body(req: Req) -> dict[str, Any]:
    """The applied configuration (YAML, hence also JSON), or kube's 400."""
    if len(req.body) > MAX_BODY:
        raise errors.RequestEntityTooLarge("the request body is too large (limit 3145728 bytes)")
    try:
        value = decode.decode_yaml(req.body, max_bytes=MAX_BODY).value
    except decode.TooLarge as e:
        raise errors.RequestEntityTooLarge(str(e)) from None
    except decode.DecodeError as e:
        raise errors.BadRequest(f"error decoding YAML: {e}") from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise errors.BadRequest("error decoding YAML: the applied configuration must be an object, not "
                                + type(value).__name__)
    md = value.get("metadata", {})
    if md is None:
        value.pop("metadata")  # `metadata: null` sets nothing
    elif not isinstance(md, dict):
        raise errors.BadRequest("error decoding YAML: metadata must be an object")
    return value


def check_name(obj: dict[str, Any], route: Route) -> None:
    """kube-apiserver's checkName on the object an apply produced."""
    md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = md.get("name") or ""
    if name != route.name:
        raise errors.BadRequest(f"the name of the object ({name}) does not match the name on the URL "
                                f"({route.name})")
    ns = md.get("namespace") or ""
    if route.namespace and ns and ns != route.namespace:
        raise errors.BadRequest(f"the namespace of the object ({ns}) does not match the namespace on the "
                                f"URL ({route.namespace})")


def scale_to_parent_config(info: KindInfo, route: Route, config: dict[str, Any]) -> dict[str, Any]:
    """An applied Scale as an applied configuration of its parent: only the replicas.

    (kube-apiserver converts managedFields between the two; the entry's
    subresource is `scale` either way.)"""
    got = (str(config.get("apiVersion", "")), str(config.get("kind", "")))
    if got != (SCALE_API_VERSION, SCALE_KIND):
        group, _, version = got[0].rpartition("/")
        raise errors.BadRequest(f"invalid object type: {group}/{version}, Kind={got[1]}")
    md = config.get("metadata") or {}
    if md.get("managedFields") is not None:
        raise errors.BadRequest("metadata.managedFields must be nil")
    out: dict[str, Any] = {"apiVersion": info.api_version, "kind": info.kind,
                           "metadata": {"name": md.get("name") or route.name}}
    spec = config.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise errors.BadRequest("error decoding YAML: spec must be an object")
    if spec and "replicas" in spec:
        assert info.scale is not None
        node = out
        parts = info.scale.spec_replicas.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = spec["replicas"]
    return out


def _apply(fm: FieldManager, live: dict[str, Any] | None, config: dict[str, Any], manager: str,
           force: bool) -> dict[str, Any]:
    try:
        return fm.apply(live, config, manager, force=force)
    except ManagedFieldsError as e:
        raise errors.InternalError(str(e)) from None
    except SchemaViolation as e:
        raise errors.Invalid.for_object(fm.kind, fm.api_version.rpartition("/")[0],
                                        str(((config.get("metadata") or {}).get("name")) or ""),
                                        [errors.cause("", f"failed to create typed patch object: {e}")]) from None


class ApplyVerbs(ResourceBase):
    """The apply patch of `ResourceAPI` (over the write loop and create of rest_write.py)."""

    if TYPE_CHECKING:
        async def _write(self, info: KindInfo, route: Route, req: Req, user: UserInfo, build: Any,
                         precondition: int | None, warnings: list[str] | None, *, verb: str,
                         validate_fields: bool = False, track: bool = True) -> Resp: ...

        async def create_object(self, info: KindInfo, route: Route, req: Req, user: UserInfo,
                                obj: dict[str, Any], warnings: list[str], *,
                                applied: bool = False) -> Resp: ...

    async def apply_patch(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        assert route.name is not None
        force = apply_options(req)
        manager = req.query["fieldManager"]
        config = decode_apply_body(req)
        subresource = route.subresource
        if subresource == "scale":
            config = scale_to_parent_config(info, route, config)
        precondition = parse_rv((config.get("metadata") or {}).get("resourceVersion"))

        def build(old: dict[str, Any]) -> dict[str, Any]:
            new = _apply(field_manager(info, subresource, old, config), old, config, manager, force)
            check_name(new, route)
            return new

        for _attempt in range(PATCH_RETRIES):
            if subresource or await self._exists(info, route):
                # The write loop resets what this endpoint may not change (status on the
                # main resource, all but status on /status), then admits and stores.
                sub_route = Route(route.group, route.version, route.plural, route.namespace, route.name,
                                  subresource)
                return await self._write(info, sub_route, req, user, build, precondition, None, verb="patch",
                                         validate_fields=True, track=False)
            if self.authorize_create is not None:
                self.authorize_create(user, route, info)
            obj = _apply(field_manager(info, "", None, config), None, config, manager, force)
            check_name(obj, route)
            self.type_check(info, obj)  # before defaulting, as for a POST
            try:
                return await self.create_object(info, route, req, user, obj,
                                                self.field_validation(info, obj, req), applied=True)
            except errors.AlreadyExists:
                continue  # created meanwhile: apply over it
        raise errors.Conflict(f'Operation cannot be fulfilled on {info.plural} "{route.name}": '
                              "too many concurrent writers; try again")

    async def _exists(self, info: KindInfo, route: Route) -> bool:
        try:
            await self.get_current(info, route)
        except errors.NotFound:
            return False
        return True


__all__ = ["ApplyVerbs", "apply_options", "check_name", "decode_apply_body", "field_manager", "ignored_paths",
           "manager_for", "prefix_from_user_agent", "refuse_force_on_patch", "scale_to_parent_config",
           "track_update"]
