"""The three gates of pods/signal and pods/exec through the API server in process
(fleet/server/processcontrol.py): RBAC's `signal` verb (not implied by update, create
or any default role but cluster-admin), the ProcessControl consent gate on and off, and
CONNECT admission.  The pods are bound to no node, so a request that passes every gate
ends at the agent lookup ("does not have a host assigned"): which error a request gets
says which gate stopped it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.api import errors
from fleet.auth import Attributes, UserInfo
from fleet.auth.bootstrap_policy import cluster_roles
from fleet.server.security import SecurityConfig
from fleet.testing.apiserver import TOKEN as ADMIN_TOKEN
from fleet.testing.apiserver import InProcessAPI, open_api

ALICE = UserInfo("alice", groups=("system:authenticated",))
BOB = UserInfo("bob", groups=("system:authenticated", "sre"))
TOKENS = {"alice-token": ALICE, "bob-token": BOB}
NO_HOST = "does not have a host assigned"
SIGNAL_PATH = "/api/v1/namespaces/default/pods/p/signal"


@pytest.fixture
async def api(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with open_api(tmp_path, namespace_controller=False, security=SecurityConfig(),
                        tokens=TOKENS) as api:
        await api.json("POST", "/api/v1/namespaces/default/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "busybox"},
                                    {"name": "side", "image": "busybox"}]}})
        yield api


async def bind(api: InProcessAPI, name: str, user: str, rules: list[dict[str, Any]] | None = None,
               cluster_role: str = "") -> None:
    role = cluster_role
    if not role:
        role = name
        status, body = await api.json("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
            "rules": rules})
        assert status == 201, body
    status, body = await api.json("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole" if cluster_role else "Role",
                    "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    assert status == 201, body


async def consent(api: InProcessAPI, **spec: Any) -> None:
    status, body = await api.json("POST", "/apis/fleet.dev/v1/namespaces/default/processcontrols", {
        "apiVersion": "fleet.dev/v1", "kind": "ProcessControl", "metadata": {"name": "oncall"},
        "spec": {"subjects": [{"kind": "User", "name": "alice"}], **spec}})
    assert status == 201, body


async def signal(api: InProcessAPI, token: str, body: Any) -> tuple[int, Any]:
    return await api.json("POST", SIGNAL_PATH, body, token=token)


async def rbac_sees(api: InProcessAPI, token: str) -> None:
    """Wait until the watch-fed RBAC authorizer lets `token` signal (the binding just made)."""
    with trio.fail_after(10):
        while True:
            status, body = await signal(api, token, {"signal": "SIGHUP", "container": "web"})
            if status != 403 or "cannot signal" not in body["message"]:
                return
            await trio.sleep(0.02)


async def test_signal_verb_is_not_implied_by_update_create_or_edit(api: InProcessAPI) -> None:
    await bind(api, "writer", "alice", [{"apiGroups": [""], "resources": ["pods", "pods/signal", "pods/exec"],
                                         "verbs": ["create", "update", "patch"]}])
    with trio.fail_after(10):  # the watch-fed authorizer has seen the binding: alice may patch
        while (await api.json("PATCH", "/api/v1/namespaces/default/pods/p", {"metadata": {"labels": {"x": "1"}}},
                              token="alice-token", content_type="application/merge-patch+json"))[0] != 200:
            await trio.sleep(0.02)
    status, body = await signal(api, "alice-token", {"signal": "SIGHUP", "container": "web"})
    assert status == 403
    assert body["message"].startswith('pods "p" is forbidden: User "alice" cannot signal resource "pods/signal" '
                                      'in API group "" in the namespace "default"')
    await bind(api, "signaller", "alice", [{"apiGroups": [""], "resources": ["pods/signal"], "verbs": ["signal"]}])
    await rbac_sees(api, "alice-token")
    status, body = await signal(api, "alice-token", {"signal": "SIGHUP", "container": "web"})
    assert status == 400 and NO_HOST in body["message"], body  # past RBAC; the gate is off


def test_no_default_role_but_cluster_admin_grants_signal() -> None:
    """Process control is opt-in (the seed's default): `signal` is in none of the default
    roles — not admin, edit or their aggregation sources — only cluster-admin's `*`."""
    granting = [r["metadata"]["name"] for r in cluster_roles() for rule in r.get("rules") or []
                if any(v in ("signal", "*") for v in rule.get("verbs") or [])
                and any(res in ("pods/signal", "pods/*", "*") for res in rule.get("resources") or [])]
    assert granting == ["cluster-admin"]


async def test_consent_gate_on_and_off(api: InProcessAPI) -> None:
    await bind(api, "signaller", "alice", [{"apiGroups": [""], "resources": ["pods/signal"], "verbs": ["signal"]}])
    await bind(api, "signaller-bob", "bob", [{"apiGroups": [""], "resources": ["pods/signal"], "verbs": ["signal"]}])
    await rbac_sees(api, "alice-token")
    await rbac_sees(api, "bob-token")
    api.server.process_control.consent_required = True
    status, body = await signal(api, "alice-token", {"signal": "SIGHUP", "container": "web"})
    assert status == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('pods "p" is forbidden: no ProcessControl in namespace "default" allows user '
                               '"alice" to send SIGHUP to container "web"')
    await consent(api, actions=["signal"], signals=["SIGHUP"], containers=["web"],
                  podSelector={"matchLabels": {"app": "web"}})
    status, body = await signal(api, "alice-token", {"signal": "hup", "container": "web"})
    assert status == 400 and NO_HOST in body["message"], body
    for who, sig, container in (("alice-token", "SIGTERM", "web"), ("alice-token", "SIGHUP", "side"),
                                ("bob-token", "SIGHUP", "web")):
        status, body = await signal(api, who, {"signal": sig, "container": container})
        assert status == 403 and "no ProcessControl" in body["message"], (who, sig, container, body)
    # Off again: RBAC alone decides, as in Kubernetes.
    api.server.process_control.consent_required = False
    status, body = await signal(api, "bob-token", {"signal": "SIGTERM", "container": "side"})
    assert status == 400 and NO_HOST in body["message"], body


async def test_bad_signal_requests(api: InProcessAPI) -> None:
    status, body = await signal(api, "alice-token", {"signal": "SIGNOPE"})
    assert status == 403  # RBAC first: alice may not signal at all
    status, body = await api.json("POST", SIGNAL_PATH, {"signal": "SIGNOPE", "container": "web"})
    assert status == 400 and "unknown signal" in body["message"]
    assert body["details"]["causes"][0]["field"] == "signal"
    status, body = await api.json("POST", SIGNAL_PATH, {"container": "web"})
    assert status == 400 and "signal: Required value" in body["message"]
    status, body = await api.json("POST", SIGNAL_PATH, {"signal": "SIGHUP", "container": "nope"})
    assert status == 400 and body["message"] == "container nope is not valid for pod p"
    status, body = await api.json("POST", SIGNAL_PATH, {"signal": "SIGHUP"})
    assert status == 400 and "a container name must be specified for pod p" in body["message"]
    status, body = await api.json("POST", "/api/v1/namespaces/default/pods/nope/signal",
                                  {"signal": "SIGHUP", "container": "web"})
    assert status == 404 and body["message"] == 'pods "nope" not found'
    status, body = await api.json("GET", SIGNAL_PATH)
    assert status == 405


class Recorder:
    def __init__(self, refuse: bool = False) -> None:
        self.seen: list[tuple[Attributes, dict[str, Any] | None]] = []
        self.refuse = refuse

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        self.seen.append((attrs, obj))
        if self.refuse and attrs.verb == "connect":
            raise errors.Forbidden('pods "p" is forbidden: refused by the test plugin')


async def test_connect_admission_sees_the_options(api: InProcessAPI) -> None:
    rec = Recorder()
    api.server.process_control.admission.validating.append(rec)  # type: ignore[union-attr]
    status, body = await api.json("POST", SIGNAL_PATH, {"signal": "SIGUSR1", "container": "side"})
    assert status == 400 and NO_HOST in body["message"]
    connects = [(a, o) for a, o in rec.seen if a.verb == "connect"]
    assert len(connects) == 1
    attrs, obj = connects[0]
    assert (attrs.resource, attrs.subresource, attrs.namespace, attrs.name) == ("pods", "signal", "default", "p")
    assert obj == {"apiVersion": "fleet.dev/v1", "kind": "PodSignal", "signal": "SIGUSR1", "container": "side"}
    rec.refuse = True
    status, body = await api.json("POST", SIGNAL_PATH, {"signal": "SIGUSR1", "container": "side"})
    assert status == 403 and "refused by the test plugin" in body["message"]


async def test_processcontrol_objects_are_validated(api: InProcessAPI) -> None:
    status, body = await api.json("POST", "/apis/fleet.dev/v1/namespaces/default/processcontrols", {
        "apiVersion": "fleet.dev/v1", "kind": "ProcessControl", "metadata": {"name": "bad"},
        "spec": {"subjects": [{"kind": "Robot", "name": "r"}], "actions": ["ssh"]}})
    assert status == 422 and body["reason"] == "Invalid"
    assert {c["field"] for c in body["details"]["causes"]} == {"spec.subjects[0].kind", "spec.actions[0]"}
    assert body["message"].startswith('ProcessControl.fleet.dev "bad" is invalid: [')


@pytest.mark.parametrize(("kind", "sub", "query", "expected"), [
    ("websocket", "exec", b"command=ls&container=web", 'to exec in container "web"'),
    ("websocket", "attach", b"container=side", 'to attach to container "side"'),
    ("raw", "portforward", b"", 'to port-forward to pod "p"'),
])
async def test_upgrades_pass_the_consent_gate(api: InProcessAPI, kind: str, sub: str, query: bytes,
                                              expected: str) -> None:
    """exec/attach (WebSocket) and port-forward (SPDY upgrade): 403 naming the missing
    ProcessControl when the gate is on, before anything reaches an agent."""
    import json

    from fleet.server import upgrade
    from fleet.server.asgi import create_app

    api.server.process_control.consent_required = True
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "raw.disconnect"}

    path = f"/api/v1/namespaces/default/pods/p/{sub}"
    scope: dict[str, Any] = {"type": "websocket" if kind == "websocket" else upgrade.SCOPE_TYPE,
                             "method": "GET" if kind == "websocket" else "POST", "path": path,
                             "raw_path": path.encode(), "query_string": query,
                             "headers": [(b"authorization", f"Bearer {ADMIN_TOKEN}".encode())],
                             "client": ("10.1.2.3", 4444), "extensions": {"websocket.http.response": {}}}
    await create_app(api.server)(scope, receive, send)
    start = next(m for m in sent if m.get("status") is not None)
    assert start["status"] == 403
    body = b"".join(m.get("body", b"") for m in sent)
    assert expected in json.loads(body)["message"]
    assert "no ProcessControl" in json.loads(body)["message"]
