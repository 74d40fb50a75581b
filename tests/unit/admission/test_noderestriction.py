"""NodeRestriction: what a node may write, table-driven over a small fake store.
The plugin's place in the pipeline is covered by tests/integration/test_node_authz.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.admission.noderestriction import NodeRestriction, forbidden_labels, is_kubelet_label
from fleet.api import errors, meta
from fleet.auth import ADMIN, Attributes, UserInfo
from fleet.store import KeyNotFound

NODE_A = UserInfo("system:node:a", groups=("system:nodes", "system:authenticated"))


class FakeStore:
    def __init__(self, *objs: tuple[str, str, str | None, dict[str, Any]]) -> None:
        self.objs = {meta.store_key(g, plural, ns, o["metadata"]["name"]): o for g, plural, ns, o in objs}

    async def get(self, key: str) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objs[key])
        except KeyError:
            raise KeyNotFound(key) from None


def pod(name: str, node: str | None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                           "uid": f"uid-{name}", "labels": {"app": "x"}},
            "spec": spec, **extra}


NODE_OBJ = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a", "uid": "node-a-uid"}}
STORE = FakeStore(("", "pods", "default", pod("mine", "a")), ("", "pods", "default", pod("theirs", "b")),
                  ("", "nodes", None, NODE_OBJ))


def mirror(**changes: Any) -> dict[str, Any]:
    p = pod("static-a", "a")
    p["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    p["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "a", "uid": "node-a-uid",
                                         "controller": True}]
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        cur = p
        for k in parents:
            cur = cur.setdefault(k, {})
        cur[leaf] = value
    return p


def node(name: str = "a", labels: dict[str, str] | None = None, taints: list[Any] | None = None,
         **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
                            "spec": dict(spec)}
    if taints is not None:
        body["spec"]["taints"] = taints
    return body


def a(verb: str, resource: str, name: str = "", ns: str = "default", sub: str = "", group: str = "") -> Attributes:
    return Attributes(verb, group, "v1", resource, sub, ns, name)


async def check(attrs: Attributes, obj: Any = None, old: Any = None, user: UserInfo = NODE_A) -> str:
    """"" when admitted, else the Forbidden (or NotFound) message."""
    try:
        await NodeRestriction(STORE).validate(attrs, user, obj, old)  # type: ignore[arg-type]
    except errors.APIError as e:
        return f"{e.code}: {e}"
    return ""


# -- nodes -------------------------------------------------------------------------------

BASE_LABELS = {"kubernetes.io/hostname": "a", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}


@pytest.mark.parametrize(("attrs", "obj", "old", "expected"), [
    (a("create", "nodes", "a", ns=""), node(labels=BASE_LABELS), None, ""),
    (a("create", "nodes", "b", ns=""), node("b"), None,
     '403: nodes "b" is forbidden: node "a" is not allowed to modify node "b"'),
    (a("patch", "nodes", "b", ns=""), node("b"), node("b"), '403: nodes "b" is forbidden: node "a" is not '
     'allowed to modify node "b"'),
    (a("patch", "nodes", "b", ns="", sub="status"), node("b"), node("b"),
     '403: nodes "b" is forbidden: node "a" is not allowed to modify node "b"'),
    (a("delete", "nodes", "b", ns=""), None, node("b"),
     '403: nodes "b" is forbidden: node "a" is not allowed to modify node "b"'),
    (a("create", "nodes", "a", ns=""), node(labels={"node-role.kubernetes.io/master": "", "team": "x"}), None,
     '403: nodes "a" is forbidden: node "a" is not allowed to set the following labels: '
     "node-role.kubernetes.io/master"),
    (a("create", "nodes", "a", ns=""), node(configSource={"configMap": {}}), None,
     '403: nodes "a" is forbidden: node "a" is not allowed to create pods with a non-nil configSource'),
    # Update: labels of its own domains and any non-Kubernetes ones are fine ...
    (a("patch", "nodes", "a", ns=""), node(labels={**BASE_LABELS, "node.kubernetes.io/exclude-from-x": "",
                                                   "example.com/rack": "r1",
                                                   "topology.kubernetes.io/zone": "z"}),
     node(labels=BASE_LABELS), ""),
    # ... taints and node-restriction labels are not.
    (a("update", "nodes", "a", ns=""), node(taints=[]), node(taints=[{"key": "k", "effect": "NoSchedule"}]),
     '403: nodes "a" is forbidden: node "a" is not allowed to modify taints'),
    (a("update", "nodes", "a", ns=""), node(labels={"node-restriction.kubernetes.io/pci": "yes"}), node(),
     '403: nodes "a" is forbidden: is not allowed to modify labels: node-restriction.kubernetes.io/pci'),
    (a("update", "nodes", "a", ns=""), node(), node(labels={"example.kubernetes.io/owner": "x"}),
     '403: nodes "a" is forbidden: is not allowed to modify labels: example.kubernetes.io/owner'),
    (a("update", "nodes", "a", ns=""), node(configSource={"configMap": {"name": "x"}}), node(),
     '403: nodes "a" is forbidden: node "a" is not allowed to update configSource to a new non-nil '
     "configSource"),
    # Status writes keep the spec as it was: admitted.
    (a("patch", "nodes", "a", ns="", sub="status"), node(taints=[{"key": "k"}]), node(taints=[{"key": "k"}]), ""),
])
async def test_nodes(attrs: Attributes, obj: Any, old: Any, expected: str) -> None:
    assert await check(attrs, obj, old) == expected


@pytest.mark.parametrize(("key", "forbidden"), [
    ("kubernetes.io/hostname", False), ("kubelet.kubernetes.io/x", False), ("foo.node.kubernetes.io/y", False),
    ("node.kubernetes.io/instance-type", False), ("beta.kubernetes.io/arch", False),
    ("node-role.kubernetes.io/worker", True), ("k8s.io/x", True), ("sub.k8s.io/x", True),
    ("node-restriction.kubernetes.io/x", True), ("a.node-restriction.kubernetes.io/x", True),
    ("example.com/x", False), ("plain", False),
])
def test_forbidden_labels(key: str, forbidden: bool) -> None:
    assert (forbidden_labels({key}) == [key]) is forbidden
    assert is_kubelet_label("kubernetes.io/os")


# -- pods ------------------------------------------------------------------------------


@pytest.mark.parametrize(("attrs", "obj", "old", "expected"), [
    (a("create", "pods", "static-a"), mirror(), None, ""),
    (a("create", "pods", "p"), pod("p", "a"), None,
     '403: pods "p" is forbidden: pod does not have "kubernetes.io/config.mirror" annotation, node "a" can only '
     "create mirror pods"),
    (a("create", "pods", "static-a"), mirror(spec__nodeName="b"), None,
     '403: pods "static-a" is forbidden: node "a" can only create pods with spec.nodeName set to itself'),
    (a("create", "pods", "static-a"), mirror(metadata__ownerReferences=[]), None,
     '403: pods "static-a" is forbidden: node "a" can only create pods with an owner reference set to itself'),
    (a("create", "pods", "static-a"), mirror(metadata__ownerReferences=[{}, {}]), None,
     '403: pods "static-a" is forbidden: node "a" can only create pods with a single owner reference set to '
     "itself"),
    (a("create", "pods", "static-a"), mirror(metadata__ownerReferences=[
        {"apiVersion": "v1", "kind": "Node", "name": "a", "uid": "node-a-uid"}]), None,
     '403: pods "static-a" is forbidden: node "a" can only create pods with a controller owner reference set to '
     "itself"),
    (a("create", "pods", "static-a"), mirror(metadata__ownerReferences=[
        {"apiVersion": "v1", "kind": "Node", "name": "a", "uid": "node-a-uid", "controller": True,
         "blockOwnerDeletion": True}]), None,
     '403: pods "static-a" is forbidden: node "a" must not set blockOwnerDeletion on an owner reference'),
    (a("create", "pods", "static-a"), mirror(metadata__ownerReferences=[
        {"apiVersion": "v1", "kind": "Node", "name": "a", "uid": "stale", "controller": True}]), None,
     '403: pods "static-a" is forbidden: node a UID mismatch: expected stale got node-a-uid'),
    (a("create", "pods", "static-a"), mirror(spec__serviceAccountName="default"), None,
     '403: pods "static-a" is forbidden: node "a" can not create pods that reference a service account'),
    (a("create", "pods", "static-a"), mirror(spec__imagePullSecrets=[{"name": "s"}]), None,
     '403: pods "static-a" is forbidden: node "a" can not create pods that reference secrets'),
    (a("create", "pods", "static-a"), mirror(spec__volumes=[{"name": "v", "configMap": {"name": "c"}}]), None,
     '403: pods "static-a" is forbidden: node "a" can not create pods that reference configmaps'),
    (a("create", "pods", "static-a"), mirror(spec__volumes=[
        {"name": "v", "projected": {"sources": [{"clusterTrustBundle": {"name": "b"}}]}}]), None,
     '403: pods "static-a" is forbidden: node "a" can not create pods that reference clustertrustbundles'),
    (a("create", "pods", "static-a"), mirror(spec__volumes=[
        {"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]), None,
     '403: pods "static-a" is forbidden: node "a" can not create pods that reference persistentvolumeclaims'),
    # Delete: only pods bound to itself.
    (a("delete", "pods", "mine"), None, pod("mine", "a"), ""),
    (a("delete", "pods", "theirs"), None, pod("theirs", "b"),
     '403: pods "theirs" is forbidden: node "a" can only delete pods with spec.nodeName set to itself'),
    (a("update", "pods", "mine"), pod("mine", "a"), pod("mine", "a"),
     '403: pods "mine" is forbidden: unexpected operation "UPDATE", node "a" can only create and delete mirror '
     "pods"),
    # Status: pods bound to itself, labels and claim statuses untouched.
    (a("patch", "pods", "mine", sub="status"), pod("mine", "a", status={"phase": "Running"}), pod("mine", "a"), ""),
    (a("patch", "pods", "theirs", sub="status"), pod("theirs", "b"), pod("theirs", "b"),
     '403: pods "theirs" is forbidden: node "a" can only update pod status for pods with spec.nodeName set to '
     "itself"),
    (a("update", "pods", "mine", sub="status"), {**pod("mine", "a"), "metadata": {"name": "mine", "labels": {}}},
     pod("mine", "a"), '403: pods "mine" is forbidden: node "a" cannot update labels through pod status'),
    (a("update", "pods", "mine", sub="status"),
     pod("mine", "a", status={"resourceClaimStatuses": [{"name": "x", "resourceClaimName": "y"}]}),
     pod("mine", "a"), '403: pods "mine" is forbidden: node "a" cannot update resource claim statues'),
    # Evictions: only of its pods; a pod that does not exist is a 404.
    (a("create", "pods", "mine", sub="eviction"), {"metadata": {"name": "mine"}}, None, ""),
    (a("create", "pods", "theirs", sub="eviction"), {"metadata": {"name": "theirs"}}, None,
     '403: pods "theirs" is forbidden: node a can only evict pods with spec.nodeName set to itself'),
    (a("create", "pods", "gone", sub="eviction"), {"metadata": {"name": "gone"}}, None,
     '404: pods "gone" not found'),
    (a("create", "pods", "mine", sub="binding"), {}, None,
     "403: pods \"mine\" is forbidden: unexpected pod subresource \"binding\", only 'status' and 'eviction' are "
     "allowed"),
])
async def test_pods(attrs: Attributes, obj: Any, old: Any, expected: str) -> None:
    assert await check(attrs, obj, old) == expected


# -- claims, tokens, leases, CSINodes ------------------------------------------------------


def pvc(**status: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "default", "resourceVersion": "5"},
            "spec": {"resources": {"requests": {"storage": "2Gi"}}}, "status": {"phase": "Bound", **status}}


def token_request(**ref: Any) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["x"], "boundObjectRef": ref}}


@pytest.mark.parametrize(("attrs", "obj", "old", "expected"), [
    (a("patch", "persistentvolumeclaims", "data", sub="status"),
     {**pvc(capacity={"storage": "2Gi"}, conditions=[], allocatedResourceStatuses=None),
      "metadata": {"name": "data", "namespace": "default", "resourceVersion": "6"}},
     pvc(capacity={"storage": "1Gi"}, conditions=[{"type": "FileSystemResizePending"}],
         allocatedResourceStatuses={"storage": "NodeResizePending"}), ""),
    (a("patch", "persistentvolumeclaims", "data", sub="status"), pvc(phase="Lost"), pvc(),
     '403: persistentvolumeclaims "data" is forbidden: node "a" is not allowed to update fields other than '
     "status.capacity and status.conditions"),
    (a("patch", "persistentvolumeclaims", "data", sub="status"),
     {**pvc(), "metadata": {"name": "data", "namespace": "default", "labels": {"x": "y"}}}, pvc(),
     '403: persistentvolumeclaims "data" is forbidden: node "a" is not allowed to update fields other than '
     "status.capacity and status.conditions"),
    (a("update", "persistentvolumeclaims", "data"), pvc(), pvc(),
     '403: persistentvolumeclaims "data" is forbidden: may only update PVC status'),
    # Tokens: bound to a pod (with the right uid) on this node.
    (a("create", "serviceaccounts", "default", sub="token"),
     token_request(apiVersion="v1", kind="Pod", name="mine", uid="uid-mine"), None, ""),
    (a("create", "serviceaccounts", "default", sub="token"), token_request(), None,
     '403: serviceaccounts "default" is forbidden: node requested token not bound to a pod'),
    (a("create", "serviceaccounts", "default", sub="token"),
     token_request(apiVersion="v1", kind="Secret", name="mine", uid="uid-mine"), None,
     '403: serviceaccounts "default" is forbidden: node requested token not bound to a pod'),
    (a("create", "serviceaccounts", "default", sub="token"), token_request(apiVersion="v1", kind="Pod", name="mine"),
     None, '403: serviceaccounts "default" is forbidden: node requested token with a pod binding without a uid'),
    (a("create", "serviceaccounts", "default", sub="token"),
     token_request(apiVersion="v1", kind="Pod", name="mine", uid="old"), None,
     '403: serviceaccounts "default" is forbidden: the UID in the bound object reference (old) does not match '
     "the UID in record. The object might have been deleted and then recreated"),
    (a("create", "serviceaccounts", "default", sub="token"),
     token_request(apiVersion="v1", kind="Pod", name="theirs", uid="uid-theirs"), None,
     '403: serviceaccounts "default" is forbidden: node requested token bound to a pod scheduled on a different '
     "node"),
    # Leases.
    (a("create", "leases", "a", ns="kube-node-lease", group="coordination.k8s.io"),
     {"metadata": {"name": "a"}}, None, ""),
    (a("create", "leases", "b", ns="kube-node-lease", group="coordination.k8s.io"),
     {"metadata": {"name": "b"}}, None,
     '403: leases.coordination.k8s.io "b" is forbidden: can only access node lease with the same name as the '
     "requesting node"),
    (a("patch", "leases", "b", ns="kube-node-lease", group="coordination.k8s.io"), {}, {},
     '403: leases.coordination.k8s.io "b" is forbidden: can only access node lease with the same name as the '
     "requesting node"),
    (a("update", "leases", "a", ns="default", group="coordination.k8s.io"), {}, {},
     '403: leases.coordination.k8s.io "a" is forbidden: can only access leases in the "kube-node-lease" system '
     "namespace"),
    # CSINodes.
    (a("create", "csinodes", "a", ns="", group="storage.k8s.io"), {"metadata": {"name": "a"}}, None, ""),
    (a("update", "csinodes", "b", ns="", group="storage.k8s.io"), {"metadata": {"name": "b"}}, {},
     '403: csinodes.storage.k8s.io "b" is forbidden: can only access CSINode with the same name as the '
     "requesting node"),
    # Kinds the plugin does not restrict.
    (a("create", "events"), {"metadata": {"name": "e"}}, None, ""),
])
async def test_other_kinds(attrs: Attributes, obj: Any, old: Any, expected: str) -> None:
    assert await check(attrs, obj, old) == expected


async def test_users_that_are_not_nodes_pass() -> None:
    for user in (ADMIN, UserInfo("system:node:a"), UserInfo("bob", groups=("system:nodes",))):
        assert await check(a("update", "nodes", "b", ns=""), node("b", taints=[]), node("b"), user=user) == ""


async def test_unidentified_node_is_refused() -> None:
    user = UserInfo("system:node:", groups=("system:nodes",))
    assert await check(a("create", "events"), {"metadata": {"name": "e"}}, user=user) == (
        '403: events "e" is forbidden: could not determine node from user "system:node:"')
