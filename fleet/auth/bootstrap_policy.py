"""The default RBAC policy: Kubernetes 1.32's ClusterRoles and ClusterRoleBindings,
Fleet's component roles, and their reconciliation at every server start.

What is here (data, in `cluster_roles()` / `cluster_role_bindings()`):

* Kubernetes' user-facing roles: `cluster-admin`; `admin`, `edit`, `view` as
  aggregated roles filled from `system:aggregate-to-admin|edit|view` (and any
  ClusterRole a user labels `rbac.authorization.k8s.io/aggregate-to-*: "true"`);
* Kubernetes' system roles: `system:basic-user`, `system:discovery`,
  `system:public-info-viewer`, `system:monitoring`, `system:auth-delegator`,
  `system:heapster`, `system:kube-aggregator`, `system:node`,
  `system:node-bootstrapper`, `system:node-proxier`, `system:node-problem-detector`,
  `system:kube-dns`, `system:kube-scheduler`, `system:volume-scheduler`,
  `system:kube-controller-manager`, `system:persistent-volume-provisioner`,
  `system:service-account-issuer-discovery`, `system:kubelet-api-admin`, the CSR
  roles (`system:certificates.k8s.io:...`) — with the rules of kube-apiserver 1.32
  (plugin/pkg/auth/authorizer/rbac/bootstrappolicy);
* Fleet's components, each with only what its code reads and writes:
  `system:fleet:controller-manager` (all of Fleet's controllers run as one
  identity, `system:kube-controller-manager`; the garbage collector and namespace
  deletion must read and delete every kind, the HPA and disruption controllers
  scale any kind, so reads/updates/deletes are on `*`, creates only on the kinds
  controllers create), `system:fleet:scheduler` (what Fleet's scheduler adds to
  kube-scheduler's role: pods/status for preemption conditions, storage classes),
  `system:fleet:cluster-dns` and `system:fleet:ingress`.

Bindings follow kube-apiserver (and kubeadm for node join): cluster-admin →
system:masters, basic-user/discovery → system:authenticated, public-info-viewer →
authenticated and unauthenticated, the scheduler and controller-manager roles →
their users, node-bootstrapper and nodeclient → system:bootstrappers,
selfnodeclient → system:nodes.  `system:node` is bound to nobody: the Node
authorizer grants nodes what they need, narrowed to their own objects.

`reconcile(store, registry)` is kube-apiserver's `rbac/bootstrap-roles` post-start
hook: missing objects are created; an existing one annotated
`rbac.authorization.kubernetes.io/autoupdate: "true"` (the default) gets the rules,
subjects, labels and annotations it lacks added (never removed); one set to
"false" is left exactly as the administrator made it.  A binding whose roleRef
differs is recreated (roleRef is immutable).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from fleet.api.registry import Registry
from fleet.auth import (
    AUTHENTICATED,
    BOOTSTRAPPERS_GROUP,
    KUBE_CONTROLLER_MANAGER_USER,
    KUBE_SCHEDULER_USER,
    NODES_GROUP,
    SERVICE_ACCOUNTS_GROUP,
    STORAGE_PROVISIONER_USER,
    STORAGE_PROVISIONERS_GROUP,
    SYSTEM_MASTERS,
    UNAUTHENTICATED,
)
from fleet.auth.rbac import covers
from fleet.store import KeyExists, KeyNotFound, RevisionConflict, Store

log = logging.getLogger(__name__)

GROUP = "rbac.authorization.k8s.io"
API_VERSION = f"{GROUP}/v1"
AUTOUPDATE = "rbac.authorization.kubernetes.io/autoupdate"
BOOTSTRAP_LABEL = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"

READ = ("get", "list", "watch")
WRITE = ("create", "delete", "deletecollection", "patch", "update")
READ_WRITE = READ + WRITE
EVENTS_GROUPS = ("", "events.k8s.io")

CONTROLLER_MANAGER_ROLE = "system:fleet:controller-manager"
SCHEDULER_ROLE = "system:fleet:scheduler"
CLUSTER_DNS_ROLE = "system:fleet:cluster-dns"
INGRESS_ROLE = "system:fleet:ingress"
STORAGE_PROVISIONER_ROLE = "system:fleet:storage-provisioner"
# The users Fleet's in-process DNS, ingress and node-local storage provisioner run as.
CLUSTER_DNS_USER = "system:fleet:cluster-dns"
INGRESS_USER = "system:fleet:ingress"


def rule(verbs: tuple[str, ...] | str, groups: tuple[str, ...] | str, resources: tuple[str, ...] | str,
         names: tuple[str, ...] = ()) -> dict[str, Any]:
    """A resource PolicyRule (one string stands for a one-item list)."""
    def as_list(v: tuple[str, ...] | str) -> list[str]:
        return [v] if isinstance(v, str) else list(v)

    r: dict[str, Any] = {"verbs": as_list(verbs), "apiGroups": as_list(groups), "resources": as_list(resources)}
    if names:
        r["resourceNames"] = list(names)
    return r


def urls(verbs: tuple[str, ...] | str, *paths: str) -> dict[str, Any]:
    """A non-resource PolicyRule."""
    return {"verbs": [verbs] if isinstance(verbs, str) else list(verbs), "nonResourceURLs": list(paths)}


def events_rule() -> dict[str, Any]:
    return rule(("create", "patch", "update"), EVENTS_GROUPS, "events")


def cluster_role(name: str, rules: list[dict[str, Any]], *, labels: dict[str, str] | None = None,
                 aggregate_from: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION, "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {**BOOTSTRAP_LABEL, **(labels or {})},
                     "annotations": {AUTOUPDATE: "true"}},
        "rules": rules,
    }
    if aggregate_from is not None:
        obj["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": {AGGREGATE_TO + aggregate_from: "true"}}]}
    return obj


def _aggregate_to(*targets: str) -> dict[str, str]:
    return {AGGREGATE_TO + t: "true" for t in targets}


def _aggregate_to_view() -> list[dict[str, Any]]:
    return [
        rule(READ, "", ("configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods",
                        "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services",
                        "services/status")),
        rule(READ, "", ("bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
                        "replicationcontrollers/status", "resourcequotas", "resourcequotas/status")),
        rule(READ, "", "namespaces"),
        rule(READ, "discovery.k8s.io", "endpointslices"),
        rule(READ, "apps", ("controllerrevisions", "daemonsets", "daemonsets/status", "deployments",
                            "deployments/scale", "deployments/status", "replicasets", "replicasets/scale",
                            "replicasets/status", "statefulsets", "statefulsets/scale", "statefulsets/status")),
        rule(READ, "autoscaling", ("horizontalpodautoscalers", "horizontalpodautoscalers/status")),
        rule(READ, "batch", ("cronjobs", "cronjobs/status", "jobs", "jobs/status")),
        rule(READ, "extensions", ("daemonsets", "daemonsets/status", "deployments", "deployments/scale",
                                  "deployments/status", "ingresses", "ingresses/status", "networkpolicies",
                                  "replicasets", "replicasets/scale", "replicasets/status",
                                  "replicationcontrollers/scale")),
        rule(READ, "policy", ("poddisruptionbudgets", "poddisruptionbudgets/status")),
        rule(READ, "networking.k8s.io", ("ingresses", "ingresses/status", "networkpolicies")),
    ]


def _aggregate_to_edit() -> list[dict[str, Any]]:
    return [
        rule(READ, "", ("pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy")),
        rule("impersonate", "", "serviceaccounts"),
        rule(WRITE, "", ("pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy")),
        rule("create", "", "pods/eviction"),
        rule(WRITE, "", ("configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
                         "replicationcontrollers/scale", "secrets", "serviceaccounts", "services",
                         "services/proxy")),
        rule("create", "", "serviceaccounts/token"),
        rule(WRITE, "apps", ("daemonsets", "deployments", "deployments/rollback", "deployments/scale",
                             "replicasets", "replicasets/scale", "statefulsets", "statefulsets/scale")),
        rule(WRITE, "autoscaling", "horizontalpodautoscalers"),
        rule(WRITE, "batch", ("cronjobs", "jobs")),
        rule(WRITE, "extensions", ("daemonsets", "deployments", "deployments/rollback", "deployments/scale",
                                   "ingresses", "networkpolicies", "replicasets", "replicasets/scale",
                                   "replicationcontrollers/scale")),
        rule(WRITE, "policy", "poddisruptionbudgets"),
        rule(WRITE, "networking.k8s.io", ("ingresses", "networkpolicies")),
        rule(READ_WRITE, "coordination.k8s.io", "leases"),
    ]


def _kube_roles() -> list[dict[str, Any]]:
    csr = "certificates.k8s.io"
    return [
        cluster_role("cluster-admin", [rule("*", "*", "*"), urls("*", "*")]),
        cluster_role("admin", [], aggregate_from="admin"),
        cluster_role("edit", [], labels=_aggregate_to("admin"), aggregate_from="edit"),
        cluster_role("view", [], labels=_aggregate_to("edit"), aggregate_from="view"),
        cluster_role("system:aggregate-to-admin", [
            rule("create", "authorization.k8s.io", "localsubjectaccessreviews"),
            rule(READ_WRITE, GROUP, ("rolebindings", "roles")),
        ], labels=_aggregate_to("admin")),
        cluster_role("system:aggregate-to-edit", _aggregate_to_edit(), labels=_aggregate_to("edit")),
        cluster_role("system:aggregate-to-view", _aggregate_to_view(), labels=_aggregate_to("view")),
        cluster_role("system:auth-delegator", [
            rule("create", "authentication.k8s.io", "tokenreviews"),
            rule("create", "authorization.k8s.io", "subjectaccessreviews"),
        ]),
        cluster_role("system:basic-user", [
            rule("create", "authorization.k8s.io", ("selfsubjectaccessreviews", "selfsubjectrulesreviews")),
            rule("create", "authentication.k8s.io", "selfsubjectreviews"),
        ]),
        cluster_role("system:certificates.k8s.io:certificatesigningrequests:nodeclient", [
            rule("create", csr, "certificatesigningrequests/nodeclient")]),
        cluster_role("system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", [
            rule("create", csr, "certificatesigningrequests/selfnodeclient")]),
        *(cluster_role(f"system:certificates.k8s.io:{signer}-approver", [
            rule("approve", csr, "signers", names=(f"kubernetes.io/{signer}",))])
          for signer in ("kube-apiserver-client", "kube-apiserver-client-kubelet", "kubelet-serving",
                         "legacy-unknown")),
        cluster_role("system:discovery", [
            urls("get", "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                 "/readyz", "/version", "/version/")]),
        cluster_role("system:heapster", [
            rule(READ, "", ("events", "namespaces", "nodes", "pods")),
            rule(READ, "extensions", "deployments"),
        ]),
        cluster_role("system:kube-aggregator", [rule(READ, "", ("endpoints", "services"))]),
        cluster_role("system:kube-controller-manager", [
            events_rule(),
            rule("create", "coordination.k8s.io", "leases"),
            rule(("get", "update"), "coordination.k8s.io", "leases", names=("kube-controller-manager",)),
            rule("create", "", ("secrets", "serviceaccounts")),
            rule("delete", "", "secrets"),
            rule("get", "", ("configmaps", "namespaces", "secrets", "serviceaccounts")),
            rule("update", "", ("secrets", "serviceaccounts")),
            rule("create", "authentication.k8s.io", "tokenreviews"),
            rule("create", "authorization.k8s.io", "subjectaccessreviews"),
            rule(("list", "watch"), "*", "*"),
            rule("create", "", "serviceaccounts/token"),
        ]),
        cluster_role("system:kube-dns", [rule(("list", "watch"), "", ("endpoints", "services"))]),
        cluster_role("system:kube-scheduler", [
            events_rule(),
            rule("create", "coordination.k8s.io", "leases"),
            rule(("get", "update"), "coordination.k8s.io", "leases", names=("kube-scheduler",)),
            rule(READ, "", "nodes"),
            rule(("delete", "get", "list", "watch"), "", "pods"),
            rule("create", "", ("bindings", "pods/binding")),
            rule(("patch", "update"), "", "pods/status"),
            rule(READ, "", ("replicationcontrollers", "services")),
            rule(READ, ("apps", "extensions"), "replicasets"),
            rule(READ, "apps", "statefulsets"),
            rule(READ, "policy", "poddisruptionbudgets"),
            rule(READ, "", ("persistentvolumeclaims", "persistentvolumes")),
            rule("create", "authentication.k8s.io", "tokenreviews"),
            rule("create", "authorization.k8s.io", "subjectaccessreviews"),
            rule(READ, "storage.k8s.io", "csinodes"),
            rule(READ, "", "namespaces"),
            rule(READ, "storage.k8s.io", "csidrivers"),
            rule(READ, "storage.k8s.io", "csistoragecapacities"),
        ]),
        cluster_role("system:kubelet-api-admin", [
            rule(READ, "", "nodes"),
            rule("proxy", "", "nodes"),
            rule("*", "", ("nodes/log", "nodes/metrics", "nodes/proxy", "nodes/stats")),
        ]),
        cluster_role("system:monitoring", [
            urls("get", "/healthz", "/healthz/*", "/livez", "/livez/*", "/metrics", "/metrics/slis", "/readyz",
                 "/readyz/*")]),
        cluster_role("system:node", [
            rule("create", "authentication.k8s.io", "tokenreviews"),
            rule("create", "authorization.k8s.io", ("localsubjectaccessreviews", "subjectaccessreviews")),
            rule(READ, "", "services"),
            rule(("create", "get", "list", "watch"), "", "nodes"),
            rule(("patch", "update"), "", "nodes/status"),
            rule(("patch", "update"), "", "nodes"),
            rule(("create", "patch", "update"), "", "events"),
            rule(READ, "", "pods"),
            rule(("create", "delete"), "", "pods"),
            rule(("patch", "update"), "", "pods/status"),
            rule("create", "", "pods/eviction"),
            rule(READ, "", ("configmaps", "secrets")),
            rule("get", "", ("persistentvolumeclaims", "persistentvolumes")),
            rule("get", "", "endpoints"),
            rule(("create", "get", "list", "watch"), csr, "certificatesigningrequests"),
            rule(("create", "delete", "get", "patch", "update"), "coordination.k8s.io", "leases"),
            rule("get", "storage.k8s.io", "volumeattachments"),
            rule("create", "", "serviceaccounts/token"),
            rule(("get", "patch", "update"), "", "persistentvolumeclaims/status"),
            rule(READ, "storage.k8s.io", "csidrivers"),
            rule(("create", "delete", "get", "patch", "update"), "storage.k8s.io", "csinodes"),
            rule(READ, "node.k8s.io", "runtimeclasses"),
        ]),
        cluster_role("system:node-bootstrapper", [
            rule(("create", "get", "list", "watch"), csr, "certificatesigningrequests")]),
        cluster_role("system:node-problem-detector", [
            rule("get", "", "nodes"), rule("patch", "", "nodes/status"), events_rule()]),
        cluster_role("system:node-proxier", [
            rule(("list", "watch"), "", ("endpoints", "services")),
            rule(READ, "", "nodes"),
            events_rule(),
            rule(("list", "watch"), "discovery.k8s.io", "endpointslices"),
        ]),
        cluster_role("system:persistent-volume-provisioner", [
            rule(("create", "delete", "get", "list", "watch"), "", "persistentvolumes"),
            rule(("get", "list", "update", "watch"), "", "persistentvolumeclaims"),
            rule(READ, "storage.k8s.io", "storageclasses"),
            rule("watch", "", "events"),
            events_rule(),
        ]),
        cluster_role("system:public-info-viewer", [
            urls("get", "/healthz", "/livez", "/readyz", "/version", "/version/")]),
        cluster_role("system:service-account-issuer-discovery", [
            urls("get", "/.well-known/openid-configuration", "/openid/v1/jwks")]),
        cluster_role("system:volume-scheduler", [
            rule(("get", "list", "patch", "update", "watch"), "", "persistentvolumes"),
            rule(READ, "storage.k8s.io", "storageclasses"),
            rule(("get", "list", "patch", "update", "watch"), "", "persistentvolumeclaims"),
        ]),
    ]


def _fleet_roles() -> list[dict[str, Any]]:
    """Roles of Fleet's own components (derived from what each one's code reads and writes)."""
    return [
        cluster_role(CONTROLLER_MANAGER_ROLE, [
            # Every controller's informers; the garbage collector and namespace deletion
            # read, patch (ownerReferences, finalizers) and delete objects of every kind;
            # each controller writes its kinds' status; the HPA and the disruption
            # controller read and write `*/scale` of any scalable kind.
            rule(("get", "list", "watch", "patch", "update", "delete", "deletecollection"), "*", "*"),
            # What controllers create: pods (ReplicaSet, StatefulSet, DaemonSet, Job),
            # claims (StatefulSet, generic ephemeral volumes), volumes (PV binder and the
            # storage provisioner), Endpoints, ServiceAccounts (`default`), events,
            # ConfigMaps (`kube-root-ca.crt` of the root CA publisher).
            rule("create", "", ("pods", "persistentvolumeclaims", "persistentvolumes", "endpoints",
                                "serviceaccounts", "events", "configmaps")),
            rule("create", "events.k8s.io", "events"),
            rule("create", "apps", ("replicasets", "controllerrevisions")),
            rule("create", "batch", "jobs"),
            rule("create", "discovery.k8s.io", "endpointslices"),
            rule("create", "storage.k8s.io", ("volumeattachments", "csistoragecapacities")),
            rule("create", "coordination.k8s.io", "leases"),
            # The clusterrole-aggregation controller writes rules it need not hold.
            rule("escalate", GROUP, "clusterroles"),
            # csrapproving approves nodes' own requests; csrsigning signs for the
            # in-tree signers (the CSR admission checks both verbs per signer name).
            rule("approve", "certificates.k8s.io", "signers",
                 names=("kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/kubelet-serving",
                        "kubernetes.io/kube-apiserver-client")),
            rule("sign", "certificates.k8s.io", "signers",
                 names=("kubernetes.io/kube-apiserver-client", "kubernetes.io/kube-apiserver-client-kubelet",
                        "kubernetes.io/kubelet-serving")),
        ]),
        cluster_role(SCHEDULER_ROLE, [
            # Beyond system:kube-scheduler and system:volume-scheduler: preemption's
            # DisruptionTarget condition and the storage kinds VolumeBinding reads.
            rule(("patch", "update"), "", "pods/status"),
            rule(READ, "storage.k8s.io", ("storageclasses", "csinodes", "csidrivers", "csistoragecapacities")),
            rule(READ, "scheduling.k8s.io", "priorityclasses"),
            rule(READ, "policy", "poddisruptionbudgets"),
        ]),
        cluster_role(CLUSTER_DNS_ROLE, [
            rule(("list", "watch"), "", ("services", "pods", "namespaces")),
            rule(("list", "watch"), "discovery.k8s.io", "endpointslices"),
        ]),
        cluster_role(INGRESS_ROLE, [
            rule(READ, "networking.k8s.io", ("ingresses", "ingressclasses")),
            rule("create", "networking.k8s.io", "ingressclasses"),
            rule(("patch", "update"), "networking.k8s.io", ("ingresses/status", "ingressclasses/status")),
            rule(READ, "gateway.networking.k8s.io", ("gatewayclasses", "gateways", "httproutes")),
            rule("create", "gateway.networking.k8s.io", "gatewayclasses"),
            rule(("patch", "update"), "gateway.networking.k8s.io",
                 ("gatewayclasses/status", "gateways/status", "httproutes/status")),
            rule(READ, "", ("services", "secrets", "namespaces")),
            rule(READ, "discovery.k8s.io", "endpointslices"),
            events_rule(),
        ]),
        # A node's node-local storage provisioner (fleet.storage.provisioner): the
        # external-provisioner's, -resizer's and -attacher's rights, as the DaemonSet of
        # a distributed provisioner holds them through its ServiceAccount.
        cluster_role(STORAGE_PROVISIONER_ROLE, [
            rule(READ + ("create", "delete", "patch", "update"), "", "persistentvolumes"),
            rule(READ + ("patch", "update"), "", ("persistentvolumeclaims", "persistentvolumeclaims/status")),
            rule(READ, "", "nodes"),
            rule(READ, "storage.k8s.io", ("storageclasses", "csinodes", "csidrivers")),
            rule(READ + ("patch", "update"), "storage.k8s.io", ("volumeattachments", "volumeattachments/status")),
            rule(READ_WRITE, "storage.k8s.io", "csistoragecapacities"),
            events_rule(),
        ]),
    ]


def cluster_roles() -> list[dict[str, Any]]:
    """Every default ClusterRole (fresh dicts).  The aggregated ones (admin, edit, view)
    come with their rules already aggregated from the other defaults, so they grant
    from the first request on; the aggregation controller keeps them current after."""
    from fleet.controllers.clusterroleaggregation import aggregate_rules

    roles = _kube_roles() + _fleet_roles()
    for _ in range(len(roles)):  # to a fixed point: admin aggregates edit, which aggregates view
        changed = False
        for role in roles:
            rules = aggregate_rules(role, roles)
            if rules is not None and rules != role["rules"]:
                role["rules"], changed = rules, True
        if not changed:
            break
    return roles


def _subject(kind: str, name: str, namespace: str = "") -> dict[str, Any]:
    if kind == "ServiceAccount":
        return {"kind": kind, "name": name, "namespace": namespace}
    return {"kind": kind, "apiGroup": GROUP, "name": name}


def cluster_role_binding(name: str, role: str, *subjects: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": dict(BOOTSTRAP_LABEL), "annotations": {AUTOUPDATE: "true"}},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
        "subjects": list(subjects),
    }


def cluster_role_bindings() -> list[dict[str, Any]]:
    """Every default ClusterRoleBinding (fresh dicts); each is named after its role."""
    def b(role: str, *subjects: dict[str, Any]) -> dict[str, Any]:
        return cluster_role_binding(role, role, *subjects)

    def group(name: str) -> dict[str, Any]:
        return _subject("Group", name)

    def user(name: str) -> dict[str, Any]:
        return _subject("User", name)

    return [
        b("cluster-admin", group(SYSTEM_MASTERS)),
        b("system:basic-user", group(AUTHENTICATED)),
        b("system:discovery", group(AUTHENTICATED)),
        b("system:public-info-viewer", group(AUTHENTICATED), group(UNAUTHENTICATED)),
        b("system:monitoring", group("system:monitoring")),
        b("system:node"),  # the Node authorizer grants nodes their rights
        b("system:node-proxier", user("system:kube-proxy")),
        b("system:kube-controller-manager", user(KUBE_CONTROLLER_MANAGER_USER)),
        b("system:kube-dns", _subject("ServiceAccount", "kube-dns", "kube-system")),
        b("system:kube-scheduler", user(KUBE_SCHEDULER_USER)),
        b("system:volume-scheduler", user(KUBE_SCHEDULER_USER)),
        b("system:service-account-issuer-discovery", group(SERVICE_ACCOUNTS_GROUP)),
        # Node join (kubeadm's bindings): a bootstrap token may file CSRs and have
        # client certificates for a new node auto-approved; a node may renew its own.
        b("system:node-bootstrapper", group(BOOTSTRAPPERS_GROUP)),
        b("system:certificates.k8s.io:certificatesigningrequests:nodeclient", group(BOOTSTRAPPERS_GROUP)),
        b("system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", group(NODES_GROUP)),
        # Fleet's components.
        b(CONTROLLER_MANAGER_ROLE, user(KUBE_CONTROLLER_MANAGER_USER)),
        b(SCHEDULER_ROLE, user(KUBE_SCHEDULER_USER)),
        b(CLUSTER_DNS_ROLE, user(CLUSTER_DNS_USER)),
        b(INGRESS_ROLE, user(INGRESS_USER)),
        # The built-in agent's provisioner, and joined nodes' (each its own certificate).
        b(STORAGE_PROVISIONER_ROLE, user(STORAGE_PROVISIONER_USER), group(STORAGE_PROVISIONERS_GROUP)),
    ]


def _namespaced(kind: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "labels": dict(BOOTSTRAP_LABEL),
                         "annotations": {AUTOUPDATE: "true"}}, **body}


def namespace_roles() -> list[dict[str, Any]]:
    """Default Roles (Kubernetes' NamespaceRoles and kubeadm's cluster-info reader)."""
    return [
        _namespaced("Role", "kube-system", "extension-apiserver-authentication-reader", {"rules": [
            rule(READ, "", "configmaps", names=("extension-apiserver-authentication",))]}),
        _namespaced("Role", "kube-public", "kubeadm:bootstrap-signer-clusterinfo", {"rules": [
            rule("get", "", "configmaps", names=("cluster-info",))]}),
    ]


def namespace_role_bindings() -> list[dict[str, Any]]:
    def binding(namespace: str, name: str, role: str, *subjects: dict[str, Any]) -> dict[str, Any]:
        return _namespaced("RoleBinding", namespace, name, {
            "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": role}, "subjects": list(subjects)})

    return [
        # The client CA bundles: the components, and nodes (a joined node's agent API
        # verifies the API server's client certificate with them; Fleet's addition).
        binding("kube-system", "system::extension-apiserver-authentication-reader",
                "extension-apiserver-authentication-reader", _subject("User", KUBE_CONTROLLER_MANAGER_USER),
                _subject("User", KUBE_SCHEDULER_USER), _subject("Group", NODES_GROUP)),
        # cluster-info: anonymous as kubeadm binds it, and bootstrap-token users (a
        # joining node reads it with its token when anonymous requests are off).
        binding("kube-public", "kubeadm:bootstrap-signer-clusterinfo", "kubeadm:bootstrap-signer-clusterinfo",
                _subject("User", "system:anonymous"), _subject("Group", BOOTSTRAPPERS_GROUP)),
    ]


# ---------------------------------------------------------------------------
# Reconciliation (pure) and the start-up hook (I/O).
# ---------------------------------------------------------------------------


def _autoupdate(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(AUTOUPDATE, "true") != "false"


def _merge_meta(existing: dict[str, Any], expected: dict[str, Any]) -> None:
    md, want = existing.setdefault("metadata", {}), expected["metadata"]
    for key in ("labels", "annotations"):
        have = md.get(key) if isinstance(md.get(key), dict) else {}
        md[key] = {**want.get(key, {}), **have}


def reconcile_role(existing: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any] | None:
    """The role `existing` should become (missing rules, selectors, labels and
    annotations added), or None when nothing changes or it is not to be updated."""
    if not _autoupdate(existing):
        return None
    out = copy.deepcopy(existing)
    _merge_meta(out, expected)
    want_agg = expected.get("aggregationRule")
    if want_agg:
        # The aggregation controller owns the rules of an aggregated role.
        have = out.get("aggregationRule") if isinstance(out.get("aggregationRule"), dict) else {}
        selectors = list(have.get("clusterRoleSelectors") or [])
        for s in want_agg["clusterRoleSelectors"]:
            if s not in selectors:
                selectors.append(s)
        out["aggregationRule"] = {**have, "clusterRoleSelectors": selectors}
    else:
        have_rules = [r for r in out.get("rules") or [] if isinstance(r, dict)]
        missing = [r for r in expected["rules"] if not covers(have_rules, [r])[0]]
        out["rules"] = have_rules + missing
    return out if out != existing else None


def reconcile_binding(existing: dict[str, Any], expected: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """(the binding `existing` should become or None, whether it must be recreated
    because its roleRef differs)."""
    if not _autoupdate(existing):
        return None, False
    out = copy.deepcopy(existing)
    _merge_meta(out, expected)
    subjects = [s for s in out.get("subjects") or [] if isinstance(s, dict)]
    for s in expected["subjects"]:
        if s not in subjects:
            subjects.append(s)
    if subjects or "subjects" in out:
        out["subjects"] = subjects
    recreate = out.get("roleRef") != expected["roleRef"]
    if recreate:
        out["roleRef"] = copy.deepcopy(expected["roleRef"])
    return (out if out != existing else None), recreate


async def _apply(store: Store, key: str, expected: dict[str, Any], is_role: bool) -> str | None:
    """Create or reconcile one object; -> what was done, or None."""
    for _ in range(5):
        try:
            existing = await store.get(key)
        except KeyNotFound:
            try:
                await store.create(key, copy.deepcopy(expected))
                return "created"
            except KeyExists:
                continue
        rv = int(existing["metadata"]["resourceVersion"])
        if is_role:
            new, recreate = reconcile_role(existing, expected), False
        else:
            new, recreate = reconcile_binding(existing, expected)
        if new is None:
            return None
        try:
            if recreate:
                await store.delete(key, expected_revision=rv)
                for f in ("uid", "resourceVersion", "creationTimestamp"):
                    new["metadata"].pop(f, None)
                await store.create(key, new)
                return "recreated"
            await store.update(key, new, expected_revision=rv)
            return "updated"
        except (RevisionConflict, KeyNotFound, KeyExists):
            continue
    log.warning("rbac bootstrap: %s kept changing; left as it is", key)
    return None


async def reconcile(store: Store, registry: Registry) -> list[str]:
    """The `rbac/bootstrap-roles` hook: -> "kind/name action" for each change made."""
    kinds = [registry.get(GROUP, "v1", plural)
             for plural in ("clusterroles", "clusterrolebindings", "roles", "rolebindings")]
    if any(info is None for info in kinds):
        return []
    done: list[str] = []
    sets = ((cluster_roles(), True), (cluster_role_bindings(), False),
            (namespace_roles(), True), (namespace_role_bindings(), False))
    for info, (objs, is_role) in zip(kinds, sets, strict=True):
        for obj in objs:
            if info.default is not None:
                info.default(obj)
            name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace")
            action = await _apply(store, info.key(namespace, name), obj, is_role)
            if action is not None:
                done.append(f"{info.singular}/{f'{namespace}/' if namespace else ''}{name} {action}")
    if done:
        log.info("rbac bootstrap: %s", ", ".join(done))
    return done


__all__ = ["AUTOUPDATE", "CLUSTER_DNS_USER", "CONTROLLER_MANAGER_ROLE", "INGRESS_USER",
           "STORAGE_PROVISIONER_USER", "cluster_role_bindings",
           "cluster_roles", "reconcile", "reconcile_binding", "reconcile_role"]
