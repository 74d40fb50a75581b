"""ValidatingAdmissionPolicy (CEL) against a real `fleet server`, configured with kubectl.

Each test's policy selects only its own namespace (namespaceSelector on
`kubernetes.io/metadata.name`), so the tests share one server.

* a ConfigMap param + a policy with `paramKind` + a binding with `paramRef`: a
  Deployment with more replicas than the param allows is refused (403, kube's
  message), one within it is admitted, and changing the param changes the verdict;
* a Warn binding's message is printed by kubectl as `Warning: ...` and the write
  goes through;
* a policy whose expression does not compile is refused with cel-go's error text.

(A webhook whose matchCondition is false is not called: tests/e2e/test_admission_webhooks.py.)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer, create_namespace, run_kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

API = "admissionregistration.k8s.io/v1"


@pytest.fixture
def ns(fleet_server: FleetServer) -> Iterator[str]:
    name = f"vap-{uuid.uuid4().hex[:6]}"
    create_namespace(fleet_server, name)
    yield name
    with fleet_server.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def made(fleet_server: FleetServer) -> Iterator[list[tuple[str, str]]]:
    """(plural, name) of the cluster-scoped objects a test created; deleted afterwards."""
    out: list[tuple[str, str]] = []
    yield out
    with fleet_server.client() as c:
        for plural, name in reversed(out):
            c.delete(f"/apis/{API}/{plural}/{name}")


def apply(srv: FleetServer, doc: dict[str, Any]) -> tuple[int, str, str]:
    return run_kubectl(srv, "apply", "-f", "-", input=json.dumps(doc))


def deployment(ns: str, name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def install_policy(srv: FleetServer, made: list[tuple[str, str]], ns: str, actions: list[str],
                   **spec: Any) -> str:
    name = f"vap-{uuid.uuid4().hex[:6]}.fleet.test"
    policy = {"apiVersion": API, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {
                           "resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                              "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}],
                           "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
                       **spec}}
    rc, out, err = apply(srv, policy)
    assert rc == 0, err
    made.append(("validatingadmissionpolicies", name))
    binding: dict[str, Any] = {"apiVersion": API, "kind": "ValidatingAdmissionPolicyBinding",
                               "metadata": {"name": name},
                               "spec": {"policyName": name, "validationActions": actions}}
    if "paramKind" in spec:
        binding["spec"]["paramRef"] = {"name": "replica-limit", "namespace": ns,
                                       "parameterNotFoundAction": "Deny"}
    rc, out, err = apply(srv, binding)
    assert rc == 0, err
    made.append(("validatingadmissionpolicybindings", name))
    return name


def create(srv: FleetServer, doc: dict[str, Any]) -> tuple[int, str, str]:
    return run_kubectl(srv, "create", "-f", "-", input=json.dumps(doc))


def eventually(srv: FleetServer, ns: str, replicas: int, *, refused: bool) -> tuple[str, str]:
    """Create Deployments until the verdict is the expected one (the caches are watch-fed)."""
    deadline = time.monotonic() + 15
    while True:
        rc, out, err = create(srv, deployment(ns, f"d-{uuid.uuid4().hex[:6]}", replicas))
        if (rc != 0) == refused:
            return out, err
        assert time.monotonic() < deadline, (rc, out, err)
        time.sleep(0.2)


def test_param_policy_denies_over_the_limit(fleet_server: FleetServer, ns: str,
                                            made: list[tuple[str, str]]) -> None:
    rc, out, err = create(fleet_server, {"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": "replica-limit", "namespace": ns},
                                         "data": {"maxReplicas": "3"}})
    assert rc == 0, err
    name = install_policy(
        fleet_server, made, ns, ["Deny"],
        paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
        variables=[{"name": "limit", "expression": "int(params.data.maxReplicas)"}],
        validations=[{"expression": "object.spec.replicas <= variables.limit", "reason": "Forbidden",
                      "messageExpression": "'replicas must be at most ' + params.data.maxReplicas"}])
    _, err = eventually(fleet_server, ns, 5, refused=True)
    assert "Error from server (Forbidden)" in err
    assert (f"is forbidden: ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: "
            "replicas must be at most 3") in err
    # Within the limit: admitted.
    rc, out, err = create(fleet_server, deployment(ns, "small", 3))
    assert rc == 0, err
    # The param is live: raise the limit and 5 replicas go through.
    rc, out, err = run_kubectl(fleet_server, "patch", "configmap", "replica-limit", "-n", ns,
                               "-p", '{"data":{"maxReplicas":"5"}}')
    assert rc == 0, err
    eventually(fleet_server, ns, 5, refused=False)
    # An update over the limit is judged too (the policy's operations include UPDATE).
    rc, out, err = run_kubectl(fleet_server, "patch", "deployment", "small", "-n", ns,
                               "-p", '{"spec":{"replicas":9}}')
    assert rc != 0 and "replicas must be at most 5" in err


def test_warn_binding_prints_a_warning(fleet_server: FleetServer, ns: str, made: list[tuple[str, str]]) -> None:
    name = install_policy(fleet_server, made, ns, ["Warn", "Audit"],
                          validations=[{"expression": "object.spec.replicas % 2 == 1",
                                        "message": "use an odd number of replicas"}])
    deadline = time.monotonic() + 15
    while True:
        rc, out, err = create(fleet_server, deployment(ns, f"w-{uuid.uuid4().hex[:6]}", 2))
        assert rc == 0, err  # Warn never refuses
        if "Warning:" in err or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (f"Warning: Validation failed for ValidatingAdmissionPolicy '{name}' with binding '{name}': "
            "use an odd number of replicas") in err


def test_policy_that_does_not_compile_is_refused(fleet_server: FleetServer, made: list[tuple[str, str]]) -> None:
    doc = {"apiVersion": API, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "broken.fleet.test"},
           "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                            "operations": ["CREATE"],
                                                            "resources": ["deployments"]}]},
                    "validations": [{"expression": "object.spec.replicas <"},
                                    {"expression": "object.spec.replicas < limit"}]}}
    rc, out, err = apply(fleet_server, doc)
    assert rc != 0
    assert 'The ValidatingAdmissionPolicy "broken.fleet.test" is invalid' in err
    assert ('spec.validations[0].expression: Invalid value: "object.spec.replicas <": compilation failed: '
            "ERROR: <input>:1:23: Syntax error: mismatched input '<EOF>'") in err
    assert "undeclared reference to 'limit'" in err
    rc, out, err = run_kubectl(fleet_server, "get", "validatingadmissionpolicy", "broken.fleet.test")
    assert rc != 0 and "NotFound" in err
