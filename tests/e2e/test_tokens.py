"""ServiceAccount tokens, TokenReview, `kubectl auth whoami`, OIDC users, against a real `fleet server`.

One server for the module, started with `--oidc-*` flags that point at an OIDC provider
this test serves over HTTPS on loopback (fleet/testing/oidc.py).  Everything goes through
kubectl where kubectl has a command for it (`create token`, `auth whoami`, `--token`,
`create -f` of a TokenReview); the OIDC discovery documents are read with httpx and a
token is verified with pyjwt against the served JWKS, as an external relying party would.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml

from fleet.testing.oidc import OIDCProvider
from tests.conftest import FleetServer, ServerFactory, _make_base

pytestmark = pytest.mark.e2e

ISS = "https://kubernetes.default.svc.cluster.local"


@pytest.fixture(scope="module")
def provider() -> Iterator[OIDCProvider]:
    base = _make_base("fleet-e2e-oidc-")
    try:
        with OIDCProvider(base) as p:
            yield p
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def server(provider: OIDCProvider) -> Iterator[FleetServer]:
    base = _make_base("fleet-e2e-tokens-")
    factory = ServerFactory(base)
    try:
        srv = factory.start(extra_args=[
            "--oidc-issuer-url", provider.issuer, "--oidc-client-id", provider.client_id,
            "--oidc-ca-file", str(provider.ca_file), "--oidc-username-prefix", "oidc:",
            "--oidc-groups-claim", "groups", "--oidc-groups-prefix", "oidc:",
            "--oidc-required-claim", "hd=example.com",
        ])
        yield srv
    except BaseException:
        if factory.servers:
            sys.stderr.write(factory.servers[0].output()[-20000:])
        raise
    finally:
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


def ok(server: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = server.kubectl(*args, input=input)
    assert rc == 0, f"kubectl {' '.join(args)} failed ({rc}):\n{out}\n{err}"
    return out


@pytest.fixture
def ns(server: FleetServer) -> Iterator[str]:
    name = f"tok-{uuid.uuid4().hex[:8]}"
    ok(server, "create", "namespace", name)
    yield name
    server.kubectl("delete", "namespace", name, "--wait=false")


def bearer(server: FleetServer, token: str) -> list[str]:
    """kubectl arguments that make the request exactly the token's user: a kubeconfig
    with the token alone (the admin kubeconfig's client certificate would otherwise go
    along, and a certificate authenticates before a token, as in kube-apiserver)."""
    path = server.data_dir.parent / f"token-{uuid.uuid5(uuid.NAMESPACE_OID, token).hex[:12]}.kubeconfig"
    if not path.exists():
        user_kubeconfig(server, path, token=token)
    return ["--kubeconfig", str(path)]


def whoami(server: FleetServer, token: str) -> dict[str, Any]:
    return json.loads(ok(server, *bearer(server, token), "auth", "whoami", "-o", "json"))


def claims(token: str) -> dict[str, Any]:
    return jwt.decode(token, options={"verify_signature": False})


def test_created_token_works_until_its_service_account_is_deleted(server: FleetServer, ns: str) -> None:
    ok(server, "-n", ns, "create", "serviceaccount", "robot")
    uid = json.loads(ok(server, "-n", ns, "get", "sa", "robot", "-o", "json"))["metadata"]["uid"]
    token = ok(server, "-n", ns, "create", "token", "robot").strip()
    c = claims(token)
    assert c["iss"] == ISS and c["aud"] == [ISS] and c["sub"] == f"system:serviceaccount:{ns}:robot"
    assert c["exp"] - c["iat"] == 3600
    assert c["kubernetes.io"]["serviceaccount"] == {"name": "robot", "uid": uid}
    me = whoami(server, token)
    assert me["kind"] == "SelfSubjectReview"
    info = me["status"]["userInfo"]
    assert info["username"] == f"system:serviceaccount:{ns}:robot" and info["uid"] == uid
    assert info["groups"] == ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    assert info["extra"]["authentication.kubernetes.io/credential-id"] == [f"JTI={c['jti']}"]
    ok(server, "-n", ns, "create", "rolebinding", "robot-view", "--clusterrole", "view",
       "--serviceaccount", f"{ns}:robot")
    assert "robot" in ok(server, *bearer(server, token), "-n", ns, "get", "serviceaccounts")
    ok(server, "-n", ns, "delete", "serviceaccount", "robot")
    rc, out, err = server.kubectl(*bearer(server, token), "-n", ns, "get", "serviceaccounts")
    assert rc != 0 and "Unauthorized" in err, (out, err)
    # The reason is in the server's log, never in the answer.
    assert re.search(r'authentication failed for [\d.:]+: serviceaccounts "robot" not found', server.output())
    assert "not found" not in err


def test_create_token_audience_duration_and_bound_pod(server: FleetServer, ns: str) -> None:
    ok(server, "-n", ns, "create", "serviceaccount", "robot")
    token = ok(server, "-n", ns, "create", "token", "robot", "--audience", "vault", "--audience", "sts",
               "--duration", "20m").strip()
    c = claims(token)
    assert c["aud"] == ["vault", "sts"] and c["exp"] - c["iat"] == 1200
    rc, _, err = server.kubectl(*bearer(server, token), "-n", ns, "get", "pods")
    assert rc != 0 and "Unauthorized" in err  # not meant for the API
    rc, _, err = server.kubectl("-n", ns, "create", "token", "robot", "--duration", "5m")
    assert rc != 0 and "may not specify a duration less than 10 minutes" in err
    ok(server, "-n", ns, "run", "p1", "--image", "busybox", "--overrides",
       json.dumps({"spec": {"serviceAccountName": "robot"}}), "--restart", "Never")
    pod_uid = json.loads(ok(server, "-n", ns, "get", "pod", "p1", "-o", "json"))["metadata"]["uid"]
    token = ok(server, "-n", ns, "create", "token", "robot", "--bound-object-kind", "Pod",
               "--bound-object-name", "p1").strip()
    assert claims(token)["kubernetes.io"]["pod"] == {"name": "p1", "uid": pod_uid}
    extra = whoami(server, token)["status"]["userInfo"]["extra"]
    assert extra["authentication.kubernetes.io/pod-name"] == ["p1"]
    assert extra["authentication.kubernetes.io/pod-uid"] == [pod_uid]
    rc, _, err = server.kubectl("-n", ns, "create", "token", "robot", "--bound-object-kind", "Pod",
                                "--bound-object-name", "p1", "--bound-object-uid", "not-the-uid")
    assert rc != 0 and "does not match the UID in record" in err
    ok(server, "-n", ns, "delete", "pod", "p1", "--grace-period=0", "--force")
    rc, _, err = server.kubectl(*bearer(server, token), "-n", ns, "get", "pods")
    assert rc != 0 and "Unauthorized" in err


def test_token_review_with_kubectl_create(server: FleetServer, ns: str) -> None:
    ok(server, "-n", ns, "create", "serviceaccount", "robot")
    token = ok(server, "-n", ns, "create", "token", "robot").strip()

    def review(tok: str, audiences: list[str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"token": tok}
        if audiences:
            spec["audiences"] = audiences
        doc = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        return json.loads(ok(server, "create", "-f", "-", "-o", "json", input=json.dumps(doc)))["status"]

    status = review(token)
    assert status["authenticated"] is True and status["audiences"] == [ISS]
    assert status["user"]["username"] == f"system:serviceaccount:{ns}:robot"
    status = review(token, ["vault"])
    assert status["authenticated"] is False and "invalid for the target audiences" in status["error"]
    status = review("not-a-token")
    assert status["authenticated"] is False and not status.get("user")
    rc, _, err = server.kubectl("get", "tokenreviews")
    assert rc != 0


def test_whoami_as_admin(server: FleetServer) -> None:
    out = ok(server, "auth", "whoami")
    assert "system:admin" in out and "system:masters" in out
    doc = ok(server, "auth", "whoami", "-o", "yaml")
    assert "kind: SelfSubjectReview" in doc and "username: system:admin" in doc


def test_oidc_user_is_authenticated_with_prefixed_name_and_groups(server: FleetServer,
                                                                   provider: OIDCProvider) -> None:
    token = provider.token(sub="alice", groups=["dev", "ops"], hd="example.com")
    info = whoami(server, token)["status"]["userInfo"]
    assert info["username"] == "oidc:alice"
    assert info["groups"] == ["oidc:dev", "oidc:ops", "system:authenticated"]
    out = ok(server, *bearer(server, token), "auth", "whoami")
    assert "oidc:alice" in out
    now = int(time.time())
    for bad in (provider.token(sub="alice", hd="example.com", iat=now - 7200, exp=now - 3600),  # expired
                provider.token(sub="alice", hd="example.com", aud="someone-else"),
                provider.token(sub="alice")):  # the required claim is missing
        rc, out, err = server.kubectl(*bearer(server, bad), "auth", "whoami")
        assert rc != 0 and "Unauthorized" in err, (out, err)
    assert "oidc: token is expired" in server.output()
    # Keys rotated at the issuer are picked up: the unknown kid makes the server fetch the
    # keys again (at most once per 10 s, so this may take that long).
    provider.rotate(keep_old=True)
    rotated = provider.token(sub="bob", hd="example.com")
    deadline = time.monotonic() + 20
    while True:
        rc, out, err = server.kubectl(*bearer(server, rotated), "auth", "whoami", "-o", "json")
        if rc == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert rc == 0, err
    assert json.loads(out)["status"]["userInfo"]["username"] == "oidc:bob"


def test_openid_discovery_verifies_a_kubectl_token(server: FleetServer, ns: str) -> None:
    ok(server, "-n", ns, "create", "serviceaccount", "robot")
    token = ok(server, "-n", ns, "create", "token", "robot", "--audience", "sts.example.com").strip()
    with server.client() as http:
        doc = http.get("/.well-known/openid-configuration").json()
        assert doc["issuer"] == ISS and doc["jwks_uri"] == ISS + "/openid/v1/jwks"
        assert doc["response_types_supported"] == ["id_token"]
        assert doc["subject_types_supported"] == ["public"]
        assert doc["id_token_signing_alg_values_supported"] == ["RS256"]
        resp = http.get("/openid/v1/jwks")
        assert resp.headers["content-type"] == "application/jwk-set+json"
        jwks = jwt.PyJWKSet.from_dict(resp.json())
    key = jwks[jwt.get_unverified_header(token)["kid"]]
    c = jwt.decode(token, key.key, algorithms=doc["id_token_signing_alg_values_supported"],
                   audience="sts.example.com", issuer=doc["issuer"])
    assert c["sub"] == f"system:serviceaccount:{ns}:robot"
    rc, out, _ = server.kubectl("get", "--raw", "/openid/v1/jwks")
    assert rc == 0 and json.loads(out)["keys"][0]["kid"] == key.key_id


# ---------------------------------------------------------------- three users, one cluster

def user_kubeconfig(server: FleetServer, path: Path, *, token: str | None = None) -> Path:
    """The admin kubeconfig's cluster with one user: the admin certificate alone
    (token None) or a bearer token alone — each request is exactly that user."""
    cfg = yaml.safe_load(server.kubeconfig.read_text())
    user = cfg["users"][0]["user"]
    if token is None:
        user.pop("token", None)
        assert user["client-certificate-data"] and user["client-key-data"]
    else:
        cfg["users"][0]["user"] = {"token": token}
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def as_user(server: FleetServer, kcfg: Path, *args: str) -> tuple[int, str, str]:
    return server.kubectl("--kubeconfig", str(kcfg), *args)


def list_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:]]


def test_three_users_each_do_exactly_what_their_bindings_allow(server: FleetServer, provider: OIDCProvider,
                                                               ns: str, tmp_path: Path) -> None:
    """The admin certificate, an OIDC user and a ServiceAccount token, side by side: each
    may do what its bindings give it and nothing more, `auth can-i --list` says so, and
    `--as` works only with the impersonate verb."""
    admin = user_kubeconfig(server, tmp_path / "admin.kubeconfig")
    ok(server, "-n", ns, "create", "serviceaccount", "robot")
    ok(server, "-n", ns, "create", "rolebinding", "dev-view", "--clusterrole", "view", "--group", "oidc:dev")
    ok(server, "-n", ns, "create", "rolebinding", "robot-edit", "--clusterrole", "edit",
       "--serviceaccount", f"{ns}:robot")
    alice = user_kubeconfig(server, tmp_path / "alice.kubeconfig",
                            token=provider.token(sub="alice", groups=["dev"], hd="example.com"))
    robot = user_kubeconfig(server, tmp_path / "robot.kubeconfig",
                            token=ok(server, "-n", ns, "create", "token", "robot").strip())

    # The admin certificate (O=system:masters): everything, anywhere.
    assert as_user(server, admin, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")[1] == \
        "system:admin"
    assert as_user(server, admin, "-n", ns, "create", "configmap", "by-admin")[0] == 0
    assert as_user(server, admin, "get", "secrets", "-A", "-o", "name")[0] == 0
    rows = list_rows(as_user(server, admin, "auth", "can-i", "--list", "-n", ns)[1])
    assert ["*.*", "[]", "[]", "[*]"] in rows

    # The OIDC user: view in this namespace through its group, nothing elsewhere.
    rc, out, err = as_user(server, alice, "-n", ns, "get", "configmaps", "-o", "name")
    assert rc == 0 and "configmap/by-admin" in out.split(), err
    rc, _, err = as_user(server, alice, "-n", ns, "create", "configmap", "by-alice")
    assert rc == 1 and (f'configmaps is forbidden: User "oidc:alice" cannot create resource "configmaps" '
                        f'in API group "" in the namespace "{ns}"') in err, err
    rc, _, err = as_user(server, alice, "-n", ns, "get", "secrets")
    assert rc == 1 and 'cannot list resource "secrets"' in err, err  # view never reads Secrets
    rc, _, err = as_user(server, alice, "-n", "default", "get", "pods")
    assert rc == 1 and 'User "oidc:alice" cannot list resource "pods"' in err, err
    rows = list_rows(as_user(server, alice, "auth", "can-i", "--list", "-n", ns)[1])
    assert ["configmaps", "[]", "[]", "[get", "list", "watch]"] in rows
    assert ["*.*", "[]", "[]", "[*]"] not in rows
    assert not [r for r in rows if r[0] in ("configmaps", "secrets") and "create" in " ".join(r)]
    assert as_user(server, alice, "auth", "can-i", "list", "configmaps", "-n", ns)[:2] == (0, "yes\n")
    assert as_user(server, alice, "auth", "can-i", "create", "configmaps", "-n", ns)[:2] == (1, "no\n")

    # The ServiceAccount token: edit in its namespace only.
    assert as_user(server, robot, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")[1] == \
        f"system:serviceaccount:{ns}:robot"
    rc, _, err = as_user(server, robot, "-n", ns, "create", "configmap", "by-robot")
    assert rc == 0, err
    rc, _, err = as_user(server, robot, "-n", "default", "create", "configmap", "by-robot")
    assert rc == 1 and f'User "system:serviceaccount:{ns}:robot" cannot create resource "configmaps"' in err
    rc, _, err = as_user(server, robot, "get", "namespaces")
    assert rc == 1 and "at the cluster scope" in err, err
    rows = list_rows(as_user(server, robot, "auth", "can-i", "--list", "-n", ns)[1])
    assert any(r[0] == "configmaps" and "create" in " ".join(r) for r in rows), rows
    assert as_user(server, robot, "auth", "can-i", "create", "configmaps", "-n", "default")[:2] == (1, "no\n")

    # --as needs the impersonate verb: the admin has it, the others not until granted.
    rc, out, err = as_user(server, admin, "--as", "bob", "auth", "whoami", "-o",
                           "jsonpath={.status.userInfo.username}")
    assert (rc, out) == (0, "bob"), err
    for kcfg, who in ((alice, "oidc:alice"), (robot, f"system:serviceaccount:{ns}:robot")):
        rc, _, err = as_user(server, kcfg, "--as", "bob", "-n", ns, "get", "configmaps")
        assert rc == 1 and (f'users "bob" is forbidden: User "{who}" cannot impersonate resource "users" '
                            'in API group "" at the cluster scope') in err, err
    ok(server, "create", "clusterrole", f"impersonate-bob-{ns}", "--verb", "impersonate",
       "--resource", "users", "--resource-name", "bob")
    ok(server, "create", "clusterrolebinding", f"alice-as-bob-{ns}", "--clusterrole",
       f"impersonate-bob-{ns}", "--user", "oidc:alice")
    try:
        rc, out, err = as_user(server, alice, "--as", "bob", "auth", "whoami", "-o",
                               "jsonpath={.status.userInfo.username}")
        assert (rc, out) == (0, "bob"), err
        # As bob, alice has bob's rights (none here), not her own.
        rc, _, err = as_user(server, alice, "--as", "bob", "-n", ns, "get", "configmaps")
        assert rc == 1 and 'User "bob" cannot list resource "configmaps"' in err, err
        rc, _, err = as_user(server, alice, "--as", "carol", "-n", ns, "get", "configmaps")
        assert rc == 1 and 'users "carol" is forbidden: User "oidc:alice" cannot impersonate' in err, err
    finally:
        server.kubectl("delete", "clusterrolebinding", f"alice-as-bob-{ns}")
        server.kubectl("delete", "clusterrole", f"impersonate-bob-{ns}")
