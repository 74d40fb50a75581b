"""`autoscaling/v1` HorizontalPodAutoscaler: the v2 objects, served in the older shape.

kube-apiserver stores one HorizontalPodAutoscaler and serves it at both
versions, converting on the way in and out.  `kubectl autoscale` (1.32)
still creates autoscaling/v1 objects, so Fleet does the same for this one
kind: objects are stored as autoscaling/v2 (what the controller reads) and
this module converts each v1 request and response around the generic REST
handlers, which only ever see v2.

    v1 spec.targetCPUUtilizationPercentage  <->  v2 metrics: [Resource cpu Utilization]
    v1 status.currentCPUUtilizationPercentage <-> v2 currentMetrics (Resource cpu)

What v1 cannot express (other metrics, behavior) travels in annotations on
the v1 form, so a v1 read-modify-write keeps it, as Kubernetes does with its
`autoscaling.alpha.kubernetes.io/*` annotations (Fleet's carry the v2 shapes
as they are, under its own names).  Patches in v1 are applied to the v1 form
of the current object and written back as an update with its
resourceVersion, retried on a conflict; watches convert each event.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from fleet.api import errors, patch
from fleet.api.registry import Registry
from fleet.auth import UserInfo
from fleet.server.http import Req, Resp, dumps
from fleet.server.request_params import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, decode_body
from fleet.server.rest import ResourceAPI
from fleet.server.routes import Route
from fleet.server.tables import wants_table
from fleet.server.watch import WatchCounter, watch

GROUP, PLURAL, KIND = "autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler"
V1, V2 = f"{GROUP}/v1", f"{GROUP}/v2"
METRICS_ANNOTATION = "autoscaling.fleet.dev/v2-metrics"
BEHAVIOR_ANNOTATION = "autoscaling.fleet.dev/v2-behavior"
PATCH_RETRIES = 5


def is_v1(route: Route) -> bool:
    return (route.group, route.version, route.plural) == (GROUP, "v1", PLURAL)


def _is_cpu_utilization(m: Any) -> bool:
    res = m.get("resource") if isinstance(m, dict) else None
    return isinstance(m, dict) and m.get("type") == "Resource" and isinstance(res, dict) and \
        res.get("name") == "cpu" and (res.get("target") or {}).get("type") == "Utilization"


def to_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored (v2) HorizontalPodAutoscaler in its autoscaling/v1 form."""
    if obj.get("kind") != KIND:
        return obj
    out = copy.deepcopy(obj)
    out["apiVersion"] = V1
    spec = out.get("spec") if isinstance(out.get("spec"), dict) else {}
    metrics = spec.pop("metrics", None) or []
    behavior = spec.pop("behavior", None)
    cpu = next((m for m in metrics if _is_cpu_utilization(m)), None)
    if cpu is not None:
        spec["targetCPUUtilizationPercentage"] = cpu["resource"]["target"].get(
            "averageUtilization")
    others = [m for m in metrics if m is not cpu]
    ann = dict(out.setdefault("metadata", {}).get("annotations") or {})
    if others:
        ann[METRICS_ANNOTATION] = json.dumps(others, separators=(",", ":"))
    if behavior is not None:
        ann[BEHAVIOR_ANNOTATION] = json.dumps(behavior, separators=(",", ":"))
    if ann:
        out["metadata"]["annotations"] = ann
    status = out.get("status")
    if isinstance(status, dict):
        v1_status = {k: status[k] for k in ("observedGeneration", "lastScaleTime",
                                            "currentReplicas", "desiredReplicas") if k in status}
        v1_status.setdefault("currentReplicas", 0)
        v1_status.setdefault("desiredReplicas", 0)
        for m in status.get("currentMetrics") or []:
            res = m.get("resource") if isinstance(m, dict) else None
            if m.get("type") == "Resource" and isinstance(res, dict) and res.get("name") == "cpu":
                util = (res.get("current") or {}).get("averageUtilization")
                if util is not None:
                    v1_status["currentCPUUtilizationPercentage"] = util
        out["status"] = v1_status
    return out


def to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    """An autoscaling/v1 HorizontalPodAutoscaler as Fleet stores it (v2)."""
    if not isinstance(obj, dict):
        raise errors.BadRequest("the body must be a JSON object")
    out = copy.deepcopy(obj)
    out["apiVersion"] = V2
    md = out.get("metadata") if isinstance(out.get("metadata"), dict) else None
    ann = dict((md or {}).get("annotations") or {})
    spec = out.get("spec")
    if isinstance(spec, dict):
        metrics: list[Any] = []
        target = spec.pop("targetCPUUtilizationPercentage", None)
        if target is not None:
            metrics.append({"type": "Resource", "resource": {"name": "cpu", "target": {
                "type": "Utilization", "averageUtilization": target}}})
        metrics += [m for m in _annotation(ann, METRICS_ANNOTATION, list) or []
                    if not _is_cpu_utilization(m) or target is None]
        if metrics:
            spec["metrics"] = metrics
        behavior = _annotation(ann, BEHAVIOR_ANNOTATION, dict)
        if behavior is not None:
            spec["behavior"] = behavior
    for key in (METRICS_ANNOTATION, BEHAVIOR_ANNOTATION):
        ann.pop(key, None)
    if md is not None:
        if ann:
            md["annotations"] = ann
        else:
            md.pop("annotations", None)
    status = out.get("status")
    if isinstance(status, dict):
        v2_status = {k: status[k] for k in ("observedGeneration", "lastScaleTime",
                                            "currentReplicas", "desiredReplicas") if k in status}
        util = status.get("currentCPUUtilizationPercentage")
        if util is not None:
            v2_status["currentMetrics"] = [{"type": "Resource", "resource": {
                "name": "cpu", "current": {"averageUtilization": util}}}]
        out["status"] = v2_status
    return out


def _annotation(ann: dict[str, Any], key: str, kind: type) -> Any:
    raw = ann.get(key)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise errors.BadRequest(f"annotation {key} is not valid JSON") from None
    if not isinstance(value, kind):
        raise errors.BadRequest(f"annotation {key} has the wrong shape")
    return value


def _convert_body(resp: Resp) -> Resp:
    """A v2 JSON response in v1 form (objects, lists, Statuses pass as they should)."""
    if not isinstance(resp.body, bytes) or not resp.content_type.startswith("application/json"):
        return resp
    try:
        doc = json.loads(resp.body)
    except ValueError:
        return resp
    if isinstance(doc, dict) and doc.get("kind") == f"{KIND}List":
        doc["apiVersion"] = V1
        doc["items"] = [to_v1(i) for i in doc.get("items") or []]
    elif isinstance(doc, dict) and doc.get("kind") == KIND:
        doc = to_v1(doc)
    else:
        return resp
    return replace(resp, body=dumps(doc))


class _ConvertedStream:
    """A watch stream (NDJSON or SSE) with every HorizontalPodAutoscaler in v1 form."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._buf = b""

    def __aiter__(self) -> _ConvertedStream:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if b"\n" in self._buf:
                line, _, self._buf = self._buf.partition(b"\n")
                return _convert_line(line) + b"\n"
            try:
                chunk = await self._inner.__anext__()
            except StopAsyncIteration:
                if self._buf:
                    rest, self._buf = self._buf, b""
                    return _convert_line(rest)
                raise
            self._buf += chunk

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


def _convert_line(line: bytes) -> bytes:
    prefix = b""
    payload = line
    if line.startswith(b"data: "):
        prefix, payload = b"data: ", line[len(b"data: "):]
    try:
        doc = json.loads(payload)
    except ValueError:
        return line
    if isinstance(doc, dict) and isinstance(doc.get("object"), dict):
        doc["object"] = to_v1(doc["object"])
    elif isinstance(doc, dict) and doc.get("kind") == KIND:
        doc = to_v1(doc)
    else:
        return line
    return prefix + dumps(doc)


class AutoscalingV1:
    """Serves autoscaling/v1 horizontalpodautoscalers through the v2 handlers."""

    def __init__(self, resources: ResourceAPI, registry: Registry, watches: WatchCounter) -> None:
        self.resources = resources
        self.registry = registry
        self.watches = watches

    async def handle(self, req: Req, route: Route, verb: str, user: UserInfo) -> Resp:
        api = self.resources
        v2_route = replace(route, version="v2")
        info = api.kind_for(replace(v2_route))
        if verb == "watch":
            resp = await watch(api, info, v2_route, req, self.watches, sse=route.sse_watch)
            if wants_table(req.headers.get("accept", "")) or isinstance(resp.body, bytes):
                return resp
            return replace(resp, body=_ConvertedStream(resp.body))
        if verb == "get":
            resp = await api.get(info, v2_route, req)
        elif verb == "list":
            resp = await api.list(info, v2_route, req)
        elif verb == "create":
            resp = await api.create(info, v2_route, self._as_v2(req), user)
        elif verb == "update":
            resp = await api.update(info, v2_route, self._as_v2(req), user)
        elif verb == "patch":
            resp = await self._patch(info, v2_route, req, user)
        elif verb == "delete":
            resp = await api.delete(info, v2_route, req, user)
        else:
            resp = await api.delete_collection(info, v2_route, req, user)
        if wants_table(req.headers.get("accept", "")):
            return resp
        return _convert_body(resp)

    @staticmethod
    def _as_v2(req: Req) -> Req:
        body = decode_body(req)  # JSON, YAML or protobuf (kubectl autoscale sends protobuf)
        if not isinstance(body, dict):
            raise errors.BadRequest("the body must be a JSON object")
        if body.get("apiVersion") not in (None, V1) or body.get("kind") not in (None, KIND):
            raise errors.BadRequest(f"the API version in the data ({body.get('apiVersion')}) does "
                                    f"not match the expected API version ({V1})")
        body.setdefault("apiVersion", V1)
        body.setdefault("kind", KIND)
        headers = {**req.headers, "content-type": "application/json"}
        return replace(req, body=dumps(to_v2(body)), headers=headers)

    async def _patch(self, info: Any, route: Route, req: Req, user: UserInfo) -> Resp:
        """Apply the patch to the v1 form of the current object, write back as an update."""
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH):
            raise errors.UnsupportedMediaType(
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}")
        body = decode_body(req, allow_patch=True)
        for attempt in range(PATCH_RETRIES):
            current = to_v1(await self.resources.get_current(info, replace(route, subresource="")))
            if ctype == JSON_PATCH:
                new = patch.json_patch(current, body)
            elif ctype == MERGE_PATCH:
                new = patch.json_merge_patch(current, body)
            else:
                new = patch.strategic_merge_patch(current, body, {})
            if not isinstance(new, dict):
                raise errors.BadRequest("the patch produced something that is not an object")
            wanted_rv = (body.get("metadata") or {}).get("resourceVersion") \
                if isinstance(body, dict) and isinstance(body.get("metadata"), dict) else None
            new.setdefault("metadata", {})["resourceVersion"] = \
                wanted_rv or current["metadata"].get("resourceVersion")
            put = replace(req, method="PUT", body=dumps(to_v2(new)),
                          headers={**req.headers, "content-type": "application/json"})
            try:
                return await self.resources.update(info, route, put, user)
            except errors.APIError as e:
                # A write between our read and update: read again (unless the patch named
                # the version it was based on, which must then fail).
                if e.code != 409 or wanted_rv or attempt == PATCH_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")


__all__ = ["AutoscalingV1", "is_v1", "to_v1", "to_v2"]
