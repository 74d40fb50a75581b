"""The default RBAC policy (fleet/auth/bootstrap_policy.py): every object valid, the
bindings' roles present, what each well-known identity may do, and the start-up
reconciliation (create missing, add missing rules/subjects, leave autoupdate=false)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from fleet.api import meta
from fleet.api.kinds.rbac import (
    default_binding,
    validate_cluster_role,
    validate_cluster_role_binding,
)
from fleet.api.registry import default_registry
from fleet.auth import (
    ANONYMOUS,
    AUTHENTICATED,
    BOOTSTRAPPERS_GROUP,
    KUBE_CONTROLLER_MANAGER_USER,
    KUBE_SCHEDULER_USER,
    NODES_GROUP,
    Attributes,
    UserInfo,
    non_resource,
)
from fleet.auth import bootstrap_policy as bp
from fleet.auth.rbac import RBACAuthorizer
from fleet.controllers.clusterroleaggregation import aggregate_rules
from fleet.store import open_store

G = bp.GROUP


def test_defaults_are_valid_and_consistent() -> None:
    roles = bp.cluster_roles()
    bindings = bp.cluster_role_bindings()
    names = [r["metadata"]["name"] for r in roles]
    assert len(names) == len(set(names))
    for r in roles:
        assert validate_cluster_role(r, None) == [], r["metadata"]["name"]
        assert r["metadata"]["annotations"][bp.AUTOUPDATE] == "true"
    for b in bindings:
        default_binding(b)
        assert validate_cluster_role_binding(b, None) == [], b["metadata"]["name"]
        assert b["roleRef"]["name"] in names


def policy() -> RBACAuthorizer:
    """An authorizer over the defaults, with aggregated roles filled as the controller would."""
    a = RBACAuthorizer()
    roles = bp.cluster_roles()
    for _ in range(3):  # admin <- edit <- view: three rounds reach the fixed point
        for r in roles:
            got = aggregate_rules(r, roles)
            if got is not None:
                r["rules"] = got
    for r in roles:
        a.cluster_roles.put(r)
    for b in bp.cluster_role_bindings():
        a.cluster_role_bindings.put(b)
    return a


def res(verb: str, resource: str, group: str = "", ns: str = "", name: str = "", sub: str = "") -> Attributes:
    return Attributes(verb, group, "v1", resource, sub, ns, name)


AUTHED = UserInfo("someone", groups=(AUTHENTICATED,))
SCHEDULER = UserInfo(KUBE_SCHEDULER_USER, groups=(AUTHENTICATED,))
KCM = UserInfo(KUBE_CONTROLLER_MANAGER_USER, groups=(AUTHENTICATED,))
DNS = UserInfo(bp.CLUSTER_DNS_USER, groups=(AUTHENTICATED,))
INGRESS = UserInfo(bp.INGRESS_USER, groups=(AUTHENTICATED,))
BOOTSTRAPPER = UserInfo("system:bootstrap:abcdef", groups=(BOOTSTRAPPERS_GROUP, AUTHENTICATED))
NODE = UserInfo("system:node:n1", groups=(NODES_GROUP, AUTHENTICATED))


@pytest.mark.parametrize(("user", "attrs", "allowed"), [
    # Everyone authenticated: discovery, health, version, self reviews.
    (AUTHED, non_resource("get", "/apis/apps/v1"), True),
    (AUTHED, non_resource("get", "/version"), True),
    (AUTHED, res("create", "selfsubjectaccessreviews", "authorization.k8s.io"), True),
    (AUTHED, res("create", "selfsubjectreviews", "authentication.k8s.io"), True),
    (AUTHED, non_resource("get", "/metrics"), False),
    (AUTHED, res("list", "pods", ns="default"), False),
    # Anonymous: only public info.
    (ANONYMOUS, non_resource("get", "/healthz"), True),
    (ANONYMOUS, non_resource("get", "/readyz"), True),
    (ANONYMOUS, non_resource("get", "/version"), True),
    (ANONYMOUS, non_resource("get", "/apis"), False),
    # The scheduler.
    (SCHEDULER, res("create", "pods", ns="a", name="p", sub="binding"), True),
    (SCHEDULER, res("patch", "pods", ns="a", name="p", sub="status"), True),
    (SCHEDULER, res("delete", "pods", ns="a", name="p"), True),
    (SCHEDULER, res("list", "csinodes", "storage.k8s.io"), True),
    (SCHEDULER, res("list", "csistoragecapacities", "storage.k8s.io"), True),
    (SCHEDULER, res("update", "persistentvolumes", name="pv"), True),
    (SCHEDULER, res("update", "persistentvolumeclaims", ns="a", name="c"), True),
    (SCHEDULER, res("create", "events", ns="a"), True),
    (SCHEDULER, res("delete", "deployments", "apps", ns="a", name="d"), False),
    (SCHEDULER, res("get", "secrets", ns="a", name="s"), False),
    # The controller manager: reads and deletes everything, creates its kinds only.
    (KCM, res("list", "widgets", "example.com"), True),
    (KCM, res("delete", "configmaps", ns="a", name="c"), True),
    (KCM, res("patch", "deployments", "apps", ns="a", name="d", sub="scale"), True),
    (KCM, res("create", "pods", ns="a"), True),
    (KCM, res("create", "replicasets", "apps", ns="a"), True),
    (KCM, res("create", "endpointslices", "discovery.k8s.io", ns="a"), True),
    (KCM, res("create", "persistentvolumes"), True),
    (KCM, res("escalate", "clusterroles", G, name="view"), True),
    (KCM, res("create", "secrets", ns="a"), True),  # system:kube-controller-manager's own role
    (KCM, res("create", "clusterrolebindings", G), False),
    (KCM, res("bind", "clusterroles", G, name="cluster-admin"), False),
    (KCM, res("impersonate", "users", name="admin"), False),
    (KCM, res("create", "deployments", "apps", ns="a"), False),
    # Cluster DNS and ingress.
    (DNS, res("list", "services"), True),
    (DNS, res("watch", "endpointslices", "discovery.k8s.io"), True),
    (DNS, res("get", "secrets", ns="a", name="s"), False),
    (INGRESS, res("list", "secrets"), True),
    (INGRESS, res("patch", "ingresses", "networking.k8s.io", ns="a", name="i", sub="status"), True),
    (INGRESS, res("patch", "httproutes", "gateway.networking.k8s.io", ns="a", name="r", sub="status"), True),
    (INGRESS, res("create", "gatewayclasses", "gateway.networking.k8s.io"), True),
    (INGRESS, res("delete", "ingresses", "networking.k8s.io", ns="a", name="i"), False),
    (INGRESS, res("patch", "ingresses", "networking.k8s.io", ns="a", name="i"), False),
    # Node join.
    (BOOTSTRAPPER, res("create", "certificatesigningrequests", "certificates.k8s.io"), True),
    (BOOTSTRAPPER, res("create", "certificatesigningrequests", "certificates.k8s.io", sub="nodeclient"), True),
    (BOOTSTRAPPER, res("list", "pods"), False),
    (NODE, res("create", "certificatesigningrequests", "certificates.k8s.io", sub="selfnodeclient"), True),
    # system:node is bound to nobody: the Node authorizer decides for nodes.
    (NODE, res("get", "pods", ns="a", name="p"), False),
])
def test_who_may_do_what(user: UserInfo, attrs: Attributes, allowed: bool) -> None:
    assert policy().authorize(user, attrs).allowed is allowed


def test_aggregated_user_roles() -> None:
    a = policy()

    def can(role: str, attrs: Attributes) -> bool:
        from fleet.auth.rbac import rule_allows

        obj = a.cluster_roles.get(role)
        assert obj is not None
        return any(rule_allows(attrs, r) for r in obj["rules"])

    assert can("view", res("list", "pods", ns="a"))
    assert not can("view", res("list", "secrets", ns="a"))
    assert can("edit", res("get", "secrets", ns="a", name="s"))
    assert can("edit", res("create", "deployments", "apps", ns="a"))
    assert not can("edit", res("create", "roles", G, ns="a"))
    assert can("admin", res("create", "roles", G, ns="a"))
    assert can("admin", res("list", "pods", ns="a"))


R_EXTRA = {"verbs": ["get"], "apiGroups": ["x"], "resources": ["y"]}


def test_reconcile_role_pure() -> None:
    expected = next(r for r in bp.cluster_roles() if r["metadata"]["name"] == "system:discovery")
    have = copy.deepcopy(expected)
    assert bp.reconcile_role(have, expected) is None
    have["rules"] = [R_EXTRA]
    have["metadata"]["labels"] = {"mine": "1"}
    got = bp.reconcile_role(have, expected)
    assert got is not None and got["rules"] == [R_EXTRA, *expected["rules"]]
    assert got["metadata"]["labels"] == {**expected["metadata"]["labels"], "mine": "1"}
    have["metadata"]["annotations"] = {bp.AUTOUPDATE: "false"}
    assert bp.reconcile_role(have, expected) is None
    # Aggregated roles: the selectors are reconciled, the rules belong to the controller.
    view = next(r for r in bp.cluster_roles() if r["metadata"]["name"] == "view")
    filled = copy.deepcopy(view)
    filled["rules"] = [R_EXTRA]
    assert bp.reconcile_role(filled, view) is None


def test_reconcile_binding_pure() -> None:
    expected = next(b for b in bp.cluster_role_bindings() if b["metadata"]["name"] == "system:discovery")
    have = copy.deepcopy(expected)
    have["subjects"] = [{"kind": "User", "apiGroup": G, "name": "extra"}]
    got, recreate = bp.reconcile_binding(have, expected)
    assert got is not None and not recreate
    assert got["subjects"] == [{"kind": "User", "apiGroup": G, "name": "extra"}, *expected["subjects"]]
    have = copy.deepcopy(expected)
    have["roleRef"]["name"] = "other"
    got, recreate = bp.reconcile_binding(have, expected)
    assert recreate and got is not None and got["roleRef"] == expected["roleRef"]


async def test_reconcile_against_a_store(tmp_path: Path) -> None:
    registry = default_registry()
    async with open_store(tmp_path / "fleet.db") as store:
        done = await bp.reconcile(store, registry)
        assert len(done) == len(bp.cluster_roles()) + len(bp.cluster_role_bindings()) + \
            len(bp.namespace_roles()) + len(bp.namespace_role_bindings())
        assert "role/kube-public/kubeadm:bootstrap-signer-clusterinfo created" in done
        assert await bp.reconcile(store, registry) == []
        key = meta.store_key(G, "clusterroles", None, "system:basic-user")
        obj = await store.get(key)
        obj["rules"] = obj["rules"][:1]
        await store.update(key, obj, expected_revision=int(obj["metadata"]["resourceVersion"]))
        frozen_key = meta.store_key(G, "clusterroles", None, "system:discovery")
        frozen = await store.get(frozen_key)
        frozen["rules"] = []
        frozen["metadata"]["annotations"][bp.AUTOUPDATE] = "false"
        await store.update(frozen_key, frozen, expected_revision=int(frozen["metadata"]["resourceVersion"]))
        await store.delete(meta.store_key(G, "clusterrolebindings", None, "cluster-admin"))
        done = await bp.reconcile(store, registry)
        assert sorted(done) == ["clusterrole/system:basic-user updated", "clusterrolebinding/cluster-admin created"]
        assert len((await store.get(key))["rules"]) == 2
        assert (await store.get(frozen_key))["rules"] == []
