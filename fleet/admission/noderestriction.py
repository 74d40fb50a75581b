"""NodeRestriction: a node may write only its own objects.

kube-apiserver's plugin (plugin/pkg/admission/noderestriction).  The Node
authorizer lets every node create and update Nodes, Leases, CSINodes, pods (mirror
pods), pod status and evictions, because an authorizer sees only the request's
attributes; this plugin sees the objects and keeps each write of a node — user
`system:node:<name>` in `system:nodes` — to what is its own:

* **Node**: only its own (`node "a" is not allowed to modify node "b"`); never a
  `configSource`; on update never its taints; labels only the kubelet's own
  (`kubernetes.io/hostname`, `kubernetes.io/os`, zone/region/instance-type ...,
  anything under `[*.]kubelet.kubernetes.io/` or `[*.]node.kubernetes.io/`) and
  never under `node-restriction.kubernetes.io/`, on create and on update, so a node
  cannot steer workloads meant for other nodes to itself;
* **Pod**: create only mirror pods bound to itself, owned by its own Node (uid
  checked) and naming no service account, Secret, ConfigMap, ClusterTrustBundle or
  claim; delete only pods bound to itself; status only of pods bound to itself,
  without touching labels or resource claim statuses; evictions only of its pods;
* **PersistentVolumeClaim**: only status, and only capacity, conditions and the
  allocated-resource fields (what the kubelet writes after growing a filesystem);
* **ServiceAccount token**: only bound to a pod (uid given and right) that is
  bound to this node;
* **Lease**: only in `kube-node-lease` and named after the node;
* **CSINode**: only its own.

Messages are Kubernetes' (admission.NewForbidden: `<resource> "<name>" is
forbidden: <why>`).  Users that are not nodes pass untouched.  A validating plugin
here (Kubernetes runs it in the mutating phase, where it mutates nothing): it judges
the object as it will be stored.
"""

from __future__ import annotations

from typing import Any

from fleet.admission.priority import forbidden
from fleet.api import errors, meta
from fleet.api.podrefs import (
    MIRROR_POD_ANNOTATION,
    pod_configmap_names,
    pod_secret_names,
)
from fleet.auth import Attributes, UserInfo
from fleet.auth.node import NODE_LEASE_NAMESPACE, node_identity
from fleet.store import KeyNotFound, Store

# Label keys a kubelet may set on its own Node (k8s.io/kubelet/pkg/apis IsKubeletLabel).
KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type",
    "kubernetes.io/os", "kubernetes.io/arch",
    "beta.kubernetes.io/os", "beta.kubernetes.io/arch",
})
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
NODE_RESTRICTION_NAMESPACE = "node-restriction.kubernetes.io"
# PVC status fields a node may write (with RecoverVolumeExpansionFailure, on by default).
PVC_STATUS_FIELDS = ("capacity", "conditions", "allocatedResourceStatuses", "allocatedResources")


def operation(verb: str) -> str:
    """The admission operation of a request verb."""
    return {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE",
            "deletecollection": "DELETE"}.get(verb, "CONNECT")


def _d(obj: Any, *path: str) -> dict[str, Any]:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if isinstance(obj, dict) else {}


def label_namespace(key: str) -> str:
    prefix, slash, _ = key.partition("/")
    return prefix if slash else ""


def _in_namespace(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def is_kubelet_label(key: str) -> bool:
    if key in KUBELET_LABELS:
        return True
    ns = label_namespace(key)
    return any(_in_namespace(ns, allowed) for allowed in KUBELET_LABEL_NAMESPACES)


def is_kubernetes_label(key: str) -> bool:
    ns = label_namespace(key)
    return _in_namespace(ns, "kubernetes.io") or _in_namespace(ns, "k8s.io")


def modified_labels(new: dict[str, Any], old: dict[str, Any]) -> set[str]:
    """Keys added, removed or changed between two label maps."""
    return {k for k in new.keys() | old.keys() if k not in new or k not in old or new[k] != old[k]}


def forbidden_labels(keys: set[str]) -> list[str]:
    """Of the modified label keys, those a node may not add, remove or change."""
    return sorted(k for k in keys
                  if _in_namespace(label_namespace(k), NODE_RESTRICTION_NAMESPACE)
                  or (is_kubernetes_label(k) and not is_kubelet_label(k)))


def _labels(obj: Any) -> dict[str, Any]:
    return _d(obj, "metadata", "labels")


class NodeRestriction:
    """Validating admission plugin for writes by nodes."""

    name = "NodeRestriction"

    def __init__(self, store: Store) -> None:
        self.store = store

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        node, is_node = node_identity(user)
        if not is_node:
            return
        if not node:
            raise self._forbid(attrs, obj, old, f'could not determine node from user "{user.name}"')
        check = _CHECKS.get((attrs.group, attrs.resource))
        if check is not None:
            why = await check(self, node, attrs, obj, old)
            if why:
                raise self._forbid(attrs, obj, old, why)

    @staticmethod
    def _forbid(attrs: Attributes, obj: Any, old: Any, why: str) -> errors.Forbidden:
        name = attrs.name or str(_d(obj, "metadata").get("name") or _d(old, "metadata").get("name") or "")
        return forbidden(attrs.resource, attrs.group, name, why)

    async def _get(self, group: str, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        """The stored object, or Kubernetes' NotFound (as the plugin's listers answer)."""
        try:
            return await self.store.get(meta.store_key(group, plural, namespace, name))
        except KeyNotFound:
            raise errors.NotFound(f'{plural} "{name}" not found', name=name, group=group,
                                  kind=plural) from None

    # -- pods ------------------------------------------------------------------------
    async def pods(self, node: str, attrs: Attributes, obj: Any, old: Any) -> str:
        op = operation(attrs.verb)
        if attrs.subresource == "status":
            if op != "UPDATE":
                return f'unexpected operation "{op}"'
            if _d(old, "spec").get("nodeName") != node:
                return f'node "{node}" can only update pod status for pods with spec.nodeName set to itself'
            if _labels(old) != _labels(obj):
                return f'node "{node}" cannot update labels through pod status'
            if (_d(old, "status").get("resourceClaimStatuses") or []) != (
                    _d(obj, "status").get("resourceClaimStatuses") or []):
                return f'node "{node}" cannot update resource claim statues'
            return ""
        if attrs.subresource == "eviction":
            if op != "CREATE":
                return f"unexpected operation {op}"
            name = attrs.name or str(_d(obj, "metadata").get("name") or "")
            if not name:
                return "could not determine pod from request data"
            pod = await self._get("", "pods", attrs.namespace, name)
            if _d(pod, "spec").get("nodeName") != node:
                return f"node {node} can only evict pods with spec.nodeName set to itself"
            return ""
        if attrs.subresource:
            return f"unexpected pod subresource \"{attrs.subresource}\", only 'status' and 'eviction' are allowed"
        if op == "CREATE":
            return await self._mirror_pod(node, obj or {})
        if op == "DELETE":
            pod = old if old is not None else await self._get("", "pods", attrs.namespace, attrs.name)
            if _d(pod, "spec").get("nodeName") != node:
                return f'node "{node}" can only delete pods with spec.nodeName set to itself'
            return ""
        return f'unexpected operation "{op}", node "{node}" can only create and delete mirror pods'

    async def _mirror_pod(self, node: str, pod: dict[str, Any]) -> str:
        if MIRROR_POD_ANNOTATION not in _d(pod, "metadata", "annotations"):
            return (f'pod does not have "{MIRROR_POD_ANNOTATION}" annotation, node "{node}" can only '
                    "create mirror pods")
        spec = _d(pod, "spec")
        if spec.get("nodeName") != node:
            return f'node "{node}" can only create pods with spec.nodeName set to itself'
        owners = _d(pod, "metadata").get("ownerReferences") or []
        if not isinstance(owners, list) or not owners:
            return f'node "{node}" can only create pods with an owner reference set to itself'
        if len(owners) > 1:
            return f'node "{node}" can only create pods with a single owner reference set to itself'
        owner = owners[0] if isinstance(owners[0], dict) else {}
        if owner.get("apiVersion") != "v1" or owner.get("kind") != "Node" or owner.get("name") != node:
            return f'node "{node}" can only create pods with an owner reference set to itself'
        if owner.get("controller") is not True:
            return f'node "{node}" can only create pods with a controller owner reference set to itself'
        if owner.get("blockOwnerDeletion") is True:
            return f'node "{node}" must not set blockOwnerDeletion on an owner reference'
        me = await self._get("", "nodes", None, node)
        uid = _d(me, "metadata").get("uid")
        if owner.get("uid") != uid:
            return f"node {node} UID mismatch: expected {owner.get('uid')} got {uid}"
        if spec.get("serviceAccountName"):
            return f'node "{node}" can not create pods that reference a service account'
        if pod_secret_names(pod):
            return f'node "{node}" can not create pods that reference secrets'
        if pod_configmap_names(pod):
            return f'node "{node}" can not create pods that reference configmaps'
        volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)]
        for v in volumes:
            for src in _d(v, "projected").get("sources") or []:
                if isinstance(src, dict) and src.get("clusterTrustBundle") is not None:
                    return f'node "{node}" can not create pods that reference clustertrustbundles'
        if any(v.get("persistentVolumeClaim") is not None for v in volumes):
            return f'node "{node}" can not create pods that reference persistentvolumeclaims'
        return ""

    # -- nodes -----------------------------------------------------------------------
    async def nodes(self, node: str, attrs: Attributes, obj: Any, old: Any) -> str:
        requested = attrs.name or str(_d(obj, "metadata").get("name") or "")
        if requested != node:
            return f'node "{node}" is not allowed to modify node "{requested}"'
        op = operation(attrs.verb)
        if op == "CREATE":
            if _d(obj, "spec").get("configSource") is not None:
                return f'node "{node}" is not allowed to create pods with a non-nil configSource'
            bad = forbidden_labels(modified_labels(_labels(obj), {}))
            if bad:
                return f'node "{node}" is not allowed to set the following labels: {", ".join(bad)}'
        elif op == "UPDATE":
            source = _d(obj, "spec").get("configSource")
            if source is not None and source != _d(old, "spec").get("configSource"):
                return f'node "{node}" is not allowed to update configSource to a new non-nil configSource'
            if (_d(obj, "spec").get("taints") or []) != (_d(old, "spec").get("taints") or []):
                return f'node "{node}" is not allowed to modify taints'
            bad = forbidden_labels(modified_labels(_labels(obj), _labels(old)))
            if bad:
                return f"is not allowed to modify labels: {', '.join(bad)}"
        return ""

    # -- claims ----------------------------------------------------------------------
    async def claims(self, node: str, attrs: Attributes, obj: Any, old: Any) -> str:
        if attrs.subresource != "status":
            return "may only update PVC status"
        op = operation(attrs.verb)
        if op != "UPDATE":
            return f'unexpected operation "{op}"'

        def rest(pvc: Any) -> dict[str, Any]:
            out = dict(pvc) if isinstance(pvc, dict) else {}
            out["metadata"] = {k: v for k, v in _d(pvc, "metadata").items()
                               if k not in ("resourceVersion", "managedFields")}
            out["status"] = {k: v for k, v in _d(pvc, "status").items() if k not in PVC_STATUS_FIELDS}
            return out

        if rest(obj) != rest(old):
            return (f'node "{node}" is not allowed to update fields other than status.capacity and '
                    "status.conditions")
        return ""

    # -- service account tokens ------------------------------------------------------
    async def service_accounts(self, node: str, attrs: Attributes, obj: Any, old: Any) -> str:
        if operation(attrs.verb) != "CREATE" or attrs.subresource != "token":
            return ""
        ref = _d(obj, "spec", "boundObjectRef")
        if ref.get("apiVersion") != "v1" or ref.get("kind") != "Pod" or not ref.get("name"):
            return "node requested token not bound to a pod"
        if not ref.get("uid"):
            return "node requested token with a pod binding without a uid"
        pod = await self._get("", "pods", attrs.namespace, str(ref["name"]))
        if ref["uid"] != _d(pod, "metadata").get("uid"):
            return (f"the UID in the bound object reference ({ref['uid']}) does not match the UID in "
                    "record. The object might have been deleted and then recreated")
        if _d(pod, "spec").get("nodeName") != node:
            return "node requested token bound to a pod scheduled on a different node"
        return ""

    # -- leases and CSINodes ---------------------------------------------------------
    async def leases(self, node: str, attrs: Attributes, obj: Any, old: Any) -> str:
        if attrs.namespace != NODE_LEASE_NAMESPACE:
            return f'can only access leases in the "{NODE_LEASE_NAMESPACE}" system namespace'
        name = _d(obj, "metadata").get("name") if operation(attrs.verb) == "CREATE" else attrs.name
        if name != node:
            return "can only access node lease with the same name as the requesting node"
        return ""

    async def csinodes(self, node: str, attrs: Attributes, obj: Any, old: Any) -> str:
        name = _d(obj, "metadata").get("name") if operation(attrs.verb) == "CREATE" else attrs.name
        if name != node:
            return "can only access CSINode with the same name as the requesting node"
        return ""


_CHECKS = {
    ("", "pods"): NodeRestriction.pods,
    ("", "nodes"): NodeRestriction.nodes,
    ("", "persistentvolumeclaims"): NodeRestriction.claims,
    ("", "serviceaccounts"): NodeRestriction.service_accounts,
    ("coordination.k8s.io", "leases"): NodeRestriction.leases,
    ("storage.k8s.io", "csinodes"): NodeRestriction.csinodes,
}


__all__ = ["NodeRestriction", "forbidden_labels", "is_kubelet_label", "modified_labels", "operation"]
