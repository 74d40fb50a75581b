"""ResourceQuota and LimitRange with kubectl 1.32 against a real `fleet server`.

The server runs its controllers (the quota controller fills `status`) and no agent: the
pods here are never scheduled anywhere, which is all admission and quota need.

- a quota-exceeding create is 403 with kube-apiserver's exact words, `status.used` follows
  creates (admission) and deletions (the controller), `kubectl get quota` prints its table;
- a pod that does not state quota-tracked compute is refused ("must specify ...");
- 20 creates fired in parallel at a pod quota of 5 create exactly 5 pods;
- `kubectl create quota` (protobuf) and object-count quotas on other kinds;
- LimitRange defaults are visible on the created pod and its bounds are refused.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer
from tests.e2e.helpers import api_get, dump_all, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")]


def ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0, f"kubectl failed rc={rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def fails(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc != 0, f"kubectl should have failed\nstdout:\n{out}\nstderr:\n{err}"
    return err


def pod(name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "busybox:1.36", "resources": res}]}}


def quota(name: str, hard: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": hard}}


def status_of(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    code, body = api_get(srv, f"/api/v1/namespaces/{ns}/resourcequotas/{name}")
    assert code == 200, body
    return body.get("status") or {}


def wait_used(srv: FleetServer, ns: str, name: str, want: dict[str, str], timeout: float = 30.0) -> None:
    wait_until(lambda: status_of(srv, ns, name).get("used") == want, timeout=timeout,
               what=f"quota {name} used == {want}")


def test_quota_refusal_usage_and_table(fleet_server: FleetServer, kubectl, namespace: str) -> None:
    ns = namespace
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(
        quota("q", {"pods": "2", "requests.cpu": "1", "limits.memory": "1Gi"}))))
    # The quota takes effect once the controller has counted (as in Kubernetes).
    wait_used(fleet_server, ns, "q", {"pods": "0", "requests.cpu": "0", "limits.memory": "0"})
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(
        pod("p1", {"cpu": "300m"}, {"memory": "256Mi"}), pod("p2", {"cpu": "200m"}, {"memory": "512Mi"}))))
    assert status_of(fleet_server, ns, "q")["used"] == {"limits.memory": "768Mi", "pods": "2",
                                                        "requests.cpu": "500m"}
    err = fails(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(pod("p3", {"cpu": "100m"},
                                                                             {"memory": "1Mi"}))))
    assert 'Error from server (Forbidden): error when creating "STDIN": pods "p3" is forbidden: exceeded ' \
           "quota: q, requested: pods=1, used: pods=2, limited: pods=2" in err, err
    code, body = api_get(fleet_server, f"/api/v1/namespaces/{ns}/pods/p3")
    assert code == 404

    table = ok(kubectl("get", "quota", "-n", ns))
    header, row = table.splitlines()
    assert header.split() == ["NAME", "AGE", "REQUEST", "LIMIT"]
    assert "pods: 2/2, requests.cpu: 500m/1" in row and "limits.memory: 768Mi/1Gi" in row, table

    # Deleting a pod gives its share back (the controller recounts).
    ok(kubectl("delete", "pod", "-n", ns, "p1", "--wait=false"))
    wait_used(fleet_server, ns, "q", {"limits.memory": "512Mi", "pods": "1", "requests.cpu": "200m"})
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(pod("p3", {"cpu": "100m"}, {"memory": "1Mi"}))))

    err = fails(kubectl("run", "-n", ns, "bare", "--image=busybox:1.36", "--restart=Never"))
    assert 'pods "bare" is forbidden: failed quota: q: must specify limits.memory for: bare; requests.cpu ' \
           "for: bare" in err, err


def test_concurrent_creates_never_exceed_the_quota(fleet_server: FleetServer, kubectl, namespace: str) -> None:
    ns = namespace
    ok(kubectl("create", "quota", "five", "-n", ns, "--hard=pods=5"))  # kubectl sends protobuf
    wait_used(fleet_server, ns, "five", {"pods": "0"})

    def create(i: int) -> int:
        with fleet_server.client(timeout=60) as c:
            return c.post(f"/api/v1/namespaces/{ns}/pods", json=pod(f"p{i}")).status_code

    with ThreadPoolExecutor(max_workers=20) as pool:
        codes = list(pool.map(create, range(20)))
    assert sorted(codes) == [201] * 5 + [403] * 15, codes
    code, body = api_get(fleet_server, f"/api/v1/namespaces/{ns}/pods")
    assert code == 200 and len(body["items"]) == 5
    assert status_of(fleet_server, ns, "five")["used"] == {"pods": "5"}


def test_object_count_quotas(fleet_server: FleetServer, kubectl, namespace: str) -> None:
    ns = namespace
    # Every namespace holds the `kube-root-ca.crt` ConfigMap (root-ca-cert-publisher),
    # and it counts, as in Kubernetes: one of the two allowed is taken.
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(
        quota("objects", {"configmaps": "2", "count/deployments.apps": "0", "services": "1"}))))
    wait_used(fleet_server, ns, "objects", {"configmaps": "1", "count/deployments.apps": "0", "services": "0"})
    ok(kubectl("create", "configmap", "one", "-n", ns, "--from-literal=a=b"))
    err = fails(kubectl("create", "configmap", "two", "-n", ns))
    assert 'configmaps "two" is forbidden: exceeded quota: objects, requested: configmaps=1, used: ' \
           "configmaps=2, limited: configmaps=2" in err, err
    err = fails(kubectl("create", "deployment", "web", "-n", ns, "--image=busybox:1.36"))
    assert 'deployments.apps "web" is forbidden: exceeded quota: objects, requested: ' \
           "count/deployments.apps=1, used: count/deployments.apps=0, limited: count/deployments.apps=0" in err
    ok(kubectl("delete", "configmap", "one", "-n", ns))
    wait_used(fleet_server, ns, "objects", {"configmaps": "1", "count/deployments.apps": "0", "services": "0"})
    ok(kubectl("create", "configmap", "two", "-n", ns))


def test_limit_range_defaults_and_bounds(fleet_server: FleetServer, kubectl, namespace: str) -> None:
    ns = namespace
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all({
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "limits"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "1", "memory": "1Gi"},
                             "default": {"cpu": "500m", "memory": "256Mi"},
                             "defaultRequest": {"cpu": "100m"}}]}})))
    ok(kubectl("run", "defaulted", "-n", ns, "--image=busybox:1.36", "--restart=Never"))
    res = ok(kubectl("get", "pod", "defaulted", "-n", ns, "-o",
                     "jsonpath={.spec.containers[0].resources.requests.cpu} "
                     "{.spec.containers[0].resources.requests.memory} "
                     "{.spec.containers[0].resources.limits.cpu} {.spec.containers[0].resources.limits.memory} "
                     "{.status.qosClass}"))
    assert res.split() == ["100m", "256Mi", "500m", "256Mi", "Burstable"]
    annotation = ok(kubectl("get", "pod", "defaulted", "-n", ns, "-o",
                            r"jsonpath={.metadata.annotations.kubernetes\.io/limit-ranger}"))
    assert annotation == ("LimitRanger plugin set: cpu, memory request for container defaulted; "
                          "cpu, memory limit for container defaulted")
    err = fails(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(pod("big", limits={"cpu": "2"}))))
    assert 'pods "big" is forbidden: maximum cpu usage per Container is 1, but limit is 2' in err, err
    assert "defaultRequest" in ok(kubectl("explain", "limitrange.spec.limits"))
    table = ok(kubectl("get", "limits", "-n", ns))
    assert table.splitlines()[0].split() == ["NAME", "CREATED", "AT"]
    described = ok(kubectl("describe", "limitrange", "limits", "-n", ns))
    assert "Container   cpu" in described and "100m" in described


def test_limit_range_defaults_satisfy_the_quota(fleet_server: FleetServer, kubectl, namespace: str) -> None:
    """LimitRanger runs before ResourceQuota: its defaults are what a cpu quota demands."""
    ns = namespace
    ok(kubectl("apply", "-n", ns, "-f", "-", input=dump_all(
        {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
         "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "250m"}}]}},
        quota("cpu", {"requests.cpu": "500m"}))))
    wait_used(fleet_server, ns, "cpu", {"requests.cpu": "0"})
    ok(kubectl("run", "a", "-n", ns, "--image=busybox:1.36", "--restart=Never"))
    ok(kubectl("run", "b", "-n", ns, "--image=busybox:1.36", "--restart=Never"))
    err = fails(kubectl("run", "c", "-n", ns, "--image=busybox:1.36", "--restart=Never"))
    assert "exceeded quota: cpu, requested: requests.cpu=250m, used: requests.cpu=500m, limited: " \
           "requests.cpu=500m" in err, err
