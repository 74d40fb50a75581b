"""/openapi/v2: the Swagger 2.0 document, its gnostic protobuf form, and how it is served.

The protobuf is checked with a small wire decoder written here from gnostic's
OpenAPIv2.proto field numbers (independent of the encoder's tables), so a wrong number or
wire type in fleet/server/openapi_proto.py shows up as a wrong decoded document.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from fleet.api.registry import KindInfo, Registry, default_registry
from fleet.server import openapi_proto
from fleet.server.openapi import OpenAPICache
from fleet.server.openapi_v2 import (
    JSON,
    PROTOBUF,
    OpenAPIV2Cache,
    document,
    negotiate,
    response,
    to_v2,
)
from fleet.testing.apiserver import open_api

PROTO_AT = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
PROTO_DOT = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

CRONTAB_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "description": "CronTabSpec is the spec of a CronTab.",
            "properties": {
                "cronSpec": {"type": "string", "description": "The cron schedule."},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "nullable": True},
                "mode": {"oneOf": [{"type": "string"}, {"type": "integer"}],
                         "x-kubernetes-int-or-string": True},
            },
            "required": ["cronSpec"],
        },
    },
}


def crontab(schema: dict[str, Any] | None = CRONTAB_SCHEMA) -> KindInfo:
    return KindInfo("stable.example.com", "v1", "CronTab", "crontabs", "crontab", short_names=("ct",),
                    strategic_merge=False, openapi_schema=schema)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return document(default_registry())


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        for v in node.values():
            out += refs(v)
        return out
    if isinstance(node, list):
        return [r for v in node for r in refs(v)]
    return []


# -- the JSON document -------------------------------------------------------------------------

def test_every_kind_has_a_definition_and_operations(doc):
    assert doc["swagger"] == "2.0" and doc["info"]["title"] and doc["info"]["version"]
    gvks = {(g["group"], g["version"], g["kind"]): name for name, d in doc["definitions"].items()
            for g in d.get("x-kubernetes-group-version-kind", [])}
    ops = {(op["x-kubernetes-group-version-kind"]["group"], op["x-kubernetes-group-version-kind"]["version"],
            op["x-kubernetes-group-version-kind"]["kind"], op["x-kubernetes-action"])
           for item in doc["paths"].values() for m, op in item.items() if m != "parameters"}
    kinds = list(default_registry().all())
    assert len(kinds) > 50
    for info in kinds:
        assert (info.group, info.version, info.kind) in gvks, info.kind
        if "get" in info.verbs:
            assert (info.group, info.version, info.kind, "get") in ops, info.kind
        if "patch" in info.verbs:
            assert (info.group, info.version, info.kind, "patch") in ops, info.kind


def test_definitions_are_named_as_kubernetes_names_them(doc):
    defs = doc["definitions"]
    for name in ("io.k8s.api.core.v1.Pod", "io.k8s.api.core.v1.PodSpec", "io.k8s.api.apps.v1.Deployment",
                 "io.k8s.api.core.v1.Event", "io.k8s.api.events.v1.Event",
                 "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "io.k8s.api.batch.v1.CronJob",
                 "io.k8s.api.rbac.v1.ClusterRole", "io.k8s.networking.gateway.v1.HTTPRoute",
                 "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"):
        assert name in defs, name
    assert defs["io.k8s.api.core.v1.Pod"]["x-kubernetes-group-version-kind"] == [
        {"group": "", "kind": "Pod", "version": "v1"}]
    assert defs["io.k8s.api.core.v1.Pod"]["properties"]["spec"] == {"$ref": "#/definitions/io.k8s.api.core.v1.PodSpec"}
    assert not [n for n in defs if n.startswith("io.fleet.")]


def test_every_ref_resolves(doc):
    found = refs(doc)
    assert len(found) > 1000
    missing = {r for r in found if r.removeprefix("#/definitions/") not in doc["definitions"]}
    assert not missing
    assert all(r.startswith("#/definitions/") for r in found)


def test_patch_and_list_extensions(doc):
    d = doc["definitions"]
    containers = d["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    assert containers["x-kubernetes-patch-strategy"] == "merge"
    assert containers["x-kubernetes-list-type"] == "map" and containers["x-kubernetes-list-map-keys"] == ["name"]
    assert containers["items"] == {"$ref": "#/definitions/io.k8s.api.core.v1.Container"}
    ports = d["io.k8s.api.core.v1.Container"]["properties"]["ports"]
    assert ports["x-kubernetes-patch-merge-key"] == "containerPort"
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    finalizers = d["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]["finalizers"]
    assert finalizers["x-kubernetes-list-type"] == "set" and "x-kubernetes-patch-merge-key" not in finalizers
    # An atomic list says nothing (Kubernetes' default).
    assert "x-kubernetes-list-type" not in d["io.k8s.api.core.v1.Container"]["properties"]["command"]


def test_operations_have_swagger2_shape(doc):
    item = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]
    assert {p["name"] for p in item["parameters"] if p["in"] == "path"} == {"namespace", "name"}
    patch = item["patch"]
    assert patch["x-kubernetes-action"] == "patch"
    assert patch["x-kubernetes-group-version-kind"] == {"group": "apps", "kind": "Deployment", "version": "v1"}
    assert patch["operationId"] == "patchAppsV1NamespacedDeployment"
    assert "application/strategic-merge-patch+json" in patch["consumes"]
    body = next(p for p in patch["parameters"] if p["in"] == "body")
    assert body["schema"] == {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}
    # `fieldValidation` on PATCH too, as kube-apiserver (kubectl's fallback lists CRDs, now served).
    assert next(p for p in patch["parameters"] if p["name"] == "fieldValidation")["in"] == "query"
    put = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["put"]
    fv = next(p for p in put["parameters"] if p["name"] == "fieldValidation")
    assert fv["in"] == "query" and fv["type"] == "string"
    assert next(p for p in patch["parameters"] if p["name"] == "force")["type"] == "boolean"
    assert patch["responses"]["200"]["schema"] == {"$ref": "#/definitions/io.k8s.api.apps.v1.Deployment"}
    post = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments"]["post"]
    assert post["x-kubernetes-action"] == "post" and set(post["responses"]) == {"200", "201", "202", "401"}
    assert next(p for p in post["parameters"] if p["in"] == "body")["schema"] == {
        "$ref": "#/definitions/io.k8s.api.apps.v1.Deployment"}
    lst = doc["paths"]["/apis/apps/v1/deployments"]["get"]
    assert lst["x-kubernetes-action"] == "list" and lst["operationId"] == "listAppsV1DeploymentForAllNamespaces"
    assert next(p for p in lst["parameters"] if p["name"] == "limit")["type"] == "integer"
    # Custom-resource-like kinds take no strategic merge patch.
    route = doc["paths"]["/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" not in route["consumes"]
    # A create-only review has a POST and nothing else.
    review = doc["paths"]["/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"]
    assert set(review) == {"post", "parameters"}


def test_a_kind_registered_at_run_time_appears_in_v2_and_v3():
    reg = default_registry()
    v2, v3 = OpenAPIV2Cache(reg), OpenAPICache(reg)
    assert "com.example.stable.v1.CronTab" not in v2.document()["definitions"]
    assert "apis/stable.example.com/v1" not in v3.index()["paths"]

    reg.register(crontab())
    d2 = v2.document()["definitions"]["com.example.stable.v1.CronTab"]
    assert d2["x-kubernetes-group-version-kind"] == [{"group": "stable.example.com", "kind": "CronTab",
                                                      "version": "v1"}]
    spec = d2["properties"]["spec"]
    assert spec["required"] == ["cronSpec"] and spec["properties"]["replicas"] == {
        "type": "integer", "minimum": 1, "maximum": 10}  # no `nullable` in Swagger 2.0
    assert spec["properties"]["mode"] == {"x-kubernetes-int-or-string": True}
    assert d2["properties"]["metadata"]["$ref"] == "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    paths = v2.document()["paths"]
    assert paths["/apis/stable.example.com/v1/namespaces/{namespace}/crontabs/{name}"]["get"][
        "responses"]["200"]["schema"] == {"$ref": "#/definitions/com.example.stable.v1.CronTab"}

    doc3 = json.loads(v3.get("apis/stable.example.com/v1"))
    c3 = doc3["components"]["schemas"]["com.example.stable.v1.CronTab"]
    assert c3["properties"]["spec"]["properties"]["replicas"]["nullable"] is True  # v3 keeps it
    assert c3["x-kubernetes-group-version-kind"][0]["kind"] == "CronTab"
    meta_ref = c3["properties"]["metadata"]["allOf"][0]["$ref"]
    assert meta_ref.removeprefix("#/components/schemas/") in doc3["components"]["schemas"]

    # The definition changes its schema: the same names, new contents, both documents follow.
    reg.register(crontab({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "image": {"type": "string"}}}}}))
    assert set(v2.document()["definitions"]["com.example.stable.v1.CronTab"]["properties"]["spec"][
        "properties"]) == {"image"}
    assert "image" in json.loads(v3.get("apis/stable.example.com/v1"))["components"]["schemas"][
        "com.example.stable.v1.CronTab"]["properties"]["spec"]["properties"]

    reg.unregister("stable.example.com", "v1", "crontabs")
    assert "com.example.stable.v1.CronTab" not in v2.document()["definitions"]
    assert not [p for p in v2.document()["paths"] if "crontabs" in p]


def test_a_kind_without_a_schema_still_gets_a_definition():
    reg = Registry()
    reg.register(crontab(None))
    d = document(reg)["definitions"]["com.example.stable.v1.CronTab"]
    assert d["x-kubernetes-preserve-unknown-fields"] is True
    assert set(d["properties"]) == {"apiVersion", "kind", "metadata"}


def test_to_v2_drops_what_swagger2_lacks():
    s = {"type": "object", "nullable": True, "properties": {"a": {"anyOf": [{"type": "string"}], "not": {},
                                                                   "items": {"nullable": True, "type": "x"}}},
         "additionalProperties": {"oneOf": [], "type": "string"}, "$ref": "#/components/schemas/X"}
    assert to_v2(s) == {"type": "object", "properties": {"a": {"items": {"type": "x"}}},
                        "additionalProperties": {"type": "string"}, "$ref": "#/definitions/X"}


def test_v3_is_unchanged_for_kinds_without_a_schema():
    """Only kinds with an `openapi_schema` get a named v3 component; the others stay inline."""
    reg = Registry()
    reg.register(crontab(None))
    doc3 = OpenAPICache(reg)
    body = json.loads(doc3.get("apis/stable.example.com/v1"))
    get = body["paths"]["/apis/stable.example.com/v1/namespaces/{namespace}/crontabs/{name}"]["get"]
    assert get["responses"]["200"]["content"]["application/json"]["schema"] == {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert body["components"]["schemas"] == {}


# -- the protobuf form -------------------------------------------------------------------------

def decode(buf: bytes) -> dict[int, list[Any]]:
    """One protobuf message: field number -> values (ints for varints, bytes for the rest)."""
    out: dict[int, list[Any]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        n = shift = 0
        while True:
            b = buf[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return n

    while i < len(buf):
        key = varint()
        num, wire = key >> 3, key & 7
        if wire == 0:
            val: Any = varint()
        elif wire == 2:
            n = varint()
            val, i = buf[i:i + n], i + n
            assert len(val) == n, "truncated"
        elif wire == 1:
            val, i = buf[i:i + 8], i + 8
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.setdefault(num, []).append(val)
    assert i == len(buf)
    return out


def named(buf: bytes, num: int = 1) -> dict[str, bytes]:
    """Repeated Named* entries (name=1, value=2) of field `num`, by name."""
    return {decode(e)[1][0].decode(): decode(e)[2][0] for e in decode(buf).get(num, [])}


def text(msg: dict[int, list[Any]], num: int) -> str:
    return msg[num][0].decode()


def extensions(buf: bytes, num: int) -> dict[str, Any]:
    """Vendor extensions (NamedAny; Any.yaml=2), read as YAML would (JSON text is YAML)."""
    return {k: json.loads(text(decode(v), 2)) for k, v in named(buf, num).items()}


def test_protobuf_decodes_to_the_same_document(doc):
    raw = openapi_proto.document(doc)
    top = decode(raw)
    assert text(top, 1) == "2.0"
    info = decode(top[2][0])
    assert text(info, 1) == doc["info"]["title"] and text(info, 2) == doc["info"]["version"]

    paths = named(top[8][0], 2)  # Paths.path = 2
    assert list(paths) == list(doc["paths"])
    item = decode(paths["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"])
    patch = item[8][0]  # PathItem.patch = 8
    op = decode(patch)
    assert text(op, 5) == "patchAppsV1NamespacedDeployment"
    assert [c.decode() for c in op[7]] == doc["paths"][
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]["consumes"]
    ext = extensions(patch, 13)
    assert ext["x-kubernetes-action"] == "patch"
    assert ext["x-kubernetes-group-version-kind"] == {"group": "apps", "kind": "Deployment", "version": "v1"}
    # parameters: ParametersItem.parameter(1) -> Parameter.non_body(2) -> NonBodyParameter.query(3)
    queries = []
    for p in op[8]:
        param = decode(decode(p)[1][0])
        if 2 in param:
            sub = decode(param[2][0])
            if 3 in sub:
                q = decode(sub[3][0])
                queries.append((text(q, 4), text(q, 2), text(q, 6)))
        else:  # BodyParameter: name=2, in=3, required=4, schema=5 (Schema._ref=1)
            body = decode(param[1][0])
            assert (text(body, 2), text(body, 3), body[4][0]) == ("body", "body", 1)
            assert text(decode(body[5][0]), 1) == "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
    assert ("force", "query", "boolean") in queries and ("dryRun", "query", "string") in queries
    # Path-level path parameters: NonBodyParameter.path = 4, `required` = 1.
    path_params = [decode(decode(decode(decode(p)[1][0])[2][0])[4][0]) for p in item[9]
                   if 4 in decode(decode(decode(p)[1][0])[2][0])]
    assert {(text(p, 4), p[1][0]) for p in path_params} == {("namespace", 1), ("name", 1)}
    # responses: Responses.response_code(1) NamedResponseValue -> ResponseValue.response(1)
    # -> Response.schema(2) SchemaItem.schema(1) -> Schema._ref(1)
    resp = named(op[9][0])
    ok = decode(decode(resp["200"])[1][0])
    assert text(ok, 1) == "OK"
    assert text(decode(decode(ok[2][0])[1][0]), 1) == "#/definitions/io.k8s.api.apps.v1.Deployment"

    defs = named(top[9][0])  # Definitions.additional_properties = 1
    assert list(defs) == list(doc["definitions"])
    pod = decode(defs["io.k8s.api.core.v1.Pod"])
    assert [t.decode() for t in decode(pod[22][0])[1]] == ["object"]  # TypeItem
    assert text(pod, 4).startswith("Pod is a collection of containers")
    assert extensions(defs["io.k8s.api.core.v1.Pod"], 31)["x-kubernetes-group-version-kind"] == [
        {"group": "", "kind": "Pod", "version": "v1"}]
    spec_props = named(decode(defs["io.k8s.api.core.v1.PodSpec"])[25][0])  # Properties
    containers = decode(spec_props["containers"])
    assert [t.decode() for t in decode(containers[22][0])[1]] == ["array"]
    assert text(decode(decode(containers[23][0])[1][0]), 1) == "#/definitions/io.k8s.api.core.v1.Container"
    ext = extensions(spec_props["containers"], 31)
    assert ext == {"x-kubernetes-patch-merge-key": "name", "x-kubernetes-patch-strategy": "merge",
                   "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    # A map: AdditionalPropertiesItem.schema = 1.
    labels = decode(named(decode(defs["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"])[25][0])["labels"])
    assert [t.decode() for t in decode(decode(decode(labels[21][0])[1][0])[22][0])[1]] == ["string"]
    # securityDefinitions(13): NamedSecurityDefinitionsItem -> api_key_security(2)
    sec = decode(decode(named(top[13][0])["BearerToken"])[2][0])
    assert (text(sec, 1), text(sec, 2), text(sec, 3)) == ("apiKey", "authorization", "header")


def test_varint_and_scalars():
    assert openapi_proto.varint(0) == b"\x00" and openapi_proto.varint(300) == b"\xac\x02"
    assert openapi_proto.varint(-1) == b"\xff" * 9 + b"\x01"
    assert openapi_proto.string(1, "") == b"" and openapi_proto.boolean(4, False) == b""
    assert openapi_proto.message(2, b"") == b"\x12\x00"  # a present empty message is written
    s = decode(openapi_proto.schema({"maximum": 1.5, "maxLength": 3, "additionalProperties": False}))
    assert s[7] == [b"\x00\x00\x00\x00\x00\x00\xf8\x3f"] and s[11] == [3]
    assert decode(s[21][0]) == {2: [0]}  # AdditionalPropertiesItem.boolean = false, written (a oneof)


# -- serving -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("accept", "want"), [
    ("", JSON), ("*/*", JSON), ("application/json", JSON), ("application/*", JSON),
    (PROTO_AT, PROTOBUF), (PROTO_DOT, PROTOBUF),
    # kubectl / client-go: the protobuf first, JSON as a fallback.
    (f"{PROTO_AT}, application/json", PROTOBUF),
    (f"application/json;q=0.5, {PROTO_DOT}", PROTOBUF),
    ("text/html, application/json;q=0.9", JSON),
    ("text/html", None), ("application/yaml", None), ("application/json;q=0", None),
])
def test_negotiate(accept, want):
    assert negotiate(accept) == want


def test_response_etag_304_gzip_and_406():
    cache = OpenAPIV2Cache(default_registry())
    r = response(cache, {"accept": "application/json"})
    assert r.status == 200 and r.content_type == JSON
    etag = r.headers["Etag"]
    assert etag.startswith('"') and len(etag) == 130 and etag == etag.upper()
    assert json.loads(r.body)["swagger"] == "2.0"
    assert "Accept" in r.headers["Vary"] and r.headers["Last-Modified"].endswith("GMT")

    p = response(cache, {"accept": PROTO_AT})
    assert p.status == 200 and p.content_type == PROTO_DOT and p.headers["Etag"] == etag
    assert decode(p.body)[1] == [b"2.0"]

    nm = response(cache, {"accept": "application/json", "if-none-match": etag})
    assert nm.status == 304 and nm.body == b"" and nm.headers["Etag"] == etag
    assert response(cache, {"if-none-match": f'"other", W/{etag}'}).status == 304
    assert response(cache, {"if-none-match": '"stale"'}).status == 200
    ims = response(cache, {"if-modified-since": r.headers["Last-Modified"]})
    assert ims.status == 304

    z = response(cache, {"accept": PROTO_DOT, "accept-encoding": "gzip, deflate"})
    assert z.headers["Content-Encoding"] == "gzip" and gzip.decompress(z.body) == p.body
    assert "Content-Encoding" not in response(cache, {"accept-encoding": "gzip;q=0"}).headers

    bad = response(cache, {"accept": "text/html"})
    assert bad.status == 406 and bad.body == b""


async def test_served_by_the_api_server(tmp_path):
    async with open_api(tmp_path) as api:
        resp = await api.call("GET", "/openapi/v2", headers={"accept": PROTO_AT + ", application/json"})
        assert resp.status == 200 and resp.content_type == PROTO_DOT
        top = decode(resp.body)
        assert "io.k8s.api.core.v1.Pod" in named(top[9][0])
        again = await api.call("GET", "/openapi/v2", headers={"if-none-match": resp.headers["Etag"]})
        assert again.status == 304
        code, root = await api.json("GET", "/")
        assert "/openapi/v2" in root["paths"]
