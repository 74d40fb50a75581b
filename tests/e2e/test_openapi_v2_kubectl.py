"""kubectl 1.32, unmodified, reading `/openapi/v2` from a real `fleet server`.

kubectl reads only the protobuf form of v2 (client-go's `OpenAPISchema()`), so these are the
checks that the gnostic encoding is right, not just well-formed:

* `kubectl explain --output=plaintext-openapiv2` (v2 only) for a kind, a field path, a list
  field, a Gateway API kind (named as a CRD) and a kind with no built-in schema.
* Client-side apply with `KUBECTL_OPENAPIV3_PATCH=false` computes its strategic merge patch
  from the v2 document (merge keys, `$setElementOrder`), and the server applies it.
* `kubectl apply -f` of a `kind: List`, whose items kubectl validates against v2 itself.
* The JSON form through `kubectl get --raw`, and the serving rules (content types, ETag and
  304, gzip, 406) over HTTP.
"""

from __future__ import annotations

import gzip
import json
import re
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.conftest import KUBECTL, FleetServer, create_namespace, run_kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

PROTO = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
PROTO_AT = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


@pytest.fixture
def ns(fleet_server: FleetServer) -> Iterator[str]:
    name = f"oa2-{uuid.uuid4().hex[:6]}"
    create_namespace(fleet_server, name)
    yield name
    with fleet_server.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


def explain(srv: FleetServer, *args: str) -> str:
    rc, out, err = run_kubectl(srv, "explain", *args, "--output=plaintext-openapiv2", timeout=90)
    assert rc == 0, f"kubectl explain {' '.join(args)} -> {rc}\n{out}\n{err}"
    return out


def test_explain_pods_from_openapiv2(fleet_server: FleetServer) -> None:
    out = explain(fleet_server, "pods")
    assert re.search(r"^KIND:\s+Pod$", out, re.M) and re.search(r"^VERSION:\s+v1$", out, re.M), out
    assert "Pod is a collection of containers" in out
    for field in ("apiVersion\t<string>", "kind\t<string>", "metadata\t<Object>", "spec\t<Object>",
                  "status\t<Object>"):
        assert field in out, out


def test_explain_field_paths_from_openapiv2(fleet_server: FleetServer) -> None:
    out = explain(fleet_server, "deployment.spec.replicas")
    assert re.search(r"^VERSION:\s+apps/v1$", out, re.M), out
    assert re.search(r"^FIELD:\s+replicas <integer>$", out, re.M), out
    assert "Number of desired pods" in out
    out = explain(fleet_server, "pods.spec.containers")
    assert re.search(r"^RESOURCE:\s+containers <\[\]Object>$", out, re.M), out
    assert "image\t<string>" in out and "ports\t<[]Object>" in out
    out = explain(fleet_server, "cronjobs.spec.jobTemplate.spec.template.spec.restartPolicy")
    assert re.search(r"^FIELD:\s+restartPolicy <string>$", out, re.M), out


def test_explain_crd_style_and_schemaless_kinds(fleet_server: FleetServer) -> None:
    # Gateway API kinds are defined as CRDs upstream; their definitions carry CRD-style names.
    out = explain(fleet_server, "httproutes.spec.rules")
    assert re.search(r"^VERSION:\s+gateway.networking.k8s.io/v1$", out, re.M), out
    assert re.search(r"^RESOURCE:\s+rules <\[\]Object>$", out, re.M), out
    assert "backendRefs\t<[]Object>" in out
    # A kind with no schema of its own (served like a CRD with x-kubernetes-preserve-unknown-fields).
    out = explain(fleet_server, "processcontrols")
    assert re.search(r"^KIND:\s+ProcessControl$", out, re.M), out
    assert "metadata\t<Object>" in out and "Standard object's metadata" in out


def test_client_side_apply_patches_from_openapiv2(fleet_server: FleetServer, ns: str) -> None:
    manifest = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                     {"name": "web", "image": "nginx:1.25",
                      "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}]}}},
    }
    env = {"KUBECTL_OPENAPIV3_PATCH": "false"}
    rc, out, err = run_kubectl(fleet_server, "apply", "-f", "-", input=yaml.safe_dump(manifest), env=env)
    assert rc == 0, err
    # A second client edits the live object: an env entry kubectl's manifest never had.
    with fleet_server.client() as c:
        r = c.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/web",
                    content=json.dumps({"spec": {"template": {"spec": {"containers": [
                        {"name": "web", "env": [{"name": "LIVE", "value": "x"}]}]}}}}),
                    headers={"Content-Type": "application/strategic-merge-patch+json"})
        assert r.status_code == 200, r.text
    manifest["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"] = "3"
    rc, out, err = run_kubectl(fleet_server, "apply", "-f", "-", "-v=8", input=yaml.safe_dump(manifest), env=env)
    assert rc == 0, err
    assert re.search(r"GET https://\S+/openapi/v2\?timeout=32s\s*$", err, re.M), err[-3000:]
    assert re.search(r"Content-Type: " + re.escape(PROTO), err), err[-3000:]
    assert "error calculating patch from openapi spec" not in err + out
    # The patch names list entries by their merge keys (from the v2 document's extensions).
    body = next(line for line in err.splitlines() if '"Request Body"' in line and "setElementOrder" in line)
    assert "$setElementOrder/env" in body
    with fleet_server.client() as c:
        obj = c.get(f"/apis/apps/v1/namespaces/{ns}/deployments/web").json()
    env_list = obj["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {e["name"]: e["value"] for e in env_list} == {"A": "1", "B": "3", "LIVE": "x"}


def test_raw_json_and_serving_rules(fleet_server: FleetServer) -> None:
    rc, out, err = run_kubectl(fleet_server, "get", "--raw", "/openapi/v2")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["swagger"] == "2.0"
    assert doc["definitions"]["io.k8s.api.apps.v1.Deployment"]["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "kind": "Deployment", "version": "v1"}]
    with fleet_server.client() as c:
        j = c.get("/openapi/v2", headers={"Accept": "application/json", "Accept-Encoding": "identity"})
        assert j.status_code == 200 and j.headers["content-type"] == "application/json"
        assert json.loads(j.content) == doc
        etag = j.headers["etag"]
        p = c.get("/openapi/v2", headers={"Accept": f"{PROTO_AT},application/json",
                                          "Accept-Encoding": "gzip"})
        assert p.status_code == 200 and p.headers["content-type"] == PROTO
        assert p.headers["content-encoding"] == "gzip" and p.headers["etag"] == etag
        assert p.content[:2] == b"\x0a\x03" and p.content[2:5] == b"2.0"  # Document.swagger, decoded by httpx
        assert c.get("/openapi/v2", headers={"If-None-Match": etag}).status_code == 304
        assert c.get("/openapi/v2", headers={"Accept": "text/html"}).status_code == 406
        with c.stream("GET", "/openapi/v2", headers={"Accept": PROTO, "Accept-Encoding": "gzip"}) as r:
            wire = b"".join(r.iter_raw())  # as sent, before httpx undoes the gzip
        assert gzip.decompress(wire) == p.content and len(wire) < len(p.content) // 3


def test_apply_a_kind_list(fleet_server: FleetServer, ns: str) -> None:
    """kubectl validates the items of a `kind: List` against /openapi/v2 (it failed with a 404 before)."""
    items = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one", "namespace": ns},
         "data": {"a": "1"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "two", "namespace": ns}},
    ]}
    rc, out, err = run_kubectl(fleet_server, "apply", "-f", "-", "-v=6", input=yaml.safe_dump(items))
    assert rc == 0, err[-3000:]
    assert "configmap/one created" in out and "serviceaccount/two created" in out
    with fleet_server.client() as c:
        assert c.get(f"/api/v1/namespaces/{ns}/configmaps/one").json()["data"] == {"a": "1"}
        assert c.get(f"/api/v1/namespaces/{ns}/serviceaccounts/two").status_code == 200
    # A typo in an item is refused by kubectl's own check against the v2 definitions, in the
    # words (and definition name) it uses against kube-apiserver.
    items["items"][0]["dataa"] = {"b": "2"}
    rc, out, err = run_kubectl(fleet_server, "apply", "-f", "-", input=yaml.safe_dump(items))
    assert rc != 0
    assert 'ValidationError(ConfigMap): unknown field "dataa" in io.k8s.api.core.v1.ConfigMap' in err, err
