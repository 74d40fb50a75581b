"""The Node authorizer: the graph (pure) and the decisions, table-driven, plus the
graph's algebra under hypothesis (removing a pod removes exactly its edges; the
order pods arrive in does not matter)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.auth import ADMIN, Attributes, UserInfo, non_resource
from fleet.auth.node import (
    NODE_RULES,
    NodeAuthorizer,
    NodeGraph,
    node_identity,
    rule_allows,
)

NODE_A = UserInfo("system:node:a", groups=("system:nodes", "system:authenticated"))
NODE_B = UserInfo("system:node:b", groups=("system:nodes",))
NO_RELATION = "no relationship found between node 'a' and this object"


def pod(name: str, node: str | None, ns: str = "default", *, volumes: list[dict[str, Any]] | None = None,
        containers: list[dict[str, Any]] | None = None, mirror: bool = False, **spec: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if mirror:
        md["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    body: dict[str, Any] = {"containers": containers or [{"name": "c", "image": "busybox"}],
                            "volumes": volumes or [], **spec}
    if node is not None:
        body["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": body}


def full_pod(name: str = "web", node: str = "a") -> dict[str, Any]:
    """A pod naming objects in every way the graph follows."""
    return pod(name, node, serviceAccountName="runner", imagePullSecrets=[{"name": "pull"}],
               containers=[{"name": "c", "image": "x",
                            "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}},
                                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}}],
                            "envFrom": [{"secretRef": {"name": "envfrom-secret"}},
                                        {"configMapRef": {"name": "envfrom-cm"}}]}],
               initContainers=[{"name": "i", "image": "x",
                                "envFrom": [{"secretRef": {"name": "init-secret"}}]}],
               volumes=[{"name": "s", "secret": {"secretName": "vol-secret"}},
                        {"name": "m", "configMap": {"name": "vol-cm"}},
                        {"name": "p", "projected": {"sources": [{"secret": {"name": "proj-secret"}},
                                                                {"configMap": {"name": "proj-cm"}},
                                                                {"serviceAccountToken": {"path": "t"}}]}},
                        {"name": "claim", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                        {"name": "csi", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-secret"}}}],
               resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu-claim"},
                               {"name": "tmpl", "resourceClaimTemplateName": "t"}])


def pv(name: str, claim: tuple[str, str] | None, *, secret: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "1Gi"},
                            "csi": {"driver": "d", "volumeHandle": name}}
    if secret:
        spec["csi"]["nodeStageSecretRef"] = {"name": secret, "namespace": "storage"}
        spec["csi"]["controllerPublishSecretRef"] = {"name": "controller-only", "namespace": "storage"}
    if claim:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1]}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def attrs(verb: str, resource: str, name: str = "", ns: str = "default", sub: str = "",
          group: str = "") -> Attributes:
    return Attributes(verb, group, "v1", resource, sub, ns, name)


def authorizer(*pods: dict[str, Any], pvs: tuple[dict[str, Any], ...] = (),
               attachments: tuple[dict[str, Any], ...] = ()) -> NodeAuthorizer:
    g = NodeGraph()
    for p in pods:
        g.set_pod(p)
    for v in pvs:
        g.set_pv(v)
    for va in attachments:
        g.set_attachment(va)
    return NodeAuthorizer(g)


def va(name: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"attacher": "d", "nodeName": node,
                                                 "source": {"persistentVolumeName": "pv"}}}


# -- identity --------------------------------------------------------------------------


@pytest.mark.parametrize(("user", "expected"), [
    (NODE_A, ("a", True)),
    (UserInfo("system:node:a"), ("", False)),  # not in system:nodes
    (UserInfo("kubelet", groups=("system:nodes",)), ("", False)),  # no system:node: prefix
    (UserInfo("system:node:", groups=("system:nodes",)), ("", True)),  # a node, unidentified
    (ADMIN, ("", False)),
])
def test_node_identity(user: UserInfo, expected: tuple[str, bool]) -> None:
    assert node_identity(user) == expected


# -- the graph -------------------------------------------------------------------------


def test_a_pod_links_everything_it_names_to_its_node() -> None:
    a = authorizer(full_pod(), pvs=(pv("vol-1", ("default", "data"), secret="stage-secret"),),
                   attachments=(va("att-1", "a"),))
    g = a.graph
    for name in ("pull", "env-secret", "envfrom-secret", "init-secret", "vol-secret", "proj-secret",
                 "csi-secret"):
        assert g.has_path("a", "secret", "default", name), name
        assert not g.has_path("b", "secret", "default", name), name
    for name in ("env-cm", "envfrom-cm", "vol-cm", "proj-cm"):
        assert g.has_path("a", "configmap", "default", name), name
    assert g.has_path("a", "pvc", "default", "data")
    assert g.has_path("a", "pvc", "default", "web-scratch")  # generic ephemeral: <pod>-<volume>
    assert g.has_path("a", "serviceAccount", "default", "runner")
    assert g.has_path("a", "resourceclaim", "default", "gpu-claim")
    # node ← pod ← pvc ← pv ← secret (only the secrets the kubelet uses)
    assert g.has_path("a", "pv", "", "vol-1")
    assert g.has_path("a", "secret", "storage", "stage-secret")
    assert not g.has_path("a", "secret", "storage", "controller-only")
    assert g.has_path("a", "volumeattachment", "", "att-1")
    assert not g.has_path("b", "volumeattachment", "", "att-1")
    # Names only count in the pod's namespace.
    assert not g.has_path("a", "secret", "other", "vol-secret")


def test_template_claim_is_reachable_once_its_name_is_recorded() -> None:
    p = full_pod()
    g = NodeGraph()
    g.set_pod(p)
    assert not g.has_path("a", "resourceclaim", "default", "web-tmpl-abcde")
    p["status"] = {"resourceClaimStatuses": [{"name": "tmpl", "resourceClaimName": "web-tmpl-abcde"}]}
    g.set_pod(p)
    assert g.has_path("a", "resourceclaim", "default", "web-tmpl-abcde")


def test_mirror_pods_link_nothing_but_themselves() -> None:
    g = NodeGraph()
    mirror = full_pod("static")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "x"}
    g.set_pod(mirror)
    assert g.edges() == {(("pod", "default", "static"), ("node", "", "a"))}


def test_unbound_pods_link_nothing_and_binding_links() -> None:
    g = NodeGraph()
    p = pod("p", None, volumes=[{"name": "s", "secret": {"secretName": "s"}}])
    g.set_pod(p)
    assert g.edges() == set()
    p["spec"]["nodeName"] = "a"
    g.set_pod(p)
    assert g.has_path("a", "secret", "default", "s")


def test_a_secret_shared_by_two_nodes_pods_stays_reachable_until_the_last_goes() -> None:
    vol = [{"name": "s", "secret": {"secretName": "shared"}}]
    g = NodeGraph()
    g.set_pod(pod("p1", "a", volumes=vol))
    g.set_pod(pod("p2", "a", volumes=vol))
    g.set_pod(pod("p3", "b", volumes=vol))
    g.delete_pod("default", "p1")
    assert g.has_path("a", "secret", "default", "shared")
    g.delete_pod("default", "p2")
    assert not g.has_path("a", "secret", "default", "shared")
    assert g.has_path("b", "secret", "default", "shared")


def test_pv_rebound_or_deleted_moves_its_edges() -> None:
    g = NodeGraph()
    g.set_pod(pod("p", "a", volumes=[{"name": "c", "persistentVolumeClaim": {"claimName": "data"}}]))
    g.set_pv(pv("v", ("default", "data"), secret="s"))
    assert g.has_path("a", "pv", "", "v") and g.has_path("a", "secret", "storage", "s")
    g.set_pv(pv("v", ("default", "other"), secret="s"))
    assert not g.has_path("a", "pv", "", "v") and not g.has_path("a", "secret", "storage", "s")
    g.set_pv(pv("v", ("default", "data"), secret="s"))
    g.delete_pv("v")
    assert not g.has_path("a", "pv", "", "v") and not g.has_path("a", "secret", "storage", "s")
    g.set_pv(pv("unbound", None))
    assert g.edges() == {(("pod", "default", "p"), ("node", "", "a")),
                         (("pvc", "default", "data"), ("pod", "default", "p"))}


def test_attachment_moved_or_deleted() -> None:
    g = NodeGraph()
    g.set_attachment(va("x", "a"))
    g.set_attachment(va("x", "b"))
    assert not g.has_path("a", "volumeattachment", "", "x") and g.has_path("b", "volumeattachment", "", "x")
    g.set_attachment(va("x", None))
    assert g.edges() == set()
    g.set_attachment(va("y", "a"))
    g.delete_attachment("y")
    assert g.edges() == set()


def test_replace_forgets_what_a_relist_no_longer_has() -> None:
    g = NodeGraph()
    g.set_pod(full_pod("old"))
    g.replace_pods([pod("new", "b")])
    assert g.edges() == {(("pod", "default", "new"), ("node", "", "b"))}


def test_malformed_objects_are_skipped() -> None:
    g = NodeGraph()
    g.set_pod({"metadata": {"name": 5}})
    g.set_pod({"metadata": {"name": "p", "namespace": "d"}, "spec": {"nodeName": "a", "volumes": 7,
                                                                     "containers": "x"}})
    g.set_pv({"metadata": {"name": "v"}, "spec": {"claimRef": "nope"}})
    g.set_attachment({"metadata": {"name": "x"}, "spec": 3})
    assert g.edges() == {(("pod", "d", "p"), ("node", "", "a"))}


# hypothesis: pods naming secrets/configmaps/claims from a small alphabet on two nodes
names = st.sampled_from(["s1", "s2", "s3"])
pods_st = st.lists(
    st.builds(
        lambda i, node, secrets, cms, claims, sa: pod(
            f"p{i}", node, serviceAccountName=sa,
            volumes=[*({"name": f"s{j}", "secret": {"secretName": s}} for j, s in enumerate(secrets)),
                     *({"name": f"c{j}", "configMap": {"name": c}} for j, c in enumerate(cms)),
                     *({"name": f"v{j}", "persistentVolumeClaim": {"claimName": c}} for j, c in enumerate(claims))]),
        st.integers(0, 5), st.sampled_from(["a", "b"]), st.lists(names, max_size=3),
        st.lists(names, max_size=2), st.lists(names, max_size=2), st.sampled_from(["", "default", "x"])),
    max_size=8, unique_by=lambda p: p["metadata"]["name"])


def graph_of(pods: list[dict[str, Any]]) -> NodeGraph:
    g = NodeGraph()
    for p in pods:
        g.set_pod(p)
    return g


@settings(max_examples=150, deadline=None)
@given(pods_st, st.data())
def test_removing_a_pod_removes_exactly_its_edges(pods: list[dict[str, Any]], data: st.DataObject) -> None:
    if not pods:
        return
    victim = data.draw(st.sampled_from(pods))
    g = graph_of(pods)
    before = g.edges()
    g.delete_pod("default", victim["metadata"]["name"])
    rest = [p for p in pods if p is not victim]
    assert g.edges() == graph_of(rest).edges()
    # ... and exactly the victim's own edges went (the others' are all still there).
    own = graph_of([victim]).edges()
    assert before - g.edges() <= own
    assert all(e in g.edges() for e in before - own)
    # Reachability agrees with a graph built without the pod.
    fresh = graph_of(rest)
    for node in ("a", "b"):
        for kind in ("secret", "configmap", "pvc", "serviceAccount"):
            for name in ("s1", "s2", "s3", "default", "x"):
                assert g.has_path(node, kind, "default", name) == fresh.has_path(node, kind, "default", name)


@settings(max_examples=100, deadline=None)
@given(pods_st, st.randoms(use_true_random=False))
def test_the_graph_does_not_depend_on_arrival_order(pods: list[dict[str, Any]], rnd: Any) -> None:
    shuffled = list(pods)
    rnd.shuffle(shuffled)
    assert graph_of(pods).edges() == graph_of(shuffled).edges()
    # Re-setting a pod (an update that changes nothing) changes nothing.
    g = graph_of(pods)
    for p in shuffled:
        g.set_pod(p)
    assert g.edges() == graph_of(pods).edges()


# -- decisions -------------------------------------------------------------------------

GRAPH = authorizer(full_pod(), pod("other", "b", volumes=[{"name": "s", "secret": {"secretName": "b-only"}},
                                                           {"name": "c", "persistentVolumeClaim": {"claimName": "b-data"}}],
                                   serviceAccountName="b-sa"),
                   pvs=(pv("vol-1", ("default", "data")), pv("vol-b", ("default", "b-data"))),
                   attachments=(va("att-a", "a"), va("att-b", "b")))

ALLOWED = (True, "", False)


def no(reason: str = "") -> tuple[bool, str, bool]:
    return (False, reason, True)


@pytest.mark.parametrize(("a", "expected"), [
    # Secrets and ConfigMaps: read one object related to the node.
    (attrs("get", "secrets", "vol-secret"), ALLOWED),
    (attrs("get", "secrets", "b-only"), no(NO_RELATION)),
    (attrs("get", "secrets", "unknown"), no(NO_RELATION)),
    (attrs("watch", "secrets", "vol-secret"), ALLOWED),  # fieldSelector=metadata.name=vol-secret
    (attrs("list", "secrets"), no("No Object name found")),
    (attrs("list", "secrets", ns=""), no("can only read namespaced object of this type")),
    (attrs("create", "secrets", "vol-secret"), no("can only read resources of this type")),
    (attrs("update", "secrets", "vol-secret"), no("can only read resources of this type")),
    (attrs("get", "configmaps", "vol-cm"), ALLOWED),
    (attrs("get", "configmaps", "vol-cm", ns="kube-system"), no(NO_RELATION)),
    # Claims: get; status update of a related claim.
    (attrs("get", "persistentvolumeclaims", "data"), ALLOWED),
    (attrs("get", "persistentvolumeclaims", "web-scratch"), ALLOWED),
    (attrs("get", "persistentvolumeclaims", "b-data"), no(NO_RELATION)),
    (attrs("list", "persistentvolumeclaims"), no("can only get individual resources of this type")),
    (attrs("patch", "persistentvolumeclaims", "data", sub="status"), ALLOWED),
    (attrs("patch", "persistentvolumeclaims", "b-data", sub="status"), no(NO_RELATION)),
    (attrs("get", "persistentvolumeclaims", "data", sub="status"), no("can only get/update/patch this type")),
    (attrs("update", "persistentvolumeclaims", "data"), no("can only get individual resources of this type")),
    # Volumes, attachments, resource claims.
    (attrs("get", "persistentvolumes", "vol-1", ns=""), ALLOWED),
    (attrs("get", "persistentvolumes", "vol-b", ns=""), no(NO_RELATION)),
    (attrs("list", "persistentvolumes", ns=""), no("can only get individual resources of this type")),
    (attrs("get", "volumeattachments", "att-a", ns="", group="storage.k8s.io"), ALLOWED),
    (attrs("get", "volumeattachments", "att-b", ns="", group="storage.k8s.io"), no(NO_RELATION)),
    (attrs("get", "resourceclaims", "gpu-claim", group="resource.k8s.io"), ALLOWED),
    # Service accounts: only tokens, only for its pods' service accounts.
    (attrs("create", "serviceaccounts", "runner", sub="token"), ALLOWED),
    (attrs("create", "serviceaccounts", "b-sa", sub="token"), no(NO_RELATION)),
    (attrs("get", "serviceaccounts", "runner"), no("can only create tokens for individual service accounts")),
    (attrs("create", "serviceaccounts", "runner"), no("can only create token subresource of serviceaccount")),
    # Leases: its own, in kube-node-lease.
    (attrs("update", "leases", "a", ns="kube-node-lease", group="coordination.k8s.io"), ALLOWED),
    (attrs("create", "leases", "", ns="kube-node-lease", group="coordination.k8s.io"), ALLOWED),
    (attrs("patch", "leases", "b", ns="kube-node-lease", group="coordination.k8s.io"),
     no("can only access node lease with the same name as the requesting node")),
    (attrs("get", "leases", "a", ns="default", group="coordination.k8s.io"),
     no('can only access leases in the "kube-node-lease" system namespace')),
    (attrs("list", "leases", ns="kube-node-lease", group="coordination.k8s.io"),
     no("can only get, create, update, patch, or delete a node lease")),
    # CSINodes: its own.
    (attrs("update", "csinodes", "a", ns="", group="storage.k8s.io"), ALLOWED),
    (attrs("create", "csinodes", "", ns="", group="storage.k8s.io"), ALLOWED),
    (attrs("delete", "csinodes", "b", ns="", group="storage.k8s.io"),
     no("can only access CSINode with the same name as the requesting node")),
    (attrs("list", "csinodes", ns="", group="storage.k8s.io"),
     no("can only get, create, update, patch, or delete a CSINode")),
    # The static node rules.
    (attrs("get", "nodes", "a", ns=""), ALLOWED),
    (attrs("list", "nodes", ns=""), ALLOWED),
    (attrs("patch", "nodes", "b", ns="", sub="status"), ALLOWED),  # NodeRestriction refuses it
    (attrs("delete", "nodes", "a", ns=""), no()),
    (attrs("watch", "pods"), ALLOWED),
    (attrs("patch", "pods", "web", sub="status"), ALLOWED),
    (attrs("create", "pods", "web", sub="eviction"), ALLOWED),
    (attrs("create", "pods", "web", sub="binding"), no()),
    (attrs("update", "pods", "web"), no()),
    (attrs("create", "pods", "web", sub="exec"), no()),
    (attrs("create", "events"), ALLOWED),
    (attrs("patch", "events", "e", group="events.k8s.io"), ALLOWED),
    (attrs("delete", "events", "e"), no()),
    (attrs("list", "endpointslices", group="discovery.k8s.io"), ALLOWED),
    (attrs("watch", "networkpolicies", group="networking.k8s.io"), ALLOWED),
    (attrs("list", "deployments", group="apps"), no()),
    (attrs("create", "certificatesigningrequests", ns="", group="certificates.k8s.io"), ALLOWED),
    (attrs("create", "tokenreviews", ns="", group="authentication.k8s.io"), ALLOWED),
    (attrs("list", "clusterroles", ns="", group="rbac.authorization.k8s.io"), no()),
])
def test_decisions(a: Attributes, expected: tuple[bool, str, bool]) -> None:
    d = GRAPH.authorize(NODE_A, a)
    assert (d.allowed, d.reason, d.no_opinion) == expected


def test_other_users_get_no_opinion() -> None:
    for user in (ADMIN, UserInfo("system:node:a"), UserInfo("alice", groups=("system:nodes",))):
        d = GRAPH.authorize(user, attrs("get", "secrets", "vol-secret"))
        assert d.no_opinion and not d.allowed and d.reason == ""


def test_unidentified_node() -> None:
    d = GRAPH.authorize(UserInfo("system:node:", groups=("system:nodes",)), attrs("get", "nodes", "a", ns=""))
    assert (d.allowed, d.no_opinion, d.reason) == (False, True, 'unknown node for user "system:node:"')


def test_another_node_sees_its_own_objects_only() -> None:
    assert GRAPH.authorize(NODE_B, attrs("get", "secrets", "b-only")).allowed
    assert not GRAPH.authorize(NODE_B, attrs("get", "secrets", "vol-secret")).allowed
    assert GRAPH.authorize(NODE_B, attrs("create", "serviceaccounts", "b-sa", sub="token")).allowed


def test_non_resource_requests_are_not_the_node_authorizers() -> None:
    assert GRAPH.authorize(NODE_A, non_resource("get", "/healthz")).no_opinion


def test_static_rules_never_grant_graph_governed_kinds() -> None:
    """An RBAC role made of NODE_RULES bound to system:nodes must not bypass the graph."""
    governed = [("", "secrets"), ("", "configmaps"), ("", "persistentvolumeclaims"), ("", "persistentvolumes"),
                ("", "serviceaccounts"), ("storage.k8s.io", "volumeattachments"), ("resource.k8s.io", "resourceclaims")]
    for group, resource in governed:
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
            for sub in ("", "status", "token"):
                a = Attributes(verb, group, "v1", resource, sub, "default", "x")
                assert not any(rule_allows(r, a) for r in NODE_RULES), (verb, resource, sub)


@pytest.mark.parametrize(("rule", "a", "ok"), [
    ({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}, attrs("get", "pods", sub="log"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["*/status"]}, attrs("get", "pods", sub="status"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["*/status"]}, attrs("get", "pods"), False),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, attrs("get", "pods", sub="status"), False),
    ({"verbs": ["get"], "apiGroups": ["apps"], "resources": ["pods"]}, attrs("get", "pods"), False),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, non_resource("get", "/api"), False),
])
def test_rule_allows(rule: dict[str, list[str]], a: Attributes, ok: bool) -> None:
    assert rule_allows(rule, a) is ok
