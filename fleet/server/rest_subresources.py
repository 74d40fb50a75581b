"""The subresources of the generic REST handlers: pods/binding (the scheduler's
bind, also POSTed to the `bindings` collection), pods/eviction (with the disruption-budget seam of eviction.py), and
scale (the autoscaling/v1 Scale view of any kind with a `ScaleInfo`).
status is the generic write of rest_write.py on the status fields.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from fleet.api import errors, meta, selectors, typecheck
from fleet.api.registry import KindInfo
from fleet.auth import Attributes, UserInfo
from fleet.server import eviction
from fleet.server.http import Req, Resp
from fleet.server.paths import check_name
from fleet.server.request_params import check_delete_options, decode_body, is_dry_run, parse_rv
from fleet.server.rest_base import PATCH_RETRIES, ResourceBase
from fleet.server.routes import Route, conflict, not_found
from fleet.store import KeyNotFound, RevisionConflict


class SubresourceVerbs(ResourceBase):
    """binding, eviction and scale of `ResourceAPI`."""

    async def _create_binding(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        """POST bindings: the Binding names its pod; then exactly pods/{name}/binding."""
        body = decode_body(req)
        md = body.get("metadata") if isinstance(body, dict) and isinstance(body.get("metadata"), dict) else {}
        name = md.get("name")
        if not name or not isinstance(name, str):
            raise errors.Invalid.for_object("Binding", "", "", [
                errors.cause("metadata.name", "Required value: name or generateName is required",
                             "FieldValueRequired")])
        check_name(name)
        pods = self.registry.get("", "v1", "pods")
        assert pods is not None
        return await self.bind(pods, replace(route, plural="pods", name=name, subresource="binding"), req, user)

    async def bind(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        """POST pods/{name}/binding: assign an unbound pod to a node (what the scheduler calls).

        As kube-apiserver's BindingREST: the Binding's name must be the pod's;
        a pod that already has a node, or is being deleted, is a 409; otherwise
        spec.nodeName, the Binding's annotations and PodScheduled=True are
        written in one update, and the answer is a Status Success (201).
        """
        assert route.name is not None
        body = decode_body(req)
        if not isinstance(body, dict) or body.get("kind") != "Binding" or body.get("apiVersion") != "v1":
            raise errors.BadRequest("the body must be a v1 Binding")
        md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if md.get("name", route.name) != route.name or md.get("namespace", route.namespace) != route.namespace:
            raise errors.BadRequest("name in URL does not match name in Binding object")
        target = body.get("target") if isinstance(body.get("target"), dict) else {}
        node = target.get("name")
        if not node or not isinstance(node, str):
            raise errors.Invalid.for_object("Binding", "", route.name, [
                errors.cause("target.name", "Required value", "FieldValueRequired")])
        if target.get("kind", "Node") != "Node":
            raise errors.Invalid.for_object("Binding", "", route.name, [
                errors.cause("target.kind", f'Unsupported value: "{target.get("kind")}": supported values: "Node"',
                             "FieldValueNotSupported")])
        attrs = Attributes("create", info.group, info.version, info.plural, "binding", route.namespace or "",
                           route.name, is_dry_run(req))
        await self.admission.admit(attrs, user, body, None)
        key = info.key(route.namespace, route.name)
        for _attempt in range(PATCH_RETRIES):
            old = await self.get_current(info, route)
            pod = copy.deepcopy(old)
            why = ""
            if pod["metadata"].get("deletionTimestamp"):
                why = f"pod {route.name} is being deleted, cannot be assigned to a host"
            elif (pod.get("spec") or {}).get("nodeName"):
                why = f'pod {route.name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            if md.get("uid") and md["uid"] != pod["metadata"].get("uid"):
                why = f"the UID in the Binding ({md['uid']}) does not match the pod's"
            if why:
                raise errors.Conflict(f'Operation cannot be fulfilled on pods/binding "{route.name}": {why}',
                                      name=route.name, kind="pods/binding")
            pod.setdefault("spec", {})["nodeName"] = node
            if isinstance(md.get("annotations"), dict) and md["annotations"]:
                pod["metadata"].setdefault("annotations", {}).update(md["annotations"])
            conditions = [c for c in pod.setdefault("status", {}).get("conditions") or []
                          if isinstance(c, dict) and c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                               "lastTransitionTime": meta.now_rfc3339()})
            pod["status"]["conditions"] = conditions
            # As create, not update: binding is the one writer allowed to set spec.nodeName.
            self.validate(info, pod, None)
            if is_dry_run(req):
                break
            try:
                await self.store.update(key, pod, expected_revision=int(old["metadata"]["resourceVersion"]))
            except RevisionConflict:
                continue  # a concurrent status write; re-check against the fresh pod
            except KeyNotFound:
                raise not_found(info, route.name) from None
            break
        else:
            raise conflict(info, route.name, "too many concurrent writers; try again")
        return Resp.json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "code": 201})

    async def evict(self, info: KindInfo, route: Route, req: Req, user: UserInfo) -> Resp:
        """POST pods/{name}/eviction: check the Eviction, admit it, evict (see evict_pod).

        Answers a Status Success (201) as kube-apiserver does; 429 when a
        disruption budget forbids it, 404 when the pod does not exist.
        """
        assert route.name is not None
        body = decode_body(req)
        if not isinstance(body, dict):
            raise errors.BadRequest("the body must be a policy/v1 Eviction")
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if (api_version, kind) != (None, None) and (
                kind != "Eviction" or api_version not in eviction.EVICTION_API_VERSIONS):
            raise errors.BadRequest(f"the body must be a policy/v1 Eviction (got {kind} in {api_version})")
        md = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if md.get("name") != route.name:
            raise errors.BadRequest("name in URL does not match name in Eviction object")
        if md.get("namespace") not in (None, "", route.namespace):
            raise errors.BadRequest("the namespace of the provided object does not match the namespace "
                                    "sent on the request")
        opts = body.get("deleteOptions")
        if opts is None:
            opts = {}
        if not isinstance(opts, dict):
            raise errors.BadRequest("deleteOptions must be an object")
        opts = check_delete_options(dict(opts))
        # propagateDryRun: the request's dryRun and the Eviction's must agree.
        query_dry = ["All"] if is_dry_run(req) else []
        body_dry = opts.get("dryRun") or []
        if query_dry and body_dry and query_dry != body_dry:
            raise errors.BadRequest(f"DryRun in DeleteOptions ({body_dry}) and CreateOptions ({query_dry}) "
                                    "do not match")
        dry_run = bool(query_dry or body_dry)
        attrs = Attributes("create", info.group, info.version, info.plural, "eviction", route.namespace or "",
                           route.name, dry_run)
        await self.admission.admit(attrs, user, body, None)
        await self.evict_pod(route.namespace or "", route.name, opts, dry_run=dry_run)
        return Resp.json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "code": 201})

    async def evict_pod(self, namespace: str, name: str, opts: dict[str, Any], *, dry_run: bool = False) -> None:
        """Evict one pod: EvictionREST.Create without the HTTP.  Used by the eviction
        subresource and by Fleet's server-side drain.

        A pod that is finished, pending or already terminating is deleted right
        away; any other must first pass its disruption budget
        (`self.budgets.admit_eviction`, 429 when it would break the budget).  The
        pod then gets the DisruptionTarget condition and is deleted per `opts`
        (gracefully for a pod on a node).  Conflicts with concurrent writers are
        retried unless the caller pinned a resourceVersion.
        """
        info = self.registry.get("", "v1", "pods")
        assert info is not None
        route = Route("", "v1", "pods", namespace, name)
        pinned = parse_rv((opts.get("preconditions") or {}).get("resourceVersion")) is not None
        admitted = False  # a budget is used up once, however often the delete is retried
        for _attempt in range(PATCH_RETRIES):
            pod = await self.get_current(info, route)
            if not admitted and not eviction.can_ignore_budgets(pod):
                await self.budgets.admit_eviction(pod, dry_run=dry_run)
                admitted = True
            try:
                await self.delete_object(info, route, pod, opts, dry_run=dry_run,
                                         mark=eviction.add_disruption_target)
            except errors.Conflict:
                if pinned:
                    raise
                continue
            return
        raise conflict(info, name, "too many concurrent writers; try again")

    async def _write_scale(self, info: KindInfo, route: Route, req: Req, user: UserInfo, change: Any, *,
                           put_body: dict[str, Any] | None = None) -> Resp:
        scale_info = info.scale
        assert scale_info is not None and route.name is not None
        holder: dict[str, Any] = {}

        def build(old: dict[str, Any]) -> dict[str, Any]:
            new_scale = change(to_scale(info, old))
            holder["scale"] = new_scale
            spec = new_scale.get("spec")
            if spec is not None and not isinstance(spec, dict):
                raise errors.Invalid.for_object("Scale", "autoscaling", route.name or "", [
                    typecheck.type_invalid("spec", spec, "object")])
            replicas = (spec or {}).get("replicas")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise errors.Invalid.for_object("Scale", "autoscaling", route.name or "", [
                    errors.cause("spec.replicas", f"Invalid value: {json.dumps(replicas)}: must be greater "
                                 "than or equal to 0")])
            meta.set_path(old, scale_info.spec_replicas, replicas)
            return old

        # The Scale's own resourceVersion is a precondition when the client sent one.
        precondition = None
        if put_body is not None:  # the body of a PUT, decoded once by `update`
            md = put_body.get("metadata")
            if md is not None and not isinstance(md, dict):
                raise errors.BadRequest("metadata must be an object")
            precondition = parse_rv((md or {}).get("resourceVersion"))
        sub_route = Route(route.group, route.version, route.plural, route.namespace, route.name, "scale")
        return await self._write(info, sub_route, req, user, build, precondition, None, verb="update")


def to_scale(info: KindInfo, obj: dict[str, Any]) -> dict[str, Any]:
    s = info.scale
    assert s is not None
    md = obj["metadata"]
    sel = meta.get_path(obj, s.label_selector)
    if isinstance(sel, dict) and ("matchLabels" in sel or "matchExpressions" in sel):
        sel_s = selectors.label_selector_to_string(sel)
    elif isinstance(sel, dict):
        sel_s = ",".join(f"{k}={v}" for k, v in sorted(sel.items()))
    elif isinstance(sel, str):
        sel_s = sel  # a custom resource's labelSelectorPath names a serialized selector
    else:
        sel_s = ""
    scale_md = {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in md}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": scale_md,
        "spec": {"replicas": meta.get_path(obj, s.spec_replicas, 0)},
        "status": {"replicas": meta.get_path(obj, s.status_replicas, 0) or 0, "selector": sel_s},
    }


def _check_scale_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("kind", "Scale") != "Scale":
        raise errors.BadRequest("the body must be an autoscaling/v1 Scale")
    return body
