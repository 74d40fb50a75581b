"""The bad-input suite: what an attacker or a careless client sends never gets a 5xx.

Against one real `fleet server` (controllers, scheduler and all, no agent),
over HTTPS on 127.0.0.1, every class of bad input the reliability issue
lists: malformed and oversized bodies, hostile JSON (depth, surrogates, NaN,
huge numbers, duplicate keys), YAML alias bombs and cycles, wrong content
types and random bytes as protobuf, invalid names, selectors and query
values, hostile patches of every patch type, and a typed-wrong value at
random schema paths of every built-in kind (hypothesis, derandomized so CI
sees the same cases).  Each refused request must be a 4xx with a Status body,
and must change nothing: a refused create leaves no object, a refused patch
leaves the resourceVersion where it was.  At the end the server still
answers /readyz and a normal create/get/delete, it logged no internal error,
and its RSS is within bounds of where it started.

The request count and status histogram are printed at module teardown (and
written to $FLEET_BAD_INPUT_REPORT as JSON when set; docs/reliability.md
quotes them).
"""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.api import schema, typecheck
from tests.e2e.badinput import Tally, assert_server_healthy, refused

NS = "bad-input"
TALLY = Tally("bad-input")
send = TALLY.send


@pytest.fixture(scope="module")
def api(fleet_server) -> Iterator[httpx.Client]:  # type: ignore[no-untyped-def]
    with fleet_server.client(timeout=30.0) as c:
        r = c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": NS}})
        assert r.status_code == 201, r.text
        yield c
    TALLY.report()


# ---------------------------------------------------------------------------
# One valid object per built-in kind: the base every hostile change starts from.
# ---------------------------------------------------------------------------

POD_SPEC = {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80}],
                            "resources": {"requests": {"cpu": "100m"}}}]}
TEMPLATE = {"metadata": {"labels": {"app": "x"}}, "spec": POD_SPEC}
SELECTOR = {"matchLabels": {"app": "x"}}

KINDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # kind: (apiVersion, collection path, body without apiVersion/kind/metadata)
    "ConfigMap": ("v1", f"/api/v1/namespaces/{NS}/configmaps", {"data": {"a": "b"}}),
    "Secret": ("v1", f"/api/v1/namespaces/{NS}/secrets", {"data": {"a": "YQ=="}}),
    "Pod": ("v1", f"/api/v1/namespaces/{NS}/pods", {"spec": POD_SPEC}),
    "Service": ("v1", f"/api/v1/namespaces/{NS}/services",
                {"spec": {"selector": {"app": "x"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
    "Endpoints": ("v1", f"/api/v1/namespaces/{NS}/endpoints",
                  {"subsets": [{"addresses": [{"ip": "10.42.0.9"}], "ports": [{"port": 80}]}]}),
    "ServiceAccount": ("v1", f"/api/v1/namespaces/{NS}/serviceaccounts", {}),
    "Event": ("v1", f"/api/v1/namespaces/{NS}/events",
              {"involvedObject": {"kind": "Pod", "name": "p", "namespace": NS}, "reason": "R",
               "message": "m", "type": "Normal", "count": 1}),
    "PersistentVolumeClaim": ("v1", f"/api/v1/namespaces/{NS}/persistentvolumeclaims",
                              {"spec": {"accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": "1Gi"}}}}),
    "ResourceQuota": ("v1", f"/api/v1/namespaces/{NS}/resourcequotas", {"spec": {"hard": {"pods": "1000"}}}),
    "LimitRange": ("v1", f"/api/v1/namespaces/{NS}/limitranges",
                   {"spec": {"limits": [{"type": "Container", "max": {"cpu": "64"}}]}}),
    "Namespace": ("v1", "/api/v1/namespaces", {}),
    "Node": ("v1", "/api/v1/nodes", {"spec": {"unschedulable": True}}),
    "Deployment": ("apps/v1", f"/apis/apps/v1/namespaces/{NS}/deployments",
                   {"spec": {"replicas": 0, "selector": SELECTOR, "template": TEMPLATE}}),
    "ReplicaSet": ("apps/v1", f"/apis/apps/v1/namespaces/{NS}/replicasets",
                   {"spec": {"replicas": 0, "selector": SELECTOR, "template": TEMPLATE}}),
    "StatefulSet": ("apps/v1", f"/apis/apps/v1/namespaces/{NS}/statefulsets",
                    {"spec": {"replicas": 0, "serviceName": "x", "selector": SELECTOR, "template": TEMPLATE}}),
    "DaemonSet": ("apps/v1", f"/apis/apps/v1/namespaces/{NS}/daemonsets",
                  {"spec": {"selector": SELECTOR, "template": TEMPLATE}}),
    "ControllerRevision": ("apps/v1", f"/apis/apps/v1/namespaces/{NS}/controllerrevisions",
                           {"revision": 1, "data": {"spec": {}}}),
    "Job": ("batch/v1", f"/apis/batch/v1/namespaces/{NS}/jobs",
            {"spec": {"suspend": True, "template": {"spec": {**POD_SPEC, "restartPolicy": "Never"}}}}),
    "CronJob": ("batch/v1", f"/apis/batch/v1/namespaces/{NS}/cronjobs",
                {"spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {"spec": {"template": {
                    "spec": {**POD_SPEC, "restartPolicy": "Never"}}}}}}),
    "Lease": ("coordination.k8s.io/v1", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
              {"spec": {"holderIdentity": "me", "leaseDurationSeconds": 10}}),
    "PriorityClass": ("scheduling.k8s.io/v1", "/apis/scheduling.k8s.io/v1/priorityclasses", {"value": 10}),
    "PodDisruptionBudget": ("policy/v1", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
                            {"spec": {"minAvailable": 1, "selector": SELECTOR}}),
    "events.k8s.io/Event": ("events.k8s.io/v1", f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
                            {"eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "fleet.dev/x",
                             "reportingInstance": "x-1", "action": "Test", "reason": "Testing", "type": "Normal",
                             "regarding": {"kind": "Pod", "name": "p", "namespace": NS}}),
    "PersistentVolume": ("v1", "/api/v1/persistentvolumes",
                         {"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                   "storageClassName": "bad-input", "hostPath": {"path": "/tmp/bad-input"}}}),
    "StorageClass": ("storage.k8s.io/v1", "/apis/storage.k8s.io/v1/storageclasses",
                     {"provisioner": "example.com/bad-input", "parameters": {"a": "b"}}),
    "CSIDriver": ("storage.k8s.io/v1", "/apis/storage.k8s.io/v1/csidrivers", {"spec": {"attachRequired": False}}),
    "CSINode": ("storage.k8s.io/v1", "/apis/storage.k8s.io/v1/csinodes",
                {"spec": {"drivers": [{"name": "example.com", "nodeID": "n1"}]}}),
    "CSIStorageCapacity": ("storage.k8s.io/v1", f"/apis/storage.k8s.io/v1/namespaces/{NS}/csistoragecapacities",
                           {"storageClassName": "bad-input", "capacity": "1Gi"}),
    # An inline volume's attachment: the attach/detach controller deletes unneeded PV ones.
    "VolumeAttachment": ("storage.k8s.io/v1", "/apis/storage.k8s.io/v1/volumeattachments",
                         {"spec": {"attacher": "example.com", "nodeName": "n1", "source": {"inlineVolumeSpec": {
                             "accessModes": ["ReadWriteOnce"], "csi": {"driver": "example.com",
                                                                       "volumeHandle": "h"}}}}}),
    "HorizontalPodAutoscaler": ("autoscaling/v2", f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers",
                                {"spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                             "name": "x"}, "maxReplicas": 3}}),
}

_names = iter(range(10**9))


def kind_name(key: str) -> str:
    return key.rpartition("/")[2]  # "events.k8s.io/Event" → "Event"


def fresh(key: str) -> dict[str, Any]:
    api_version, _, body = KINDS[key]
    name = f"{kind_name(key).lower()}-{next(_names)}"
    return {"apiVersion": api_version, "kind": kind_name(key), "metadata": {"name": name},
            **copy.deepcopy(body)}


def item_path(kind: str, name: str) -> str:
    return f"{KINDS[kind][1]}/{name}"


def create_ok(c: httpx.Client, kind: str) -> dict[str, Any]:
    obj = fresh(kind)
    r = send(c, "control", "POST", KINDS[kind][1], body=json.dumps(obj).encode())
    assert r.status_code == 201, (kind, r.status_code, r.text[:600])
    return r.json()


def stable(obj: dict[str, Any]) -> dict[str, Any]:
    """What a client's write changes and controllers leave alone (they write status,
    annotations such as a Deployment's revision, and so the resourceVersion)."""
    md = obj["metadata"]
    # A Node's spec is its controllers' too (pod CIDR from node IPAM, taints).
    skip = ("metadata", "status", "spec") if obj.get("kind") == "Node" else ("metadata", "status")
    return {**{k: v for k, v in obj.items() if k not in skip},
            "metadata": {k: md.get(k) for k in ("name", "namespace", "uid", "labels", "ownerReferences",
                                                "creationTimestamp", *(("generation",) if "spec" not in skip else ()))}}


def absent(c: httpx.Client, kind: str, name: str) -> None:
    r = send(c, "control", "GET", item_path(kind, name))
    assert r.status_code == 404, f"{kind} {name} was stored: {r.text[:400]}"


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


RSS: dict[str, int] = {}


def test_aaa_rss_before(api: httpx.Client, fleet_server) -> None:  # type: ignore[no-untyped-def]
    # Warm up the paths the suite uses, so "before" is a server that has served.
    for _ in range(20):
        create_ok(api, "ConfigMap")
    RSS["before"] = _rss_kib(fleet_server.pid)


# ---------------------------------------------------------------------------
# Typed-wrong values at schema paths (hypothesis)
# ---------------------------------------------------------------------------

Step = tuple[str, str]  # ("field", name) | ("item", "") | ("key", "")


def schema_paths(type_name: str, max_depth: int = 7) -> list[tuple[tuple[Step, ...], Any, str, str]]:
    """Every (steps, leaf expr, owner type, field) reachable from `type_name`."""
    out: list[tuple[tuple[Step, ...], Any, str, str]] = []

    def walk(expr: Any, steps: tuple[Step, ...], owner: str, fname: str, seen: frozenset[str]) -> None:
        out.append((steps, expr, owner, fname))
        if len(steps) >= max_depth or isinstance(expr, str):
            return
        if "ref" in expr:
            if expr["ref"] in seen:
                return
            for f, spec in schema.types()[expr["ref"]]["fields"].items():
                if not steps and f in ("apiVersion", "kind"):
                    continue
                walk(spec["type"], (*steps, ("field", f)), expr["ref"], f, seen | {expr["ref"]})
        elif "list" in expr:
            walk(expr["list"], (*steps, ("item", "")), owner, fname, seen)
        else:
            walk(expr["map"], (*steps, ("key", "")), owner, fname, seen)

    walk({"ref": type_name}, (), "", "", frozenset())
    return [p for p in out if p[0] and wrong_values(p[1], p[2], p[3])]


def wrong_values(expr: Any, owner: str, fname: str) -> list[Any]:
    """JSON values that are certainly not of the type `expr` describes."""
    obj, arr, num, frac, text, flag = {"x": 1}, [1], 7, 1.5, "seven", True
    if not isinstance(expr, str):
        return [num, text, flag, arr] if "list" not in expr else [num, text, flag, obj]
    if (owner, fname) in typecheck.QUANTITY_FIELDS:
        return [flag, obj, arr, "not-a-quantity"]
    if (owner, fname) in typecheck.INT_OR_STRING_FIELDS:
        return [flag, obj, arr, frac, 2**40]
    return {
        "string": [num, flag, obj, arr, frac],
        "integer": [text, flag, obj, arr, frac, 2**64] if fname in typecheck.INT64_FIELDS
        else [text, flag, obj, arr, frac, 2**31],
        "boolean": [text, num, obj, arr],
        "number": [text, flag, obj, arr],
        "date-time": [num, flag, obj, arr, "yesterday"],
        "date": [num, flag, obj, arr],
        "byte": [num, flag, obj, arr, "not base64!"],
    }.get(expr, [])


def put_at(obj: dict[str, Any], steps: tuple[Step, ...], value: Any) -> dict[str, Any]:
    """`obj` with `value` at `steps`, building what is missing on the way."""
    cur: Any = obj
    for i, (kind, name) in enumerate(steps):
        last = i == len(steps) - 1
        nxt_kind = None if last else steps[i + 1][0]
        blank: Any = [] if nxt_kind == "item" else {}
        if kind == "field":
            if last:
                cur[name] = value
            else:
                if not isinstance(cur.get(name), dict | list) or (nxt_kind == "item") != isinstance(cur.get(name), list):
                    cur[name] = blank
                cur = cur[name]
        elif kind == "item":
            if last:
                cur[:] = [value] if not cur else [value, *cur[1:]]
            else:
                if not cur or not isinstance(cur[0], dict | list):
                    cur[:] = [blank]
                cur = cur[0]
        else:
            if last:
                cur["hostile"] = value
            else:
                if not isinstance(cur.get("hostile"), dict | list):
                    cur["hostile"] = blank
                cur = cur["hostile"]
    return obj


def patch_at(steps: tuple[Step, ...], value: Any) -> dict[str, Any]:
    return put_at({}, steps, value)


def _paths_for(kind: str) -> list[tuple[tuple[Step, ...], Any, str, str]]:
    api_version = KINDS[kind][0]
    group, _, version = api_version.rpartition("/")
    root = schema.root_type(group, version, kind_name(kind))
    assert root is not None, f"no schema for {kind}"
    return schema_paths(root)


PATHS = {kind: _paths_for(kind) for kind in KINDS}
HYP = settings(max_examples=80, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _path_and_value(kind: str) -> st.SearchStrategy[tuple[tuple[Step, ...], Any]]:
    return st.sampled_from(PATHS[kind]).flatmap(
        lambda p: st.tuples(st.just(p[0]), st.sampled_from(wrong_values(p[1], p[2], p[3]))))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_typed_wrong_field_on_create_is_refused_and_stores_nothing(api: httpx.Client, kind: str) -> None:
    @HYP
    @given(_path_and_value(kind))
    def run(case: tuple[tuple[Step, ...], Any]) -> None:
        steps, value = case
        obj = put_at(fresh(kind), steps, value)
        name = obj["metadata"].get("name") if isinstance(obj.get("metadata"), dict) else None
        r = send(api, "typed-wrong create", "POST", KINDS[kind][1], body=json.dumps(obj).encode())
        refused(r)
        if isinstance(name, str) and name:
            absent(api, kind, name)

    run()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_typed_wrong_field_in_a_merge_patch_is_refused_and_changes_nothing(api: httpx.Client,
                                                                          kind: str) -> None:
    target = create_ok(api, kind)
    name = target["metadata"]["name"]

    @HYP
    @given(_path_and_value(kind))
    def run(case: tuple[tuple[Step, ...], Any]) -> None:
        steps, value = case
        if steps[0] == ("field", "metadata") and len(steps) > 1 and steps[1][1] in ("name", "namespace"):
            return  # a rename is refused too, but as a 400 before typing; covered below
        r = send(api, "typed-wrong patch", "PATCH", item_path(kind, name),
                 body=json.dumps(patch_at(steps, value)).encode(), ctype="application/merge-patch+json")
        refused(r)
        got = send(api, "control", "GET", item_path(kind, name))
        assert got.status_code == 200 and stable(got.json()) == stable(target), got.text[:400]

    run()


# ---------------------------------------------------------------------------
# Malformed and oversized bodies, hostile JSON and YAML
# ---------------------------------------------------------------------------

def _nested(depth: int) -> bytes:
    return b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep"},"data":' + \
        b'{"a":' * depth + b'"x"' + b"}" * depth + b"}"


LAUGHS = "\n".join(
    ["apiVersion: v1", "kind: ConfigMap", "metadata: {name: laughs}", 'a: &a ["lol","lol","lol","lol","lol"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(9)]
).encode()

BODIES: list[tuple[str, bytes, str, tuple[int, ...]]] = [
    # (what, body, content type, acceptable codes)
    ("empty object", b"{}", "application/json", (422,)),
    ("null metadata", b'{"apiVersion":"v1","kind":"ConfigMap","metadata":null}', "application/json", (422,)),
    ("metadata a number", b'{"metadata":5}', "application/json", (400, 422)),
    ("metadata a list", b'{"metadata":[]}', "application/json", (400, 422)),
    ("null", b"null", "application/json", (400,)),
    ("a list", b"[]", "application/json", (400,)),
    ("a string", b'"configmap"', "application/json", (400,)),
    ("true", b"true", "application/json", (400,)),
    ("a number", b"5", "application/json", (400,)),
    ("empty", b"", "application/json", (400,)),
    ("whitespace", b"   \n", "application/json", (400,)),
    ("truncated", b'{"metadata":{"name":"t"', "application/json", (400,)),
    ("trailing garbage", b'{"metadata":{"name":"t"}} x', "application/json", (400,)),
    ("depth 1000", _nested(1000), "application/json", (400,)),
    ("depth 100000", _nested(100000), "application/json", (400,)),
    ("lone surrogate", b'{"metadata":{"name":"s"},"data":{"a":"\\ud800"}}', "application/json", (400,)),
    ("surrogate in a key", b'{"metadata":{"name":"s"},"data":{"\\udfff":"a"}}', "application/json", (400,)),
    ("invalid utf-8", b'{"metadata":{"name":"s"},"data":{"a":"\xff\xfe"}}', "application/json", (400,)),
    ("utf-16", '{"metadata":{"name":"s"}}'.encode("utf-16"), "application/json", (400,)),
    ("NaN", b'{"metadata":{"name":"s"},"data":{"a":NaN}}', "application/json", (400,)),
    ("Infinity", b'{"metadata":{"name":"s"},"immutable":Infinity}', "application/json", (400,)),
    ("float overflow", b'{"metadata":{"name":"s"},"immutable":1e999}', "application/json", (400,)),
    ("huge integer", b'{"metadata":{"name":"s"},"immutable":' + b"9" * 100 + b"}", "application/json", (400,)),
    ("5000-digit integer", b'{"metadata":{"name":"s"},"immutable":' + b"9" * 5000 + b"}", "application/json",
     (400,)),
    ("duplicate keys, strict", b'{"metadata":{"name":"d1","name":"d2"}}', "application/json", (400,)),
    ("wrong kind", b'{"apiVersion":"v1","kind":"Secret","metadata":{"name":"k"}}', "application/json", (400,)),
    ("wrong apiVersion", b'{"apiVersion":"v2","kind":"ConfigMap","metadata":{"name":"k"}}',
     "application/json", (400,)),
    ("kind a number", b'{"apiVersion":"v1","kind":5,"metadata":{"name":"k"}}', "application/json", (400,)),
    ("name a number", b'{"metadata":{"name":5}}', "application/json", (422,)),
    ("name too long", json.dumps({"metadata": {"name": "a" * 300}}).encode(), "application/json", (422,)),
    ("name with a slash", b'{"metadata":{"name":"a/b"}}', "application/json", (422,)),
    ("labels a list", b'{"metadata":{"name":"l","labels":["a"]}}', "application/json", (422,)),
    ("label value a number", b'{"metadata":{"name":"l","labels":{"a":5}}}', "application/json", (422,)),
    ("owner reference incomplete", b'{"metadata":{"name":"o","ownerReferences":[{"kind":"","name":5}]}}',
     "application/json", (422,)),
    ("owner reference uid a number", b'{"metadata":{"name":"o","ownerReferences":[{"uid":5}]}}',
     "application/json", (422,)),
    ("managedFields garbage", b'{"metadata":{"name":"m","managedFields":[{"manager":5}]}}',
     "application/json", (422,)),
    ("data a string", b'{"metadata":{"name":"d"},"data":"x"}', "application/json", (422,)),
    ("over 3 MiB", b'{"metadata":{"name":"big"},"data":{"a":"' + b"x" * (3 * 1024 * 1024) + b'"}}',
     "application/json", (413,)),
    ("yaml alias bomb", LAUGHS, "application/yaml", (400, 413)),
    ("yaml alias cycle", b"apiVersion: v1\nkind: ConfigMap\nmetadata: &m {name: cyc, labels: *m}\n",
     "application/yaml", (400,)),
    ("yaml self list", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cyc}\ndata: &a [*a]\n",
     "application/yaml", (400,)),
    ("yaml not a mapping", b"- a\n- b\n", "application/yaml", (400,)),
    ("yaml binary", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bin}\ndata: {a: !!binary aGk=}\n",
     "application/yaml", (400,)),
    ("yaml python tag", b"!!python/object/apply:os.system ['true']\n", "application/yaml", (400,)),
    ("yaml deep", b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "application/yaml", (400,)),
    ("text/plain", b'{"metadata":{"name":"t"}}', "text/plain", (415,)),
    ("xml", b"<configmap/>", "application/xml", (415,)),
    ("protobuf without magic", b"\x00\x01\x02", "application/vnd.kubernetes.protobuf", (400,)),
    ("protobuf truncated", b"k8s\x00\x0a\xff\xff\xff\xff\x0f", "application/vnd.kubernetes.protobuf", (400,)),
    ("json sent as protobuf", b'{"metadata":{"name":"p"}}', "application/vnd.kubernetes.protobuf", (400,)),
]


@pytest.mark.parametrize(("what", "body", "ctype", "codes"), BODIES, ids=[b[0] for b in BODIES])
def test_malformed_bodies_are_refused(api: httpx.Client, what: str, body: bytes, ctype: str,
                                      codes: tuple[int, ...]) -> None:
    before = send(api, "control", "GET", KINDS["ConfigMap"][1]).json()["items"]
    r = send(api, "malformed body", "POST", KINDS["ConfigMap"][1], body=body, ctype=ctype,
             params={"fieldValidation": "Strict"})
    refused(r, *codes)
    after = send(api, "control", "GET", KINDS["ConfigMap"][1]).json()["items"]
    assert [o["metadata"]["name"] for o in after] == [o["metadata"]["name"] for o in before]


def test_yaml_keeps_timestamps_as_strings_and_numeric_keys_as_text(api: httpx.Client) -> None:
    body = (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: yaml-ok}\n"
            b"data: {when: 2020-01-01T00:00:00Z, 1: one}\n")
    r = send(api, "control", "POST", KINDS["ConfigMap"][1], body=body, ctype="application/yaml")
    assert r.status_code == 201, r.text
    assert r.json()["data"] == {"when": "2020-01-01T00:00:00Z", "1": "one"}


@HYP
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_as_protobuf_are_refused(api: httpx.Client, raw: bytes, magic: bool) -> None:
    body = (b"k8s\x00" + raw) if magic else raw
    r = send(api, "random protobuf", "POST", KINDS["ConfigMap"][1], body=body,
             ctype="application/vnd.kubernetes.protobuf")
    if r.status_code == 201:  # random bytes that happen to decode to a valid ConfigMap: fine, not a crash
        return
    refused(r)


@HYP
@given(st.binary(max_size=300))
def test_random_bytes_as_json_and_yaml_are_refused(api: httpx.Client, raw: bytes) -> None:
    for ctype in ("application/json", "application/yaml"):
        r = send(api, "random json/yaml", "POST", KINDS["ConfigMap"][1], body=raw, ctype=ctype)
        refused(r)


def test_unknown_fields_are_dropped_with_a_warning_and_refused_when_strict(api: httpx.Client) -> None:
    obj = fresh("ConfigMap")
    obj["bogus"] = {"deep": 1}
    obj["metadata"]["alsoBogus"] = 1
    r = send(api, "unknown fields", "POST", KINDS["ConfigMap"][1], body=json.dumps(obj).encode())
    assert r.status_code == 201, r.text
    assert "bogus" not in r.json() and "alsoBogus" not in r.json()["metadata"]
    assert 'unknown field \\"bogus\\"' in r.headers.get("warning", "")
    got = send(api, "control", "GET", item_path("ConfigMap", obj["metadata"]["name"])).json()
    assert "bogus" not in got
    obj = fresh("ConfigMap")
    obj["bogus"] = 1
    r = send(api, "unknown fields", "POST", KINDS["ConfigMap"][1], body=json.dumps(obj).encode(),
             params={"fieldValidation": "Strict"})
    refused(r, 400)
    absent(api, "ConfigMap", obj["metadata"]["name"])


def test_a_deployment_with_replicas_past_int32_is_422(api: httpx.Client) -> None:
    for replicas in (2**31, 2**63 - 1, -(2**31) - 1):
        obj = fresh("Deployment")
        obj["spec"]["replicas"] = replicas
        body = refused(send(api, "int32 range", "POST", KINDS["Deployment"][1], body=json.dumps(obj).encode()),
                       422)
        assert any(c["field"] == "spec.replicas" for c in body["details"]["causes"]), body
        absent(api, "Deployment", obj["metadata"]["name"])
    d = create_ok(api, "Deployment")
    path = item_path("Deployment", d["metadata"]["name"])
    refused(send(api, "int32 range", "PATCH", path, body=b'{"spec":{"replicas":2147483648}}',
                 ctype="application/merge-patch+json"), 422)
    refused(send(api, "int32 range", "PATCH", f"{path}/scale", body=b'{"spec":{"replicas":2147483648}}',
                 ctype="application/merge-patch+json"), 422)
    got = send(api, "control", "GET", path).json()
    assert got["spec"]["replicas"] == 0


def test_status_5_patch_names_status(api: httpx.Client) -> None:
    pod = create_ok(api, "Pod")
    path = item_path("Pod", pod["metadata"]["name"])
    for sub in ("", "/status"):
        body = refused(send(api, "status 5", "PATCH", path + sub, body=b'{"status": 5}',
                            ctype="application/merge-patch+json"), 422)
        assert [c["field"] for c in body["details"]["causes"]] == ["status"], body
        assert "status" in body["message"]
    refused(send(api, "status 5", "PATCH", path + "/status", body=b'{"status": {"phase": 5}}',
                 ctype="application/merge-patch+json"), 422)
    refused(send(api, "status 5", "PATCH", path, body=b'{"spec":{"nodeName":"no-such-node"}}',
                 ctype="application/strategic-merge-patch+json"), 422)
    got = send(api, "control", "GET", path).json()
    assert stable(got) == stable(pod) and not got["spec"].get("nodeName")


# ---------------------------------------------------------------------------
# Hostile patches of every patch type
# ---------------------------------------------------------------------------

MERGE, JSONP, SMP = ("application/merge-patch+json", "application/json-patch+json",
                     "application/strategic-merge-patch+json")

PATCHES: list[tuple[str, str, bytes]] = [
    ("merge true", MERGE, b"true"),
    ("merge list", MERGE, b"[]"),
    ("merge number", MERGE, b"5"),
    ("merge null", MERGE, b"null"),
    ("merge metadata 5", MERGE, b'{"metadata":5}'),
    ("merge rename", MERGE, b'{"metadata":{"name":"other"}}'),
    ("merge namespace", MERGE, b'{"metadata":{"namespace":"default"}}'),
    ("merge kind", MERGE, b'{"kind":"Secret"}'),
    ("merge apiVersion", MERGE, b'{"apiVersion":"v2"}'),
    ("merge spec string", MERGE, b'{"spec":"x"}'),
    ("merge containers a map", MERGE, b'{"spec":{"containers":{"a":1}}}'),
    ("merge containers null", MERGE, b'{"spec":{"containers":null}}'),
    ("merge stale rv", MERGE, b'{"metadata":{"resourceVersion":"1"}}'),
    ("merge rv garbage", MERGE, b'{"metadata":{"resourceVersion":"abc"}}'),
    ("merge rv with a space", MERGE, b'{"metadata":{"resourceVersion":" 5"}}'),
    ("merge rv underscored", MERGE, b'{"metadata":{"resourceVersion":"1_0"}}'),
    ("merge rv a number", MERGE, b'{"metadata":{"resourceVersion":5}}'),
    ("merge uid", MERGE, b'{"metadata":{"uid":5}}'),
    ("merge finalizers a string", MERGE, b'{"metadata":{"finalizers":"x"}}'),
    ("merge deep", MERGE, b'{"spec":' + b'{"a":' * 2000 + b"1" + b"}" * 2001),
    ("json not a list", JSONP, b'{"op":"add"}'),
    ("json op a number", JSONP, b"[5]"),
    ("json unknown op", JSONP, b'[{"op":"frobnicate","path":"/spec"}]'),
    ("json no path", JSONP, b'[{"op":"add","value":1}]'),
    ("json path a number", JSONP, b'[{"op":"add","path":5,"value":1}]'),
    ("json path without slash", JSONP, b'[{"op":"add","path":"spec","value":1}]'),
    ("json path to nowhere", JSONP, b'[{"op":"replace","path":"/no/such/field","value":1}]'),
    ("json remove missing", JSONP, b'[{"op":"remove","path":"/spec/nothing"}]'),
    ("json index out of range", JSONP, b'[{"op":"add","path":"/spec/containers/99999999999999999999","value":{}}]'),
    ("json negative index", JSONP, b'[{"op":"add","path":"/spec/containers/-2","value":{}}]'),
    ("json index garbage", JSONP, b'[{"op":"replace","path":"/spec/containers/x/image","value":"a"}]'),
    ("json failed test", JSONP, b'[{"op":"test","path":"/metadata/name","value":"other"}]'),
    ("json replace root", JSONP, b'[{"op":"replace","path":"","value":5}]'),
    ("json replace root list", JSONP, b'[{"op":"replace","path":"","value":[]}]'),
    ("json move from missing", JSONP, b'[{"op":"move","from":"/nope","path":"/spec/x"}]'),
    ("json move into itself", JSONP, b'[{"op":"move","from":"/spec","path":"/spec/inner"}]'),
    ("json copy from a number", JSONP, b'[{"op":"copy","from":5,"path":"/spec/x"}]'),
    ("json set status 5", JSONP, b'[{"op":"add","path":"/status","value":5}]'),
    ("json set replicas huge", JSONP, b'[{"op":"add","path":"/spec/x","value":' + b"9" * 30 + b"}]"),
    ("json escaped path", JSONP, b'[{"op":"add","path":"/metadata/labels/a~2b","value":"x"}]'),
    ("smp list", SMP, b"[1]"),
    ("smp root delete", SMP, b'{"$patch":"delete"}'),
    ("smp root replace", SMP, b'{"$patch":"replace"}'),
    ("smp unknown directive", SMP, b'{"$patch":"frobnicate"}'),
    ("smp directive a number", SMP, b'{"spec":{"$patch":5}}'),
    ("smp setElementOrder a number", SMP, b'{"spec":{"$setElementOrder/containers":5}}'),
    ("smp setElementOrder garbage", SMP, b'{"spec":{"$setElementOrder/containers":[5,{"x":1}]}}'),
    ("smp retainKeys a number", SMP, b'{"spec":{"$retainKeys":5}}'),
    ("smp retainKeys garbage", SMP, b'{"spec":{"$retainKeys":[5]}}'),
    ("smp deleteFromPrimitiveList a number", SMP, b'{"metadata":{"$deleteFromPrimitiveList/finalizers":5}}'),
    ("smp delete item without key", SMP, b'{"spec":{"containers":[{"$patch":"delete"}]}}'),
    ("smp item not an object", SMP, b'{"spec":{"containers":[5]}}'),
    ("smp item key a number", SMP, b'{"spec":{"containers":[{"name":5}]}}'),
    ("smp containers a string", SMP, b'{"spec":{"containers":"x"}}'),
    ("smp status 5", SMP, b'{"status":5}'),
    ("smp deep", SMP, b'{"spec":' + b'{"a":' * 2000 + b"1" + b"}" * 2001),
    ("apply patch", "application/apply-patch+yaml", b"apiVersion: v1\nkind: Pod\n"),
    ("unknown patch type", "application/x-patch", b"{}"),
]


@pytest.mark.parametrize(("what", "ctype", "body"), PATCHES, ids=[p[0] for p in PATCHES])
def test_hostile_patches_are_refused_and_change_nothing(api: httpx.Client, what: str, ctype: str,
                                                        body: bytes) -> None:
    pod = create_ok(api, "Pod")
    path = item_path("Pod", pod["metadata"]["name"])
    refused(send(api, "hostile patch", "PATCH", path, body=body, ctype=ctype))
    got = send(api, "control", "GET", path)
    assert got.status_code == 200 and stable(got.json()) == stable(pod)


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "ReplicaSet"])
def test_hostile_scale_writes_are_refused(api: httpx.Client, kind: str) -> None:
    obj = create_ok(api, kind)
    path = item_path(kind, obj["metadata"]["name"]) + "/scale"
    for body, ctype in [(b'{"spec":{"replicas":"3"}}', MERGE), (b'{"spec":{"replicas":-1}}', MERGE),
                        (b'{"spec":{"replicas":1.5}}', MERGE), (b'{"spec":5}', MERGE), (b"true", MERGE),
                        (b'[{"op":"replace","path":"/spec/replicas","value":true}]', JSONP),
                        (b'{"kind":"Scale","spec":{"replicas":2147483648}}', "application/json"),
                        (b'{"kind":"Pod","spec":{"replicas":1}}', "application/json"), (b"[]", "application/json"),
                        (b"5", "application/json"), (b'{"metadata":5,"spec":{"replicas":1}}', "application/json"),
                        (b'{"metadata":{"resourceVersion":" 5"},"spec":{"replicas":1}}', "application/json"),
                        (b'{"metadata":{"resourceVersion":5},"spec":{"replicas":1}}', "application/json")]:
        method = "PUT" if ctype == "application/json" else "PATCH"
        refused(send(api, "hostile scale", method, path, body=body, ctype=ctype))
    got = send(api, "control", "GET", item_path(kind, obj["metadata"]["name"])).json()
    assert stable(got) == stable(obj)


def test_hostile_bindings_and_evictions_are_refused(api: httpx.Client) -> None:
    pod = create_ok(api, "Pod")
    path = item_path("Pod", pod["metadata"]["name"])
    for body in (b"5", b"[]", b'{"kind":"Binding","apiVersion":"v1","target":5}',
                 b'{"kind":"Binding","apiVersion":"v1","metadata":{"name":"other"},"target":{"name":"n"}}',
                 b'{"kind":"Binding","apiVersion":"v1","metadata":5,"target":{"name":5}}',
                 b'{"kind":"Binding","apiVersion":"v1","target":{"kind":"Pod","name":"n"}}'):
        refused(send(api, "hostile binding", "POST", path + "/binding", body=body))
    for body in (b"5", b'{"kind":"Eviction","apiVersion":"policy/v1","metadata":{"name":"other"}}',
                 b'{"kind":"Eviction","apiVersion":"policy/v1","metadata":5}',
                 json.dumps({"kind": "Eviction", "apiVersion": "policy/v1", "metadata": {"name":
                             pod["metadata"]["name"]}, "deleteOptions": 5}).encode(),
                 json.dumps({"kind": "Eviction", "apiVersion": "policy/v1", "metadata": {"name":
                             pod["metadata"]["name"]}, "deleteOptions": {"gracePeriodSeconds": "x"}}).encode()):
        refused(send(api, "hostile eviction", "POST", path + "/eviction", body=body))
    got = send(api, "control", "GET", path)
    assert got.status_code == 200 and stable(got.json()) == stable(pod)


# ---------------------------------------------------------------------------
# Invalid names, selectors and query values
# ---------------------------------------------------------------------------

LIST_QUERIES: list[dict[str, str]] = [
    {"labelSelector": "a in ("}, {"labelSelector": "=x"}, {"labelSelector": "a=b=c"}, {"labelSelector": "!"},
    {"labelSelector": "a notin b"}, {"labelSelector": "a" * 400 + "=b"}, {"labelSelector": "a,,b"},
    {"fieldSelector": "spec.nope=x"}, {"fieldSelector": "metadata.name"}, {"fieldSelector": "==="},
    {"fieldSelector": "metadata.name=a,"}, {"limit": "-1"}, {"limit": "abc"}, {"limit": "1.5"},
    {"limit": "9" * 30}, {"continue": "garbage"}, {"continue": "!!!"}, {"continue": "e30"},
    {"continue": base64.urlsafe_b64encode(b'{"v":"fleet/1","rv":-5,"start":"/x"}').decode()},
    {"continue": base64.urlsafe_b64encode(b'{"v":"fleet/1","rv":"a","start":5}').decode()},
    {"continue": base64.urlsafe_b64encode(b'{"v":"fleet/1","rv":99999999999999999999999,"start":"/"}').decode()},
    {"continue": base64.urlsafe_b64encode(b'{"v":"fleet/1","rv":1,"start":"/registry/secrets/kube-system/"}').decode()},
    {"continue": base64.urlsafe_b64encode(b"[1,2]").decode()},
    {"resourceVersion": "abc"}, {"resourceVersion": "-1"}, {"resourceVersion": "9" * 30},
    {"resourceVersion": "1", "resourceVersionMatch": "Bogus"},
    {"resourceVersionMatch": "Exact"},
    {"watch": "true", "resourceVersion": "abc"}, {"watch": "true", "timeoutSeconds": "abc"},
    {"watch": "true", "timeoutSeconds": "9" * 30},
    {"watch": "true", "labelSelector": "a in ("},
    {"watch": "true", "sendInitialEvents": "true"},
]


@pytest.mark.parametrize("query", LIST_QUERIES, ids=[json.dumps(q)[:60] for q in LIST_QUERIES])
def test_bad_list_and_watch_queries_are_refused(api: httpx.Client, query: dict[str, str]) -> None:
    r = send(api, "bad query", "GET", KINDS["ConfigMap"][1], params=query, timeout=10.0)
    refused(r)


WRITE_QUERIES: list[dict[str, str]] = [
    {"dryRun": "Bogus"}, {"dryRun": "All", "fieldValidation": "Nope"}, {"fieldManager": "x" * 200},
    {"fieldValidation": "strict!"},
]


@pytest.mark.parametrize("query", WRITE_QUERIES, ids=[json.dumps(q)[:60] for q in WRITE_QUERIES])
def test_bad_write_queries_are_refused(api: httpx.Client, query: dict[str, str]) -> None:
    obj = fresh("ConfigMap")
    refused(send(api, "bad query", "POST", KINDS["ConfigMap"][1], body=json.dumps(obj).encode(), params=query))
    absent(api, "ConfigMap", obj["metadata"]["name"])


DELETE_QUERIES: list[tuple[dict[str, str], bytes | None]] = [
    ({"propagationPolicy": "Sideways"}, None), ({"gracePeriodSeconds": "abc"}, None),
    ({"gracePeriodSeconds": "9" * 30}, None), ({"orphanDependents": "maybe"}, None), ({"dryRun": "Some"}, None),
    ({}, b"5"), ({}, b'{"gracePeriodSeconds":"x"}'), ({}, b'{"preconditions":5}'),
    ({}, b'{"preconditions":{"uid":"wrong"}}'), ({}, b'{"preconditions":{"resourceVersion":"1"}}'),
    ({}, b'{"propagationPolicy":"Orphan","orphanDependents":true}'), ({}, b"{bad json"),
]


@pytest.mark.parametrize(("query", "body"), DELETE_QUERIES, ids=[f"{json.dumps(q)}{b!r}"[:60] for q, b in DELETE_QUERIES])
def test_bad_deletes_are_refused_and_delete_nothing(api: httpx.Client, query: dict[str, str],
                                                    body: bytes | None) -> None:
    cm = create_ok(api, "ConfigMap")
    path = item_path("ConfigMap", cm["metadata"]["name"])
    refused(send(api, "bad delete", "DELETE", path, body=body, params=query))
    got = send(api, "control", "GET", path)
    assert got.status_code == 200 and not got.json()["metadata"].get("deletionTimestamp")


# "." and ".." themselves are left out: HTTP clients (httpx, kubectl) remove dot
# segments before sending, as RFC 3986 says, so the server never sees them.
BAD_ITEM_PATHS = ["%2F", "a%2Fb", "%2e%2e", "%2E", "a%00b", "%", "%zz", "A_B", "x" * 300]


@pytest.mark.parametrize("name", BAD_ITEM_PATHS)
def test_invalid_names_in_item_paths_touch_nothing(api: httpx.Client, name: str) -> None:
    keep = [create_ok(api, "ConfigMap")["metadata"]["name"] for _ in range(3)]
    base = KINDS["ConfigMap"][1]
    for method in ("DELETE", "GET", "PUT", "PATCH"):
        body = b"{}" if method in ("PUT", "PATCH") else None
        ctype = MERGE if method == "PATCH" else "application/json"
        r = send(api, "bad name", method, f"{base}/{name}", body=body, ctype=ctype)
        refused(r)
    refused(send(api, "bad name", "DELETE", base + "//"))
    names = {o["metadata"]["name"] for o in send(api, "control", "GET", base).json()["items"]}
    assert set(keep) <= names


def test_bad_namespaces_and_resources_are_4xx(api: httpx.Client) -> None:
    for path in ("/api/v1/namespaces/no-such-ns/configmaps/x", "/api/v1/nosuchresources",
                 "/apis/no.such.group/v1/things", "/api/v9/pods", "/api/v1/namespaces/default/pods/p/nosub",
                 "/api/v1/namespaces/default/pods/p/log/extra/segments"):
        refused(send(api, "bad path", "GET", path))
    obj = fresh("ConfigMap")
    refused(send(api, "bad path", "POST", "/api/v1/namespaces/no-such-ns/configmaps",
                 body=json.dumps(obj).encode()), 404)


def test_kubectl_patch_status_5_is_422_naming_status(api: httpx.Client, kubectl) -> None:  # type: ignore[no-untyped-def]
    pod = create_ok(api, "Pod")
    name = pod["metadata"]["name"]
    rc, out, err = kubectl("-n", NS, "patch", "pod", name, "--type", "merge", "-p", '{"status": 5}')
    assert rc != 0, out
    assert f'The Pod "{name}" is invalid: status: Invalid value: 5: must be of type object' in err, err
    rc, out, err = kubectl("-n", NS, "patch", "deployment", create_ok(api, "Deployment")["metadata"]["name"],
                           "--type", "merge", "-p", '{"spec": {"replicas": 2147483648}}')
    assert rc != 0 and "spec.replicas: Invalid value: 2147483648" in err, err
    rc, out, err = kubectl("-n", NS, "get", "pod", name, "-o", "json")
    assert rc == 0 and stable(json.loads(out)) == stable(pod), err


# ---------------------------------------------------------------------------
# Last: the server is fine
# ---------------------------------------------------------------------------


def test_zzz_the_server_still_serves(api: httpx.Client, fleet_server) -> None:  # type: ignore[no-untyped-def]
    assert_server_healthy(api, fleet_server, TALLY, NS)
    time.sleep(0.5)
    if "before" in RSS:
        after = _rss_kib(fleet_server.pid)
        print(f"\nserver RSS before {RSS['before']} KiB, after {after} KiB")
        assert after <= RSS["before"] * 1.2 + 8 * 1024, (RSS["before"], after)
