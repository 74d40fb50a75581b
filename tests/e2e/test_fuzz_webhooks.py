"""Hostile admission webhooks and hypothesis-drawn writes through them.

One real `fleet server` over HTTPS on 127.0.0.1, and one webhook server of the
test's (fleet/testing/webhook.py: HTTPS on 127.0.0.1 with a test CA) whose
answer to each AdmissionReview is drawn by hypothesis together with the write
that triggers it: valid answers with random JSONPatches (including ones that
rename the object, set a wrong type, remove what validation needs), patches that
are not base64, not JSON or not a list, a wrong patchType, wrong or missing
UIDs, `allowed` missing or not a boolean, huge and odd warnings, non-JSON and
deeply nested bodies, wrong apiVersion/kind, denials with any status code
(0, 399, 600, 2⁴⁰, negative) and message, and slow answers under the timeout.
The writes are ConfigMap and Pod creates (valid and malformed manifests) and
merge / JSON patches of a ConfigMap.

Two mutating webhooks, the same server behind both, each selecting one
namespace: `fail.fuzz.fleet.test` (failurePolicy Fail) and
`ignore.fuzz.fleet.test` (failurePolicy Ignore).  For every write:

* no 5xx, but for kube-apiserver's own 500 when a Fail webhook cannot be used
  (`Internal error occurred: failed calling webhook "<name>": ...`, a Status
  naming the webhook) — never under Ignore;
* a refusal is a 4xx Status (a denial names the webhook:
  `admission webhook "<name>" denied the request`);
* an admitted object is what validation allows: it is stored under the name and
  namespace asked for, and reads back as a well-typed object;
* nothing hangs (20 s per request), and the server keeps answering.

More admission mechanisms (a ValidatingAdmissionPolicy in CEL, say) are one more
`Case`: a function that installs it for a fresh namespace and says which 5xx
message, if any, it may produce; `run_case` sends it the same drawn writes.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.testing.oidc import loopback_tls
from fleet.testing.webhook import WebhookServer
from tests.conftest import FleetServer
from tests.e2e.badinput import Tally, assert_server_healthy, ok, refused

TALLY = Tally("webhook-fuzz")
API = "admissionregistration.k8s.io/v1"
HYP = settings(max_examples=200, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
POLICY_DENIALS = [0]  # drawn writes the CEL policy refused
EXPECTED_5XX = [0]  # kube-apiserver's own "failed calling webhook" 500s, counted as sent


# --------------------------------------------------------------------------- the webhook

class Plan:
    """What the webhook answers next (the test sends one request at a time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.make: Callable[[dict[str, Any]], bytes] = lambda review: b""

    def answer(self, path: str, review: dict[str, Any]) -> bytes:
        with self.lock:
            return self.make(review)


PLAN = Plan()


@pytest.fixture(scope="module")
def hook_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[bytes, WebhookServer]]:
    ca_file, cert_file, key_file = loopback_tls(tmp_path_factory.mktemp("fuzz-webhook-tls"), "fuzz-webhook")
    srv = WebhookServer(cert_file, key_file, PLAN.answer)
    try:
        yield ca_file.read_bytes(), srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def admin(fleet_server: FleetServer) -> Iterator[httpx.Client]:
    with fleet_server.client(timeout=30.0) as c:
        yield c
    TALLY.report()


def review_of(**response: Any) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "response": response}).encode()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


_json = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                     max_leaves=8)
_paths = st.sampled_from(["/metadata/labels/x", "/metadata/labels", "/metadata/name", "/metadata/namespace",
                          "/metadata/uid", "/metadata/annotations/a", "/data/k", "/data", "/spec",
                          "/spec/containers/0/image", "/spec/containers/-", "/spec/containers", "/status",
                          "/kind", "/apiVersion", "", "/metadata/finalizers/-", "/metadata/ownerReferences",
                          "/binaryData/b", "/immutable", "/metadata/generateName", "/nope/deeper"])
_op = st.fixed_dictionaries({"op": st.sampled_from(["add", "replace", "remove", "move", "copy", "test", "bogus"]),
                             "path": _paths},
                            optional={"value": _json, "from": _paths})
_patch_ops = st.lists(_op, max_size=4)
_codes = st.sampled_from([0, 200, 399, 400, 403, 409, 422, 429, 500, 503, 599, 600, 999, 1000, 2**31, 2**40, -1])


def _answer_kinds() -> st.SearchStrategy[Callable[[dict[str, Any]], bytes]]:
    """A strategy of webhook behaviours: review -> response body."""
    def uid(r: dict[str, Any]) -> Any:
        return (r.get("request") or {}).get("uid")

    def allow_with(ops: list[Any]) -> Callable[[dict[str, Any]], bytes]:
        return lambda r: review_of(uid=uid(r), allowed=True, patchType="JSONPatch",
                                   patch=b64(json.dumps(ops).encode()))

    def raw_patch(patch: Any, ptype: Any = "JSONPatch") -> Callable[[dict[str, Any]], bytes]:
        return lambda r: review_of(uid=uid(r), allowed=True, patchType=ptype, patch=patch)

    def deny(code: int, message: Any, reason: Any) -> Callable[[dict[str, Any]], bytes]:
        return lambda r: review_of(uid=uid(r), allowed=False,
                                   status={"code": code, "message": message, "reason": reason})

    def fields(extra: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
        return lambda r: review_of(**{"uid": uid(r), "allowed": True, **extra})

    def body(raw: bytes) -> Callable[[dict[str, Any]], bytes]:
        return lambda r: raw

    def slow(seconds: float) -> Callable[[dict[str, Any]], bytes]:
        def answer(r: dict[str, Any]) -> bytes:
            time.sleep(seconds)
            return review_of(uid=uid(r), allowed=True)
        return answer

    return st.one_of(
        _patch_ops.map(allow_with),
        st.one_of(st.just("not base64!"), st.just(b64(b"not json")), st.just(b64(b'{"op":"add"}')),
                  st.just(b64(b"[" * 3000 + b"]" * 3000)), _json).map(raw_patch),
        st.tuples(st.just(b64(b"[]")), st.one_of(st.just("JSONMergePatch"), _json)).map(lambda t: raw_patch(*t)),
        st.builds(deny, _codes, st.one_of(st.text(max_size=200), st.just("x" * 20000), _json),
                  st.one_of(st.text(max_size=20), _json)),
        st.builds(fields, st.fixed_dictionaries({}, optional={
            "uid": st.one_of(st.text(max_size=40), _json), "allowed": _json,
            "warnings": st.one_of(st.lists(st.text(max_size=300), max_size=30), _json,
                                  st.just(["w" * 100000]), st.just(["line\nbreak", "\u2603", "\x00"]),
                                  st.just(["w" * 1000] * 1000)),
            "auditAnnotations": _json, "status": _json, "patchType": _json})),
        st.sampled_from([b"", b"<html>", b"null", b"[]", b'{"kind":"AdmissionReview"}', b"{" * 5000,
                         b"[" * 5000 + b"]" * 5000, b'{"apiVersion":"admission.k8s.io/v1beta1",'
                         b'"kind":"AdmissionReview","response":{"allowed":true}}', b"\xff\xfe"]).map(body),
        st.sampled_from([0.3, 1.0]).map(slow),
    )


# --------------------------------------------------------------------------- the writes

_label_value = st.text(alphabet="abcXYZ019-_.", max_size=12)
_data = st.dictionaries(st.text(alphabet="abc-_.019", min_size=1, max_size=8), st.one_of(st.text(max_size=30), _json),
                        max_size=3)


def _configmap(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"apiVersion": st.just("v1"), "kind": st.just("ConfigMap"),
                                  "metadata": st.fixed_dictionaries(
                                      {"name": st.just(name)},
                                      optional={"labels": st.dictionaries(st.sampled_from(["a", "b", "c/d"]),
                                                                          _label_value, max_size=2)})},
                                 optional={"data": _data, "immutable": st.booleans()})


def _pod(name: str) -> st.SearchStrategy[dict[str, Any]]:
    container = st.fixed_dictionaries({"name": st.sampled_from(["c", "C", ""]),
                                       "image": st.one_of(st.just("busybox"), _json)})
    return st.fixed_dictionaries({"apiVersion": st.just("v1"), "kind": st.just("Pod"),
                                  "metadata": st.just({"name": name}),
                                  "spec": st.fixed_dictionaries({"containers": st.lists(container, max_size=2)})})


@dataclass
class Write:
    method: str
    path: str  # under /api/v1/namespaces/<ns>/
    body: bytes
    ctype: str
    kind: str  # "configmaps" | "pods"
    name: str


def _writes() -> st.SearchStrategy[Write]:
    def create(kind: str, obj: dict[str, Any]) -> Write:
        return Write("POST", kind, json.dumps(obj).encode(), "application/json", kind, obj["metadata"]["name"])

    def patch(ctype: str, body: Any) -> Write:
        return Write("PATCH", "configmaps/target", json.dumps(body).encode(), ctype, "configmaps", "target")

    name = st.builds(lambda: f"w-{uuid.uuid4().hex[:8]}")
    return st.one_of(
        name.flatmap(_configmap).map(lambda o: create("configmaps", o)),
        name.flatmap(_pod).map(lambda o: create("pods", o)),
        st.builds(patch, st.just("application/merge-patch+json"),
                  st.fixed_dictionaries({}, optional={"data": _data, "metadata": st.fixed_dictionaries(
                      {}, optional={"labels": st.dictionaries(st.just("a"), _label_value)})})),
        st.builds(patch, st.just("application/json-patch+json"), _patch_ops),
    )


# --------------------------------------------------------------------------- the cases

@dataclass
class Case:
    """One admission mechanism under fuzz, installed for one namespace.

    `install(admin, namespace)` configures it; `allowed_500` is the start of the one
    5xx message it may produce (kube-apiserver's own), or None; `denier` the start of
    its denials' message (a denial carries the code the mechanism chose, 5xx included,
    as kube-apiserver passes it on)."""

    name: str
    install: Callable[[httpx.Client, str], None]
    allowed_500: str | None
    denier: str


def _webhook_case(policy: str, ca: bytes, url: str) -> Case:
    hook_name = f"{policy.lower()}.fuzz.fleet.test"

    def install(admin: httpx.Client, ns: str) -> None:
        cfg = {"apiVersion": API, "kind": "MutatingWebhookConfiguration", "metadata": {"name": f"fuzz-{ns}"},
               "webhooks": [{"name": hook_name, "clientConfig": {"url": url, "caBundle": b64(ca)},
                             "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                        "resources": ["configmaps", "pods"]}],
                             "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                             "failurePolicy": policy, "timeoutSeconds": 3, "sideEffects": "None",
                             "admissionReviewVersions": ["v1"]}]}
        ok(TALLY, admin.post(f"/apis/{API}/mutatingwebhookconfigurations", json=cfg))

    allowed = f'Internal error occurred: failed calling webhook "{hook_name}"' if policy == "Fail" else None
    return Case(f"webhook {policy}", install, allowed, f'admission webhook "{hook_name}" denied the request')


# A ValidatingAdmissionPolicy whose CEL reads the drawn objects' fields (after the webhook's
# drawn answer mutated them): comprehensions over data and containers, a regex, a
# messageExpression, a variable and a matchCondition — values of any shape that validation
# let through.  An evaluation error is a failure under failurePolicy Fail (a 4xx, never a 5xx).
POLICY_VALIDATIONS = [
    {"expression": "!has(object.data) || object.data.all(k, size(object.data[k]) < 4 && "
                   "object.data[k] != 'deny-me')",
     "messageExpression": "'data of ' + object.metadata.name + ' refused'"},
    {"expression": "!has(object.spec) || object.spec.containers.all(c, c.image.matches('^[a-z0-9./:@_-]+$'))",
     "message": "images are lower case", "reason": "Forbidden"},
    {"expression": "variables.labels.all(k, size(variables.labels[k]) < 4 && !k.contains('deny'))"},
]


def _policy_case(ca: bytes, url: str) -> Case:
    """The Ignore webhook (its drawn answers mutate or refuse first) and, behind it, a
    CEL policy judging whatever the webhook and validation let through."""
    hook = _webhook_case("Ignore", ca, url)

    def install(admin: httpx.Client, ns: str) -> None:
        hook.install(admin, ns)
        name = f"fuzz-{ns}"
        ok(TALLY, admin.post(f"/apis/{API}/validatingadmissionpolicies", json={
            "apiVersion": API, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{
                         "operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                         "resources": ["configmaps", "pods"]}]},
                     "matchConditions": [{"name": "not-skipped",
                                          "expression": "!object.metadata.name.startsWith('skip-')"}],
                     "variables": [{"name": "labels", "expression":
                                    "has(object.metadata.labels) ? object.metadata.labels : {}"}],
                     "validations": POLICY_VALIDATIONS}}))
        ok(TALLY, admin.post(f"/apis/{API}/validatingadmissionpolicybindings", json={
            "apiVersion": API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                     "matchResources": {"namespaceSelector": {
                         "matchLabels": {"kubernetes.io/metadata.name": ns}}}}}))
        # Policies and bindings are watch-fed too: wait until the policy refuses.
        deadline = time.monotonic() + 10
        while True:
            body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "deny-me"},
                               "metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}"}}).encode()
            r = TALLY.send(admin, "control", "POST", f"/api/v1/namespaces/{ns}/configmaps", body=body)
            if r.status_code == 422 and "ValidatingAdmissionPolicy" in r.text:
                break
            assert time.monotonic() < deadline, ("the policy never refused", r.status_code, r.text[:300])
            time.sleep(0.1)

    return Case("policy", install, hook.allowed_500, hook.denier)


def _setup(admin: httpx.Client, case: Case) -> str:
    ns = f"fuzz-wh-{uuid.uuid4().hex[:6]}"
    ok(TALLY, admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": ns}}))
    # Pods need their account: the serviceaccount controller makes it; do not wait for it.
    r = admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts",
                   json={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    TALLY.count("control", r.status_code)
    assert r.status_code in (201, 409), (r.status_code, r.text[:300])
    PLAN.make = lambda r: review_of(uid=r["request"]["uid"], allowed=True)
    ok(TALLY, admin.post(f"/api/v1/namespaces/{ns}/configmaps", json={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "target"}, "data": {"k": "v"}}))
    case.install(admin, ns)
    # The configuration cache is watch-fed: wait until the server calls the webhook.
    deadline = time.monotonic() + 10
    called = threading.Event()
    PLAN.make = lambda r: (called.set(), review_of(uid=r["request"]["uid"], allowed=True))[1]
    while not called.is_set():
        assert time.monotonic() < deadline, "the webhook was never called"
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}"}}).encode()
        TALLY.send(admin, "control", "POST", f"/api/v1/namespaces/{ns}/configmaps", body=body)
        time.sleep(0.1)
    return ns


def _check(admin: httpx.Client, case: Case, ns: str, w: Write, r: httpx.Response) -> None:
    assert r.status_code < 600, (r.status_code, r.text[:500])
    if r.status_code >= 500:
        body = r.json()
        assert body["kind"] == "Status" and body["code"] == r.status_code, body
        EXPECTED_5XX[0] += 1
        if body["message"].startswith(case.denier):
            return  # the webhook denied with a 5xx code of its choosing
        assert case.allowed_500 is not None, (case.name, r.status_code, r.text[:500])
        assert r.status_code == 500 and body["message"].startswith(case.allowed_500), body["message"][:500]
        return
    if r.status_code >= 400:
        body = r.json()
        if body.get("kind") == "Status" and "denied the request" in str(body.get("message")):
            # A denial is the webhook's Status, its reason kept as given (empty when it
            # gave none, as kube-apiserver's ToStatusErr keeps it).
            assert body["message"].startswith(case.denier), body["message"][:300]
            assert body["status"] == "Failure" and body["code"] == r.status_code, body
            return
        if "ValidatingAdmissionPolicy 'fuzz-" in str(body.get("message")):
            POLICY_DENIALS[0] += 1
        refused(r)
        return
    assert r.status_code in (200, 201), (r.status_code, r.text[:500])
    # Admitted: stored as asked, and well typed (validation ran after the mutation).
    got = TALLY.send(admin, "control", "GET", f"/api/v1/namespaces/{ns}/{w.kind}/{w.name}")
    assert got.status_code == 200, got.text[:500]
    obj = got.json()
    assert obj["metadata"]["name"] == w.name and obj["metadata"]["namespace"] == ns, obj["metadata"]
    assert obj["kind"] == ("ConfigMap" if w.kind == "configmaps" else "Pod"), obj
    if w.kind == "configmaps":
        assert all(isinstance(v, str) for v in (obj.get("data") or {}).values()), obj
    else:
        assert all(isinstance(c.get("image"), str) for c in obj["spec"]["containers"]), obj


def run_case(admin: httpx.Client, case: Case) -> None:
    ns = _setup(admin, case)

    @HYP
    @given(_answer_kinds(), _writes())
    def one(answer: Callable[[dict[str, Any]], bytes], w: Write) -> None:
        PLAN.make = answer
        try:
            r = TALLY.send(admin, f"{case.name} write", w.method, f"/api/v1/namespaces/{ns}/{w.path}",
                           body=w.body, ctype=w.ctype, timeout=20.0)
        finally:
            PLAN.make = lambda rv: review_of(uid=rv["request"]["uid"], allowed=True)
        _check(admin, case, ns, w, r)

    one()


CASES: dict[str, Callable[[bytes, str], Case]] = {
    "webhook-fail": lambda ca, url: _webhook_case("Fail", ca, url),
    "webhook-ignore": lambda ca, url: _webhook_case("Ignore", ca, url),
    "policy": _policy_case,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_admission_answers_and_drawn_writes(admin: httpx.Client, hook_server: tuple[bytes, WebhookServer],
                                                    case: str) -> None:
    ca, srv = hook_server
    run_case(admin, CASES[case](ca, f"https://127.0.0.1:{srv.port}/fuzz"))
    if case == "policy":  # the drawn writes reached the policy, and it judged some of them
        assert POLICY_DENIALS[0] > 0


def test_zzz_the_server_still_serves(admin: httpx.Client, fleet_server: FleetServer, tmp_path: Path) -> None:
    PLAN.make = lambda r: review_of(uid=r["request"]["uid"], allowed=True)
    assert_server_healthy(admin, fleet_server, TALLY, "default", expected_5xx=EXPECTED_5XX[0])
