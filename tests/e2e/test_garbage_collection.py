"""Cascading deletion and namespace deletion through kubectl, against a real `fleet server`.

Owner chains are built from plain objects — ConfigMaps owning ConfigMaps and
Pods, a ReplicaSet with 0 replicas owning pods its selector does not match —
so no workload controller re-creates or adopts anything and the tests see only
the API server's delete semantics and the garbage collector.  Pods stay
unscheduled (the server runs with no agent), so deleting one is immediate.
A finalizer (`example.com/hold`) on a dependent is how a test keeps a
deletion "in progress" for as long as it needs to look at it.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from tests.conftest import KUBECTL, FleetServer, ServerFactory, create_namespace
from tests.e2e.helpers import dump_all, wait_until

HOLD = "example.com/hold"
TIMEOUT = 60.0  # generous: the machine is shared


def cm(name: str, *owners: dict[str, Any], finalizers: list[str] = ()) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if owners:
        md["ownerReferences"] = list(owners)
    if finalizers:
        md["finalizers"] = list(finalizers)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": {"k": name}}


def pod(name: str, *owners: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": labels or {"app": "gc-test"}}
    if owners:
        md["ownerReferences"] = list(owners)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def ref(owner: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    r = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
         "uid": owner["metadata"]["uid"]}
    if block:
        r["blockOwnerDeletion"] = True
    return r


def apply(kubectl: Any, ns: str, *docs: dict[str, Any]) -> None:
    rc, out, err = kubectl("-n", ns, "apply", "-f", "-", input=dump_all(*docs))
    assert rc == 0, err


def get(kubectl: Any, ns: str, what: str) -> dict[str, Any] | None:
    """`kubectl get -o json`, or None when NotFound."""
    rc, out, err = kubectl("-n", ns, "get", what, "-o", "json")
    if rc != 0:
        assert "NotFound" in err or "not found" in err, err
        return None
    return json.loads(out)


def gone(kubectl: Any, ns: str, *whats: str) -> bool:
    return all(get(kubectl, ns, w) is None for w in whats)


def release(kubectl: Any, ns: str, what: str) -> None:
    rc, _, err = kubectl("-n", ns, "patch", what, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    assert rc == 0, err


def test_background_cascade_is_kubectls_default(kubectl, namespace):
    apply(kubectl, namespace, cm("owner"), cm("bystander"))
    owner = get(kubectl, namespace, "cm/owner")
    assert owner
    apply(kubectl, namespace, cm("child", ref(owner)), pod("child-pod", ref(owner, block=False)))
    child = get(kubectl, namespace, "cm/child")
    assert child
    apply(kubectl, namespace, cm("grandchild", ref(child)))

    rc, out, err = kubectl("-n", namespace, "delete", "cm", "owner")
    assert rc == 0, err
    assert get(kubectl, namespace, "cm/owner") is None  # Background: the owner goes at once
    wait_until(lambda: gone(kubectl, namespace, "cm/child", "cm/grandchild", "pod/child-pod"),
               timeout=TIMEOUT, what="the dependents to be collected")
    assert get(kubectl, namespace, "cm/bystander") is not None


def test_replicaset_owner_deleted_takes_its_pods(kubectl, namespace):
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
          "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "rs-selects-nothing-here"}},
                   "template": {"metadata": {"labels": {"app": "rs-selects-nothing-here"}},
                                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
    apply(kubectl, namespace, rs)
    owner = get(kubectl, namespace, "replicaset/rs")
    assert owner
    # Not the ReplicaSet's controllerRef and not matched by its selector: only the
    # garbage collector cares about these pods.
    apply(kubectl, namespace, *(pod(f"p{i}", ref(owner, block=False)) for i in range(3)))
    rc, _, err = kubectl("-n", namespace, "delete", "replicaset", "rs", "--cascade=background")
    assert rc == 0, err
    wait_until(lambda: gone(kubectl, namespace, "pod/p0", "pod/p1", "pod/p2"), timeout=TIMEOUT,
               what="the ReplicaSet's pods to be collected")


def test_foreground_cascade_keeps_the_owner_until_dependents_are_gone(kubectl, fleet_server, namespace):
    apply(kubectl, namespace, cm("owner"))
    owner = get(kubectl, namespace, "cm/owner")
    assert owner
    apply(kubectl, namespace, cm("held", ref(owner), finalizers=[HOLD]), cm("plain", ref(owner)))

    # kubectl waits for the owner to be gone; it must still be waiting while `held` blocks.
    assert KUBECTL
    cache = fleet_server.data_dir.parent / "kubectl-cache"
    proc = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(fleet_server.kubeconfig), "--cache-dir", str(cache), "-n", namespace,
         "delete", "cm", "owner", "--cascade=foreground", "--timeout=120s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def owner_marked() -> dict[str, Any] | None:
            o = get(kubectl, namespace, "cm/owner")
            return o if o and o["metadata"].get("deletionTimestamp") else None
        marked = wait_until(owner_marked, timeout=TIMEOUT, what="the owner to be marked for deletion")
        assert marked["metadata"]["finalizers"] == ["foregroundDeletion"]
        wait_until(lambda: gone(kubectl, namespace, "cm/plain"), timeout=TIMEOUT, what="`plain` to be deleted")
        held = get(kubectl, namespace, "cm/held")
        assert held and held["metadata"].get("deletionTimestamp")  # deleted, waiting for its finalizer

        rc, out, _ = kubectl("-n", namespace, "get", "cm", "owner", "-o",
                             "jsonpath={.metadata.deletionTimestamp} {.metadata.finalizers}")
        assert rc == 0 and out.split(" ", 1)[1] == '["foregroundDeletion"]', out
        time.sleep(1.0)
        assert proc.poll() is None, "kubectl delete --cascade=foreground returned while a dependent blocks"

        release(kubectl, namespace, "cm/held")
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err
        assert 'configmap "owner" deleted' in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert gone(kubectl, namespace, "cm/owner", "cm/held", "cm/plain")


def test_orphan_cascade_leaves_dependents_without_the_reference(kubectl, namespace):
    apply(kubectl, namespace, cm("owner"), cm("other-owner"))
    owner, other = get(kubectl, namespace, "cm/owner"), get(kubectl, namespace, "cm/other-owner")
    assert owner and other
    apply(kubectl, namespace, cm("only-child", ref(owner)), cm("shared-child", ref(owner), ref(other)),
          pod("orphan-pod", ref(owner)))
    rc, out, err = kubectl("-n", namespace, "delete", "cm", "owner", "--cascade=orphan")
    assert rc == 0, err
    assert 'configmap "owner" deleted' in out
    wait_until(lambda: gone(kubectl, namespace, "cm/owner"), timeout=TIMEOUT, what="the owner to be gone")
    only = get(kubectl, namespace, "cm/only-child")
    shared = get(kubectl, namespace, "cm/shared-child")
    orphan_pod = get(kubectl, namespace, "pod/orphan-pod")
    assert only and "ownerReferences" not in only["metadata"]
    assert orphan_pod and "ownerReferences" not in orphan_pod["metadata"]
    assert shared and [r["name"] for r in shared["metadata"]["ownerReferences"]] == ["other-owner"]
    # They stay: nothing collects them later either.
    time.sleep(1.0)
    assert get(kubectl, namespace, "cm/only-child") is not None


def test_deleting_a_namespace_empties_it(kubectl, fleet_server):
    ns = f"gc-ns-{int(time.time() * 1000) % 10**8}"
    create_namespace(fleet_server, ns)
    apply(kubectl, ns, cm("a"), cm("held", finalizers=[HOLD]), pod("p1"), pod("p2"),
          {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "v"}},
          {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
           "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}}})
    rc, out, err = kubectl("delete", "ns", ns, "--wait=false")
    assert rc == 0, err

    def terminating_with_conditions() -> dict[str, Any] | None:
        rc, out, _ = kubectl("get", "ns", ns, "-o", "json")
        if rc != 0:
            return None
        obj = json.loads(out)
        conds = {c["type"]: c for c in obj["status"].get("conditions") or []}
        done = conds.get("NamespaceFinalizersRemaining", {}).get("status") == "True"
        return obj if done else None
    obj = wait_until(terminating_with_conditions, timeout=TIMEOUT, what="the namespace's deletion conditions")
    assert obj["status"]["phase"] == "Terminating"
    rc, out, _ = kubectl("get", "ns", ns)
    assert rc == 0 and "Terminating" in out
    conds = {c["type"]: c for c in obj["status"]["conditions"]}
    assert conds["NamespaceContentRemaining"]["reason"] == "SomeResourcesRemain"
    assert "configmaps. has 1 resource instances" in conds["NamespaceContentRemaining"]["message"]
    assert conds["NamespaceFinalizersRemaining"]["message"] == (
        "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances")
    # Everything without a finalizer is gone already; new content is refused.
    assert gone(kubectl, ns, "cm/a", "pod/p1", "pod/p2", "secret/s", "service/svc")
    rc, _, err = kubectl("-n", ns, "create", "configmap", "late")
    assert rc != 0 and "being terminated" in err

    # `kubectl delete ns` waits until the namespace is really gone.
    assert KUBECTL
    cache = fleet_server.data_dir.parent / "kubectl-cache"
    proc = subprocess.Popen([KUBECTL, "--kubeconfig", str(fleet_server.kubeconfig), "--cache-dir", str(cache),
                             "delete", "ns", ns, "--timeout=120s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert proc.poll() is None, "kubectl delete ns returned while content remains"
        release(kubectl, ns, "cm/held")
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rc, _, err = kubectl("get", "ns", ns)
    assert rc != 0 and "NotFound" in err


def _client_json(srv: FleetServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    with srv.client() as c:
        r = c.request(method, path, json=body)
    return r.status_code, r.json()


def test_foreground_deletion_completes_after_a_crash(fleet_server_factory: ServerFactory):
    srv = fleet_server_factory.start()
    ns = "gc-restart"
    create_namespace(srv, ns)
    base = f"/api/v1/namespaces/{ns}/configmaps"
    code, owner = _client_json(srv, "POST", base, cm("owner"))
    assert code == 201, owner
    code, mid = _client_json(srv, "POST", base, cm("mid", ref(owner)))
    assert code == 201, mid
    for doc in (cm("held", ref(mid), finalizers=[HOLD]), cm("leaf", ref(owner))):
        code, out = _client_json(srv, "POST", base, doc)
        assert code == 201, out
    code, out = _client_json(srv, "DELETE", f"{base}/owner", {"propagationPolicy": "Foreground"})
    assert code == 200 and out["metadata"]["finalizers"] == ["foregroundDeletion"]

    def held_marked_leaf_gone() -> bool:
        code, held = _client_json(srv, "GET", f"{base}/held")
        marked = code == 200 and bool(held["metadata"].get("deletionTimestamp"))
        return marked and _client_json(srv, "GET", f"{base}/leaf")[0] == 404
    wait_until(held_marked_leaf_gone, timeout=TIMEOUT, what="the chain to be deleted down to `held`")

    srv.kill()  # mid-deletion: owner and mid wait in the foreground for `held`
    srv.start()
    for name in ("owner", "mid"):
        code, obj = _client_json(srv, "GET", f"{base}/{name}")
        assert code == 200 and obj["metadata"]["finalizers"] == ["foregroundDeletion"], obj
    with srv.client() as c:
        r = c.patch(f"{base}/held", json={"metadata": {"finalizers": None}},
                    headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    def all_gone() -> bool:
        return all(_client_json(srv, "GET", f"{base}/{n}")[0] == 404 for n in ("owner", "mid", "held"))
    wait_until(all_gone, timeout=TIMEOUT, what="the foreground deletion to complete after the restart")
