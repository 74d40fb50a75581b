"""The writing verbs of the generic REST handlers: create, update, patch (JSON,
merge, strategic merge and apply patches) through one optimistic-concurrency
write loop, and delete / deletecollection with their per-kind strategies
(graceful pods in deletion.py, a namespace's finalization here), and the
namespace's `finalize` subresource through which the namespace controller
(fleet/controllers/namespace.py) hands a namespace it has emptied back.

Kinds with values to allocate (a Service's ClusterIP and NodePorts) get their
`AllocationStrategy` (allocation.py) called around the store write: create and
update allocate after validation and commit or revert with the write; a delete
that removes the object, or an update that removes its last finalizer, releases.
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from fleet.api import errors, meta, patch
from fleet.api.registry import KindInfo
from fleet.auth import Attributes, UserInfo
from fleet.server import crd_conversion, deletion
from fleet.server.allocation import removed_by_update
from fleet.server.apply import ApplyVerbs, refuse_force_on_patch, track_update
from fleet.server.http import Req, Resp
from fleet.server.request_params import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    decode_body,
    decode_request,
    delete_options,
    is_dry_run,
    parse_rv,
    random_suffix,
    warning_headers,
)
from fleet.server.rest_base import PATCH_RETRIES
from fleet.server.rest_subresources import _check_scale_body, to_scale
from fleet.server.routes import Route, conflict, not_found, qualified
from fleet.store import KeyExists, KeyNotFound, RevisionConflict

PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class WriteVerbs(ApplyVerbs):
    """create, update, patch, delete and deletecollection of `ResourceAPI`."""

    # ------------------------------------------------------------------- write
    async def create(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        handler = self.create_subresources.get((info.group, info.plural, route.subresource))
        if handler is not None and route.name is not None:
            return await handler(info, route, req, user)
        if route.name is not None:
            raise errors.MethodNotAllowed(f"POST is not supported on a named {info.kind}")
        strategy = self.create_strategies.get((info.group, info.plural))
        if strategy is not None:
            return await strategy(info, route, req, user)
        decoded = decode_request(req)
        obj = self.check_type(info, decoded.value)
        warnings = self.field_validation(info, obj, req, decoded.duplicates)
        # Types first, as kube-apiserver decodes before anything else: the namespace
        # checks, defaulting and admission read the object as the schema says it is.
        self.type_check(info, obj)
        return await self.create_object(info, route, req, user, obj, warnings)

    async def create_object(self, info: KindInfo, route: Route, req: Req, user: UserInfo, obj: dict[str, Any],
                            warnings: list[str], *, applied: bool = False) -> Resp:
        """The create pipeline from a decoded, type-checked object: a POST's body, or
        what an apply to a missing object produced (`applied`: its managedFields are
        the apply's, not tracked again)."""
        md = obj["metadata"]
        if info.namespaced:
            ns = md.get("namespace") or route.namespace
            if route.namespace and md.get("namespace") and md["namespace"] != route.namespace:
                raise errors.BadRequest("the namespace of the provided object does not match the namespace "
                                        "sent on the request")
            if not ns:
                raise errors.BadRequest("the namespace of the object is required")
            md["namespace"] = ns
            route.namespace = ns
        else:
            md.pop("namespace", None)
        # managedFields a client sends are honoured (kube-apiserver's field manager
        # reads them, then adds the creator's entry after defaulting, below).
        sent_managed = md.get("managedFields")
        for f in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation", "selfLink"):
            md.pop(f, None)
        if not applied:
            md.pop("managedFields", None)
        if not md.get("name") and md.get("generateName"):
            md["name"] = str(md["generateName"]) + random_suffix()
        # Assigned before defaulting: some defaults derive from it (a Job's selector).
        md["uid"] = str(uuid.uuid4())
        if info.has_status and not info.status_on_create:
            obj.pop("status", None)
        if info.default is not None:
            info.default(obj)
        info.fill_zero_status(obj)
        if info.prepare_create is not None:
            info.prepare_create(obj, user)
        if not applied:
            if sent_managed is not None:
                obj["metadata"]["managedFields"] = sent_managed
            obj = track_update(info, "", req, None, obj)
        if info.namespaced:
            await self.check_namespace(route.namespace or "")
        # kube-apiserver's order: mutating admission, then validation of what it
        # produced, then validating admission (see fleet/admission/__init__.py).
        attrs = Attributes("create", info.group, info.version, info.plural, "", route.namespace or "",
                           md.get("name") or "", is_dry_run(req))
        obj = await self.admission.mutate(attrs, user, obj, None)
        md = obj["metadata"]
        self.validate(info, obj, None)
        await self.admission.validate(attrs, user, obj, None)
        allocator = self.allocators.get((info.group, info.plural))
        txn = await allocator.before_create(obj, dry_run=is_dry_run(req)) if allocator is not None else None
        if is_dry_run(req):
            md.setdefault("creationTimestamp", meta.now_rfc3339())
            md.setdefault("generation", 1)
            return Resp.json(201, obj, warning_headers(warnings))
        try:
            stored = await self.store.create(info.key(route.namespace, md["name"]),
                                             await crd_conversion.to_storage(info, obj))
        except BaseException as e:
            if txn is not None:
                await txn.revert()
            if isinstance(e, KeyExists):
                raise errors.AlreadyExists(f'{qualified(info)} "{md["name"]}" already exists', name=md["name"],
                                           group=info.group, kind=info.plural) from None
            raise
        if txn is not None:
            await txn.commit()
        stored = await crd_conversion.one(info, stored)
        return Resp.json(201, stored, warning_headers(warnings))

    async def update(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        assert route.name is not None
        handler = self.update_subresources.get((info.group, info.plural, route.subresource))
        if handler is not None:
            return await handler(info, route, req, user)
        decoded = decode_request(req)
        body = decoded.value
        if route.subresource == "scale":
            scale_body = _check_scale_body(body)
            return await self._write_scale(info, route, req, user, lambda scale: scale_body, put_body=scale_body)
        obj = self.check_type(info, body)
        md = obj["metadata"]
        if md.get("name") and md["name"] != route.name:
            raise errors.BadRequest(f"the name of the object ({md['name']}) does not match the name on "
                                    f"the URL ({route.name})")
        if info.namespaced and md.get("namespace") and md["namespace"] != route.namespace:
            raise errors.BadRequest("the namespace of the provided object does not match the namespace "
                                    "sent on the request")
        warnings = self.field_validation(info, obj, req, decoded.duplicates)
        precondition = parse_rv(md.get("resourceVersion"))
        return await self._write(info, route, req, user, lambda old: copy.deepcopy(obj), precondition,
                                 warnings, verb="update")

    async def patch(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        assert route.name is not None
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == APPLY_PATCH:
            return await self.apply_patch(info, route, req, user)
        if ctype not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH):
            raise errors.UnsupportedMediaType(
                f'the body of the request was in an unknown format - accepted media types include: '
                f'{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}, {APPLY_PATCH}')
        refuse_force_on_patch(req)
        if ctype == STRATEGIC_PATCH and not info.strategic_merge:
            raise errors.UnsupportedMediaType(f"strategic merge patch is not supported for {info.kind}; "
                                              "use a merge or JSON patch")
        body = decode_body(req, allow_patch=True)
        if ctype == JSON_PATCH and not isinstance(body, list):
            raise errors.BadRequest("json patch must be a list of operations")
        if ctype != JSON_PATCH and not isinstance(body, dict):
            raise errors.BadRequest("a merge patch must be a JSON object")

        def apply(doc: dict[str, Any], smp_schema: dict[str, Any]) -> dict[str, Any]:
            if ctype == JSON_PATCH:
                out = patch.json_patch(doc, body)
            elif ctype == MERGE_PATCH:
                out = patch.json_merge_patch(doc, body)
            else:
                out = patch.strategic_merge_patch(doc, body, smp_schema)
            if not isinstance(out, dict):
                raise errors.BadRequest("the patch produced something that is not an object")
            return out

        if route.subresource == "scale":
            return await self._write_scale(info, route, req, user, lambda scale: apply(scale, {}))
        precondition = None
        if isinstance(body, dict):
            precondition = parse_rv((body.get("metadata") or {}).get("resourceVersion")
                                    if isinstance(body.get("metadata"), dict) else None)
        schema_root = info.strategic_schema() if ctype == STRATEGIC_PATCH else {}

        def build(old: dict[str, Any]) -> dict[str, Any]:
            old_rv = old["metadata"].get("resourceVersion")
            new = apply(old, schema_root)
            self.check_type(info, new)
            # A JSON patch that replaces the resourceVersion makes it a precondition, as
            # kube-apiserver's storage does (kubectl's managedFields migration relies on it).
            new_rv = new["metadata"].get("resourceVersion") if isinstance(new["metadata"], dict) else None
            if ctype == JSON_PATCH and new_rv not in (None, "", old_rv):
                parse_rv(new_rv)
                raise conflict(info, route.name or "")
            return new

        return await self._write(info, route, req, user, build, precondition, None, verb="patch",
                                 validate_fields=True)

    async def _write(self, info: KindInfo, route: Route, req: Req, user: UserInfo, build: Any,
                     precondition: int | None, warnings: list[str] | None, *, verb: str,
                     validate_fields: bool = False, track: bool = True) -> Resp:
        """Read-modify-write with optimistic concurrency.  Without a client precondition a
        conflict with a concurrent writer is retried on the fresh object (as kube-apiserver
        does for patches and unconditional updates).  The writer's managedFields entry is
        recorded after defaulting (`track`; an apply's `build` records its own)."""
        assert route.name is not None
        key = info.key(route.namespace, route.name)
        for _attempt in range(PATCH_RETRIES):
            old = await self.get_current(info, route)
            old_rv = int(old["metadata"]["resourceVersion"])
            if precondition is not None and precondition != old_rv:
                raise conflict(info, route.name)
            new = build(copy.deepcopy(old))
            md = new.setdefault("metadata", {})
            if md.get("name") not in (None, route.name):
                raise errors.BadRequest("metadata.name cannot be changed")
            md["name"] = route.name
            if info.namespaced:
                if md.get("namespace") not in (None, route.namespace):
                    raise errors.BadRequest("metadata.namespace cannot be changed")
                md["namespace"] = route.namespace
            if validate_fields:
                warnings = self.field_validation(info, new, req)
            self.type_check(info, new)
            if route.subresource in ("status", "approval"):
                status = new.get("status")
                applied_managed = new["metadata"].get("managedFields")
                new = copy.deepcopy(old)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
                if not track:  # an apply through /status: its managedFields are the answer
                    new["metadata"].pop("managedFields", None)
                    if applied_managed is not None:
                        new["metadata"]["managedFields"] = applied_managed
            elif info.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            # Server-managed metadata is not the client's to change.
            for f in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "generation"):
                if f in old["metadata"]:
                    md_new = new["metadata"]
                    md_new[f] = old["metadata"][f]
                else:
                    new["metadata"].pop(f, None)
            new["metadata"]["resourceVersion"] = str(old_rv)
            if info.default is not None:
                info.default(new)
            info.fill_zero_status(new)
            if info.prepare_update is not None and route.subresource not in ("status", "approval"):
                info.prepare_update(new, old)
            if info.prepare_status_update is not None and route.subresource == "status":
                info.prepare_status_update(new, old)
            if info.prepare_approval_update is not None and route.subresource == "approval":
                info.prepare_approval_update(new, old)
            if track:
                new = track_update(info, route.subresource, req, old, new)
            attrs = Attributes(verb, info.group, info.version, info.plural, route.subresource,
                               route.namespace or "", route.name, is_dry_run(req))
            new = await self.admission.mutate(attrs, user, new, old)
            self.validate(info, new, old)
            await self.admission.validate(attrs, user, new, old)
            allocator = self.allocators.get((info.group, info.plural)) if route.subresource != "status" else None
            txn = await allocator.before_update(old, new, dry_run=is_dry_run(req)) if allocator is not None else None
            if is_dry_run(req):
                return Resp.json(200, new, warning_headers(warnings or []))
            try:
                stored = await self.store.update(key, await crd_conversion.to_storage(info, new),
                                                 expected_revision=old_rv)
            except BaseException as e:
                if txn is not None:
                    await txn.revert()
                if isinstance(e, RevisionConflict):
                    if precondition is not None:
                        raise conflict(info, route.name) from None
                    continue
                if isinstance(e, KeyNotFound):
                    raise not_found(info, route.name) from None
                raise
            if txn is not None:
                await txn.commit()
            if allocator is not None and removed_by_update(stored):
                await allocator.after_delete(stored)
            stored = await crd_conversion.one(info, stored)
            if route.subresource == "scale":
                return Resp.json(200, to_scale(info, stored))
            return Resp.json(200, stored, warning_headers(warnings or []))
        raise conflict(info, route.name, "too many concurrent writers; try again")

    # ------------------------------------------------------------------ delete
    async def delete(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        assert route.name is not None
        opts = delete_options(req)
        dry_run = is_dry_run(req)
        old = await self.get_current(info, route)
        attrs = Attributes("delete", info.group, info.version, info.plural, "", route.namespace or "",
                           route.name, dry_run)
        await self.admission.admit(attrs, user, None, old)
        strategy = self.delete_strategies.get((info.group, info.plural))
        if strategy is not None:
            return await strategy(info, route, old, opts, dry_run=dry_run)
        obj, code = await self.delete_object(info, route, old, opts, dry_run=dry_run)
        return Resp.json(code, obj, warning_headers(deletion.warnings_for(info, opts)))

    async def delete_object(self, info: KindInfo, route: Route, old: dict[str, Any], opts: dict[str, Any],
                            *, dry_run: bool,
                            mark: Any = None) -> tuple[dict[str, Any], int]:
        """Delete `old` (already read, already admitted) per DeleteOptions `opts`;
        returns (object, HTTP code).  Shared by DELETE and the eviction subresource.

        The propagation policy becomes GC finalizers and pods on a node are only
        marked (see fleet/server/deletion.py).  `mark(obj)`, if given, is applied
        in the write that starts the deletion (eviction's DisruptionTarget
        condition).  The code is 200, or 202 when the object stays and the client
        asked for cascading with the legacy `orphanDependents: false` — the one
        case kube-apiserver answers 202."""
        assert route.name is not None
        old = await crd_conversion.to_storage(info, old)
        try:
            obj, removed = await deletion.delete_stored(self.store, info, info.key(route.namespace, route.name),
                                                        opts, current=old, dry_run=dry_run, mark=mark)
        except KeyNotFound:
            raise not_found(info, route.name) from None
        except deletion.PreconditionFailed as e:
            raise conflict(info, route.name, str(e)) from None
        except deletion.TooManyConflicts:
            raise conflict(info, route.name, "too many concurrent writers; try again") from None
        allocator = self.allocators.get((info.group, info.plural))
        if removed and not dry_run and allocator is not None:
            await allocator.after_delete(obj)
        obj = await crd_conversion.one(info, obj)
        return obj, 202 if not removed and opts.get("orphanDependents") is False else 200

    async def _delete_namespace(self, info: KindInfo, route: Route, old: dict[str, Any], opts: dict[str, Any],
                                *, dry_run: bool) -> Resp:
        """Start a namespace's finalization: deletionTimestamp, phase Terminating and
        the GC finalizers the options ask for, in one write; the namespace
        controller (fleet/controllers/namespace.py) then empties it and hands it
        back through `finalize`.  A repeated DELETE only rewrites the GC
        finalizers, as for any object."""
        assert route.name is not None
        if route.name in PROTECTED_NAMESPACES:
            raise errors.Forbidden(f'namespaces "{route.name}" is forbidden: this namespace may not be deleted',
                                   name=route.name, kind="namespaces")
        pre = opts.get("preconditions") or {}
        expected_rv = parse_rv(pre.get("resourceVersion"))
        if pre.get("uid") and old["metadata"].get("uid") != pre["uid"]:
            raise conflict(info, route.name, "the UID precondition did not match")
        if expected_rv is not None and int(old["metadata"]["resourceVersion"]) != expected_rv:
            raise conflict(info, route.name)
        code = 202 if opts.get("orphanDependents") is False else 200
        old_fins = list(old["metadata"].get("finalizers") or [])
        fins = deletion.gc_finalizers(info, old_fins, opts)
        if old["metadata"].get("deletionTimestamp") and fins is old_fins:
            return Resp.json(code, old)
        new = copy.deepcopy(old)
        if fins:
            new["metadata"]["finalizers"] = fins
        else:
            new["metadata"].pop("finalizers", None)
        if not old["metadata"].get("deletionTimestamp"):
            new["metadata"]["deletionTimestamp"] = meta.now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
        new.setdefault("status", {})["phase"] = "Terminating"
        if dry_run:
            return Resp.json(200, new)
        try:
            stored = await self.store.update(info.key(None, route.name), new,
                                             expected_revision=int(old["metadata"]["resourceVersion"]))
        except RevisionConflict:
            raise conflict(info, route.name) from None
        except KeyNotFound:
            raise not_found(info, route.name) from None
        return Resp.json(code, stored)

    async def _finalize_namespace(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        """PUT namespaces/{name}/finalize: kube-apiserver's FinalizeREST.

        Only `spec.finalizers` is taken from the body (everything else stays as
        stored; the body's resourceVersion, if any, is a precondition).  As
        kube-apiserver's ShouldDeleteNamespaceDuringUpdate: a namespace being
        deleted whose update leaves it with neither spec nor metadata finalizers
        is removed — the namespace controller's last finalize ends the namespace;
        with metadata finalizers left (`foregroundDeletion`) their owner's final
        update does (the store's rule for removing a last finalizer)."""
        assert route.name is not None
        obj = self.check_type(info, decode_request(req).value)
        md = obj["metadata"]
        if md.get("name") and md["name"] != route.name:
            raise errors.BadRequest(f"the name of the object ({md['name']}) does not match the name on "
                                    f"the URL ({route.name})")
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        finalizers = spec.get("finalizers")
        if finalizers is not None and not (isinstance(finalizers, list)
                                           and all(isinstance(f, str) for f in finalizers)):
            raise errors.BadRequest("spec.finalizers must be a list of strings")

        def build(old: dict[str, Any]) -> dict[str, Any]:
            old.setdefault("spec", {})["finalizers"] = list(finalizers or [])
            return old

        resp = await self._write(info, route, req, user, build, parse_rv(md.get("resourceVersion")), None,
                                 verb="update")
        if is_dry_run(req):
            return resp
        stored = json.loads(resp.body)  # type: ignore[arg-type]
        smd = stored["metadata"]
        if smd.get("deletionTimestamp") and not smd.get("finalizers") and \
                not (stored.get("spec") or {}).get("finalizers"):
            try:
                stored, _ = await self.store.delete(info.key(None, route.name), expected_uid=smd.get("uid"),
                                                    expected_revision=int(smd["resourceVersion"]))
            except (KeyNotFound, RevisionConflict):
                # Gone already, or written since: that writer's namespace is the
                # current one, and the controller finalizes again on its event.
                pass
        return Resp.json(200, stored)

    async def delete_collection(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        ls, fs = self.selectors(info, req)
        res = await self.store.list(info.key(route.namespace))
        deleted = []
        for o in res.items:
            if not (ls.matches(o["metadata"].get("labels")) and fs.matches(o)):
                continue
            r = Route(route.group, route.version, route.plural, o["metadata"].get("namespace"),
                      o["metadata"]["name"])
            try:
                # The body is the collection's DeleteOptions (propagationPolicy...), for every item.
                resp = await self.delete(info, r, Req("DELETE", req.path, dict(req.query), req.headers, req.body),
                                         user)
            except errors.NotFound:
                continue
            deleted.append(json.loads(resp.body))  # type: ignore[arg-type]
        return Resp.json(200, {"kind": info.list_kind, "apiVersion": info.api_version,
                               "metadata": {"resourceVersion": str(self.store.current_revision())},
                               "items": deleted})
