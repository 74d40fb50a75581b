"""Services across real nodes: every piece of issue 11 at once, as a user meets it.

Two machines in network namespaces, each with a real `fleet agent` (tests/e2e/multinode.py),
one `fleet server`; the server allocates ClusterIPs and NodePorts, its controllers keep
EndpointSlices from ready pods, each agent programs its node's Service rules (nftables)
and routes to the other node's pods.  Shown here:

* pod → ClusterIP → endpoints on both nodes: both answer over repeated requests;
* NodePort from the host (outside the cluster), answered by both nodes' pods;
* scaling the backend Deployment changes who answers;
* a deleted pod stops receiving traffic while its container still runs (terminating
  endpoints leave the rules before the process exits);
* service-link variables (`KUBERNETES_SERVICE_HOST`, `WEB_SERVICE_HOST`) in new pods.
"""

from __future__ import annotations

import collections
import time
import urllib.request
from typing import Any

import pytest

from tests.e2e.multinode import IMAGE, MultiNodeCluster

pytestmark = [pytest.mark.e2e]

# busybox httpd answering the pod's own name; `trap '' TERM` keeps the shell (the
# container's init) alive on SIGTERM, and `httpd` without -f runs in the background, so
# a deleted pod keeps serving until its grace period ends and it is killed.
SERVE = ("mkdir -p /www; echo $HOSTNAME > /www/index.html; trap '' TERM; "
         "httpd -p 8080 -h /www; while true; do sleep 1; done")


def web_template(app: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}},
            "spec": {"terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "web", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", SERVE],
                                     "ports": [{"name": "http", "containerPort": 8080}],
                                     "readinessProbe": {"httpGet": {"path": "/", "port": 8080},
                                                        "periodSeconds": 1}}]}}


def ready_endpoints(cluster: MultiNodeCluster, ns: str, svc: str) -> dict[str, str]:
    """podName -> IP of the Service's ready endpoints, from its EndpointSlices."""
    code, body = cluster.get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
                             f"?labelSelector=kubernetes.io/service-name%3D{svc}")
    assert code == 200, body
    out = {}
    for s in body["items"]:
        for e in s.get("endpoints") or []:
            if (e.get("conditions") or {}).get("ready"):
                out[(e.get("targetRef") or {}).get("name", "?")] = e["addresses"][0]
    return out


def wait_for(what: str, fn: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def answers(cluster: MultiNodeCluster, ns: str, pod: str, url: str, n: int) -> collections.Counter[str]:
    """Who answered `n` requests for `url` from inside `pod` (one shell, one exec)."""
    script = (f"i=0; while [ $i -lt {n} ]; do timeout 3 wget -q -O - {url} || echo FAIL; "
              "i=$((i+1)); done")
    rc, out, err = cluster.kubectl("-n", ns, "exec", pod, "--", "sh", "-c", script)
    assert rc == 0, (rc, out, err)
    return collections.Counter(line.strip() for line in out.splitlines() if line.strip())


def delete_pods_now(cluster: MultiNodeCluster, ns: str, timeout: float = 60.0) -> None:
    """Delete every pod of `ns` with a 1 s grace and wait until they are gone (the
    backends ignore SIGTERM: the module's teardown must not wait out their grace)."""
    with cluster.client() as c:
        r = c.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/web")
        assert r.status_code in (200, 404), r.text
        r = c.delete(f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=1")
        assert r.status_code == 200, r.text
    wait_for("every pod gone", lambda: not cluster.get(f"/api/v1/namespaces/{ns}/pods")[1]["items"],
             timeout=timeout)


def test_cluster_ip_and_node_port_reach_pods_on_both_nodes(multinode: MultiNodeCluster) -> None:
    cluster = multinode
    ns = cluster.create_namespace()
    n0, n1 = cluster.nodes[0], cluster.nodes[1]
    # One backend pinned to each node, and a client on the first.
    for name, node in (("web-a", n0), ("web-b", n1)):
        manifest = cluster.pod(name, node, ["sh", "-c", SERVE], grace=2)
        manifest["metadata"]["labels"] = {"app": "web"}
        manifest["spec"]["containers"][0].update(
            ports=[{"name": "http", "containerPort": 8080}],
            readinessProbe={"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1})
        cluster.create_pod(ns, manifest)
    svc = cluster.post(f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"type": "NodePort", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    cip = svc["spec"]["clusterIP"]
    node_port = svc["spec"]["ports"][0]["nodePort"]
    assert cip.startswith("10.43.") and 30000 <= node_port <= 32767
    cluster.create_pod(ns, cluster.pod("client", n0, ["sleep", "3600"]))
    client = cluster.wait_pod_ready(ns, "client")
    for name in ("web-a", "web-b"):
        cluster.wait_pod_ready(ns, name)
    wait_for("two ready endpoints", lambda: len(ready_endpoints(cluster, ns, "web")) == 2)

    # The client pod was created after the Service: it carries the service links.
    rc, env, err = cluster.kubectl("-n", ns, "exec", "client", "--", "env")
    assert rc == 0, err
    assert f"WEB_SERVICE_HOST={cip}" in env and "KUBERNETES_SERVICE_HOST=10.43.0.1" in env
    assert client["spec"]["nodeName"] == n0.name

    # pod → ClusterIP: both nodes' pods answer (random balancing; 40 tries make missing
    # one a 2^-39 event).
    seen = wait_for("both backends through the ClusterIP",
                    lambda: (lambda c: c if {"web-a", "web-b"} <= set(c) else None)(
                        answers(cluster, ns, "client", f"http://{cip}/", 40)))
    assert "FAIL" not in seen, seen

    # NodePort from the host, on each node's address: both pods answer through either.
    for node in (n0, n1):
        got: collections.Counter[str] = collections.Counter()
        for _ in range(40):
            with urllib.request.urlopen(f"http://{node.address}:{node_port}/", timeout=5) as r:
                got[r.read().decode().strip()] += 1
        assert set(got) == {"web-a", "web-b"}, (node.name, got)
    delete_pods_now(cluster, ns)


def test_scaling_and_deletion_change_who_answers(multinode: MultiNodeCluster) -> None:
    cluster = multinode
    ns = cluster.create_namespace()
    cluster.post(f"/apis/apps/v1/namespaces/{ns}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": web_template("web")}})
    svc = cluster.post(f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    cip = svc["spec"]["clusterIP"]
    cluster.create_pod(ns, cluster.pod("client", cluster.nodes[1], ["sleep", "3600"]))
    cluster.wait_pod_ready(ns, "client")
    eps = wait_for("two ready endpoints", lambda: (lambda e: e if len(e) == 2 else None)(
        ready_endpoints(cluster, ns, "web")), timeout=90)
    wait_for("both replicas answer", lambda: set(answers(cluster, ns, "client", f"http://{cip}/", 30))
             == set(eps))

    # Scale to 3: the new replica starts answering.
    cluster.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/web/scale", {"spec": {"replicas": 3}})
    eps = wait_for("three ready endpoints", lambda: (lambda e: e if len(e) == 3 else None)(
        ready_endpoints(cluster, ns, "web")), timeout=90)
    wait_for("three replicas answer", lambda: set(answers(cluster, ns, "client", f"http://{cip}/", 40))
             == set(eps))

    # Delete one pod: it ignores SIGTERM and keeps serving for its 30 s grace, but it
    # leaves the Service's rules at once.
    victim = sorted(eps)[0]
    with cluster.client() as c:
        r = c.delete(f"/api/v1/namespaces/{ns}/pods/{victim}")
    assert r.status_code == 200, r.text
    wait_for("the victim's endpoint to leave the ready set",
             lambda: victim not in ready_endpoints(cluster, ns, "web"))
    victim_ip = eps[victim]
    deadline = time.monotonic() + 20
    while True:
        got = answers(cluster, ns, "client", f"http://{cip}/", 30)
        if victim not in got or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert victim not in got, got
    # ... while the pod is still there, terminating, and its server still answers.
    code, pod = cluster.get(f"/api/v1/namespaces/{ns}/pods/{victim}")
    assert code == 200 and pod["metadata"].get("deletionTimestamp"), pod
    direct = answers(cluster, ns, "client", f"http://{victim_ip}:8080/", 1)
    assert set(direct) == {victim}, direct

    # Scale to 1: only the last replica answers.
    cluster.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/web/scale", {"spec": {"replicas": 1}})
    one = wait_for("one ready endpoint", lambda: (lambda e: e if len(e) == 1 else None)(
        ready_endpoints(cluster, ns, "web")), timeout=90)
    wait_for("only the last replica answers",
             lambda: set(answers(cluster, ns, "client", f"http://{cip}/", 20)) == set(one))
    delete_pods_now(cluster, ns)
