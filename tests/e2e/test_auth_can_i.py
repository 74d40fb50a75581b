"""`kubectl auth can-i` and impersonation against a real `fleet server` (kubectl 1.32, the admin
kubeconfig: a system:masters user).

kubectl sends SelfSubjectAccessReview / SelfSubjectRulesReview as protobuf and formats the
answer itself (yes/no, the --list table), so matching its output here means the server's
answers match kube-apiserver's for the same rules.

Authorization mode: the server's default, `Node,RBAC`, with the default roles reconciled at
start (system:basic-user lets every authenticated user ask the self reviews).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import KUBECTL, FleetServer, ServerFactory

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(fleet_server_factory: ServerFactory) -> Iterator[FleetServer]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    yield fleet_server_factory.start()


def can_i(server: FleetServer, *args: str) -> tuple[int, str, str]:
    return server.kubectl("auth", "can-i", *args)


def test_can_i_as_admin(server: FleetServer) -> None:
    assert can_i(server, "create", "pods") == (0, "yes\n", "")
    assert can_i(server, "*", "*") == (0, "yes\n", "")
    assert can_i(server, "delete", "nodes", "--all-namespaces") == (0, "yes\n", "")
    assert can_i(server, "get", "/healthz") == (0, "yes\n", "")
    assert can_i(server, "create", "deployments.apps", "-n", "kube-system", "--subresource", "scale")[:2] == \
        (0, "yes\n")
    # A resource discovery does not list: kubectl warns, the server still answers.
    rc, out, err = can_i(server, "list", "foos")
    assert (rc, out) == (0, "yes\n")
    assert "the server doesn't have a resource type 'foos'" in err


def test_can_i_list_shows_the_star_rules(server: FleetServer) -> None:
    rc, out, err = can_i(server, "--list", "-n", "ns")
    assert (rc, err) == (0, "")
    lines = [line.rstrip() for line in out.splitlines()]
    assert lines[0].split() == ["Resources", "Non-Resource", "URLs", "Resource", "Names", "Verbs"]
    rows = [line.split() for line in lines[1:]]
    assert ["*.*", "[]", "[]", "[*]"] in rows
    assert ["[*]", "[]", "[*]"] in rows
    # cluster-admin's two rules, then what system:authenticated is bound to (basic-user's
    # self reviews, the discovery and public-info URLs — /healthz twice, from both roles),
    # as `kubectl auth can-i --list` shows for a kind cluster's admin.
    assert ["selfsubjectaccessreviews.authorization.k8s.io", "[]", "[]", "[create]"] in rows
    assert ["selfsubjectreviews.authentication.k8s.io", "[]", "[]", "[create]"] in rows
    assert rows.count(["[/healthz]", "[]", "[get]"]) == 2
    assert ["[/apis/*]", "[]", "[get]"] in rows


def test_can_i_as_another_user(server: FleetServer) -> None:
    # The admin (system:masters) may impersonate anyone; the review answers for bob, who
    # has no grant on pods (system:basic-user lets him ask).
    assert can_i(server, "get", "pods", "--as", "bob") == (1, "no\n", "")
    assert can_i(server, "get", "pods", "--as", "bob", "--as-group", "devs") == (1, "no\n", "")
    assert can_i(server, "list", "secrets", "--as", "system:serviceaccount:default:builder",
                 "-n", "default") == (1, "no\n", "")
    # A grant to the impersonated group answers for bob in it.
    rc, _, err = server.kubectl("create", "rolebinding", "devs-view", "--clusterrole", "view",
                                "--group", "devs", "-n", "default")
    assert rc == 0, err
    assert can_i(server, "get", "pods", "--as", "bob", "--as-group", "devs", "-n", "default") == \
        (0, "yes\n", "")
    # The request itself runs as bob: authorized as bob, refused as bob.
    rc, out, err = server.kubectl("get", "namespaces", "default", "--as", "bob", "-o", "name")
    assert rc == 1 and 'User "bob" cannot get resource "namespaces"' in err
    # kubectl refuses groups without a user itself; the server answers such a request 500.
    rc, _, err = server.kubectl("get", "pods", "--as-group", "devs")
    assert rc == 1 and "without impersonating a user" in err


def test_reviews_over_the_wire(server: FleetServer) -> None:
    sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
           "spec": {"user": "bob", "groups": ["devs"],
                    "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}}}
    rc, out, err = server.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(sar))
    assert rc == 0, err
    got = json.loads(out)
    assert got["kind"] == "SubjectAccessReview"
    assert got["spec"]["user"] == "bob"
    assert got["status"]["allowed"] is False  # RBAC has no opinion: no "denied"
    assert "denied" not in got["status"]

    with httpx.Client(base_url=server.url, verify=server.verify(),
                      headers={"Authorization": f"Bearer {server.token}"}) as c:
        r = c.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json={**sar, "spec": {}})
        assert r.status_code == 422
        assert r.json()["message"] == (
            '.authorization.k8s.io "" is invalid: [spec.resourceAttributes: Invalid value: "null": exactly one '
            "of nonResourceAttributes or resourceAttributes must be specified, spec.user: Invalid value: \"\": "
            "at least one of user or group must be specified]")
        r = c.post("/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews",
                   json={**sar, "kind": "LocalSubjectAccessReview"})
        assert r.status_code == 201 and r.json()["metadata"]["namespace"] == "default"
        r = c.post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                   json={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {}})
        assert (r.status_code, r.json()["message"]) == (400, "no namespace on request")
        r = c.get("/api/v1/namespaces/default/pods", headers={"Impersonate-Group": "devs"})
        # kube-apiserver's message; a 400 Status where kube-apiserver sends a text/plain 500.
        assert r.status_code == 400
        assert (r.json()["reason"], r.json()["message"]) == (
            "BadRequest", "requested [{Group  devs    }] without impersonating a user")
