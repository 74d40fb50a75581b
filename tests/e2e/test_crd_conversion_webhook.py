"""CRD webhook conversion against a real `fleet server`: a two-version CRD whose versions
differ in shape, converted by a webhook written here.

`people.conv.fleet.test`: v1 (storage) has `spec.firstName` + `spec.lastName`, v2 (served)
has `spec.fullName`; the conversion webhook (fleet/testing/webhook.py's HTTPS server, its
certificate from a test CA, the CRD carrying that CA as `caBundle`) splits and joins them.

* a Person created at v1 reads at v2 and one created at v2 reads at v1 (stored at v1);
* a list at v2 has every item at v2; a watch at v2 sends the objects written at v1 at v2;
* a webhook that fails: a read at the other version gets kube's answer, a 500
  `conversion webhook for conv.fleet.test/v1, Kind=Person failed: <message>`.
"""

from __future__ import annotations

import base64
import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.testing.oidc import loopback_tls
from fleet.testing.webhook import WebhookServer
from tests.conftest import FleetServer, create_namespace

pytestmark = [pytest.mark.e2e]

GROUP = "conv.fleet.test"
CRD = f"people.{GROUP}"
V1, V2 = f"{GROUP}/v1", f"{GROUP}/v2"


def convert(path: str, review: dict[str, Any]) -> dict[str, Any]:
    """The conversion webhook: v1 firstName + lastName <-> v2 fullName; /fail refuses."""
    req = review["request"]
    if path == "/fail":
        return {"apiVersion": review["apiVersion"], "kind": "ConversionReview",
                "response": {"uid": req["uid"], "result": {"status": "Failure",
                                                           "message": "the converter is down"}}}
    out = []
    for o in req["objects"]:
        o = copy.deepcopy(o)
        spec = o.setdefault("spec", {})
        if req["desiredAPIVersion"] == V2:
            spec["fullName"] = f"{spec.pop('firstName', '')} {spec.pop('lastName', '')}".strip()
        else:
            first, _, last = spec.pop("fullName", "").partition(" ")
            spec.update(firstName=first, lastName=last)
        o["apiVersion"] = req["desiredAPIVersion"]
        out.append(o)
    return {"apiVersion": review["apiVersion"], "kind": "ConversionReview",
            "response": {"uid": req["uid"], "convertedObjects": out, "result": {"status": "Success"}}}


def crd(url: str, ca: bytes) -> dict[str, Any]:
    def version(name: str, storage: bool, props: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "served": True, "storage": storage,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": props}}}}}
    s = {"type": "string"}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": CRD},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": "people", "singular": "person", "kind": "Person", "listKind": "PersonList"},
                     "versions": [version("v1", True, {"firstName": s, "lastName": s}),
                                  version("v2", False, {"fullName": s})],
                     "conversion": {"strategy": "Webhook", "webhook": {
                         "conversionReviewVersions": ["v1"],
                         "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()}}}}}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebhookServer, bytes]]:
    ca, cert, key = loopback_tls(Path(tmp_path_factory.mktemp("conv-tls")), "conv")
    with WebhookServer(cert, key, convert) as srv:
        yield srv, ca.read_bytes()


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def people(fleet_server: FleetServer, webhook: tuple[WebhookServer, bytes]) -> Iterator[str]:
    """The CRD, established; yields a fresh namespace."""
    srv, ca = webhook
    with fleet_server.client() as c:
        r = c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd(srv.url("/convert"), ca))
        assert r.status_code == 201, r.text

        def established() -> bool:
            got = c.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}").json()
            conds = (got.get("status") or {}).get("conditions") or []
            return any(x.get("type") == "Established" and x.get("status") == "True" for x in conds) and \
                c.get(f"/apis/{V2}/people").status_code == 200
        wait_for("the CRD to be established", established)
    ns = f"conv-{uuid.uuid4().hex[:6]}"
    create_namespace(fleet_server, ns)
    yield ns
    with fleet_server.client() as c:
        c.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}")


def path(version: str, ns: str, name: str = "") -> str:
    return f"/apis/{GROUP}/{version}/namespaces/{ns}/people" + (f"/{name}" if name else "")


def person(version: str, name: str, full: str) -> dict[str, Any]:
    first, _, last = full.partition(" ")
    spec = {"fullName": full} if version == "v2" else {"firstName": first, "lastName": last}
    return {"apiVersion": f"{GROUP}/{version}", "kind": "Person", "metadata": {"name": name}, "spec": spec}


def test_created_at_one_version_read_at_the_other(fleet_server: FleetServer, people: str,
                                                  webhook: tuple[WebhookServer, bytes]) -> None:
    srv, _ = webhook
    with fleet_server.client() as c:
        r = c.post(path("v1", people), json=person("v1", "ada", "Ada Lovelace"))
        assert r.status_code == 201, r.text
        got = c.get(path("v2", people, "ada")).json()
        assert got["apiVersion"] == V2 and got["spec"] == {"fullName": "Ada Lovelace"}, got
        asked = [r for r in srv.reviews if any(o["metadata"]["name"] == "ada" for o in r["request"]["objects"])]
        assert asked and asked[-1]["apiVersion"] == "apiextensions.k8s.io/v1"
        assert asked[-1]["request"]["desiredAPIVersion"] == V2
        assert asked[-1]["request"]["objects"][0]["spec"] == {"firstName": "Ada", "lastName": "Lovelace"}
        # Created at v2: stored at v1 (converted on the way in), read back at either.
        r = c.post(path("v2", people), json=person("v2", "alan", "Alan Turing"))
        assert r.status_code == 201, r.text
        assert r.json()["apiVersion"] == V2 and r.json()["spec"] == {"fullName": "Alan Turing"}
        got = c.get(path("v1", people, "alan")).json()
        assert got["apiVersion"] == V1 and got["spec"] == {"firstName": "Alan", "lastName": "Turing"}, got
        assert got["metadata"]["uid"] == r.json()["metadata"]["uid"]


def test_list_and_watch_at_the_other_version(fleet_server: FleetServer, people: str) -> None:
    with fleet_server.client() as c:
        for name, full in (("grace", "Grace Hopper"), ("edsger", "Edsger Dijkstra")):
            assert c.post(path("v1", people), json=person("v1", name, full)).status_code == 201
        listed = c.get(path("v2", people)).json()
        assert listed["apiVersion"] == V2
        byname = {o["metadata"]["name"]: o for o in listed["items"]}
        assert byname["grace"]["spec"] == {"fullName": "Grace Hopper"}
        assert all(o["apiVersion"] == V2 for o in listed["items"])
        rv = listed["metadata"]["resourceVersion"]
    with httpx.Client(base_url=fleet_server.url, verify=fleet_server.verify(), timeout=30,
                      headers={"Authorization": f"Bearer {fleet_server.token}"}) as w, \
            fleet_server.client() as c:
        with w.stream("GET", path("v2", people), params={"watch": "1", "resourceVersion": rv,
                                                          "timeoutSeconds": "20"}) as stream:
            assert c.post(path("v1", people), json=person("v1", "barbara", "Barbara Liskov")).status_code == 201
            for line in stream.iter_lines():
                if not line:
                    continue
                ev = json.loads(line)
                if ev["object"]["metadata"].get("name") == "barbara":
                    assert ev["type"] == "ADDED"
                    assert ev["object"]["apiVersion"] == V2
                    assert ev["object"]["spec"] == {"fullName": "Barbara Liskov"}
                    break


def test_failing_webhook_answers_kubes_error(fleet_server: FleetServer, people: str,
                                             webhook: tuple[WebhookServer, bytes]) -> None:
    srv, ca = webhook
    with fleet_server.client() as c:
        assert c.post(path("v1", people), json=person("v1", "kurt", "Kurt Godel")).status_code == 201
        patch = {"spec": {"conversion": {"webhook": {"clientConfig": {"url": srv.url("/fail")}}}}}
        r = c.patch(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}", json=patch,
                    headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text
        try:
            def refused() -> httpx.Response | None:
                got = c.get(path("v2", people, "kurt"))
                return got if got.status_code == 500 else None
            r = wait_for("the failing webhook to be used", refused)
            status = r.json()
            assert status["kind"] == "Status" and status["code"] == 500
            assert status["message"] == f"conversion webhook for {V1}, Kind=Person failed: the converter is down"
            # A list at v2 too; the storage version needs no conversion: still readable.
            listed = c.get(path("v2", people))
            assert listed.status_code == 500 and "the converter is down" in listed.json()["message"]
            assert c.get(path("v1", people, "kurt")).status_code == 200
            # A watch at v2 ends with an ERROR event carrying the Status when an event cannot be converted.
            rv = c.get(path("v1", people)).json()["metadata"]["resourceVersion"]
            with c.stream("GET", path("v2", people), params={"watch": "1", "resourceVersion": rv,
                                                              "timeoutSeconds": "20"}) as stream:
                assert c.post(path("v1", people), json=person("v1", "emmy", "Emmy Noether")).status_code == 201
                events = [json.loads(line) for line in stream.iter_lines() if line]
            assert events[-1]["type"] == "ERROR", events
            assert events[-1]["object"]["code"] == 500
            assert "the converter is down" in events[-1]["object"]["message"]
        finally:
            patch["spec"]["conversion"]["webhook"]["clientConfig"]["url"] = srv.url("/convert")
            c.patch(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}", json=patch,
                    headers={"Content-Type": "application/merge-patch+json"})
