"""Gateway API kinds served natively, seen through unmodified kubectl and the python client.

One `fleet server --no-agent` is shared by the module; no CRD is installed at any
point.  Each test works in its own namespace (and its own GatewayClass name):

* `kubectl apply -f` a GatewayClass, a Gateway with HTTP and HTTPS listeners and
  an HTTPRoute with weighted backendRefs, header matches and filters; the stored
  objects carry the CRDs' defaults; `kubectl get gatewayclass,gateway,httproute`
  and `kubectl get gtw` print the CRDs' columns; `kubectl describe httproute`
  renders the object; a second `kubectl apply` of an edited manifest patches it
  (a JSON merge patch, since these kinds take no strategic merge patch, as CRDs);
  status written through the status subresource fills ADDRESS and PROGRAMMED.
* An invalid route (a path regex that does not compile, a redirect together with
  backendRefs) is refused with 422 and both causes, and nothing is stored.
* `kubectl explain httproute.spec.rules` and `kubectl api-resources
  --api-group=gateway.networking.k8s.io` work from discovery and /openapi/v3.
* The python client's CustomObjectsApi creates, gets, lists, patches (merge patch)
  and watches an HTTPRoute.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.conftest import KUBECTL, FleetServer, create_namespace, run_kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

GROUP = "gateway.networking.k8s.io"


@pytest.fixture
def ns(fleet_server: FleetServer) -> Iterator[str]:
    name = f"g12-{uuid.uuid4().hex[:6]}"
    create_namespace(fleet_server, name)
    yield name
    with fleet_server.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def gc_name(fleet_server: FleetServer) -> Iterator[str]:
    name = f"g12-{uuid.uuid4().hex[:6]}"
    yield name
    with fleet_server.client() as c:
        c.delete(f"/apis/{GROUP}/v1/gatewayclasses/{name}")


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=90)
    assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
    return out


def manifest(gc: str, *, canary_weight: int = 10) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: {gc}
spec:
  controllerName: fleet.dev/gateway-controller
  description: Fleet's built-in gateway
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: web
spec:
  gatewayClassName: {gc}
  listeners:
  - name: http
    port: 8080
    protocol: HTTP
  - name: https
    port: 8443
    protocol: HTTPS
    hostname: "*.example.com"
    tls:
      certificateRefs:
      - name: example-cert
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: shop
spec:
  parentRefs:
  - name: web
  hostnames: ["shop.example.com", "www.shop.example.com"]
  rules:
  - matches:
    - path: {{type: PathPrefix, value: /cart}}
      headers:
      - name: X-Canary
        value: "yes"
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{{name: X-Via, value: fleet}}]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        remove: [Server]
    backendRefs:
    - name: cart
      port: 80
      weight: {100 - canary_weight}
    - name: cart-canary
      port: 80
      weight: {canary_weight}
  - matches:
    - path: {{type: Exact, value: /old}}
    filters:
    - type: RequestRedirect
      requestRedirect: {{scheme: https, hostname: shop.example.com}}
"""


def get_json(srv: FleetServer, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(srv, "get", *args, "-o", "json"))


def header_and_rows(out: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return lines[0].split(), [ln.split() for ln in lines[1:]]


def test_apply_get_describe(fleet_server: FleetServer, ns: str, gc_name: str) -> None:
    out = kubectl(fleet_server, "-n", ns, "apply", "-f", "-", input=manifest(gc_name))
    assert f"gatewayclass.gateway.networking.k8s.io/{gc_name} created" in out
    assert "gateway.gateway.networking.k8s.io/web created" in out
    assert "httproute.gateway.networking.k8s.io/shop created" in out

    # The CRDs' defaults, as stored.
    gw = get_json(fleet_server, "-n", ns, "gateway", "web")
    http, https = gw["spec"]["listeners"]
    assert http["allowedRoutes"] == {"namespaces": {"from": "Same"}}
    assert https["tls"] == {"mode": "Terminate",
                            "certificateRefs": [{"group": "", "kind": "Secret", "name": "example-cert"}]}
    assert [(c["type"], c["status"], c["reason"]) for c in gw["status"]["conditions"]] == [
        ("Accepted", "Unknown", "Pending"), ("Programmed", "Unknown", "Pending")]
    route = get_json(fleet_server, "-n", ns, "httproute", "shop")
    assert route["spec"]["parentRefs"] == [{"group": GROUP, "kind": "Gateway", "name": "web"}]
    rule0, rule1 = route["spec"]["rules"]
    assert rule0["matches"][0]["headers"] == [{"name": "X-Canary", "type": "Exact", "value": "yes"}]
    assert [(b["name"], b["weight"], b["kind"], b["group"]) for b in rule0["backendRefs"]] == [
        ("cart", 90, "Service", ""), ("cart-canary", 10, "Service", "")]
    assert rule1["filters"][0]["requestRedirect"]["statusCode"] == 302

    # Tables: the CRDs' printer columns.
    out = kubectl(fleet_server, "-n", ns, "get", "gatewayclass,gateway,httproute")
    assert f"gatewayclass.gateway.networking.k8s.io/{gc_name}" in out
    blocks = [b for b in out.split("\n\n") if b.strip()]
    heads = [header_and_rows(b)[0] for b in blocks]
    assert ["NAME", "CONTROLLER", "ACCEPTED", "AGE"] in heads
    assert ["NAME", "CLASS", "ADDRESS", "PROGRAMMED", "AGE"] in heads
    assert ["NAME", "HOSTNAMES", "AGE"] in heads
    assert '["shop.example.com","www.shop.example.com"]' in out
    head, rows = header_and_rows(kubectl(fleet_server, "-n", ns, "get", "gtw"))
    assert head == ["NAME", "CLASS", "ADDRESS", "PROGRAMMED", "AGE"]
    assert rows[0][:2] == ["web", gc_name] and "Unknown" in rows[0]
    head, rows = header_and_rows(kubectl(fleet_server, "get", "gc", gc_name, "-o", "wide"))
    assert head == ["NAME", "CONTROLLER", "ACCEPTED", "AGE", "DESCRIPTION"]
    assert rows[0][:3] == [gc_name, "fleet.dev/gateway-controller", "Unknown"]
    assert " ".join(rows[0][4:]) == "Fleet's built-in gateway"

    out = kubectl(fleet_server, "-n", ns, "describe", "httproute", "shop")
    for text in ("Name:         shop", f"Namespace:    {ns}", "API Version:  gateway.networking.k8s.io/v1",
                 "Kind:         HTTPRoute", "Backend Refs:", "cart-canary", "X-Canary", "Request Redirect:"):
        assert text in out, (text, out)

    # What a controller writes through the status subresource shows in the table.
    kubectl(fleet_server, "-n", ns, "patch", "gateway", "web", "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"addresses": [{"type": "IPAddress", "value": "127.0.0.1"}], "conditions": [
                {"type": "Programmed", "status": "True", "reason": "Programmed", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
    head, rows = header_and_rows(kubectl(fleet_server, "-n", ns, "get", "gtw", "web"))
    assert rows == [["web", gc_name, "127.0.0.1", "True", rows[0][-1]]]
    assert get_json(fleet_server, "-n", ns, "gateway", "web")["metadata"]["generation"] == 1

    # A second apply of an edited manifest: kubectl sends a JSON merge patch.
    out = kubectl(fleet_server, "-n", ns, "apply", "-f", "-", input=manifest(gc_name, canary_weight=50))
    assert "httproute.gateway.networking.k8s.io/shop configured" in out
    route = get_json(fleet_server, "-n", ns, "httproute", "shop")
    assert [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]] == [50, 50]
    assert route["metadata"]["generation"] == 2

    # Merge patch works, strategic merge patch is refused as for a custom resource.
    kubectl(fleet_server, "-n", ns, "patch", "httproute", "shop", "--type=merge",
            "-p", '{"spec":{"hostnames":["shop.example.com"]}}')
    assert get_json(fleet_server, "-n", ns, "httproute", "shop")["spec"]["hostnames"] == ["shop.example.com"]
    rc, _, err = run_kubectl(fleet_server, "-n", ns, "patch", "httproute", "shop",
                             "-p", '{"spec":{"hostnames":["x.example.com"]}}')
    assert rc != 0 and "strategic merge patch is not supported" in err, err


def test_invalid_route_refused(fleet_server: FleetServer, ns: str) -> None:
    bad = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: broken
spec:
  parentRefs: [{name: web}]
  rules:
  - matches:
    - path: {type: RegularExpression, value: "/api/(v1"}
    filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https}
    backendRefs:
    - {name: api, port: 80}
"""
    rc, out, err = run_kubectl(fleet_server, "-n", ns, "apply", "-f", "-", input=bad, timeout=90)
    assert rc != 0, out
    assert 'The HTTPRoute "broken" is invalid' in err, err
    assert 'spec.rules[0].matches[0].path.value: Invalid value: "/api/(v1": must be a valid regular ' \
           "expression" in err, err
    assert 'spec.rules[0]: Invalid value: "object": RequestRedirect filter must not be used together with ' \
           "backendRefs" in err, err
    with fleet_server.client() as c:
        r = c.post(f"/apis/{GROUP}/v1/namespaces/{ns}/httproutes", json={
            "apiVersion": f"{GROUP}/v1", "kind": "HTTPRoute", "metadata": {"name": "broken"},
            "spec": {"rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/a//b"}}]}]}})
        assert r.status_code == 422, r.text
        status = r.json()
        assert status["reason"] == "Invalid"
        assert status["message"].startswith('HTTPRoute.gateway.networking.k8s.io "broken" is invalid: ')
        assert {"field": "spec.rules[0].matches[0].path", "reason": "FieldValueInvalid",
                "message": "Invalid value: \"object\": must not contain '//' when type one of "
                           "['Exact', 'PathPrefix']"} in status["details"]["causes"]
        assert c.get(f"/apis/{GROUP}/v1/namespaces/{ns}/httproutes/broken").status_code == 404


def test_explain_and_api_resources(fleet_server: FleetServer) -> None:
    out = kubectl(fleet_server, "explain", "httproute.spec.rules")
    assert "GROUP:      gateway.networking.k8s.io" in out and "KIND:       HTTPRoute" in out
    for field in ("backendRefs", "filters", "matches", "timeouts"):
        assert field in out, (field, out)
    out = kubectl(fleet_server, "explain", "gateway.spec.listeners.tls")
    assert "certificateRefs" in out
    head, rows = header_and_rows(kubectl(fleet_server, "api-resources", f"--api-group={GROUP}"))
    assert head == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert sorted(rows) == [
        ["gatewayclasses", "gc", f"{GROUP}/v1", "false", "GatewayClass"],
        ["gateways", "gtw", f"{GROUP}/v1", "true", "Gateway"],
        ["httproutes", f"{GROUP}/v1", "true", "HTTPRoute"],
    ]
    out = kubectl(fleet_server, "api-resources", "--categories=gateway-api", "-o", "name")
    assert sorted(out.split()) == [f"gatewayclasses.{GROUP}", f"gateways.{GROUP}", f"httproutes.{GROUP}"]


def test_python_client_custom_objects(fleet_server: FleetServer, ns: str) -> None:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(fleet_server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        co = client.CustomObjectsApi(api)
        body = {"apiVersion": f"{GROUP}/v1", "kind": "HTTPRoute", "metadata": {"name": "py"},
                "spec": {"parentRefs": [{"name": "web"}],
                         "rules": [{"backendRefs": [{"name": "svc", "port": 8080}]}]}}
        created = co.create_namespaced_custom_object(GROUP, "v1", ns, "httproutes", body)
        assert created["spec"]["rules"][0]["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
        got = co.get_namespaced_custom_object(GROUP, "v1", ns, "httproutes", "py")
        assert got["metadata"]["uid"] == created["metadata"]["uid"]
        listed = co.list_namespaced_custom_object(GROUP, "v1", ns, "httproutes")
        assert [i["metadata"]["name"] for i in listed["items"]] == ["py"]
        events = [(e["type"], e["object"]["metadata"]["name"]) for e in watch.Watch().stream(
            co.list_namespaced_custom_object, GROUP, "v1", ns, "httproutes",
            resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=2)]
        assert events == []  # nothing changed since the list
        co.patch_namespaced_custom_object(GROUP, "v1", ns, "httproutes", "py",
                                          {"spec": {"hostnames": ["py.example.com"]}})
        events = [(e["type"], e["object"]["spec"].get("hostnames")) for e in watch.Watch().stream(
            co.list_namespaced_custom_object, GROUP, "v1", ns, "httproutes",
            resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=2)]
        assert events == [("MODIFIED", ["py.example.com"])]
        with pytest.raises(ApiException) as e:
            co.create_namespaced_custom_object(GROUP, "v1", ns, "httproutes", {
                **body, "metadata": {"name": "bad"},
                "spec": {"rules": [{"backendRefs": [{"name": "svc", "port": 8080, "weight": -5}]}]}})
        assert e.value.status == 422
