"""Impersonation (fleet/auth/impersonation.py): header parsing, the `impersonate` checks and
the user they produce, pure; then through the in-process API (the hook in access.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.api import errors
from fleet.auth import Attributes, Decision, UserInfo
from fleet.auth.impersonation import (
    ImpersonationHeaderError,
    ImpersonationRequest,
    impersonate,
    impersonated_user,
    impersonation_requests,
    split_service_account,
    unescape_extra_key,
    without_impersonation_headers,
)
from tests.unit.auth.fakes import Grant, GrantAuthorizer, make_authorizer, review_api

ALICE = UserInfo("alice", groups=("system:authenticated",))


def allow_all(attrs: Attributes) -> Decision:
    return Decision(True)


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


def test_no_headers_no_impersonation() -> None:
    assert impersonation_requests({"authorization": "Bearer x"}) == []
    assert impersonate(ALICE, {}, allow_all) is None


def test_requests_in_kube_order_with_repeated_groups_and_extras() -> None:
    headers = {"impersonate-user": "bob", "impersonate-group": "g1, g2",
               "impersonate-extra-scopes": "view, edit", "impersonate-extra-acme.com%2fteam": "blue",
               "impersonate-uid": "1234"}
    assert impersonation_requests(headers) == [
        ImpersonationRequest("User", "bob"),
        ImpersonationRequest("Group", "g1"), ImpersonationRequest("Group", "g2"),
        ImpersonationRequest("UserExtra", "view", extra_key="scopes"),
        ImpersonationRequest("UserExtra", "edit", extra_key="scopes"),
        ImpersonationRequest("UserExtra", "blue", extra_key="acme.com/team"),
        ImpersonationRequest("UID", "1234"),
    ]


def test_service_account_users() -> None:
    assert split_service_account("system:serviceaccount:ns:builder") == ("ns", "builder")
    assert split_service_account("system:serviceaccount:ns") is None
    assert split_service_account("system:serviceaccount:Bad_NS:x") is None
    assert split_service_account("system:serviceaccount:ns:a:b") is None
    assert split_service_account("bob") is None
    assert impersonation_requests({"impersonate-user": "system:serviceaccount:ns:builder"}) == [
        ImpersonationRequest("ServiceAccount", "builder", namespace="ns")]
    # Not a valid service account name: an ordinary user of that name.
    assert impersonation_requests({"impersonate-user": "system:serviceaccount:ns:"}) == [
        ImpersonationRequest("User", "system:serviceaccount:ns:")]


def test_extra_keys_are_percent_decoded_and_lower_cased() -> None:
    assert unescape_extra_key("acme.com%2Fteam") == "acme.com/team"
    assert unescape_extra_key("bad%zzkey") == "bad%zzkey"  # PathUnescape fails: kept as sent
    assert unescape_extra_key("trailing%") == "trailing%"
    _, r = impersonation_requests({"impersonate-user": "bob", "Impersonate-Extra-Scopes": "x"})
    assert r == ImpersonationRequest("UserExtra", "x", extra_key="scopes")


@pytest.mark.parametrize(("headers", "message"), [
    ({"impersonate-group": "g1, g2"},
     "requested [{Group  g1    } {Group  g2    }] without impersonating a user"),
    ({"impersonate-extra-scopes": "v"},
     "requested [{UserExtra  v  authentication.k8s.io/v1  scopes}] without impersonating a user"),
    ({"impersonate-uid": "u1"},
     "requested [{UID  u1  authentication.k8s.io/v1  }] without impersonating a user"),
])
def test_attributes_without_a_user_are_malformed(headers: dict[str, str], message: str) -> None:
    with pytest.raises(ImpersonationHeaderError) as e:
        impersonation_requests(headers)
    assert str(e.value) == message


# ---------------------------------------------------------------------------
# Checks and the resulting user
# ---------------------------------------------------------------------------


def test_each_attribute_is_checked_in_kube_resources() -> None:
    asked: list[Attributes] = []

    def record(attrs: Attributes) -> Decision:
        asked.append(attrs)
        return Decision(True)

    headers = {"impersonate-user": "system:serviceaccount:ns:sa", "impersonate-group": "g",
               "impersonate-extra-scopes": "view", "impersonate-uid": "7"}
    impersonate(ALICE, headers, record)
    assert asked == [
        Attributes("impersonate", "", "", "serviceaccounts", "", "ns", "sa"),
        Attributes("impersonate", "", "", "groups", "", "", "g"),
        Attributes("impersonate", "authentication.k8s.io", "v1", "userextras", "scopes", "", "view"),
        Attributes("impersonate", "authentication.k8s.io", "v1", "uids", "", "", "7"),
    ]


@pytest.mark.parametrize(("refused", "message", "details"), [
    ("users", 'users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group "" '
              "at the cluster scope", {"name": "bob", "kind": "users"}),
    ("groups", 'groups "g" is forbidden: User "alice" cannot impersonate resource "groups" in API group "" '
               "at the cluster scope", {"name": "g", "kind": "groups"}),
    ("userextras", 'userextras.authentication.k8s.io "view" is forbidden: User "alice" cannot '
                   'impersonate resource "userextras/scopes" in API group "authentication.k8s.io" at the '
                   "cluster scope",
     {"name": "view", "group": "authentication.k8s.io", "kind": "userextras"}),
    ("uids", 'uids.authentication.k8s.io "7" is forbidden: User "alice" cannot impersonate resource "uids" '
             'in API group "authentication.k8s.io" at the cluster scope',
     {"name": "7", "group": "authentication.k8s.io", "kind": "uids"}),
])
def test_first_refusal_is_a_403_in_kube_words(refused: str, message: str, details: dict[str, str]) -> None:
    def deny(attrs: Attributes) -> Decision:
        return Decision(attrs.resource != refused, no_opinion=attrs.resource == refused)

    headers = {"impersonate-user": "bob", "impersonate-group": "g", "impersonate-extra-scopes": "view",
               "impersonate-uid": "7"}
    with pytest.raises(errors.Forbidden) as e:
        impersonate(ALICE, headers, deny)
    assert e.value.message == message
    assert e.value.status()["details"] == details


def test_refusal_reason_and_service_account_namespace() -> None:
    with pytest.raises(errors.Forbidden) as e:
        impersonate(ALICE, {"impersonate-user": "system:serviceaccount:ns:sa"},
                    lambda attrs: Decision(False, "no way"))
    assert e.value.message == ('serviceaccounts "sa" is forbidden: User "alice" cannot impersonate resource '
                               '"serviceaccounts" in API group "" in the namespace "ns": no way')


@pytest.mark.parametrize(("headers", "expected"), [
    ({"impersonate-user": "bob"}, UserInfo("bob", "", ("system:authenticated",))),
    ({"impersonate-user": "bob", "impersonate-group": "devs, ops"},
     UserInfo("bob", "", ("devs", "ops", "system:authenticated"))),
    ({"impersonate-user": "bob", "impersonate-group": "system:authenticated"},
     UserInfo("bob", "", ("system:authenticated",))),
    ({"impersonate-user": "bob", "impersonate-group": "system:unauthenticated"},
     UserInfo("bob", "", ("system:unauthenticated",))),
    ({"impersonate-user": "system:anonymous"}, UserInfo("system:anonymous", "", ("system:unauthenticated",))),
    ({"impersonate-user": "system:serviceaccount:ns:sa"},
     UserInfo("system:serviceaccount:ns:sa", "",
              ("system:serviceaccounts", "system:serviceaccounts:ns", "system:authenticated"))),
    # Groups given: they are the authority, the service account's own are not added.
    ({"impersonate-user": "system:serviceaccount:ns:sa", "impersonate-group": "g"},
     UserInfo("system:serviceaccount:ns:sa", "", ("g", "system:authenticated"))),
    ({"impersonate-user": "bob", "impersonate-uid": "42", "impersonate-extra-scopes": "a, b"},
     UserInfo("bob", "42", ("system:authenticated",), {"scopes": ["a", "b"]})),
])
def test_the_impersonated_user(headers: dict[str, str], expected: UserInfo) -> None:
    assert impersonate(ALICE, headers, allow_all) == expected
    assert impersonated_user(impersonation_requests(headers)) == expected


def test_headers_are_dropped_once_applied() -> None:
    headers = {"authorization": "Bearer t", "impersonate-user": "bob", "impersonate-group": "g",
               "impersonate-uid": "1", "impersonate-extra-x": "y", "accept": "application/json"}
    assert without_impersonation_headers(headers) == {"authorization": "Bearer t", "accept": "application/json"}


# ---------------------------------------------------------------------------
# Through the API
# ---------------------------------------------------------------------------


def can_i_pods(verb: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "resource": "pods", "namespace": namespace}}}


SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


async def test_admin_acts_as_bob(tmp_path: Path) -> None:
    async with review_api(tmp_path) as api:
        # As the admin (system:masters): allowed.  As bob (no grant in "default"... he has
        # viewers' get/list pods everywhere, but no create): the review answers for bob.
        status, body = await api.json("POST", SSAR, can_i_pods("create", "default"))
        assert body["status"]["allowed"] is True
        status, body = await api.json("POST", SSAR, can_i_pods("create", "default"),
                                      headers={"Impersonate-User": "bob"})
        assert (status, body["status"]) == (201, {"allowed": False})
        # Impersonating only the name: bob's groups are not looked up (kube does not either).
        status, body = await api.json("POST", SSAR, can_i_pods("list", "default"),
                                      headers={"Impersonate-User": "bob"})
        assert body["status"]["allowed"] is False
        status, body = await api.json("POST", SSAR, can_i_pods("list", "default"),
                                      headers={"Impersonate-User": "bob", "Impersonate-Group": "viewers"})
        assert body["status"]["allowed"] is True

        # The impersonated user really makes the request: bob cannot list pods in "default"
        # as himself alone, so the real list is refused in his name.
        status, body = await api.json("GET", "/api/v1/namespaces/default/pods",
                                      headers={"Impersonate-User": "bob"})
        assert status == 403
        assert body["message"] == ('pods is forbidden: User "bob" cannot list resource "pods" in API group "" '
                                   'in the namespace "default"')
        assert body["details"] == {"kind": "pods"}


async def test_impersonation_is_itself_authorized(tmp_path: Path) -> None:
    authz = make_authorizer()
    authz.grants["alice"].append(Grant(("impersonate",), "", "users", names=("bob",)))
    async with review_api(tmp_path, authz) as api:
        status, body = await api.json("POST", SSAR, can_i_pods("list", "x"), token="alice-token",
                                      headers={"Impersonate-User": "bob"})
        assert status == 201  # allowed to impersonate bob; bob may ask (system:authenticated)
        status, body = await api.json("POST", SSAR, can_i_pods("list", "x"), token="alice-token",
                                      headers={"Impersonate-User": "carol"})
        assert status == 403
        assert body["message"] == ('users "carol" is forbidden: User "alice" cannot impersonate resource "users" '
                                   'in API group "" at the cluster scope')
        assert body["details"] == {"name": "carol", "kind": "users"}
        # Bob yes, but not bob in a group alice may not hand out.
        status, body = await api.json("POST", SSAR, can_i_pods("list", "x"), token="alice-token",
                                      headers={"Impersonate-User": "bob", "Impersonate-Group": "viewers"})
        assert status == 403
        assert body["message"].startswith('groups "viewers" is forbidden: User "alice" cannot impersonate')


async def test_groups_without_a_user_are_a_400_with_kubes_message(tmp_path: Path) -> None:
    async with review_api(tmp_path) as api:
        resp = await api.call("GET", "/api/v1/namespaces/default/pods", headers={"Impersonate-Group": "g"})
        assert resp.status == 400
        body = json.loads(resp.body)
        assert body["kind"] == "Status" and body["reason"] == "BadRequest", body
        assert body["message"] == "requested [{Group  g    }] without impersonating a user", body


async def test_server_keeps_the_impersonator_for_audit(tmp_path: Path) -> None:
    seen: list[Any] = []
    async with review_api(tmp_path, GrantAuthorizer()) as api:
        real_dispatch = api.server.dispatch

        async def spy(req: Any) -> Any:
            seen.append((req.user, req.impersonator, dict(req.headers)))
            return await real_dispatch(req)

        api.server.dispatch = spy  # type: ignore[method-assign]
        await api.call("GET", "/api/v1/namespaces", headers={"Impersonate-User": "bob"})
        await api.call("GET", "/api/v1/namespaces")
    (user, impersonator, headers), (plain_user, plain_impersonator, _) = seen
    assert user == UserInfo("bob", "", ("system:authenticated",))
    assert impersonator is not None and impersonator.name == "system:admin"
    assert "impersonate-user" not in headers
    assert plain_user.name == "system:admin" and plain_impersonator is None


# ---------------------------------------------------------------------------
# The upgrade paths (WebSocket exec/attach/port-forward, SPDY port-forward)
# ---------------------------------------------------------------------------


async def _upgrade(api: Any, scope: dict[str, Any], first: dict[str, Any]) -> list[dict[str, Any]]:
    from fleet.server.asgi import create_app

    sent: list[dict[str, Any]] = []
    inbox = [first]

    async def receive() -> dict[str, Any]:
        return inbox.pop() if inbox else {"type": "websocket.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    await create_app(api.server)(scope, receive, send)
    return sent


@pytest.mark.parametrize(("extra", "message"), [
    ([(b"impersonate-user", b"carol")],
     'users "carol" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the '
     "cluster scope"),
    ([(b"impersonate-user", b"bob")],
     'pods "p" is forbidden: User "bob" cannot create resource "pods/exec" in API group "" in the namespace '
     '"team-a"'),
    ([(b"impersonate-group", b"g")],
     "requested [{Group  g    }] without impersonating a user"),
])
async def test_websocket_exec_runs_as_the_impersonated_user(tmp_path: Path, extra: list[tuple[bytes, bytes]],
                                                            message: str) -> None:
    import json

    authz = make_authorizer()
    authz.grants["alice"] += [Grant(("impersonate",), "", "users", names=("bob",)),
                              Grant(("create",), "", "pods/exec", "team-a")]
    path = "/api/v1/namespaces/team-a/pods/p/exec"
    scope = {"type": "websocket", "path": path, "raw_path": path.encode(), "query_string": b"command=ls",
             "headers": [(b"authorization", b"Bearer alice-token"), *extra],
             "subprotocols": ["v5.channel.k8s.io"], "extensions": {"websocket.http.response": {}}}
    async with review_api(tmp_path, authz) as api:
        sent = await _upgrade(api, scope, {"type": "websocket.connect"})
    start = next(m for m in sent if m["type"] == "websocket.http.response.start")
    body = next(m for m in sent if m["type"] == "websocket.http.response.body")
    assert json.loads(body["body"])["message"] == message
    assert start["status"] == (400 if b"impersonate-group" in dict(extra) else 403)


async def test_spdy_port_forward_runs_as_the_impersonated_user(tmp_path: Path) -> None:
    import json

    from fleet.server import upgrade

    path = "/api/v1/namespaces/team-a/pods/p/portforward"
    scope = {"type": upgrade.SCOPE_TYPE, "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"authorization", b"Bearer test-token"),
                                              (b"impersonate-user", b"bob"),
                                              (b"x-stream-protocol-version", b"portforward.k8s.io")]}
    async with review_api(tmp_path) as api:
        sent = await _upgrade(api, scope, {"type": "raw.disconnect"})
    assert [m["type"] for m in sent] == ["raw.response"]
    assert sent[0]["status"] == 403
    assert json.loads(sent[0]["body"])["message"] == (
        'pods "p" is forbidden: User "bob" cannot create resource "pods/portforward" in API group "" in the '
        'namespace "team-a"')
