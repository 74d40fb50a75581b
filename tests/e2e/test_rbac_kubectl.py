"""RBAC end to end.

In process (fleet/testing/apiserver.py `open_api` with the server's own security
assembly: `security.build(authorization_mode="RBAC")`, the default roles reconciled,
escalation prevention in the admission chain, and a token authenticator mapping test
tokens to users): bindings made by the admin decide what users may do, through the
whole request pipeline —

* `view` lists pods but not secrets; `edit` creates deployments but not roles;
* a user with no binding gets 403 in Kubernetes' exact words;
* a RoleBinding to a ClusterRole grants it in that namespace only;
* resourceNames restrict by name (get one ConfigMap, not list them);
* a role with permissions its author lacks is refused (escalation), then allowed
  once the author may `escalate`; a binding likewise with `bind`;
* everyone authenticated may read /version and /healthz, anonymous /healthz only.

Against a real `fleet server` (RBAC on by default) with kubectl as the admin:
`kubectl create role|clusterrole|rolebinding|clusterrolebinding`, `kubectl get` and
`describe` of them, the default ClusterRoles listed, and a new ClusterRole labelled
`aggregate-to-view` aggregated into `view` by the controller manager.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.api import meta
from fleet.auth import ADMIN, TokenAuthenticator, UnionAuthenticator, UserInfo, bootstrap_policy
from fleet.controllers.clusterroleaggregation import ClusterRoleAggregationController
from fleet.controllers.runtime import Context
from fleet.server import security
from fleet.store import DELETED
from fleet.testing.apiserver import TOKEN, InProcessAPI, open_api
from tests.conftest import KUBECTL, ServerFactory

RBAC = "/apis/rbac.authorization.k8s.io/v1"

USERS = {
    "alice-token": UserInfo("alice", groups=("devs",)),
    "bob-token": UserInfo("bob"),
    "carol-token": UserInfo("carol"),
    "dave-token": UserInfo("dave"),
}


@asynccontextmanager
async def rbac_api(tmp_path: Path) -> AsyncIterator[InProcessAPI]:
    """The in-process API with `fleet server`'s RBAC assembly."""
    async with open_api(tmp_path) as api:
        store, registry = api.store, api.server.registry
        await bootstrap_policy.reconcile(store, registry)
        sec = await security.build(security.SecurityConfig(authorization_mode="RBAC"), data_dir=tmp_path,
                                   store=store, registry=registry, admin_token=TOKEN)
        async with trio.open_nursery() as nursery:
            for _, task in sec.tasks:
                await nursery.start(task)
            tokens = {TOKEN: ADMIN, **USERS}
            api.server.authenticator = UnionAuthenticator(TokenAuthenticator(tokens))
            api.server.authorizer = sec.authorizer
            api.server.admission.validating[:0] = sec.validating_admission
            await nursery.start(run_aggregation, api)
            yield api
            nursery.cancel_scope.cancel()


class _StoreRoles:
    """The clusterrole-aggregation controller's view of ClusterRoles, fed from a store
    watch (the in-process client serves no watches, so no informer)."""

    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objs.get(key.lstrip("/"))

    def list(self) -> list[dict[str, Any]]:
        return list(self.objs.values())


async def run_aggregation(api: InProcessAPI, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """The real ClusterRoleAggregationController over `api.client()`."""
    controller = ClusterRoleAggregationController()
    roles = _StoreRoles()
    prefix = meta.store_key("rbac.authorization.k8s.io", "clusterroles", None)
    async with api.client() as client:
        controller.ctx = Context(client=client, informers=None)  # type: ignore[arg-type]
        controller.roles = roles  # type: ignore[assignment]
        listed = await api.store.list(prefix)
        roles.objs = {o["metadata"]["name"]: o for o in listed.items}
        controller.enqueue_aggregated()
        watch = await api.store.watch(prefix, from_revision=listed.revision)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.run, controller.ctx)
            task_status.started()
            async for ev in watch:
                if ev.type == DELETED:
                    roles.objs.pop(ev.obj["metadata"]["name"], None)
                else:
                    roles.objs[ev.obj["metadata"]["name"]] = ev.obj
                controller.enqueue_aggregated()


async def eventually(fn: Any, timeout: float = 5.0) -> Any:
    """Retry `fn()` (async, returns truthy when done) while the RBAC caches catch up."""
    with trio.fail_after(timeout):
        while True:
            got = await fn()
            if got:
                return got
            await trio.sleep(0.02)


def binding(name: str, role_kind: str, role: str, *, users: tuple[str, ...] = (), groups: tuple[str, ...] = (),
            namespace: str | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if namespace:
        md["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
            "metadata": md, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [{"kind": "User", "name": u} for u in users] + [{"kind": "Group", "name": g} for g in groups]}


async def status_as(api: InProcessAPI, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return await api.json(method, path, body, token=token)


async def admin(api: InProcessAPI, method: str, path: str, body: Any = None) -> Any:
    code, out = await api.json(method, path, body)
    assert code in (200, 201), (code, out)
    return out


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


async def test_view_edit_and_no_binding(tmp_path: Path) -> None:
    async with rbac_api(tmp_path) as api:
        await admin(api, "POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("alice-view", "ClusterRole", "view", groups=("devs",), namespace="default"))
        await admin(api, "POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("bob-edit", "ClusterRole", "edit", users=("bob",), namespace="default"))

        async def alice_lists() -> bool:
            return (await status_as(api, "alice-token", "GET", "/api/v1/namespaces/default/pods"))[0] == 200

        await eventually(alice_lists)
        # view excludes secrets.
        code, out = await status_as(api, "alice-token", "GET", "/api/v1/namespaces/default/secrets")
        assert code == 403
        assert out["message"] == ('secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" '
                                  'in the namespace "default"')
        assert out["reason"] == "Forbidden"
        # ... and the grant is for that namespace only.
        code, out = await status_as(api, "alice-token", "GET", "/api/v1/namespaces/kube-system/pods")
        assert code == 403
        code, _ = await status_as(api, "alice-token", "POST", "/apis/apps/v1/namespaces/default/deployments",
                                  deployment("nope"))
        assert code == 403

        async def bob_creates() -> bool:
            code, _ = await status_as(api, "bob-token", "POST", "/apis/apps/v1/namespaces/default/deployments",
                                      deployment("web"))
            return code == 201

        await eventually(bob_creates)
        code, _ = await status_as(api, "bob-token", "GET", "/api/v1/namespaces/default/secrets")
        assert code == 200
        # edit cannot manage RBAC.
        code, out = await status_as(api, "bob-token", "POST", f"{RBAC}/namespaces/default/roles",
                                    {"metadata": {"name": "r"}, "rules": []})
        assert code == 403
        assert out["message"].startswith('roles.rbac.authorization.k8s.io is forbidden: User "bob" cannot create '
                                         'resource "roles" in API group "rbac.authorization.k8s.io"')
        # Subresource and name in the message.
        code, out = await status_as(api, "carol-token", "GET", "/api/v1/namespaces/default/pods/p1/log")
        assert code == 403
        assert out["message"] == ('pods "p1" is forbidden: User "carol" cannot get resource "pods/log" in API group '
                                  '"" in the namespace "default"')
        # No binding at all.
        code, out = await status_as(api, "carol-token", "GET", "/apis/apps/v1/deployments")
        assert code == 403
        assert out["message"] == ('deployments.apps is forbidden: User "carol" cannot list resource "deployments" '
                                  'in API group "apps" at the cluster scope')


async def test_discovery_and_public_info(tmp_path: Path) -> None:
    async with rbac_api(tmp_path) as api:
        for path in ("/version", "/healthz", "/apis", "/api/v1"):
            code, _ = await status_as(api, "carol-token", "GET", path)
            assert code == 200, path
        code, out = await status_as(api, "carol-token", "GET", "/metrics")
        assert code in (403, 404)


async def test_resource_names(tmp_path: Path) -> None:
    async with rbac_api(tmp_path) as api:
        await admin(api, "POST", "/api/v1/namespaces/default/configmaps",
                    {"metadata": {"name": "app-config"}, "data": {"a": "1"}})
        await admin(api, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "other"}})
        await admin(api, "POST", f"{RBAC}/namespaces/default/roles", {
            "metadata": {"name": "one-config"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["app-config"],
                       "verbs": ["get", "list"]}]})
        await admin(api, "POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("carol-one", "Role", "one-config", users=("carol",), namespace="default"))

        async def carol_gets() -> bool:
            return (await status_as(api, "carol-token", "GET",
                                    "/api/v1/namespaces/default/configmaps/app-config"))[0] == 200

        await eventually(carol_gets)
        assert (await status_as(api, "carol-token", "GET", "/api/v1/namespaces/default/configmaps/other"))[0] == 403
        # A list names no object: resourceNames never match it.
        assert (await status_as(api, "carol-token", "GET", "/api/v1/namespaces/default/configmaps"))[0] == 403


async def test_escalation_refused_then_allowed(tmp_path: Path) -> None:
    async with rbac_api(tmp_path) as api:
        # dave may manage roles and bindings in default (admin there), and nothing else.
        await admin(api, "POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("dave-admin", "ClusterRole", "admin", users=("dave",), namespace="default"))
        big = {"metadata": {"name": "nodes-reader"},
               "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]}

        async def dave_can_list_roles() -> bool:
            # admin aggregates edit, which aggregates view: pods arrive last.
            return (await status_as(api, "dave-token", "GET", f"{RBAC}/namespaces/default/roles"))[0] == 200 \
                and (await status_as(api, "dave-token", "GET", "/api/v1/namespaces/default/pods"))[0] == 200

        await eventually(dave_can_list_roles)
        code, out = await status_as(api, "dave-token", "POST", f"{RBAC}/namespaces/default/roles", big)
        assert code == 403, out
        assert out["message"] == (
            'roles.rbac.authorization.k8s.io "nodes-reader" is forbidden: user "dave" '
            '(groups=["system:authenticated"]) is attempting to grant RBAC permissions not currently held:\n'
            '{APIGroups:[""], Resources:["nodes"], Verbs:["get" "list"]}')
        # What dave holds himself he may grant.
        code, out = await status_as(api, "dave-token", "POST", f"{RBAC}/namespaces/default/roles", {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
        assert code == 201, out["message"]
        # Binding cluster-admin in his namespace would grant what he lacks.
        code, out = await status_as(api, "dave-token", "POST", f"{RBAC}/namespaces/default/rolebindings",
                                    binding("x", "ClusterRole", "cluster-admin", users=("carol",),
                                            namespace="default"))
        assert code == 403 and "attempting to grant RBAC permissions not currently held" in out["message"]
        # `escalate` on roles lets him write any role; `bind` on cluster-admin lets him bind it.
        await admin(api, "POST", f"{RBAC}/clusterroles", {
            "metadata": {"name": "escalator"},
            "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]},
                      {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                       "resourceNames": ["cluster-admin"], "verbs": ["bind"]}]})
        await admin(api, "POST", f"{RBAC}/namespaces/default/rolebindings",
                    binding("dave-escalate", "ClusterRole", "escalator", users=("dave",), namespace="default"))

        async def dave_escalates() -> bool:
            code, _ = await status_as(api, "dave-token", "POST", f"{RBAC}/namespaces/default/roles", big)
            return code == 201

        await eventually(dave_escalates)
        code, out = await status_as(api, "dave-token", "POST", f"{RBAC}/namespaces/default/rolebindings",
                                    binding("x", "ClusterRole", "cluster-admin", users=("carol",),
                                            namespace="default"))
        assert code == 201, out


async def test_cluster_role_binding_and_roleref_immutable(tmp_path: Path) -> None:
    async with rbac_api(tmp_path) as api:
        await admin(api, "POST", f"{RBAC}/clusterrolebindings",
                    binding("bob-view", "ClusterRole", "view", users=("bob",)))

        async def bob_lists_everywhere() -> bool:
            return (await status_as(api, "bob-token", "GET", "/api/v1/pods"))[0] == 200

        await eventually(bob_lists_everywhere)
        code, out = await api.json("PATCH", f"{RBAC}/clusterrolebindings/bob-view",
                                   {"roleRef": {"name": "edit"}}, content_type="application/merge-patch+json")
        assert code == 422
        assert any(c["message"].endswith("cannot change roleRef") for c in out["details"]["causes"])


# ---------------------------------------------------------------------------
# A real server and kubectl (the admin).
# ---------------------------------------------------------------------------

pytestmark_kubectl = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")


def _wait(fn: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


@pytest.mark.e2e
@pytestmark_kubectl
def test_kubectl_rbac(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.start()

    def k(*args: str) -> str:
        rc, out, err = srv.kubectl(*args)
        assert rc == 0, (args, out, err)
        return out

    out = k("get", "clusterroles")
    assert out.splitlines()[0].split() == ["NAME", "CREATED", "AT"]
    names = {line.split()[0] for line in out.splitlines()[1:]}
    assert {"cluster-admin", "admin", "edit", "view", "system:discovery", "system:node",
            "system:kube-scheduler", "system:fleet:controller-manager"} <= names
    out = k("get", "clusterrolebinding", "cluster-admin", "-o", "wide")
    assert out.splitlines()[0].split() == ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"]
    assert "ClusterRole/cluster-admin" in out and "system:masters" in out

    k("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", "default")
    k("create", "rolebinding", "read-pods", "--role=pod-reader", "--user=jane", "--group=qa",
      "--serviceaccount=default:robot", "-n", "default")
    k("create", "clusterrole", "node-reader", "--verb=get", "--resource=nodes", "--non-resource-url=/logs/*")
    k("create", "clusterrolebinding", "read-nodes", "--clusterrole=node-reader", "--user=jane")
    role = json.loads(k("get", "role", "pod-reader", "-n", "default", "-o", "json"))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    out = k("get", "rolebinding", "read-pods", "-n", "default", "-o", "wide")
    assert out.splitlines()[1].split() == ["read-pods", "Role/pod-reader", out.splitlines()[1].split()[2],
                                           "jane", "qa", "default:robot"]
    out = k("describe", "role", "pod-reader", "-n", "default")
    assert "pods" in out and "[get list watch]" in out
    out = k("describe", "rolebinding", "read-pods", "-n", "default")
    assert "pod-reader" in out and "jane" in out and "robot" in out

    # A ClusterRole labelled aggregate-to-view joins `view`.
    k("create", "clusterrole", "widgets-view", "--verb=get,list,watch", "--resource=configmaps")
    k("label", "clusterrole", "widgets-view", "rbac.authorization.k8s.io/aggregate-to-view=true")
    k("create", "clusterrole", "widgets-extra", "--verb=get", "--resource=nodes")
    k("label", "clusterrole", "widgets-extra", "rbac.authorization.k8s.io/aggregate-to-view=true")

    def view_has_nodes() -> bool:
        view = json.loads(k("get", "clusterrole", "view", "-o", "json"))
        return {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]} in (view.get("rules") or [])

    _wait(view_has_nodes)
    # kubectl create clusterrole --aggregation-rule (an AggregationRule in protobuf).
    k("create", "clusterrole", "widgets-all", "--aggregation-rule=rbac.authorization.k8s.io/aggregate-to-view=true")
    _wait(lambda: {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
          in (json.loads(k("get", "clusterrole", "widgets-all", "-o", "json")).get("rules") or []))
    # ... and through edit and admin, which aggregate view.
    admin_role = json.loads(k("get", "clusterrole", "admin", "-o", "json"))
    _wait(lambda: {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
          in (json.loads(k("get", "clusterrole", "admin", "-o", "json")).get("rules") or []))
    assert admin_role["aggregationRule"]["clusterRoleSelectors"]

    # kubectl apply (client-side, strict validation through /openapi/v3).
    applied = """apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: applied
  namespace: default
rules:
- apiGroups: ["apps"]
  resources: ["deployments", "deployments/scale"]
  verbs: ["get", "patch"]
"""
    rc, out, err = srv.kubectl("apply", "-f", "-", input=applied)
    assert rc == 0, err
    rc, out, err = srv.kubectl("apply", "-f", "-", input=applied.replace('"patch"', '"update"'))
    assert rc == 0, err
    assert json.loads(k("get", "role", "applied", "-n", "default", "-o", "json"))["rules"][0]["verbs"] == \
        ["get", "update"]
    out = k("describe", "clusterrole", "view")
    assert "PolicyRule" in out and "pods" in out
    node_reader = json.loads(k("get", "clusterrole", "node-reader", "-o", "json"))
    assert node_reader["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                                    {"nonResourceURLs": ["/logs/*"], "verbs": ["get"]}]
    out = k("describe", "clusterrolebinding", "read-nodes")
    assert "node-reader" in out and "jane" in out
    crb = json.loads(k("get", "clusterrolebinding", "read-nodes", "-o", "json"))
    assert crb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-reader"}
    assert crb["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "jane"}]
    # roleRef cannot change.
    rc, out, err = srv.kubectl("patch", "clusterrolebinding", "read-nodes", "--type=merge",
                               "-p", '{"roleRef":{"name":"view"}}')
    assert rc != 0 and "cannot change roleRef" in err


@pytest.mark.e2e
def test_anonymous_sees_only_public_info(fleet_server_factory: ServerFactory) -> None:
    """With --anonymous-auth, RBAC's defaults let system:anonymous read health and the
    version, nothing else (403 in kube-apiserver's words)."""
    import httpx

    srv = fleet_server_factory.start(extra_args=["--anonymous-auth"])
    with httpx.Client(base_url=srv.url, timeout=10, verify=srv.verify()) as c:
        for path in ("/healthz", "/livez", "/readyz", "/version"):
            assert c.get(path).status_code == 200, path
        r = c.get("/apis")
        assert r.status_code == 403
        assert r.json()["message"] == 'forbidden: User "system:anonymous" cannot get path "/apis"'
        r = c.get("/api/v1/namespaces/default/pods")
        assert r.status_code == 403
        assert r.json()["message"] == ('pods is forbidden: User "system:anonymous" cannot list resource "pods" in '
                                       'API group "" in the namespace "default"')
