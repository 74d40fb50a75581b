"""Ingress, IngressClass and NetworkPolicy served like Kubernetes, seen through real
kubectl and the official `kubernetes` Python client.

One `fleet server --no-agent` is shared by the module (no node is needed: these
are API objects only); each test works in its own namespace.  IngressClasses
are cluster-scoped, so each test names its own.

* `kubectl create ingress --rule ... --class`, `get ing -o wide`, `describe ingress`;
  a controller's `/status` write shows in ADDRESS, and a write of the main
  resource can neither set nor clear it.
* An IngressClass annotated as the default is given to an Ingress created
  without a class (DefaultIngressClass admission); `get ingressclass` prints it.
* A NetworkPolicy: defaulted (policyTypes, port protocol), `get netpol`,
  `describe networkpolicy`.
* Invalid objects are refused with 422 and kube's messages.
* `kubectl api-resources`, `kubectl explain ingress.spec.rules`, and the Python client's
  NetworkingV1Api.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.conftest import KUBECTL, FleetServer, run_kubectl
from tests.e2e.helpers import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

API = "/apis/networking.k8s.io/v1"


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=60)
    assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
    return out


def kubectl_fails(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=60)
    assert rc != 0, f"kubectl {' '.join(args)} unexpectedly succeeded\n{out}"
    return err


def table(out: str) -> list[list[str]]:
    """kubectl's table as rows of cells (cells are separated by at least two spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in out.strip().splitlines()]


@pytest.fixture
def uniq() -> str:
    return uuid.uuid4().hex[:6]


def test_create_get_describe_ingress_and_status(fleet_server: FleetServer, namespace: str) -> None:
    srv, ns = fleet_server, namespace
    kubectl(srv, "-n", ns, "create", "ingress", "simple", "--class", "fleet",
            "--rule", "foo.com/bar*=svc1:8080,tls=my-cert")
    ing = json.loads(kubectl(srv, "-n", ns, "get", "ing", "simple", "-o", "json"))
    assert ing["spec"] == {
        "ingressClassName": "fleet",
        "rules": [{"host": "foo.com", "http": {"paths": [
            {"path": "/bar", "pathType": "Prefix",
             "backend": {"service": {"name": "svc1", "port": {"number": 8080}}}}]}}],
        "tls": [{"hosts": ["foo.com"], "secretName": "my-cert"}],
    }
    assert ing["metadata"]["generation"] == 1
    assert not ing.get("status", {}).get("loadBalancer")

    rows = table(kubectl(srv, "-n", ns, "get", "ing", "-o", "wide"))
    assert rows[0] == ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]
    # ADDRESS is empty: the row has one cell less.
    assert rows[1][:4] == ["simple", "fleet", "foo.com", "80, 443"]

    desc = kubectl(srv, "-n", ns, "describe", "ingress", "simple")
    assert "Ingress Class:    fleet" in desc, desc
    assert "my-cert terminates foo.com" in desc, desc
    assert "/bar" in desc and "svc1:8080" in desc, desc

    # A controller reports the address through /status ...
    with srv.client() as c:
        url = f"{API}/namespaces/{ns}/ingresses/simple"
        cur = c.get(url).json()
        cur["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}, {"hostname": "lb.example.com"}]}}
        cur["spec"]["ingressClassName"] = "ignored-on-status"
        r = c.put(url + "/status", json=cur)
        assert r.status_code == 200, r.text
        assert r.json()["spec"]["ingressClassName"] == "fleet"  # spec changes are ignored there
        # ... a bad address is refused there with kube's message ...
        bad = r.json()
        bad["status"]["loadBalancer"]["ingress"].append({"hostname": "10.0.0.1"})
        r = c.put(url + "/status", json=bad)
        assert r.status_code == 422, r.text
        assert r.json()["details"]["causes"] == [{
            "reason": "FieldValueInvalid", "field": "status.loadBalancer.ingress[2].hostname",
            "message": 'Invalid value: "10.0.0.1": must be a DNS name, not an IP address'}]
        # ... and an update of the Ingress itself keeps it.
        cur = c.get(url).json()
        cur["status"] = {}
        cur["spec"]["rules"][0]["host"] = "bar.com"
        r = c.put(url, json=cur)
        assert r.status_code == 200, r.text
        assert r.json()["status"]["loadBalancer"]["ingress"][0]["ip"] == "192.0.2.10"
        assert r.json()["metadata"]["generation"] == 2
    rows = table(kubectl(srv, "-n", ns, "get", "ing", "simple"))
    assert rows[1][:5] == ["simple", "fleet", "bar.com", "192.0.2.10,lb.example.com", "80, 443"]


def ingress_json(name: str, **spec: Any) -> str:
    body = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name},
            "spec": spec or {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}}
    return json.dumps(body)


def test_default_ingress_class(fleet_server: FleetServer, namespace: str, uniq: str) -> None:
    srv, ns = fleet_server, namespace
    # Named to sort before any other default created in the same second (kube's tie-break).
    cls = f"a-e2e-{uniq}"
    kubectl(srv, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": cls, "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
        "spec": {"controller": "fleet.dev/ingress",
                 "parameters": {"apiGroup": "k8s.example.com", "kind": "Params", "name": "p"}}}))
    try:
        rows = table(kubectl(srv, "get", "ingressclass", cls))
        assert rows[0] == ["NAME", "CONTROLLER", "PARAMETERS", "AGE"]
        assert rows[1][:3] == [cls, "fleet.dev/ingress", "Params.k8s.example.com/p"]
        got = json.loads(kubectl(srv, "get", "ingressclass", cls, "-o", "json"))
        assert got["spec"]["parameters"]["scope"] == "Cluster"  # defaulted

        # The admission plugin reads classes from a watch-fed cache: wait (with server-side
        # dry runs, which go through admission) until it has seen the new class.
        def dry_run_class() -> str:
            out = kubectl(srv, "-n", ns, "create", "--dry-run=server", "-o", "json", "-f", "-",
                          input=ingress_json("probe"))
            return json.loads(out)["spec"].get("ingressClassName", "")
        wait_until(lambda: dry_run_class() == cls, timeout=10, what="the default class in admission")

        kubectl(srv, "-n", ns, "apply", "-f", "-", input=ingress_json("no-class"))
        ing = json.loads(kubectl(srv, "-n", ns, "get", "ing", "no-class", "-o", "json"))
        assert ing["spec"]["ingressClassName"] == cls
        assert table(kubectl(srv, "-n", ns, "get", "ing", "no-class"))[1][:3] == ["no-class", cls, "*"]

        # The legacy annotation counts as a class: no default is given then.
        body = json.loads(ingress_json("annotated"))
        body["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "nginx"}
        kubectl(srv, "-n", ns, "apply", "-f", "-", input=json.dumps(body))
        ing = json.loads(kubectl(srv, "-n", ns, "get", "ing", "annotated", "-o", "json"))
        assert "ingressClassName" not in ing["spec"]

        # spec.controller is immutable.
        err = kubectl_fails(srv, "patch", "ingressclass", cls, "--type=merge", "-p",
                            '{"spec":{"controller":"other.dev/x"}}')
        assert 'spec.controller: Invalid value: "other.dev/x": field is immutable' in err, err
    finally:
        kubectl(srv, "delete", "ingressclass", cls)


def test_invalid_ingresses_are_refused(fleet_server: FleetServer, namespace: str) -> None:
    srv, ns = fleet_server, namespace
    cases = [
        (ingress_json("bad", rules=[{"host": "foo.com", "http": {"paths": [
            {"path": "/x", "backend": {"service": {"name": "s", "port": {"number": 80}}}}]}}]),
         "spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"),
        (ingress_json("bad", rules=[{"host": "1.2.3.4"}]),
         'spec.rules[0].host: Invalid value: "1.2.3.4": must be a DNS name, not an IP address'),
        (ingress_json("bad", rules=[{"http": {"paths": [
            {"path": "/a//b", "pathType": "Exact", "backend": {"service": {"name": "s", "port": {"number": 80}}}}]}}]),
         "spec.rules[0].http.paths[0].path: Invalid value: \"/a//b\": must not contain '//'"),
        (ingress_json("bad", defaultBackend={"service": {"name": "s", "port": {"number": 80, "name": "http"}}}),
         'spec.defaultBackend: Invalid value: "": cannot set both port name & port number'),
        (ingress_json("bad", ingressClassName="x", tls=[{"hosts": ["foo.com"]}]),
         "spec: Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified"),
    ]
    for body, message in cases:
        err = kubectl_fails(srv, "-n", ns, "create", "-f", "-", input=body)
        assert 'The Ingress "bad" is invalid' in err and message in err, err
    body = json.loads(ingress_json("bad", ingressClassName="fleet",
                                   defaultBackend={"service": {"name": "s", "port": {"number": 80}}}))
    body["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "nginx"}
    with srv.client() as c:
        r = c.post(f"{API}/namespaces/{ns}/ingresses", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "annotations.kubernetes.io/ingress.class",
        "message": 'Invalid value: "nginx": must match `ingressClassName` when both are specified'}]
    assert "bad" not in kubectl(srv, "-n", ns, "get", "ing", "-o", "name")


NETPOL = {
    "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "db"},
    "spec": {"podSelector": {"matchLabels": {"app": "db"}},
             "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "api"}}},
                                   {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                          "ports": [{"port": 5432}]}],
             "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": 53, "protocol": "UDP"}]}]},
}


def test_network_policy(fleet_server: FleetServer, namespace: str) -> None:
    srv, ns = fleet_server, namespace
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=json.dumps(NETPOL))
    got = json.loads(kubectl(srv, "-n", ns, "get", "netpol", "db", "-o", "json"))
    assert got["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert got["spec"]["ingress"][0]["ports"] == [{"port": 5432, "protocol": "TCP"}]
    rows = table(kubectl(srv, "-n", ns, "get", "netpol"))
    assert rows[0] == ["NAME", "POD-SELECTOR", "AGE"] and rows[1][:2] == ["db", "app=db"]
    desc = kubectl(srv, "-n", ns, "describe", "networkpolicy", "db")
    for text in ("PodSelector:     app=db", "Allowing ingress traffic:", "To Port: 5432/TCP",
                 "PodSelector: role=api", "IPBlock:", "CIDR: 10.0.0.0/8", "Except: 10.1.0.0/16",
                 "Allowing egress traffic:", "To Port: 53/UDP", "Policy Types: Ingress, Egress"):
        assert text in desc, desc

    bad = json.loads(json.dumps(NETPOL))
    bad["metadata"]["name"] = "bad"
    bad["spec"]["ingress"][0]["from"][1]["ipBlock"]["except"] = ["11.0.0.0/16"]
    bad["spec"]["ingress"][0]["ports"] = [{"port": "http", "endPort": 90}]
    err = kubectl_fails(srv, "-n", ns, "apply", "-f", "-", input=json.dumps(bad))
    assert 'The NetworkPolicy "bad" is invalid' in err, err
    assert 'spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric' in err
    assert 'spec.ingress[0].from[1].ipBlock.except[0]: Invalid value: "11.0.0.0/16": must be a strict subset of ' \
           '`cidr`' in err


def test_api_resources_and_explain(fleet_server: FleetServer) -> None:
    rows = {r[0]: r for r in (line.split() for line in
                              kubectl(fleet_server, "api-resources", "--api-group=networking.k8s.io").splitlines())}
    assert rows["ingresses"] == ["ingresses", "ing", "networking.k8s.io/v1", "true", "Ingress"]
    assert rows["ingressclasses"] == ["ingressclasses", "networking.k8s.io/v1", "false", "IngressClass"]
    assert rows["networkpolicies"] == ["networkpolicies", "netpol", "networking.k8s.io/v1", "true", "NetworkPolicy"]
    out = kubectl(fleet_server, "explain", "ingress.spec.rules")
    assert "GROUP:      networking.k8s.io" in out and "KIND:       Ingress" in out, out
    assert "host" in out and "http" in out, out
    out = kubectl(fleet_server, "explain", "networkpolicy.spec.policyTypes")
    assert "FIELD: policyTypes" in out, out


@pytest.fixture(scope="module")
def networking_api(fleet_server: FleetServer) -> Iterator[client.NetworkingV1Api]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(fleet_server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        yield client.NetworkingV1Api(api)


def test_python_client(networking_api: client.NetworkingV1Api, namespace: str) -> None:
    api, ns = networking_api, namespace
    backend = client.V1IngressBackend(service=client.V1IngressServiceBackend(
        name="web", port=client.V1ServiceBackendPort(number=80)))
    api.create_namespaced_ingress(ns, client.V1Ingress(
        metadata=client.V1ObjectMeta(name="py"),
        spec=client.V1IngressSpec(ingress_class_name="fleet", rules=[client.V1IngressRule(
            host="py.example.com", http=client.V1HTTPIngressRuleValue(paths=[
                client.V1HTTPIngressPath(path="/", path_type="Prefix", backend=backend)]))])))
    ing = api.read_namespaced_ingress("py", ns)
    assert ing.spec.rules[0].host == "py.example.com"
    assert ing.spec.rules[0].http.paths[0].backend.service.port.number == 80
    assert [i.metadata.name for i in api.list_namespaced_ingress(ns).items] == ["py"]

    api.create_namespaced_network_policy(ns, client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name="py"),
        spec=client.V1NetworkPolicySpec(pod_selector=client.V1LabelSelector(match_labels={"app": "py"}),
                                        egress=[client.V1NetworkPolicyEgressRule(
                                            ports=[client.V1NetworkPolicyPort(port=443)])])))
    np = api.read_namespaced_network_policy("py", ns)
    assert np.spec.policy_types == ["Ingress", "Egress"]
    assert np.spec.egress[0].ports[0].protocol == "TCP"

    with pytest.raises(ApiException) as exc:
        api.create_namespaced_network_policy(ns, client.V1NetworkPolicy(
            metadata=client.V1ObjectMeta(name="bad"),
            spec=client.V1NetworkPolicySpec(pod_selector=client.V1LabelSelector(),
                                            policy_types=["Ingress", "Sideways"])))
    assert exc.value.status == 422
    assert json.loads(exc.value.body)["details"]["causes"][0]["field"] == "spec.policyTypes[1]"
    api.delete_namespaced_ingress("py", ns)
    wait_until(lambda: not api.list_namespaced_ingress(ns).items, timeout=10, what="the Ingress gone")
