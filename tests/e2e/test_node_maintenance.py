"""Node maintenance against a real `fleet server` (no agent): the pods/eviction subresource,
kubectl 1.32's cordon / drain / uncordon, Fleet's own nodes/{name}/drain and
nodes/{name}/schedulable REST, and `kfleet drain`.

The server runs with `--no-agent`: each test creates a Node object and pods already bound
to it.  A node's agent is what finally removes a pod whose graceful deletion started;
`FakeKubelet` plays that part (it deletes terminating pods of its node with
gracePeriodSeconds=0, as the agent does when the containers have stopped), so drains can
complete.  The lead's tests cover the same commands with a real agent and simulated nodes.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fleet.cli import kfleet
from tests.conftest import KUBECTL, FleetServer, ServerFactory, _make_base, run_kubectl
from tests.e2e.helpers import api_get, wait_until

pytestmark = pytest.mark.e2e

DRAIN_ANNOTATION = "fleet.dev/drain-status"


def ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0, f"failed rc={rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def post(srv: FleetServer, path: str, body: Any) -> tuple[int, Any]:
    with srv.client() as c:
        r = c.post(path, json=body)
    return r.status_code, r.json()


def make_node(srv: FleetServer) -> str:
    name = f"node-{uuid.uuid4().hex[:6]}"
    code, body = post(srv, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                              "metadata": {"name": name}})
    assert code == 201, body
    return name


@pytest.fixture(scope="module")
def fleet_server() -> Iterator[FleetServer]:
    """This module's own server: its pods name owners (ReplicaSet "web", a DaemonSet) that
    the test plays itself, so the controllers that would act on them — and the garbage
    collector, which deletes pods whose owner does not exist — are left out."""
    base = _make_base("fleet-e2e-maint-")
    factory = ServerFactory(base)
    try:
        yield factory.start(extra_args=[
            "--controllers", "*,-garbagecollector,-replicaset,-daemonset,-disruption"])
    finally:
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


def make_pod(srv: FleetServer, ns: str, name: str, node: str, *, owner: tuple[str, str] | None = ("ReplicaSet", "web"),
             emptydir: bool = False, grace: int = 30) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                  "uid": str(uuid.uuid4()), "controller": True}]
    spec: dict[str, Any] = {"nodeName": node, "terminationGracePeriodSeconds": grace,
                            "containers": [{"name": "c", "image": "busybox:1.36"}]}
    if emptydir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    code, body = post(srv, f"/api/v1/namespaces/{ns}/pods",
                      {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec})
    assert code == 201, body
    return body


def make_daemonset(srv: FleetServer, ns: str, name: str) -> None:
    code, body = post(srv, f"/apis/apps/v1/namespaces/{ns}/daemonsets", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
    assert code == 201, body


def pod_names(srv: FleetServer, node: str) -> set[str]:
    code, body = api_get(srv, f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
    assert code == 200, body
    return {p["metadata"]["name"] for p in body["items"]}


class FakeKubelet:
    """Finishes graceful deletions on one node, as its agent would, from a thread."""

    def __init__(self, srv: FleetServer, node: str) -> None:
        self.srv, self.node = srv, node
        self.stop = threading.Event()
        self.removed: list[str] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with self.srv.client() as c:
            while not self.stop.is_set():
                r = c.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.node}")
                for p in r.json().get("items") or []:
                    md = p["metadata"]
                    if md.get("deletionTimestamp"):
                        c.request("DELETE", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}",
                                  json={"gracePeriodSeconds": 0, "preconditions": {"uid": md["uid"]}})
                        self.removed.append(md["name"])
                self.stop.wait(0.1)


@contextlib.contextmanager
def fake_kubelet(srv: FleetServer, node: str) -> Iterator[FakeKubelet]:
    k = FakeKubelet(srv, node)
    k.thread.start()
    try:
        yield k
    finally:
        k.stop.set()
        k.thread.join(timeout=10)


def kfleet_run(srv: FleetServer, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = kfleet.run(["--kubeconfig", str(srv.kubeconfig), *argv])
    return rc, out.getvalue(), err.getvalue()


# -- pods/eviction -------------------------------------------------------------------------


def test_eviction_subresource(fleet_server: FleetServer, namespace: str) -> None:
    node = make_node(fleet_server)
    make_pod(fleet_server, namespace, "a", node)
    make_pod(fleet_server, namespace, "b", node, grace=7)
    base = f"/api/v1/namespaces/{namespace}/pods"

    code, body = post(fleet_server, f"{base}/a/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": namespace},
        "deleteOptions": {"gracePeriodSeconds": 0}})
    assert (code, body["status"]) == (201, "Success"), body
    assert api_get(fleet_server, f"{base}/a")[0] == 404

    # policy/v1beta1, and the pod's own grace period: it terminates gracefully.
    code, body = post(fleet_server, f"{base}/b/eviction", {
        "apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "b"}})
    assert code == 201, body
    code, got = api_get(fleet_server, f"{base}/b")
    assert code == 200 and got["metadata"]["deletionGracePeriodSeconds"] == 7
    assert any(c["type"] == "DisruptionTarget" and c["reason"] == "EvictionByEvictionAPI"
               for c in got["status"]["conditions"])

    code, body = post(fleet_server, f"{base}/missing/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "missing"}})
    assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound")
    assert body["message"] == 'pods "missing" not found'


def test_discovery_advertises_eviction_for_kubectl(fleet_server: FleetServer) -> None:
    code, body = api_get(fleet_server, "/api/v1")
    sub = {r["name"]: r for r in body["resources"]}
    assert sub["pods/eviction"]["group"] == "policy" and sub["pods/eviction"]["version"] == "v1"
    assert sub["pods/eviction"]["kind"] == "Eviction"
    assert {"nodes/drain", "nodes/schedulable"} <= set(sub)
    if KUBECTL:
        # Subresources stay out of kubectl's resource list.
        out = ok(run_kubectl(fleet_server, "api-resources", "--api-group="))
        assert "drain" not in out and "schedulable" not in out and "eviction" not in out


# -- kubectl cordon / drain / uncordon -------------------------------------------------------


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_cordon_drain_uncordon(fleet_server: FleetServer, kubectl, namespace: str) -> None:
    node = make_node(fleet_server)
    make_daemonset(fleet_server, namespace, "agent")
    make_pod(fleet_server, namespace, "web-1", node)
    make_pod(fleet_server, namespace, "web-2", node, grace=5)
    make_pod(fleet_server, namespace, "cache", node, emptydir=True)
    make_pod(fleet_server, namespace, "bare", node, owner=None)
    make_pod(fleet_server, namespace, "ds-pod", node, owner=("DaemonSet", "agent"))
    other = make_node(fleet_server)
    make_pod(fleet_server, namespace, "elsewhere", other)

    assert ok(kubectl("cordon", node)).strip() == f"node/{node} cordoned"
    assert api_get(fleet_server, f"/api/v1/nodes/{node}")[1]["spec"]["unschedulable"] is True
    out = ok(kubectl("get", "node", node, "--no-headers"))
    assert "SchedulingDisabled" in out.split()[1]

    # Without the flags kubectl refuses, naming each kind of pod, and evicts nothing.
    rc, out, err = kubectl("drain", node, "--timeout=30s")
    assert rc != 0
    assert f"node/{node} already cordoned" in out
    assert f"cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): {namespace}/ds-pod" in err
    assert f"cannot delete Pods with local storage (use --delete-emptydir-data to override): {namespace}/cache" in err
    assert f"{namespace}/bare" in err
    assert pod_names(fleet_server, node) == {"web-1", "web-2", "cache", "bare", "ds-pod"}

    with fake_kubelet(fleet_server, node):
        rc, out, err = kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                               "--timeout=60s", timeout=90)
    assert rc == 0, (out, err)
    for name in ("web-1", "web-2", "cache", "bare"):
        assert f"evicting pod {namespace}/{name}" in out
        assert f"pod/{name} evicted" in out
    assert f"node/{node} drained" in out
    assert f"ignoring DaemonSet-managed Pods: {namespace}/ds-pod" in err
    # The DaemonSet's pod stays, and so does everything on other nodes.
    assert pod_names(fleet_server, node) == {"ds-pod"}
    assert pod_names(fleet_server, other) == {"elsewhere"}

    assert ok(kubectl("uncordon", node)).strip() == f"node/{node} uncordoned"
    assert "unschedulable" not in api_get(fleet_server, f"/api/v1/nodes/{node}")[1]["spec"]


# -- Fleet's drain REST and kfleet -----------------------------------------------------------


def drain_doc(srv: FleetServer, node: str) -> dict[str, Any]:
    code, body = api_get(srv, f"/api/v1/nodes/{node}/drain")
    assert code == 200, body
    return body


def wait_drained(srv: FleetServer, node: str, timeout: float = 30.0) -> dict[str, Any]:
    return wait_until(lambda: (d := drain_doc(srv, node))["phase"] != "Running" and d,
                      timeout=timeout, what=f"the drain of {node} to end")


def test_fleet_drain_rest(fleet_server: FleetServer, namespace: str) -> None:
    node = make_node(fleet_server)
    make_daemonset(fleet_server, namespace, "agent")
    make_pod(fleet_server, namespace, "web", node)
    make_pod(fleet_server, namespace, "ds-pod", node, owner=("DaemonSet", "agent"))
    make_pod(fleet_server, namespace, "bare", node, owner=None)

    # Refused like kubectl drain: Failed, nothing evicted, the node stays cordoned.
    code, body = post(fleet_server, f"/api/v1/nodes/{node}/drain", {})
    assert code == 202 and body["phase"] == "Running", body
    done = wait_drained(fleet_server, node)
    assert done["phase"] == "Failed"
    assert sorted(done["errors"]) == sorted([
        f"cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): {namespace}/ds-pod",
        f"cannot delete Pods that declare no controller (use --force to override): {namespace}/bare"])
    assert pod_names(fleet_server, node) == {"web", "ds-pod", "bare"}

    with fake_kubelet(fleet_server, node):
        code, body = post(fleet_server, f"/api/v1/nodes/{node}/drain",
                          {"ignoreDaemonSets": True, "force": True, "timeoutSeconds": 60})
        assert code == 202, body
        done = wait_drained(fleet_server, node)
    assert done["phase"] == "Complete", done
    assert sorted(done["evicted"]) == [f"{namespace}/bare", f"{namespace}/web"]
    assert done["remaining"] == [] and done["blockedByBudget"] == [] and done["errors"] == []
    assert done["skipped"] == [f"{namespace}/ds-pod"] and done["startTime"] and done["completionTime"]
    assert pod_names(fleet_server, node) == {"ds-pod"}

    # The state is in the Node, for any client to read.
    n = api_get(fleet_server, f"/api/v1/nodes/{node}")[1]
    assert json.loads(n["metadata"]["annotations"][DRAIN_ANNOTATION])["phase"] == "Complete"
    assert n["spec"]["unschedulable"] is True

    code, n = post(fleet_server, f"/api/v1/nodes/{node}/schedulable", {"schedulable": True})
    assert code == 200 and "unschedulable" not in n["spec"]
    code, body = post(fleet_server, f"/api/v1/nodes/{node}/schedulable", {"schedulable": "yes"})
    assert (code, body["kind"], body["reason"]) == (422, "Status", "Invalid")
    code, body = post(fleet_server, "/api/v1/nodes/no-such-node/drain", {})
    assert (code, body["reason"]) == (404, "NotFound")


def test_kfleet_drain(fleet_server: FleetServer, namespace: str) -> None:
    node = make_node(fleet_server)
    make_pod(fleet_server, namespace, "web", node)
    make_pod(fleet_server, namespace, "cache", node, emptydir=True)

    rc, out, err = kfleet_run(fleet_server, "cordon", node)
    assert (rc, out.strip()) == (0, f"node/{node} cordoned"), err
    rc, out, _ = kfleet_run(fleet_server, "cordon", node)
    assert out.strip() == f"node/{node} already cordoned"
    rc, out, _ = kfleet_run(fleet_server, "schedulable", node, "true")
    assert (rc, out.strip()) == (0, f"node/{node} uncordoned")
    rc, out, _ = kfleet_run(fleet_server, "schedulable", node, "false")
    assert (rc, out.strip()) == (0, f"node/{node} cordoned")

    # Refused for the emptyDir pod; --wait reports it and exits 1.
    rc, out, err = kfleet_run(fleet_server, "drain", node, "--wait", "--timeout", "30s")
    assert rc == 1
    assert (f"error: cannot delete Pods with local storage (use --delete-emptydir-data to override): "
            f"{namespace}/cache") in err

    with fake_kubelet(fleet_server, node):
        rc, out, err = kfleet_run(fleet_server, "drain", node, "--delete-emptydir-data", "--wait",
                                  "--timeout", "60s")
    assert rc == 0, (out, err)
    assert f"evicting pod {namespace}/web" in out and "pod/cache evicted" in out
    assert out.strip().endswith(f"node/{node} drained")

    rc, out, _ = kfleet_run(fleet_server, "drain-status", node)
    assert rc == 0
    lines = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln and not ln.startswith(" "))
    assert lines["Phase"].strip() == "Complete"
    assert lines["Options"].strip() == "deleteEmptyDirData, timeoutSeconds=60"
    assert sorted(x.strip() for x in lines["Evicted"].split(",")) == [f"{namespace}/cache", f"{namespace}/web"]
    rc, out, _ = kfleet_run(fleet_server, "drain-status", node, "-o", "json")
    assert json.loads(out)["kind"] == "NodeDrain"

    # Without --wait kfleet returns at once; the server goes on.
    make_pod(fleet_server, namespace, "late", node)
    with fake_kubelet(fleet_server, node):
        rc, out, _ = kfleet_run(fleet_server, "drain", node, "--grace-period", "0")
        assert rc == 0 and "drain started" in out
        assert wait_drained(fleet_server, node)["phase"] == "Complete"
    rc, out, _ = kfleet_run(fleet_server, "uncordon", node)
    assert out.strip() == f"node/{node} uncordoned"
    rc, _, err = kfleet_run(fleet_server, "drain-status", "no-such-node")
    assert rc == 1 and 'Error from server (NotFound): nodes "no-such-node" not found' in err


def test_drain_survives_a_server_restart(fleet_server_factory) -> None:
    srv = fleet_server_factory.start()
    node = make_node(srv)
    make_pod(srv, "default", "web", node)
    code, body = post(srv, f"/api/v1/nodes/{node}/drain", {})
    assert code == 202, body
    # The pod is evicted (terminating) but no agent finishes it: the drain waits.
    wait_until(lambda: drain_doc(srv, node)["evicted"], what="the eviction")
    assert drain_doc(srv, node)["phase"] == "Running"
    srv.kill()
    srv.start()
    assert drain_doc(srv, node)["phase"] == "Running"
    with fake_kubelet(srv, node) as k:
        done = wait_drained(srv, node)
        assert "web" in k.removed
    assert done["phase"] == "Complete" and done["evicted"] == ["default/web"]


def test_python_client_eviction(fleet_server: FleetServer, namespace: str) -> None:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(fleet_server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        v1 = client.CoreV1Api(api)
        node = make_node(fleet_server)
        make_pod(fleet_server, namespace, "p", node)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name="p", namespace=namespace),
                                 delete_options=client.V1DeleteOptions(grace_period_seconds=0))
        v1.create_namespaced_pod_eviction("p", namespace, body)
        assert api_get(fleet_server, f"/api/v1/namespaces/{namespace}/pods/p")[0] == 404
        with pytest.raises(client.exceptions.ApiException) as exc:
            v1.create_namespaced_pod_eviction("p", namespace, body)
        assert exc.value.status == 404
