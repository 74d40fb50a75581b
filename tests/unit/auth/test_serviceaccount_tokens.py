"""fleet.auth.serviceaccount: signing keys, bound tokens in Kubernetes' shape, verification."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fleet.auth import AuthenticationError, Credentials
from fleet.auth.serviceaccount import (
    CREDENTIAL_ID_KEY,
    NODE_NAME_KEY,
    NODE_UID_KEY,
    POD_NAME_KEY,
    POD_UID_KEY,
    Binding,
    KeyFiles,
    ObjectRef,
    ServiceAccountTokenAuthenticator,
    TokenIssuer,
    key_id,
    load_or_create_keys,
    rotate_signing_key,
)

ISS = "https://kubernetes.default.svc.cluster.local"


class Objects:
    """A fake store: (plural, namespace, name) -> object."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str, str], dict[str, Any]] = {}

    def add(self, plural: str, namespace: str, name: str, **md: Any) -> dict[str, Any]:
        obj = {"metadata": {"name": name, "namespace": namespace or None, "uid": str(uuid.uuid4()), **md},
               "spec": {}}
        self.objs[(plural, namespace, name)] = obj
        return obj

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get((plural, namespace, name))


def uid(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sa-keys")


@pytest.fixture
def world(keys_dir: Path) -> tuple[TokenIssuer, ServiceAccountTokenAuthenticator, Objects]:
    keys = load_or_create_keys(keys_dir)
    objs = Objects()
    return TokenIssuer(keys, ISS), ServiceAccountTokenAuthenticator(keys, objs.get, issuers=[ISS]), objs


def bearer(token: str) -> Credentials:
    return Credentials({"authorization": f"Bearer {token}"})


async def test_key_made_once_and_kept_private(tmp_path: Path) -> None:
    a = load_or_create_keys(tmp_path / "tls")
    assert (tmp_path / "tls" / "sa.key").stat().st_mode & 0o777 == 0o600
    b = load_or_create_keys(tmp_path / "tls")
    assert a.kid == b.kid and a.algorithm == "RS256"
    assert a.signing.key_size == 2048  # type: ignore[union-attr]
    jwks = a.jwks()["keys"]
    assert [(k["kid"], k["kty"], k["alg"], k["use"]) for k in jwks] == [(a.kid, "RSA", "RS256", "sig")]


async def test_issued_token_has_kubernetes_bound_shape_and_verifies(world: Any) -> None:
    issuer, auth, objs = world
    sa = objs.add("serviceaccounts", "ns1", "robot")
    pod = objs.add("pods", "ns1", "p1")
    node = objs.add("nodes", "", "n1")
    token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                            expiration_seconds=3600,
                            binding=Binding(pod=ObjectRef("p1", uid(pod)), node=ObjectRef("n1", uid(node))))
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "RS256" and header["kid"] == issuer.keys.kid
    c = jwt.decode(token, issuer.keys.signing.public_key(), algorithms=["RS256"], audience=ISS, issuer=ISS)
    assert c["sub"] == "system:serviceaccount:ns1:robot"
    assert c["exp"] - c["iat"] == 3600 and c["nbf"] == c["iat"]
    uuid.UUID(c["jti"])
    assert c["kubernetes.io"] == {"namespace": "ns1", "serviceaccount": {"name": "robot", "uid": uid(sa)},
                                  "pod": {"name": "p1", "uid": uid(pod)}, "node": {"name": "n1", "uid": uid(node)}}
    user = await auth.authenticate(bearer(token))
    assert user.name == "system:serviceaccount:ns1:robot" and user.uid == uid(sa)
    assert user.groups == ("system:serviceaccounts", "system:serviceaccounts:ns1")
    assert user.extra == {POD_NAME_KEY: ["p1"], POD_UID_KEY: [uid(pod)], NODE_NAME_KEY: ["n1"],
                          NODE_UID_KEY: [uid(node)], CREDENTIAL_ID_KEY: [f"JTI={c['jti']}"]}


async def test_expired_and_not_yet_valid_tokens_are_refused(world: Any) -> None:
    issuer, auth, objs = world
    sa = objs.add("serviceaccounts", "ns1", "robot")
    now = time.time()
    token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                            expiration_seconds=600, now=now)
    auth.clock = lambda: now + 600 + 30  # inside the 60 s leeway
    assert (await auth.authenticate(bearer(token))) is not None
    auth.clock = lambda: now + 600 + 61
    with pytest.raises(AuthenticationError, match="^service account token has expired$"):
        await auth.authenticate(bearer(token))
    auth.clock = lambda: now - 120
    with pytest.raises(AuthenticationError, match="^service account token is not valid yet$"):
        await auth.authenticate(bearer(token))


async def test_wrong_audience_is_refused_and_review_audiences_are_honoured(world: Any) -> None:
    issuer, auth, objs = world
    sa = objs.add("serviceaccounts", "ns1", "robot")
    token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=["vault"],
                            expiration_seconds=600)
    with pytest.raises(AuthenticationError, match=r'token audiences \["vault"\] is invalid for the target '
                                                  r'audiences \["https://kubernetes.default.svc.cluster.local"\]'):
        await auth.authenticate(bearer(token))
    found = await auth.authenticate_token(token, ["vault", "other"])
    assert found is not None and found.audiences == ["vault"]


async def test_wrong_key_and_tampering_are_refused(world: Any, tmp_path: Path) -> None:
    issuer, auth, objs = world
    sa = objs.add("serviceaccounts", "ns1", "robot")
    stranger = TokenIssuer(load_or_create_keys(tmp_path / "other"), ISS)
    forged, _ = stranger.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                               expiration_seconds=600)
    with pytest.raises(AuthenticationError, match="no keys found"):
        await auth.authenticate(bearer(forged))
    # The same forgery claiming our key id: the signature does not verify.
    _, c = stranger.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                          expiration_seconds=600)
    forged_kid = jwt.encode(c, stranger.keys.signing, algorithm="RS256", headers={"kid": issuer.keys.kid})
    with pytest.raises(AuthenticationError, match="cryptographic primitive"):
        await auth.authenticate(bearer(forged_kid))
    # A genuine token whose payload was changed (another namespace's account).
    good, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                           expiration_seconds=600)
    h, _, s = good.split(".")
    _, c2 = issuer.issue(namespace="kube-system", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                         expiration_seconds=600)
    other_payload = jwt.encode(c2, issuer.keys.signing, algorithm="RS256").split(".")[1]
    with pytest.raises(AuthenticationError, match="cryptographic primitive"):
        await auth.authenticate(bearer(f"{h}.{other_payload}.{s}"))
    # An unsigned token ("alg": "none") is never accepted.
    unsigned = jwt.encode(c, None, algorithm="none", headers={"kid": issuer.keys.kid})
    with pytest.raises(AuthenticationError):
        await auth.authenticate(bearer(unsigned))


async def test_tokens_of_others_are_not_ours(world: Any) -> None:
    issuer, auth, _ = world
    assert await auth.authenticate(Credentials({})) is None
    assert await auth.authenticate(bearer("fleet-admin-abc")) is None
    assert await auth.authenticate(bearer("a.b.c")) is None
    other = jwt.encode({"iss": "https://accounts.example.com", "sub": "x"}, "s" * 32, algorithm="HS256")
    assert await auth.authenticate(bearer(other)) is None


async def test_deleted_or_recreated_service_account_invalidates_its_tokens(world: Any) -> None:
    issuer, auth, objs = world
    sa = objs.add("serviceaccounts", "ns1", "robot")
    token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                            expiration_seconds=600)
    assert await auth.authenticate(bearer(token))
    del objs.objs[("serviceaccounts", "ns1", "robot")]
    with pytest.raises(AuthenticationError, match='^serviceaccounts "robot" not found$'):
        await auth.authenticate(bearer(token))
    again = objs.add("serviceaccounts", "ns1", "robot")
    with pytest.raises(AuthenticationError, match=rf"service account UID \({uid(again)}\) does not match "
                                                  rf"claim \({uid(sa)}\)"):
        await auth.authenticate(bearer(token))


async def test_bound_pod_deleted_or_terminating_invalidates_the_token(world: Any) -> None:
    issuer, auth, objs = world
    sa = objs.add("serviceaccounts", "ns1", "robot")
    pod = objs.add("pods", "ns1", "p1")
    token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                            expiration_seconds=600, binding=Binding(pod=ObjectRef("p1", uid(pod))))
    assert (await auth.authenticate(bearer(token))).extra[POD_NAME_KEY] == ["p1"]
    # Terminating with its grace period still running: kube-apiserver still accepts it.
    pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30))
    assert await auth.authenticate(bearer(token))
    pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 120))
    with pytest.raises(AuthenticationError, match="^service account token has been invalidated$"):
        await auth.authenticate(bearer(token))
    del objs.objs[("pods", "ns1", "p1")]
    with pytest.raises(AuthenticationError, match="^service account token has been invalidated$"):
        await auth.authenticate(bearer(token))
    objs.add("pods", "ns1", "p1")  # the same name, another pod
    with pytest.raises(AuthenticationError, match="pod UID .* does not match service account pod ref claim"):
        await auth.authenticate(bearer(token))


async def test_secret_and_node_bound_tokens(world: Any) -> None:
    issuer, auth, objs = world
    sa = objs.add("serviceaccounts", "ns1", "robot")
    secret = objs.add("secrets", "ns1", "s1")
    node = objs.add("nodes", "", "n1")
    by_secret, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                                expiration_seconds=600, binding=Binding(secret=ObjectRef("s1", uid(secret))))
    by_node, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                              expiration_seconds=600, binding=Binding(node=ObjectRef("n1", uid(node))))
    assert await auth.authenticate(bearer(by_secret))
    assert (await auth.authenticate(bearer(by_node))).extra[NODE_NAME_KEY] == ["n1"]
    del objs.objs[("secrets", "ns1", "s1")]
    del objs.objs[("nodes", "", "n1")]
    for token in (by_secret, by_node):
        with pytest.raises(AuthenticationError, match="^service account token has been invalidated$"):
            await auth.authenticate(bearer(token))
    with pytest.raises(ValueError, match="only be bound to one object type"):
        issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS], expiration_seconds=600,
                     binding=Binding(secret=ObjectRef("s1", "u"), pod=ObjectRef("p", "u")))


async def test_rotation_keeps_old_tokens_valid_and_signs_with_the_new_key(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    objs = Objects()
    sa = objs.add("serviceaccounts", "ns1", "robot")
    old_keys = load_or_create_keys(tls)
    old_token, _ = TokenIssuer(old_keys, ISS).issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa),
                                                    audiences=[ISS], expiration_seconds=600)
    new_keys = rotate_signing_key(tls)
    assert new_keys.kid != old_keys.kid
    assert [key_id(k) for k in new_keys.verifying] == [new_keys.kid, old_keys.kid]
    assert {k["kid"] for k in new_keys.jwks()["keys"]} == {new_keys.kid, old_keys.kid}
    auth = ServiceAccountTokenAuthenticator(load_or_create_keys(tls), objs.get, issuers=[ISS])
    assert await auth.authenticate(bearer(old_token))
    new_token, _ = TokenIssuer(load_or_create_keys(tls), ISS).issue(
        namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS], expiration_seconds=600)
    assert jwt.get_unverified_header(new_token)["kid"] == new_keys.kid
    assert await auth.authenticate(bearer(new_token))
    # A second rotation (keep=1) drops the oldest key: its tokens stop verifying.
    rotate_signing_key(tls)
    auth = ServiceAccountTokenAuthenticator(load_or_create_keys(tls), objs.get, issuers=[ISS])
    with pytest.raises(AuthenticationError, match="no keys found"):
        await auth.authenticate(bearer(old_token))
    assert await auth.authenticate(bearer(new_token))


async def test_ec_signing_key_and_extra_verification_keys(tmp_path: Path) -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    key_file = tmp_path / "ec.key"
    key_file.write_bytes(ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    other = load_or_create_keys(tmp_path / "other")
    pub_file = tmp_path / "other.pub"
    pub_file.write_bytes(other.signing.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    keys = load_or_create_keys(tmp_path / "tls", signing_key_file=key_file, extra_key_files=[pub_file])
    assert keys.algorithm == "ES256" and keys.algorithms() == ["ES256", "RS256"]
    objs = Objects()
    sa = objs.add("serviceaccounts", "ns1", "robot")
    auth = ServiceAccountTokenAuthenticator(keys, objs.get, issuers=[ISS])
    for issuer in (TokenIssuer(keys, ISS), TokenIssuer(other, ISS)):
        token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                                expiration_seconds=600)
        assert await auth.authenticate(bearer(token))
    assert keys.jwks()["keys"][0]["kty"] == "EC" and keys.jwks()["keys"][0]["crv"] == "P-256"


async def test_running_server_picks_up_a_rotation_without_restart(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    objs = Objects()
    sa = objs.add("serviceaccounts", "ns1", "robot")
    keys = load_or_create_keys(tls)
    files = KeyFiles(keys, tls)
    issuer, auth = TokenIssuer(keys, ISS), ServiceAccountTokenAuthenticator(keys, objs.get, issuers=[ISS])
    old_kid = keys.kid
    old_token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                                expiration_seconds=600)
    assert files.reload_if_changed() is False
    rotated = rotate_signing_key(tls)
    assert files.reload_if_changed() is True
    assert keys.kid == rotated.kid != old_kid
    new_token, _ = issuer.issue(namespace="ns1", sa_name="robot", sa_uid=uid(sa), audiences=[ISS],
                                expiration_seconds=600)
    assert jwt.get_unverified_header(new_token)["kid"] == rotated.kid
    assert await auth.authenticate(bearer(old_token)) and await auth.authenticate(bearer(new_token))
    # A broken key file keeps the keys in use.
    (tls / "sa.key").write_text("-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    assert files.reload_if_changed() is False and keys.kid == rotated.kid
