"""Schemathesis over the served OpenAPI v3, as admin and as a low-privilege ServiceAccount.

One real `fleet server` over HTTPS on 127.0.0.1.  The test reads the server's own
`/openapi/v3` index and every group-version document it names, loads each with
schemathesis (`schemathesis.openapi.from_dict`), and draws a few requests for
every operation from the operation's hypothesis strategy (derandomized, so CI
sends the same requests every run; namespaced paths are pinned to this module's
namespace so the requests meet real objects and the ServiceAccount's grant):
three positive cases (what the schema allows) per operation, and one negative
case (what it does not) for every other write operation — negative cases are
about 0.2 s each to draw, so all of them would double the module's time.

The same requests are sent twice:

1. as `fuzz-reader`, a ServiceAccount whose only grant is `get`/`list` on
   configmaps in this namespace (a Role and RoleBinding; its token from the
   TokenRequest API).  Every answer must be below 500; outside what the grant
   (or every authenticated user: the self reviews) allows, every answer is a 403
   (or the 400 for a path whose name cannot exist, refused before routing).  A
   snapshot of every listable object (kind, namespace, name → resourceVersion)
   taken by the admin before and after the run must not have changed, apart from
   what controllers write on their own (leases, events);
2. as the admin (system:masters): every answer below 500.

Nothing may hang (each request has a 20 s bound; watches are not read past their
headers), and at the end the server answers, its log has no traceback, and the
counts (`FLEET_BAD_INPUT_REPORT`, see tests/e2e/badinput.py) give the number of
requests by identity and status.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from tests.conftest import FleetServer
from tests.e2e.badinput import Tally, assert_server_healthy, low_privilege_service_account, ok

NS = "fuzz-openapi"
SA = "fuzz-reader"
TALLY = Tally("openapi-fuzz")
EXAMPLES = 3  # positive ones per operation; every operation is covered by each identity
GEN = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
               phases=[Phase.generate], suppress_health_check=list(HealthCheck))
# Kinds controllers write by themselves while the ServiceAccount runs (leader leases,
# events about what they did): left out of the before/after snapshot.
CHURN = {"leases", "events"}
# What the ServiceAccount may get a 2xx for: its grant, and the reviews every
# authenticated user may create (system:basic-user), which store nothing.
SELF_REVIEWS = ("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                "/apis/authentication.k8s.io/v1/selfsubjectreviews")


@pytest.fixture(scope="module")
def admin(fleet_server: FleetServer) -> Iterator[httpx.Client]:
    with fleet_server.client(timeout=30.0) as c:
        yield c
    TALLY.report()


@pytest.fixture(scope="module")
def reader(fleet_server: FleetServer, admin: httpx.Client) -> Iterator[httpx.Client]:
    """A client for a ServiceAccount that may only get and list configmaps in NS."""
    token = low_privilege_service_account(admin, TALLY, NS, SA)
    for i in range(3):  # something for the fuzzer's reads, writes and deletes to meet
        ok(TALLY, admin.post(f"/api/v1/namespaces/{NS}/configmaps", json={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}, "data": {"a": "b"}}))
    with fleet_server.client(token=token, timeout=30.0) as c:
        r = c.get(f"/api/v1/namespaces/{NS}/configmaps")
        assert r.status_code == 200, r.text  # the grant works
        assert c.get(f"/api/v1/namespaces/{NS}/secrets").status_code == 403  # and is all it has
        yield c


# --------------------------------------------------------------------------- the cases

def _documents(admin: httpx.Client) -> dict[str, dict[str, Any]]:
    index = ok(TALLY, admin.get("/openapi/v3"))
    return {gv: ok(TALLY, admin.get(ref["serverRelativeURL"])) for gv, ref in sorted(index["paths"].items())}


def _draw(op: Any, mode: GenerationMode, examples: int) -> list[dict[str, Any]]:
    """Requests for one operation (namespaced paths pinned to NS), as transport kwargs."""
    pinned = {"namespace": NS} if "{namespace}" in op.path else {}
    drawn: list[dict[str, Any]] = []

    @settings(GEN, max_examples=examples)
    @given(op.as_strategy(generation_mode=mode, path_parameters=pinned))
    def draw(case: Any) -> None:
        drawn.append(case.as_transport_kwargs(base_url=""))

    draw()
    return drawn


def _cases(docs: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(operation label, transport kwargs) — EXAMPLES drawn for every operation."""
    out: list[tuple[str, dict[str, Any]]] = []
    writes = 0
    for doc in docs.values():
        for result in schemathesis.openapi.from_dict(doc).get_all_operations():
            op = result.ok()
            label = f"{op.method.upper()} {op.path}"
            drawn = _draw(op, GenerationMode.POSITIVE, EXAMPLES)
            assert drawn, f"no case for {label}"
            if op.method.upper() in ("POST", "PUT", "PATCH"):
                # Negative cases (what the schema does not allow) cost ~0.2 s an operation
                # to draw: one for every other write operation, in the documents' order.
                writes += 1
                if writes % 2:
                    drawn += _draw(op, GenerationMode.NEGATIVE, 1)
            gvk = (op.definition.raw or {}).get("x-kubernetes-group-version-kind") or {}
            for i, kw in enumerate(drawn):
                # Past the first case, bodies say what they are (so they get past the
                # apiVersion/kind check into typing, validation and admission), and the
                # second case sends no query (random dryRun / fieldValidation / fieldManager
                # values stop most writes before their body is read).
                if i and gvk and isinstance(kw.get("json"), dict) and op.method.upper() in ("POST", "PUT"):
                    group, version = gvk.get("group", ""), gvk["version"]
                    kw["json"].update(apiVersion=f"{group}/{version}" if group else version, kind=gvk["kind"])
                if i == 1 and op.method.upper() in ("POST", "PUT", "PATCH"):
                    kw["params"] = {}
            out.extend((label, kw) for kw in drawn)
    return out


def _send(c: httpx.Client, what: str, kw: dict[str, Any]) -> httpx.Response:
    """One schemathesis case (requests-style kwargs) through httpx; a watch's body is not read."""
    headers = {k: v for k, v in kw.get("headers", {}).items()
               if k.lower() in ("content-type", "accept")}
    if "json" in kw:
        content: bytes | None = json.dumps(kw["json"]).encode()
        headers.setdefault("Content-Type", "application/json")
    elif "data" in kw:
        data = kw["data"]
        content = data.encode() if isinstance(data, str) else bytes(data)
    else:
        content = None
    url = kw["url"]
    with c.stream(kw["method"], url, params=kw.get("params") or None, content=content,
                  headers=headers, timeout=20.0) as r:
        if "stream=watch" not in r.headers.get("content-type", ""):
            r.read()
    TALLY.count(what, r.status_code)
    return r


def _may_reader_succeed(method: str, path: str) -> bool:
    path = path.split("?", 1)[0]
    if method == "POST" and path in SELF_REVIEWS:
        return True
    cm = f"/api/v1/namespaces/{NS}/configmaps"
    return method == "GET" and (path == cm or (path.startswith(cm + "/") and path.count("/") == 6))


def _snapshot(admin: httpx.Client, docs: dict[str, dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    """Every object a list operation of the served schema returns → its resourceVersion."""
    snap: dict[tuple[str, str, str], str] = {}
    for doc in docs.values():
        for path, item in doc["paths"].items():
            if "{" in path or "get" not in item or path.rsplit("/", 1)[1] in CHURN:
                continue
            r = admin.get(path)
            TALLY.count("control", r.status_code)
            if r.status_code != 200 or not isinstance(r.json().get("items"), list):
                continue
            for o in r.json()["items"]:
                md = o.get("metadata") or {}
                snap[(path, md.get("namespace", ""), md.get("name", ""))] = md.get("resourceVersion", "")
    return snap


# --------------------------------------------------------------------------- the run

RUN: dict[str, Any] = {}


def test_every_operation_as_a_low_privilege_service_account(admin: httpx.Client, reader: httpx.Client) -> None:
    t0 = time.monotonic()
    docs = _documents(admin)
    cases = _cases(docs)
    RUN.update(docs=docs, cases=cases, generated_s=time.monotonic() - t0)
    ops = {label for label, _ in cases}
    before = _snapshot(admin, docs)
    t1 = time.monotonic()
    codes: Counter[int] = Counter()
    server_errors, bypasses = [], []
    for label, kw in cases:
        r = _send(reader, "schemathesis as ServiceAccount", kw)
        codes[r.status_code] += 1
        if r.status_code >= 500:
            server_errors.append((label, kw, r.status_code, r.text[:300]))
        elif not _may_reader_succeed(kw["method"], kw["url"]) and r.status_code != 403:
            # Outside the grant: forbidden, or refused before authorization because the
            # path names no object at all (a name holding "%", tests/e2e/test_bad_input.py).
            if not (r.status_code == 400 and "invalid resource name" in r.text):
                bypasses.append((label, kw, r.status_code, r.text[:200]))
    RUN["reader_s"] = time.monotonic() - t1
    after = _snapshot(admin, docs)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    print(f"\nschemathesis: {len(docs)} documents, {len(ops)} operations, {len(cases)} cases "
          f"(generated in {RUN['generated_s']:.1f}s); as ServiceAccount {dict(sorted(codes.items()))} "
          f"in {RUN['reader_s']:.1f}s; snapshot of {len(before)} objects")
    assert not server_errors, server_errors[:5]
    assert not bypasses, bypasses[:5]
    assert not changed, changed[:20]
    assert codes[403] > 0.8 * len(cases)


def test_every_operation_as_admin(admin: httpx.Client) -> None:
    assert RUN.get("cases"), "the ServiceAccount run did not draw the cases"
    t0 = time.monotonic()
    codes: Counter[int] = Counter()
    server_errors = []
    for label, kw in RUN["cases"]:
        r = _send(admin, "schemathesis as admin", kw)
        codes[r.status_code] += 1
        if r.status_code >= 500:
            server_errors.append((label, kw, r.status_code, r.text[:300]))
    print(f"\nschemathesis as admin: {dict(sorted(codes.items()))} in {time.monotonic() - t0:.1f}s")
    assert not server_errors, server_errors[:5]


def test_zzz_the_server_still_serves(admin: httpx.Client, fleet_server: FleetServer) -> None:
    assert_server_healthy(admin, fleet_server, TALLY, NS)

