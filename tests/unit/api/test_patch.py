"""Reference cases and properties for fleet.api.patch and fleet.api.smp_schema.

Strategic-merge cases follow the Kubernetes "Update API Objects in Place
Using kubectl patch" task page and apimachinery's documented directive
behaviour; merge-patch and JSON-patch cases are the RFC 7386 / RFC 6902
appendix examples.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.api.errors import BadRequest, Invalid
from fleet.api.patch import (
    create_merge_patch,
    json_equal,
    json_merge_patch,
    json_patch,
    strategic_merge_patch,
    three_way_merge_patch,
)
from fleet.api.smp_schema import PRIMITIVE_SET, ListSchema, keyed, schema_for

DEPLOY = schema_for("Deployment")
POD = schema_for("Pod")


def _deployment(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "patch-demo", "finalizers": ["a", "b"]},
        "spec": {
            "replicas": 2,
            "template": {
                "metadata": {"labels": {"app": "nginx"}},
                "spec": {
                    "containers": containers,
                    "tolerations": [{"effect": "NoSchedule", "key": "dedicated",
                                     "value": "test-team"}],
                },
            },
            **spec,
        },
    }


NGINX = {"name": "patch-demo-ctr", "image": "nginx"}
REDIS = {"name": "patch-demo-ctr-2", "image": "redis"}


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def _directive_keys(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [k for k in value if k.startswith("$")]
        for v in value.values():
            found += _directive_keys(v)
        return found
    if isinstance(value, list):
        return [k for v in value for k in _directive_keys(v)]
    return []


# --------------------------------------------------------------------------
# Strategic merge patch reference cases
# --------------------------------------------------------------------------

SMP_CASES: list[tuple[str, dict[str, Any], dict[str, Any], Any]] = [
    (
        # The task page: containers merge by name.  The new container comes
        # first: patch items are ordered before server-only items that did
        # not precede them (the page shows redis above nginx).
        "containers merged by name",
        _deployment([NGINX]),
        {"spec": {"template": {"spec": {"containers": [REDIS]}}}},
        lambda o: _pod_spec(o)["containers"] == [REDIS, NGINX],
    ),
    (
        "tolerations have no merge key and are replaced",
        _deployment([NGINX]),
        {"spec": {"template": {"spec": {"tolerations": [
            {"effect": "NoSchedule", "key": "disktype", "value": "ssd"}]}}}},
        lambda o: _pod_spec(o)["tolerations"]
        == [{"effect": "NoSchedule", "key": "disktype", "value": "ssd"}],
    ),
    (
        "$patch: replace as a list item replaces the whole list",
        _deployment([NGINX, REDIS]),
        {"spec": {"template": {"spec": {"containers": [
            {"$patch": "replace"}, {"name": "only", "image": "busybox"}]}}}},
        lambda o: _pod_spec(o)["containers"] == [{"name": "only", "image": "busybox"}],
    ),
    (
        "$patch: replace on a map replaces the map",
        _deployment([NGINX]),
        {"spec": {"template": {"metadata": {"labels": {"$patch": "replace", "tier": "web"}}}}},
        lambda o: o["spec"]["template"]["metadata"]["labels"] == {"tier": "web"},
    ),
    (
        "$patch: delete on a list item removes it by merge key",
        _deployment([NGINX, REDIS]),
        {"spec": {"template": {"spec": {"containers": [
            {"name": "patch-demo-ctr", "$patch": "delete"}]}}}},
        lambda o: _pod_spec(o)["containers"] == [REDIS],
    ),
    (
        "$patch: delete on a map empties it",
        _deployment([NGINX]),
        {"spec": {"template": {"metadata": {"labels": {"$patch": "delete"}}}}},
        lambda o: o["spec"]["template"]["metadata"]["labels"] == {},
    ),
    (
        "$patch: merge on a map is the default behaviour",
        _deployment([NGINX]),
        {"spec": {"template": {"metadata": {"labels": {"$patch": "merge", "tier": "web"}}}}},
        lambda o: o["spec"]["template"]["metadata"]["labels"] == {"app": "nginx", "tier": "web"},
    ),
    (
        # The task page's retainKeys exercise.
        "$retainKeys drops unlisted keys before merging",
        _deployment([NGINX], strategy={"type": "RollingUpdate",
                                       "rollingUpdate": {"maxSurge": "30%"}}),
        {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}},
        lambda o: o["spec"]["strategy"] == {"type": "Recreate"},
    ),
    (
        "$deleteFromPrimitiveList removes values from a primitive list",
        _deployment([NGINX]),
        {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
        lambda o: o["metadata"]["finalizers"] == ["b"],
    ),
    (
        "finalizers merge as an ordered set",
        _deployment([NGINX]),
        {"metadata": {"finalizers": ["b", "c"]}},
        lambda o: o["metadata"]["finalizers"] == ["a", "b", "c"],
    ),
    (
        "$setElementOrder reorders a keyed list and is consumed",
        _deployment([{"name": "a"}, {"name": "b"}, {"name": "c"}]),
        {"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b", "image": "new"}],
        }}}},
        lambda o: _pod_spec(o)["containers"]
        == [{"name": "c"}, {"name": "a"}, {"name": "b", "image": "new"}],
    ),
    (
        "$setElementOrder on a primitive list",
        _deployment([NGINX]),
        {"metadata": {"$setElementOrder/finalizers": ["b", "a"]}},
        lambda o: o["metadata"]["finalizers"] == ["b", "a"],
    ),
    (
        "env merges by name inside a container merged by name",
        _deployment([{"name": "app", "env": [{"name": "A", "value": "1"},
                                             {"name": "B", "value": "2"}]}]),
        {"spec": {"template": {"spec": {"containers": [
            {"name": "app", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}]}}}},
        lambda o: _pod_spec(o)["containers"][0]["env"]
        == [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
    ),
    (
        "container ports merge by containerPort, command is replaced",
        _deployment([{"name": "app", "command": ["a", "b"],
                      "ports": [{"containerPort": 80}, {"containerPort": 81}]}]),
        {"spec": {"template": {"spec": {"containers": [
            {"name": "app", "command": ["c"], "ports": [{"containerPort": 81, "name": "x"}]}]}}}},
        lambda o: _pod_spec(o)["containers"][0]
        == {"name": "app", "command": ["c"],
            "ports": [{"containerPort": 80}, {"containerPort": 81, "name": "x"}]},
    ),
    (
        "null deletes a key, maps merge recursively",
        _deployment([NGINX]),
        {"spec": {"replicas": None, "template": {"metadata": {"labels": {"tier": "web"}}}}},
        lambda o: "replicas" not in o["spec"]
        and o["spec"]["template"]["metadata"]["labels"] == {"app": "nginx", "tier": "web"},
    ),
    (
        "appended items and new fields have their directives stripped",
        _deployment([NGINX]),
        {"spec": {"template": {"spec": {
            "containers": [{"name": "new", "env": [{"name": "X", "$patch": "delete"}],
                            "resources": {"$patch": "replace", "limits": {"cpu": "1"}}}],
            "securityContext": {"$retainKeys": ["a"], "a": 1, "b": None}}}}},
        lambda o: _pod_spec(o)["containers"][0]
        == {"name": "new", "env": [], "resources": {"limits": {"cpu": "1"}}}
        and _pod_spec(o)["securityContext"] == {"a": 1},
    ),
]


@pytest.mark.parametrize("name,doc,patch,check", SMP_CASES, ids=[c[0] for c in SMP_CASES])
def test_strategic_merge_reference(name: str, doc: dict[str, Any], patch: dict[str, Any],
                                   check: Any) -> None:
    doc_before, patch_before = copy.deepcopy(doc), copy.deepcopy(patch)
    out = strategic_merge_patch(doc, patch, DEPLOY)
    assert check(out), out
    assert _directive_keys(out) == []
    assert doc == doc_before and patch == patch_before  # inputs untouched


def test_service_ports_merge_by_port() -> None:
    svc = {"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443}]}}
    out = strategic_merge_patch(svc, {"spec": {"ports": [{"port": 80, "targetPort": 9090}]}},
                                schema_for("Service"))
    assert out["spec"]["ports"] == [{"port": 80, "targetPort": 9090}, {"port": 443}]


def test_node_addresses_and_conditions_merge_by_type() -> None:
    node = {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                     {"type": "Hostname", "address": "n1"}],
                       "conditions": [{"type": "Ready", "status": "False"}]}}
    patch = {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
                        "conditions": [{"type": "MemoryPressure", "status": "False"},
                                       {"type": "Ready", "status": "True"}]}}
    out = strategic_merge_patch(node, patch, schema_for("Node"))
    assert out["status"]["addresses"] == [{"type": "InternalIP", "address": "10.0.0.2"},
                                          {"type": "Hostname", "address": "n1"}]
    assert {c["type"]: c["status"] for c in out["status"]["conditions"]} == {
        "Ready": "True", "MemoryPressure": "False"}


def test_owner_references_merge_by_uid() -> None:
    obj = {"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]}}
    out = strategic_merge_patch(obj, {"metadata": {"ownerReferences": [
        {"uid": "2", "name": "b"}]}}, schema_for("ConfigMap"))
    assert [r["uid"] for r in out["metadata"]["ownerReferences"]] == ["2", "1"]


def test_merge_keys_compare_as_json() -> None:
    # True must not match 1 as a merge key (Python's == would say it does).
    schema = {"items": keyed("id")}
    out = strategic_merge_patch({"items": [{"id": 1, "v": "a"}]},
                                {"items": [{"id": True, "v": "b"}]}, schema)
    assert len(out["items"]) == 2


@pytest.mark.parametrize("patch", [
    {"$patch": "frobnicate"},
    {"spec": {"template": {"spec": {"containers": [{"name": "x", "$patch": "merge"}]}}}},
    {"spec": {"template": {"spec": {"containers": [{"name": "x", "$patch": "bogus"}]}}}},
    {"spec": {"template": {"spec": {"containers": [{"image": "no-name"}]}}}},
    {"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}},
    {"spec": {"template": {"spec": {"containers": ["not-a-map"]}}}},
    {"spec": {"strategy": {"$retainKeys": "type"}}},
    {"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}},
    {"metadata": {"$setElementOrder/finalizers": "a"}},
    # The patch list must follow $setElementOrder.
    {"metadata": {"$setElementOrder/finalizers": ["a", "b"], "finalizers": ["c"]}},
    {"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
        "containers": [{"name": "b"}, {"name": "a"}]}}}},
])
def test_strategic_merge_rejects_bad_patches(patch: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        strategic_merge_patch(_deployment([NGINX]), patch, DEPLOY)


def test_pod_status_conditions_and_pod_ips() -> None:
    pod = {"status": {"conditions": [{"type": "Ready", "status": "False"}],
                      "podIPs": [{"ip": "10.0.0.1"}]}}
    out = strategic_merge_patch(pod, {"status": {"conditions": [
        {"type": "Ready", "status": "True"}], "podIPs": [{"ip": "fd00::1"}]}}, POD)
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert out["status"]["podIPs"] == [{"ip": "fd00::1"}, {"ip": "10.0.0.1"}]


# --------------------------------------------------------------------------
# Schema tree
# --------------------------------------------------------------------------


def test_schema_tree_shapes() -> None:
    pod_spec = DEPLOY["spec"]["template"]["spec"]
    assert pod_spec["containers"] == ListSchema("name", "merge", pod_spec["containers"].item)
    assert pod_spec["containers"].item["env"].merge_key == "name"
    assert pod_spec["containers"].item["ports"].merge_key == "containerPort"
    assert pod_spec["containers"].item["volumeMounts"].merge_key == "mountPath"
    assert pod_spec["containers"].item["volumeDevices"].merge_key == "devicePath"
    assert pod_spec["hostAliases"].merge_key == "ip"
    assert pod_spec["topologySpreadConstraints"].merge_key == "topologyKey"
    for untagged in ("tolerations", "command", "args", "envFrom"):
        assert untagged not in pod_spec and untagged not in pod_spec["containers"].item
    cron = schema_for("CronJob")
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"] is pod_spec
    assert schema_for("Service")["spec"]["ports"].merge_key == "port"
    assert schema_for("Pod")["status"]["conditions"].merge_key == "type"
    generic = schema_for("SomethingNew")
    assert generic["metadata"]["finalizers"] == PRIMITIVE_SET
    assert generic["metadata"]["ownerReferences"].merge_key == "uid"


# --------------------------------------------------------------------------
# Three-way (client-side apply) patches
# --------------------------------------------------------------------------


def test_three_way_first_apply_only_sets_differences() -> None:
    modified = _deployment([NGINX])
    current = copy.deepcopy(modified)
    current["status"] = {"replicas": 2}
    _pod_spec(current)["containers"][0]["imagePullPolicy"] = "Always"
    assert three_way_merge_patch(None, modified, current, DEPLOY) == {}
    modified["spec"]["replicas"] = 3
    assert three_way_merge_patch(None, modified, current, DEPLOY) == {"spec": {"replicas": 3}}


def test_three_way_deletes_what_last_applied_had() -> None:
    original = _deployment([NGINX, REDIS], paused=True)
    original["metadata"]["finalizers"] = ["a", "b"]
    _pod_spec(original)["containers"][0] = {**NGINX, "env": [{"name": "A", "value": "1"}]}
    current = copy.deepcopy(original)
    current["status"] = {"replicas": 2}
    modified = _deployment([{**NGINX, "image": "nginx:2"}])
    modified["metadata"]["finalizers"] = ["a"]

    patch = three_way_merge_patch(original, modified, current, DEPLOY)
    assert patch["spec"]["paused"] is None
    assert patch["metadata"] == {"$deleteFromPrimitiveList/finalizers": ["b"],
                                 "$setElementOrder/finalizers": ["a"]}
    containers = patch["spec"]["template"]["spec"]["containers"]
    assert {"name": "patch-demo-ctr", "image": "nginx:2", "env": None} in containers
    assert {"$patch": "delete", "name": "patch-demo-ctr-2"} in containers

    out = strategic_merge_patch(current, patch, DEPLOY)
    assert _pod_spec(out)["containers"] == [{"name": "patch-demo-ctr", "image": "nginx:2"}]
    assert out["metadata"]["finalizers"] == ["a"]
    assert "paused" not in out["spec"] and out["status"] == {"replicas": 2}


def test_three_way_with_empty_schema_is_a_merge_patch() -> None:
    original = {"data": {"a": "1", "b": "2"}, "list": [1, 2]}
    modified = {"data": {"a": "1"}, "list": [1]}
    current = {"data": {"a": "1", "b": "2", "c": "3"}, "list": [1, 2]}
    patch = three_way_merge_patch(original, modified, current, {})
    assert patch == {"data": {"b": None}, "list": [1]}
    assert json_merge_patch(current, patch) == {"data": {"a": "1", "c": "3"}, "list": [1]}


# --------------------------------------------------------------------------
# RFC 7386 appendix A
# --------------------------------------------------------------------------

RFC7386 = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize("target,patch,result", RFC7386)
def test_json_merge_patch_rfc7386(target: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy(target)
    assert json_merge_patch(target, patch) == result
    assert target == before


# --------------------------------------------------------------------------
# RFC 6902 appendix A
# --------------------------------------------------------------------------

RFC6902_OK = [
    ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}],
     {"baz": "qux", "foo": "bar"}),
    ({"foo": ["bar", "baz"]}, [{"op": "add", "path": "/foo/1", "value": "qux"}],
     {"foo": ["bar", "qux", "baz"]}),
    ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
    ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}],
     {"foo": ["bar", "baz"]}),
    ({"baz": "qux", "foo": "bar"}, [{"op": "replace", "path": "/baz", "value": "boo"}],
     {"baz": "boo", "foo": "bar"}),
    ({"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
     [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
     {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}}),
    ({"foo": ["all", "grass", "cows", "eat"]}, [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
     {"foo": ["all", "cows", "eat", "grass"]}),
    ({"baz": "qux", "foo": ["a", 2, "c"]},
     [{"op": "test", "path": "/baz", "value": "qux"}, {"op": "test", "path": "/foo/1", "value": 2}],
     {"baz": "qux", "foo": ["a", 2, "c"]}),
    ({"foo": "bar"}, [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
     {"foo": "bar", "child": {"grandchild": {}}}),
    ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}],
     {"foo": "bar", "baz": "qux"}),
    ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": 10}], {"/": 9, "~1": 10}),
    ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
     {"foo": ["bar", ["abc", "def"]]}),
    # Beyond the appendix: copy, root replacement, escaped "/".
    ({"a": {"b": [1]}}, [{"op": "copy", "from": "/a/b", "path": "/c"}],
     {"a": {"b": [1]}, "c": [1]}),
    ({"a": 1}, [{"op": "replace", "path": "", "value": {"z": 2}}], {"z": 2}),
    ({"a/b": 1}, [{"op": "replace", "path": "/a~1b", "value": 2}], {"a/b": 2}),
]


@pytest.mark.parametrize("doc,ops,result", RFC6902_OK)
def test_json_patch_rfc6902(doc: Any, ops: list[Any], result: Any) -> None:
    before = copy.deepcopy(doc)
    assert json_patch(doc, ops) == result
    assert doc == before


RFC6902_INVALID = [
    ({"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}]),  # A.9
    ({"foo": "bar"}, [{"op": "add", "path": "/baz/bat", "value": "qux"}]),  # A.12
    ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": "10"}]),  # A.15
    ({"a": True}, [{"op": "test", "path": "/a", "value": 1}]),  # bool is not a number
    ({"a": 1}, [{"op": "test", "path": "/missing", "value": None}]),
    ({"a": 1}, [{"op": "remove", "path": "/b"}]),
    ({"a": 1}, [{"op": "replace", "path": "/b", "value": 1}]),
    ({"a": [1]}, [{"op": "add", "path": "/a/5", "value": 1}]),
    ({"a": [1]}, [{"op": "add", "path": "/a/01", "value": 1}]),
    ({"a": [1]}, [{"op": "remove", "path": "/a/-"}]),
    ({"a": {"b": 1}}, [{"op": "move", "from": "/a", "path": "/a/b/c"}]),
    ({"a": 1}, [{"op": "add", "path": "a", "value": 1}]),
    ({"a": 1}, [{"op": "add", "path": "/~2", "value": 1}]),
    ({"a": 1}, [{"op": "frob", "path": "/a"}]),
]


@pytest.mark.parametrize("doc,ops", RFC6902_INVALID)
def test_json_patch_failures_are_invalid(doc: Any, ops: list[Any]) -> None:
    before = copy.deepcopy(doc)
    with pytest.raises(Invalid) as err:
        json_patch(doc, ops)
    assert err.value.code == 422
    assert doc == before


def test_json_patch_is_atomic() -> None:
    doc = {"a": 1}
    with pytest.raises(Invalid):
        json_patch(doc, [{"op": "add", "path": "/b", "value": 2},
                         {"op": "test", "path": "/a", "value": 2}])
    assert doc == {"a": 1}


@pytest.mark.parametrize("ops", [
    {"op": "add", "path": "/a", "value": 1},
    "nope",
    [{"path": "/a", "value": 1}],
    ["add"],
    [{"op": "add", "value": 1}],
    [{"op": "add", "path": "/a"}],
    [{"op": "move", "path": "/a"}],
])
def test_json_patch_malformed_is_bad_request(ops: Any) -> None:
    with pytest.raises(BadRequest) as err:
        json_patch({"a": 1}, ops)
    assert err.value.code == 400


# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------

_keys = st.sampled_from(["a", "b", "c", "d", "name", "x-y"])
_scalars = st.one_of(st.booleans(), st.integers(-5, 5), st.text(max_size=3))


def _json(nulls: bool) -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), _scalars) if nulls else _scalars
    return st.recursive(
        leaves,
        lambda children: st.one_of(st.lists(children, max_size=3),
                                   st.dictionaries(_keys, children, max_size=4)),
        max_leaves=12,
    )


@settings(max_examples=300, deadline=None)
@given(_json(nulls=True), _json(nulls=False))
def test_create_merge_patch_round_trips(a: Any, b: Any) -> None:
    assert json_merge_patch(a, create_merge_patch(a, b)) == b


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _json(nulls=True), max_size=4),
       st.dictionaries(_keys, _json(nulls=True), max_size=4))
def test_strategic_merge_with_empty_schema_is_json_merge(doc: dict[str, Any],
                                                         patch: dict[str, Any]) -> None:
    assert strategic_merge_patch(doc, patch, {}) == json_merge_patch(doc, patch)


# Objects for the three-way property: a keyed list whose items hold a nested
# keyed list, a primitive set and free-form JSON everywhere else.
THREE_WAY_SCHEMA: dict[str, Any] = {
    "items": keyed("name", {"ports": keyed("port")}),
    "tags": PRIMITIVE_SET,
    "meta": {"tags": PRIMITIVE_SET},
}


def _objects(nulls: bool) -> st.SearchStrategy[dict[str, Any]]:
    port = st.fixed_dictionaries({"port": st.integers(1, 4)},
                                 optional={"proto": st.sampled_from(["TCP", "UDP"])})
    item = st.fixed_dictionaries(
        {"name": st.sampled_from(["p", "q", "r", "s"])},
        optional={"image": st.text(max_size=2), "x": _json(nulls),
                  "ports": st.lists(port, max_size=3, unique_by=lambda p: p["port"])},
    )
    return st.fixed_dictionaries({}, optional={
        "items": st.lists(item, max_size=4, unique_by=lambda i: i["name"]),
        "tags": st.lists(st.sampled_from(["t1", "t2", "t3", "t4"]), max_size=4, unique=True),
        "meta": st.fixed_dictionaries({}, optional={
            "tags": st.lists(st.sampled_from(["u1", "u2"]), unique=True),
            "labels": st.dictionaries(_keys, st.text(max_size=2), max_size=3)}),
        "a": _json(nulls),
        "b": _json(nulls),
    })


def _contains(have: Any, want: Any, node: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            k in have and _contains(have[k], v, node.get(k) if isinstance(node, dict) else None)
            for k, v in want.items())
    if isinstance(want, list) and isinstance(node, ListSchema) and node.strategy == "merge":
        if not isinstance(have, list):
            return False
        if node.merge_key is None:
            return all(any(json_equal(h, w) for h in have) for w in want)
        by_key = {h[node.merge_key]: h for h in have}
        return all(w[node.merge_key] in by_key
                   and _contains(by_key[w[node.merge_key]], w, node.item) for w in want)
    return json_equal(have, want)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), _objects(nulls=False)), _objects(nulls=False),
       _objects(nulls=True))
def test_three_way_patch_reaches_modified(original: dict[str, Any] | None,
                                          modified: dict[str, Any],
                                          current: dict[str, Any]) -> None:
    inputs = copy.deepcopy((original, modified, current))
    patch = three_way_merge_patch(original, modified, current, THREE_WAY_SCHEMA)
    assert (original, modified, current) == inputs  # nothing mutated
    out = strategic_merge_patch(current, patch, THREE_WAY_SCHEMA)
    assert _contains(out, modified, THREE_WAY_SCHEMA), (patch, out)
    for key in original or {}:
        if key not in modified:
            assert key not in out
    # Items removed from the last-applied configuration are gone too.
    dropped = {i["name"] for i in (original or {}).get("items", [])} - {
        i["name"] for i in modified.get("items", [])}
    assert not dropped & {i["name"] for i in out.get("items", [])}
    assert _directive_keys(out) == []
