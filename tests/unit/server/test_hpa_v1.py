"""autoscaling/v1 HorizontalPodAutoscalers: conversion to and from the stored v2 form, and the
v1 endpoints through the in-process API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleet.server.hpa_v1 import BEHAVIOR_ANNOTATION, METRICS_ANNOTATION, to_v1, to_v2
from fleet.testing.apiserver import open_api

V1_PATH = "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers"
V2_PATH = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
REF = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
CPU60 = {"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 60}}}
MEM = {"type": "Resource", "resource": {"name": "memory", "target": {
    "type": "AverageValue", "averageValue": "100Mi"}}}


def v2(metrics: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 5,
                     "metrics": metrics, **extra}}


def test_to_v1_and_back_keeps_everything():
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 10}}
    obj = v2([CPU60, MEM], behavior=behavior)
    obj["status"] = {"currentReplicas": 2, "desiredReplicas": 3, "lastScaleTime": "T",
                     "currentMetrics": [{"type": "Resource", "resource": {
                         "name": "cpu", "current": {"averageUtilization": 42,
                                                    "averageValue": "42m"}}}],
                     "conditions": [{"type": "AbleToScale", "status": "True"}]}
    old = to_v1(obj)
    assert old["apiVersion"] == "autoscaling/v1"
    assert old["spec"] == {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 5,
                           "targetCPUUtilizationPercentage": 60}
    assert json.loads(old["metadata"]["annotations"][METRICS_ANNOTATION]) == [MEM]
    assert json.loads(old["metadata"]["annotations"][BEHAVIOR_ANNOTATION]) == behavior
    assert old["status"] == {"currentReplicas": 2, "desiredReplicas": 3, "lastScaleTime": "T",
                             "currentCPUUtilizationPercentage": 42}
    back = to_v2(old)
    assert back["spec"] == obj["spec"]
    assert "annotations" not in back["metadata"]
    assert back["status"]["currentMetrics"][0]["resource"]["current"] == {"averageUtilization": 42}


def test_to_v2_without_a_cpu_target():
    back = to_v2({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
                  "metadata": {"name": "web", "annotations": {"keep": "me"}},
                  "spec": {"scaleTargetRef": REF, "maxReplicas": 3}})
    assert "metrics" not in back["spec"]  # defaulting gives cpu 80%, as for v2
    assert back["metadata"]["annotations"] == {"keep": "me"}


async def test_v1_endpoints(tmp_path):
    async with open_api(tmp_path) as api:
        code, created = await api.json("POST", V1_PATH, {
            "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": REF, "maxReplicas": 4, "targetCPUUtilizationPercentage": 70}})
        assert code == 201, created
        assert created["apiVersion"] == "autoscaling/v1"
        assert created["spec"] == {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 4,
                                   "targetCPUUtilizationPercentage": 70}
        code, stored = await api.json("GET", f"{V2_PATH}/web")
        assert stored["spec"]["metrics"] == [{"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]

        code, listed = await api.json("GET", V1_PATH)
        assert listed["kind"] == "HorizontalPodAutoscalerList"
        assert listed["apiVersion"] == "autoscaling/v1"
        assert listed["items"][0]["spec"]["targetCPUUtilizationPercentage"] == 70

        # A v1 patch is applied to the v1 form: v2-only fields survive it.
        code, _ = await api.json("PATCH", f"{V2_PATH}/web", {"spec": {"metrics": [
            stored["spec"]["metrics"][0], MEM]}}, content_type="application/merge-patch+json")
        assert code == 200
        code, patched = await api.json("PATCH", f"{V1_PATH}/web",
                                       {"spec": {"targetCPUUtilizationPercentage": 50}},
                                       content_type="application/merge-patch+json")
        assert code == 200, patched
        assert patched["spec"]["targetCPUUtilizationPercentage"] == 50
        code, stored = await api.json("GET", f"{V2_PATH}/web")
        assert stored["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 50
        assert stored["spec"]["metrics"][1] == MEM
        code, patched = await api.json("PATCH", f"{V1_PATH}/web", [
            {"op": "replace", "path": "/spec/maxReplicas", "value": 9}],
            content_type="application/json-patch+json")
        assert code == 200 and patched["spec"]["maxReplicas"] == 9
        # A patch naming a stale resourceVersion is refused, not retried.
        code, body = await api.json("PATCH", f"{V1_PATH}/web",
                                    {"metadata": {"resourceVersion": "1"},
                                     "spec": {"maxReplicas": 8}},
                                    content_type="application/merge-patch+json")
        assert code == 409, body

        # Validation speaks about the stored form.
        code, body = await api.json("POST", V1_PATH, {
            "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "bad"},
            "spec": {"scaleTargetRef": REF, "maxReplicas": 4,
                     "targetCPUUtilizationPercentage": 0}})
        assert code == 422, body
        code, body = await api.json("POST", V1_PATH, {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "bad"}, "spec": {}})
        assert code == 400

        # Watch: every event's object in v1 form.
        resp = await api.call("GET", V1_PATH, query={"watch": "1", "timeoutSeconds": "1"})
        lines = [json.loads(line) async for line in _lines(resp.body)]
        assert lines and lines[0]["type"] == "ADDED"
        assert lines[0]["object"]["apiVersion"] == "autoscaling/v1"
        assert lines[0]["object"]["spec"]["targetCPUUtilizationPercentage"] == 50

        code, body = await api.json("DELETE", f"{V1_PATH}/web")
        assert code == 200 and body["apiVersion"] == "autoscaling/v1"
        assert (await api.json("GET", f"{V2_PATH}/web"))[0] == 404


async def _lines(body: Any) -> Any:
    buf = b""
    async for chunk in body:
        buf += chunk
    for line in buf.splitlines():
        if line.strip():
            yield line


@pytest.mark.parametrize("path", [V1_PATH, V2_PATH])
async def test_tables_at_both_versions(tmp_path, path):
    async with open_api(tmp_path) as api:
        assert (await api.json("POST", V2_PATH, v2([CPU60])))[0] == 201
        resp = await api.call("GET", path, headers={
            "accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
        table = json.loads(resp.body)
        assert table["rows"][0]["cells"][:5] == ["web", "Deployment/web", "cpu: <unknown>/60%",
                                                 "1", 5]


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _ld(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _vi(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n)


async def test_v1_protobuf_create_like_kubectl_autoscale(tmp_path):
    # What `kubectl autoscale deployment web --min 2 --max 5 --cpu-percent 60` posts.
    ref = _ld(1, "Deployment") + _ld(2, "web") + _ld(3, "apps/v1")
    raw = _ld(1, _ld(1, "web")) + _ld(2, _ld(1, ref) + _vi(2, 2) + _vi(3, 5) + _vi(4, 60)) + \
        _ld(3, b"")
    body = b"k8s\x00" + _ld(1, _ld(1, "autoscaling/v1") + _ld(2, "HorizontalPodAutoscaler")) + \
        _ld(2, raw) + _ld(3, "") + _ld(4, "")
    async with open_api(tmp_path) as api:
        code, created = await api.json("POST", V1_PATH, body,
                                       content_type="application/vnd.kubernetes.protobuf")
        assert code == 201, created
        assert created["spec"] == {"scaleTargetRef": REF, "minReplicas": 2, "maxReplicas": 5,
                                   "targetCPUUtilizationPercentage": 60}


async def test_v1_metadata_only_reads_pass_unconverted(tmp_path):
    # PartialObjectMetadata (fleet/server/negotiate.py) is no HorizontalPodAutoscaler:
    # the v1 conversion leaves it, its list and its watch events as they are.
    pom = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    async with open_api(tmp_path) as api:
        code, made = await api.json("POST", V2_PATH, v2([CPU60]))
        assert code == 201, made
        code, got = await api.json("GET", f"{V1_PATH}/web", headers={"accept": pom})
        assert got == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": made["metadata"]}
        code, listed = await api.json("GET", V1_PATH, headers={
            "accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"})
        assert listed["kind"] == "PartialObjectMetadataList" and listed["items"][0]["metadata"]["name"] == "web"
        resp = await api.call("GET", V1_PATH, query={"watch": "1"}, headers={"accept": pom})
        it = resp.body.__aiter__()
        line = await it.__anext__()
        ev = json.loads(line)
        assert ev["type"] == "ADDED" and ev["object"] == got
        await it.aclose()
