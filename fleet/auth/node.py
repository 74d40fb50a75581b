"""The Node authorizer: a node may read only what the pods bound to it need.

kube-apiserver's `--authorization-mode=Node` (plugin/pkg/auth/authorizer/node).  A
request from a node — user `system:node:<name>` in group `system:nodes` — for a
Secret, ConfigMap, PersistentVolumeClaim, PersistentVolume, ResourceClaim,
VolumeAttachment or a ServiceAccount token is allowed only when the object is
related to that node in a graph of the cluster's objects:

    node ← pod ← secret | configmap | pvc | serviceaccount | resourceclaim
                   pvc ← pv ← secret          (the secrets a volume's mount needs)
    node ← volumeattachment

`NodeGraph` is that graph, as a pure data structure: `set_pod` / `delete_pod`,
`set_pv` / `delete_pv`, `set_attachment` / `delete_attachment`, and `has_path`.
`GraphFeed` keeps one current from store watches of pods, PersistentVolumes and
VolumeAttachments (the server's `Security.tasks` runs it); the API serves only once
it has listed all three, so a node is never refused for an object the graph has not
seen yet at start.  Edges are recomputed from the pod on every change (Kubernetes
re-adds a pod only when its node or uid changes; recomputing is as cheap here and
also right for ephemeral containers added later).

Mirror pods (annotation `kubernetes.io/config.mirror`) get the pod → node edge and
nothing else: a node must never be able to create a pod that grants it access to
other objects (NodeRestriction refuses such pods too; this is defence in depth).

Other requests from nodes are decided by the *static node rules* (`NODE_RULES`,
Kubernetes' bootstrappolicy.NodeRules, kept in the authorizer as Kubernetes does —
its `system:node` ClusterRoleBinding has no subjects): register and report its Node,
read and write pods, events, leases in `kube-node-lease` with its own name, its own
CSINode.  The NodeRestriction admission plugin (fleet/admission/noderestriction.py)
then keeps each write to the node's own objects, which an authorizer cannot see.

Fleet's agent is the kubelet, kube-proxy and the network-policy agent in one, so its
static rules also hold what kube-proxy's `system:node-proxier` role and a policy agent
read: EndpointSlices, NetworkPolicies, Namespaces, every Node (peers' pod CIDRs for
routes) and every Pod (policy peers).  Kubernetes' AuthorizeNodeWithSelectors (list
and watch of pods only with `spec.nodeName=<self>`, of nodes only with its own name)
is therefore not applied.

Like Kubernetes', this authorizer never denies: a request it does not allow gets
*no opinion* with the reason in Kubernetes' words ("no relationship found between
node 'a' and this object"), so RBAC (next in `--authorization-mode Node,RBAC`) may
still allow it; when nothing allows it the 403 carries the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from fleet.api import meta
from fleet.api.podrefs import (
    is_mirror_pod,
    pod_configmap_names,
    pod_pvc_names,
    pod_resource_claim_names,
    pod_secret_names,
    pv_kubelet_secret_refs,
)
from fleet.auth import NODE_USER_PREFIX, NODES_GROUP, Attributes, Decision, UserInfo
from fleet.store import Store
from fleet.store.watchcache import WatchCache

log = logging.getLogger(__name__)

NODE_LEASE_NAMESPACE = "kube-node-lease"

# Vertex kinds a pod points from (ref → pod edges).
SECRET, CONFIGMAP, PVC, SERVICEACCOUNT, RESOURCECLAIM = (
    "secret", "configmap", "pvc", "serviceAccount", "resourceclaim")
PV, VOLUMEATTACHMENT = "pv", "volumeattachment"


def node_identity(user: UserInfo) -> tuple[str, bool]:
    """(node name, is a node): a user `system:node:<name>` in group `system:nodes`
    (nodeidentifier.NewDefaultNodeIdentifier).  A node whose name is empty is a node
    that cannot be identified."""
    if not user.name.startswith(NODE_USER_PREFIX) or NODES_GROUP not in user.groups:
        return "", False
    return user.name[len(NODE_USER_PREFIX):], True


# ---------------------------------------------------------------------------------------
# The graph


@dataclass(frozen=True)
class PodEdges:
    """What one pod bound to a node links to that node."""

    node: str
    refs: frozenset[tuple[str, str]]  # (vertex kind, name), all in the pod's namespace


def pod_edges(pod: Mapping[str, Any]) -> PodEdges | None:
    """The pod's edges, or None for a pod not bound to a node (it links nothing)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return None
    if is_mirror_pod(pod):
        return PodEdges(node, frozenset())
    refs: set[tuple[str, str]] = set()
    sa = spec.get("serviceAccountName")
    if isinstance(sa, str) and sa:
        refs.add((SERVICEACCOUNT, sa))
    refs.update((SECRET, n) for n in pod_secret_names(pod))
    refs.update((CONFIGMAP, n) for n in pod_configmap_names(pod))
    refs.update((PVC, n) for n in pod_pvc_names(pod))
    refs.update((RESOURCECLAIM, n) for n in pod_resource_claim_names(pod))
    return PodEdges(node, frozenset(refs))


@dataclass(frozen=True)
class PVEdges:
    claim: tuple[str, str]  # (namespace, name) of spec.claimRef
    secrets: frozenset[tuple[str, str]]


def _name_ns(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    md = obj.get("metadata")
    if not isinstance(md, dict):
        return None
    name, ns = md.get("name"), md.get("namespace") or ""
    if not isinstance(name, str) or not name or not isinstance(ns, str):
        return None
    return ns, name


class NodeGraph:
    """Which objects each node may reach, from pods, PersistentVolumes and
    VolumeAttachments.  Pure: no I/O, no clock; fed by `GraphFeed` (or a test)."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], PodEdges] = {}
        # (kind, namespace, name) → node → number of that node's pods naming it
        self._refs: dict[tuple[str, str, str], dict[str, int]] = {}
        self._pvs: dict[str, PVEdges] = {}
        self._pvs_by_claim: dict[tuple[str, str], set[str]] = {}
        self._pvs_by_secret: dict[tuple[str, str], set[str]] = {}
        self._attachments: dict[str, str] = {}

    # -- pods ------------------------------------------------------------------------
    def set_pod(self, pod: Mapping[str, Any]) -> None:
        """Add or replace a pod's edges (a pod with no node has none)."""
        key = _name_ns(pod)
        if key is None:
            return
        edges = pod_edges(pod)
        if self._pods.get(key) == edges:
            return
        self.delete_pod(*key)
        if edges is None:
            return
        self._pods[key] = edges
        ns = key[0]
        for kind, name in edges.refs:
            per_node = self._refs.setdefault((kind, ns, name), {})
            per_node[edges.node] = per_node.get(edges.node, 0) + 1

    def delete_pod(self, namespace: str, name: str) -> None:
        edges = self._pods.pop((namespace, name), None)
        if edges is None:
            return
        for kind, ref in edges.refs:
            per_node = self._refs[(kind, namespace, ref)]
            per_node[edges.node] -= 1
            if not per_node[edges.node]:
                del per_node[edges.node]
            if not per_node:
                del self._refs[(kind, namespace, ref)]

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """The pods after a (re)list: every pod not in `pods` is gone."""
        self._pods.clear()
        self._refs.clear()
        for p in pods:
            self.set_pod(p)

    # -- persistent volumes ----------------------------------------------------------
    def set_pv(self, pv: Mapping[str, Any]) -> None:
        """A PersistentVolume links the secrets its mount needs to its bound claim."""
        key = _name_ns(pv)
        if key is None:
            return
        name = key[1]
        self.delete_pv(name)
        spec = pv.get("spec") if isinstance(pv.get("spec"), dict) else {}
        ref = spec.get("claimRef")
        if not isinstance(ref, dict):
            return
        claim = (ref.get("namespace"), ref.get("name"))
        if not all(isinstance(p, str) and p for p in claim):
            return
        edges = PVEdges((str(claim[0]), str(claim[1])), frozenset(pv_kubelet_secret_refs(pv)))
        self._pvs[name] = edges
        self._pvs_by_claim.setdefault(edges.claim, set()).add(name)
        for s in edges.secrets:
            self._pvs_by_secret.setdefault(s, set()).add(name)

    def delete_pv(self, name: str) -> None:
        edges = self._pvs.pop(name, None)
        if edges is None:
            return
        _discard(self._pvs_by_claim, edges.claim, name)
        for s in edges.secrets:
            _discard(self._pvs_by_secret, s, name)

    def replace_pvs(self, pvs: Iterable[Mapping[str, Any]]) -> None:
        self._pvs.clear()
        self._pvs_by_claim.clear()
        self._pvs_by_secret.clear()
        for pv in pvs:
            self.set_pv(pv)

    # -- volume attachments ----------------------------------------------------------
    def set_attachment(self, va: Mapping[str, Any]) -> None:
        key = _name_ns(va)
        if key is None:
            return
        spec = va.get("spec") if isinstance(va.get("spec"), dict) else {}
        node = spec.get("nodeName")
        if isinstance(node, str) and node:
            self._attachments[key[1]] = node
        else:
            self._attachments.pop(key[1], None)

    def delete_attachment(self, name: str) -> None:
        self._attachments.pop(name, None)

    def replace_attachments(self, vas: Iterable[Mapping[str, Any]]) -> None:
        self._attachments.clear()
        for va in vas:
            self.set_attachment(va)

    # -- questions -------------------------------------------------------------------
    def _pod_ref_on(self, node: str, kind: str, namespace: str, name: str) -> bool:
        return node in self._refs.get((kind, namespace, name), ())

    def has_path(self, node: str, kind: str, namespace: str, name: str) -> bool:
        """Is the object (`kind` one of the vertex kinds) related to `node`?"""
        if kind == VOLUMEATTACHMENT:
            return self._attachments.get(name) == node
        if kind == PV:
            edges = self._pvs.get(name)
            return edges is not None and self._pod_ref_on(node, PVC, *edges.claim)
        if self._pod_ref_on(node, kind, namespace, name):
            return True
        if kind == SECRET:  # node ← pod ← pvc ← pv ← secret
            return any(self._pod_ref_on(node, PVC, *self._pvs[pv].claim)
                       for pv in self._pvs_by_secret.get((namespace, name), ()))
        return False

    def edges(self) -> set[tuple[tuple[str, str, str], tuple[str, str, str]]]:
        """Every edge as ((kind, namespace, name), (kind, namespace, name)), pointing
        toward the node (for tests and debugging)."""
        out: set[tuple[tuple[str, str, str], tuple[str, str, str]]] = set()
        for (ns, name), pe in self._pods.items():
            pod = ("pod", ns, name)
            out.add((pod, ("node", "", pe.node)))
            out.update(((kind, ns, ref), pod) for kind, ref in pe.refs)
        for name, pv in self._pvs.items():
            out.add(((PV, "", name), (PVC, *pv.claim)))
            out.update(((SECRET, *s), (PV, "", name)) for s in pv.secrets)
        out.update(((VOLUMEATTACHMENT, "", va), ("node", "", node)) for va, node in self._attachments.items())
        return out


def _discard(index: dict[tuple[str, str], set[str]], key: tuple[str, str], value: str) -> None:
    values = index.get(key)
    if values is not None:
        values.discard(value)
        if not values:
            del index[key]


# ---------------------------------------------------------------------------------------
# Static node rules


def _rule(verbs: Sequence[str], groups: Sequence[str], resources: Sequence[str]) -> dict[str, list[str]]:
    return {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources)}


READ = ("get", "list", "watch")

# What every node may do beyond the graph-governed kinds (PolicyRule JSON shape).
# Kubernetes' NodeRules without the kinds the graph decides (secrets, configmaps,
# claims, volumes, volumeattachments, serviceaccounts, leases, csinodes: an RBAC role
# must never grant those to system:nodes, or the graph would be bypassed), plus what
# Fleet's agent reads as kube-proxy and as the network-policy agent.
NODE_RULES: tuple[dict[str, list[str]], ...] = (
    # Delegated authentication/authorization checks (non-mutating creates).
    _rule(["create"], ["authentication.k8s.io"], ["tokenreviews"]),
    _rule(["create"], ["authorization.k8s.io"], ["subjectaccessreviews", "localsubjectaccessreviews"]),
    # Service environment variables; the service proxy (kube-proxy's system:node-proxier).
    _rule(READ, [""], ["services"]),
    _rule(READ, ["discovery.k8s.io"], ["endpointslices"]),
    # Register the Node and report its status; NodeRestriction keeps a node to its own.
    # list/watch of every Node: the pod network routes to peers' pod CIDRs.
    _rule(["create", "get", "list", "watch"], [""], ["nodes"]),
    _rule(["update", "patch"], [""], ["nodes/status"]),
    _rule(["update", "patch"], [""], ["nodes"]),
    _rule(["create", "update", "patch"], ["", "events.k8s.io"], ["events"]),
    # Its pods (and, for network policy peers, every pod).
    _rule(READ, [""], ["pods"]),
    # Mirror pods; NodeRestriction: only bound to itself, naming no other object.
    _rule(["create", "delete"], [""], ["pods"]),
    _rule(["update", "patch"], [""], ["pods/status"]),
    _rule(["create"], [""], ["pods/eviction"]),
    # Its own client certificate rotation.
    _rule(["create", "get", "list", "watch"], ["certificates.k8s.io"], ["certificatesigningrequests"]),
    _rule(READ, ["storage.k8s.io"], ["csidrivers"]),
    _rule(READ, ["node.k8s.io"], ["runtimeclasses"]),
    # The network-policy agent: policies and the namespaces their selectors match.
    _rule(READ, ["networking.k8s.io"], ["networkpolicies"]),
    _rule(READ, [""], ["namespaces"]),
)


def rule_allows(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    """RBAC's RuleAllows for a rule without resourceNames or nonResourceURLs.
    (One small copy: the RBAC authorizer's matcher lands with the rbac work.)"""
    if not attrs.resource_request:
        return False
    verbs, groups, resources = rule.get("verbs", ()), rule.get("apiGroups", ()), rule.get("resources", ())
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if "*" not in groups and attrs.group not in groups:
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    return ("*" in resources or combined in resources
            or (bool(attrs.subresource) and f"*/{attrs.subresource}" in resources))


# ---------------------------------------------------------------------------------------
# The authorizer


def _no(reason: str = "") -> Decision:
    return Decision(False, reason, no_opinion=True)


ALLOW = Decision(True)


class NodeAuthorizer:
    """`Authorizer` for `--authorization-mode Node` over a `NodeGraph`."""

    def __init__(self, graph: NodeGraph | None = None,
                 rules: Sequence[Mapping[str, Any]] = NODE_RULES) -> None:
        self.graph = graph if graph is not None else NodeGraph()
        self.rules = list(rules)

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        node, is_node = node_identity(user)
        if not is_node:
            return _no()
        if not node:
            return _no(f'unknown node for user "{user.name}"')
        if attrs.resource_request:
            decide = _BY_RESOURCE.get((attrs.group, attrs.resource))
            if decide is not None:
                return decide(self, node, attrs)
        if any(rule_allows(r, attrs) for r in self.rules):
            return ALLOW
        return _no()

    # -- the graph-governed kinds ------------------------------------------------------
    def _related(self, node: str, kind: str, attrs: Attributes) -> Decision:
        if not attrs.name:
            return _no("No Object name found")
        if self.graph.has_path(node, kind, attrs.namespace, attrs.name):
            return ALLOW
        return _no(f"no relationship found between node '{node}' and this object")

    def _read_namespaced(self, node: str, kind: str, attrs: Attributes) -> Decision:
        """get, and list/watch of one object (`fieldSelector=metadata.name=<name>`)."""
        if attrs.verb not in READ:
            return _no("can only read resources of this type")
        if attrs.subresource:
            return _no("cannot read subresource")
        if not attrs.namespace:
            return _no("can only read namespaced object of this type")
        return self._related(node, kind, attrs)

    def _get(self, node: str, kind: str, attrs: Attributes) -> Decision:
        if attrs.verb != "get":
            return _no("can only get individual resources of this type")
        if attrs.subresource:
            return _no("cannot get subresource")
        return self._related(node, kind, attrs)

    def secrets(self, node: str, attrs: Attributes) -> Decision:
        return self._read_namespaced(node, SECRET, attrs)

    def configmaps(self, node: str, attrs: Attributes) -> Decision:
        return self._read_namespaced(node, CONFIGMAP, attrs)

    def claims(self, node: str, attrs: Attributes) -> Decision:
        if attrs.subresource == "status":
            # The node writes a claim's status after growing its filesystem;
            # NodeRestriction keeps that write to capacity and conditions.
            if attrs.verb not in ("update", "patch"):
                return _no("can only get/update/patch this type")
            return self._related(node, PVC, attrs)
        return self._get(node, PVC, attrs)

    def volumes(self, node: str, attrs: Attributes) -> Decision:
        return self._get(node, PV, attrs)

    def resource_claims(self, node: str, attrs: Attributes) -> Decision:
        return self._get(node, RESOURCECLAIM, attrs)

    def attachments(self, node: str, attrs: Attributes) -> Decision:
        return self._get(node, VOLUMEATTACHMENT, attrs)

    def service_accounts(self, node: str, attrs: Attributes) -> Decision:
        """Only `create serviceaccounts/token` for the service account of one of its
        pods (NodeRestriction: and bound to that pod)."""
        if attrs.verb != "create" or not attrs.name:
            return _no("can only create tokens for individual service accounts")
        if attrs.subresource != "token":
            return _no("can only create token subresource of serviceaccount")
        return self._related(node, SERVICEACCOUNT, attrs)

    def leases(self, node: str, attrs: Attributes) -> Decision:
        if attrs.verb not in ("get", "create", "update", "patch", "delete"):
            return _no("can only get, create, update, patch, or delete a node lease")
        if attrs.namespace != NODE_LEASE_NAMESPACE:
            return _no(f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace')
        # A create names no object in the request: NodeRestriction checks the body.
        if attrs.verb != "create" and attrs.name != node:
            return _no("can only access node lease with the same name as the requesting node")
        return ALLOW

    def csinodes(self, node: str, attrs: Attributes) -> Decision:
        if attrs.verb not in ("get", "create", "update", "patch", "delete"):
            return _no("can only get, create, update, patch, or delete a CSINode")
        if attrs.subresource:
            return _no("cannot authorize CSINode subresources")
        if attrs.verb != "create" and attrs.name != node:
            return _no("can only access CSINode with the same name as the requesting node")
        return ALLOW


_BY_RESOURCE = {
    ("", "secrets"): NodeAuthorizer.secrets,
    ("", "configmaps"): NodeAuthorizer.configmaps,
    ("", "persistentvolumeclaims"): NodeAuthorizer.claims,
    ("", "persistentvolumes"): NodeAuthorizer.volumes,
    ("resource.k8s.io", "resourceclaims"): NodeAuthorizer.resource_claims,
    ("storage.k8s.io", "volumeattachments"): NodeAuthorizer.attachments,
    ("", "serviceaccounts"): NodeAuthorizer.service_accounts,
    ("coordination.k8s.io", "leases"): NodeAuthorizer.leases,
    ("storage.k8s.io", "csinodes"): NodeAuthorizer.csinodes,
}


# ---------------------------------------------------------------------------------------
# Keeping the graph current


class _Feed(WatchCache):
    """A store list+watch (WatchCache's loop, re-listing after a watch error) that
    hands each object to the graph instead of keeping it."""

    def __init__(self, prefix: str, put: Any, drop: Any, replace: Any) -> None:
        super().__init__(prefix)
        self._put, self._drop, self._replace = put, drop, replace

    def replace(self, objs: Iterable[dict[str, Any]]) -> None:
        self._replace(objs)

    def put(self, obj: dict[str, Any]) -> None:
        self._put(obj)

    def drop(self, obj: dict[str, Any]) -> None:
        key = _name_ns(obj)
        if key is not None:
            self._drop(*key)


class GraphFeed:
    """Keeps a `NodeGraph` current from store watches of pods, PersistentVolumes and
    VolumeAttachments; `run` is started (task_status) once all three have listed."""

    def __init__(self, graph: NodeGraph) -> None:
        self.graph = graph
        g = graph
        self.feeds = [
            _Feed(meta.store_key("", "pods", None), g.set_pod, g.delete_pod, g.replace_pods),
            _Feed(meta.store_key("", "persistentvolumes", None), g.set_pv,
                  lambda _ns, name: g.delete_pv(name), g.replace_pvs),
            _Feed(meta.store_key("storage.k8s.io", "volumeattachments", None), g.set_attachment,
                  lambda _ns, name: g.delete_attachment(name), g.replace_attachments),
        ]

    @property
    def synced(self) -> bool:
        return all(f.synced for f in self.feeds)

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            for f in self.feeds:
                await n.start(f.run, store)
            log.debug("node authorizer graph synced")
            task_status.started()


__all__ = ["GraphFeed", "NODE_RULES", "NodeAuthorizer", "NodeGraph", "node_identity", "pod_edges",
           "rule_allows"]
