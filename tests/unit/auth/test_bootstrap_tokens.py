"""Bootstrap tokens: format, Secret shape, the authenticator's verdicts, JWS, cluster-info."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest

from fleet.auth import BOOTSTRAPPERS_GROUP, AuthenticationError, Credentials
from fleet.auth import bootstrap as b
from fleet.cli.token import list_rows, parse_duration

NOW = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
TOKEN = "abcdef.0123456789abcdef"


def creds(token: str) -> Credentials:
    return Credentials({"authorization": f"Bearer {token}"})


def authenticator(*secrets: dict[str, Any], now: dt.datetime = NOW) -> b.BootstrapTokenAuthenticator:
    by_name = {s["metadata"]["name"]: s for s in secrets}

    async def lookup(name: str) -> dict[str, Any] | None:
        return by_name.get(name)

    return b.BootstrapTokenAuthenticator(lookup, clock=lambda: now)


def test_generated_tokens_have_the_kubernetes_shape() -> None:
    tokens = {b.generate_token() for _ in range(50)}
    assert len(tokens) == 50
    assert all(b.TOKEN_RE.match(t) for t in tokens)
    assert b.parse_token("abcdef.0123456789abcdef") == ("abcdef", "0123456789abcdef")
    for bad in ("ABCDEF.0123456789abcdef", "abcde.0123456789abcdef", "abcdef0123456789abcdef", "fleet-admin-x"):
        assert b.parse_token(bad) is None


def test_secret_is_what_kubeadm_writes() -> None:
    s = b.token_secret(TOKEN, ttl=dt.timedelta(hours=2), description="node 2", now=NOW)
    assert s["type"] == "bootstrap.kubernetes.io/token"
    assert s["metadata"] == {"name": "bootstrap-token-abcdef", "namespace": "kube-system"}
    data = b.secret_data(s)
    assert data == {"token-id": "abcdef", "token-secret": "0123456789abcdef", "description": "node 2",
                    "expiration": "2026-12-03T12:00:00Z", "usage-bootstrap-authentication": "true",
                    "usage-bootstrap-signing": "true",
                    "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token"}
    assert "expiration" not in b.secret_data(b.token_secret(TOKEN, ttl=None))


@pytest.mark.parametrize("kw, msg", [
    ({"groups": ["system:masters"]}, "must match"),
    ({"usages": ["authentication", "magic"]}, "invalid bootstrap token usage"),
])
def test_secret_refuses_bad_groups_and_usages(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        b.token_secret(TOKEN, **kw)
    with pytest.raises(ValueError, match="was not of the form"):
        b.token_secret("nope")


async def test_valid_token_authenticates_as_bootstrap_user() -> None:
    s = b.token_secret(TOKEN, now=NOW, groups=["system:bootstrappers:kubeadm:default-node-token"])
    user = await authenticator(s).authenticate(creds(TOKEN))
    assert user is not None
    assert user.name == "system:bootstrap:abcdef"
    assert user.groups == (BOOTSTRAPPERS_GROUP, "system:bootstrappers:kubeadm:default-node-token")


async def test_other_tokens_are_not_ours() -> None:
    a = authenticator(b.token_secret(TOKEN, now=NOW))
    assert await a.authenticate(creds("fleet-admin-something")) is None
    assert await a.authenticate(Credentials({})) is None
    assert await a.authenticate(Credentials({"authorization": "Basic abc"})) is None


def _edit(secret: dict[str, Any], **data: str | None) -> dict[str, Any]:
    for k, v in data.items():
        key = k.replace("_", "-")
        if v is None:
            secret["data"].pop(key, None)
        else:
            secret["data"][key] = base64.b64encode(v.encode()).decode()
    return secret


@pytest.mark.parametrize("secret, token, why", [
    (None, TOKEN, "no secret"),
    (b.token_secret(TOKEN, now=NOW), "abcdef.ffffffffffffffff", "wrong token secret"),
    (b.token_secret(TOKEN, ttl=dt.timedelta(hours=1), now=NOW - dt.timedelta(hours=2)), TOKEN, "expired"),
    (_edit(b.token_secret(TOKEN, now=NOW), expiration="garbage"), TOKEN, "expired"),
    (b.token_secret(TOKEN, usages=["signing"], now=NOW), TOKEN, "not marked for authentication"),
    ({**b.token_secret(TOKEN, now=NOW), "type": "Opaque"}, TOKEN, "type"),
    (_edit(b.token_secret(TOKEN, now=NOW), token_id="zzzzzz"), TOKEN, "token id does not match"),
])
async def test_bad_tokens_are_authentication_errors(secret: dict[str, Any] | None, token: str, why: str) -> None:
    a = authenticator(*([secret] if secret else []))
    with pytest.raises(AuthenticationError, match=why):
        await a.authenticate(creds(token))


async def test_deleting_secret_is_refused() -> None:
    s = b.token_secret(TOKEN, now=NOW)
    s["metadata"]["deletionTimestamp"] = "2026-12-03T09:00:00Z"
    with pytest.raises(AuthenticationError, match="being deleted"):
        await authenticator(s).authenticate(creds(TOKEN))


async def test_only_bootstrapper_extra_groups_are_granted() -> None:
    s = _edit(b.token_secret(TOKEN, now=NOW), auth_extra_groups="system:masters,system:bootstrappers:x")
    user = await authenticator(s).authenticate(creds(TOKEN))
    assert user is not None and user.groups == (BOOTSTRAPPERS_GROUP, "system:bootstrappers:x")


def test_detached_jws_round_trip_and_tamper() -> None:
    content = b.cluster_info_kubeconfig("https://10.0.0.1:9300", b"-----BEGIN CERTIFICATE-----\nx\n")
    jws = b.compute_detached_signature(content, "abcdef", "0123456789abcdef")
    header, payload, sig = jws.split(".")
    assert payload == "" and header and sig
    assert b.verify_detached_signature(content, jws, "abcdef", "0123456789abcdef")
    assert not b.verify_detached_signature(content + " ", jws, "abcdef", "0123456789abcdef")
    assert not b.verify_detached_signature(content, jws, "abcdef", "ffffffffffffffff")
    assert not b.verify_detached_signature(content, jws, "zzzzzz", "0123456789abcdef")
    assert not b.verify_detached_signature(content, "not-a-jws", "abcdef", "0123456789abcdef")


def test_signed_data_adds_and_removes_signatures() -> None:
    cm = b.cluster_info_configmap("https://s:9300", b"CA")
    kc = cm["data"]["kubeconfig"]
    assert b.parse_cluster_info_kubeconfig(kc) == ("https://s:9300", b"CA")
    signing = b.token_secret(TOKEN, now=NOW)
    auth_only = b.token_secret("bbbbbb.0123456789abcdef", usages=["authentication"], now=NOW)
    expired = b.token_secret("cccccc.0123456789abcdef", ttl=dt.timedelta(hours=1), now=NOW - dt.timedelta(hours=3))
    want = b.signed_data(cm, [signing, auth_only, expired], NOW)
    assert want is not None
    assert set(want) == {"kubeconfig", "jws-kubeconfig-abcdef"}
    cm["data"] = want
    assert b.signed_data(cm, [signing], NOW) is None  # already signed
    cm["data"]["jws-kubeconfig-dddddd"] = "stale"
    assert set(b.signed_data(cm, [signing], NOW) or {}) == {"kubeconfig", "jws-kubeconfig-abcdef"}
    assert set(b.signed_data(cm, [], NOW) or {}) == {"kubeconfig"}


def test_ca_cert_hash_is_sha256_of_spki(tmp_path: Any) -> None:
    from fleet.auth.pki import ensure_serving_tls

    tls = ensure_serving_tls(tmp_path)
    h = b.ca_cert_hash(tls.ca_cert_pem)
    assert h.startswith("sha256:") and len(h) == len("sha256:") + 64
    assert h == b.ca_cert_hash(tls.ca_cert_pem)


def test_token_list_rows_and_durations() -> None:
    rows = list_rows([b.token_secret(TOKEN, ttl=dt.timedelta(hours=23), description="d", now=NOW),
                      b.token_secret("bbbbbb.0123456789abcdef", ttl=None, usages=["authentication"], groups=[]),
                      {"type": "Opaque", "metadata": {"name": "x", "namespace": "kube-system"}}], NOW)
    assert rows == [
        [TOKEN, "23h", "2026-12-04T09:00:00Z", "authentication,signing", "d",
         "system:bootstrappers:kubeadm:default-node-token"],
        ["bbbbbb.0123456789abcdef", "<forever>", "<never>", "authentication", "<none>", "<none>"],
    ]
    assert parse_duration("24h") == dt.timedelta(hours=24)
    assert parse_duration("1h30m") == dt.timedelta(minutes=90)
    assert parse_duration("0") == dt.timedelta(0)
    with pytest.raises(ValueError):
        parse_duration("tomorrow")


async def test_ensure_cluster_info_creates_and_refreshes(tmp_path: Any) -> None:
    from fleet.testing.apiserver import open_api

    async with open_api(tmp_path, namespace_controller=False) as api:
        store, registry = api.store, api.server.registry
        await b.ensure_cluster_info(store, registry, "https://10.0.0.1:9300", b"CA1")
        code, cm = await api.json("GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info")
        assert code == 200
        assert b.parse_cluster_info_kubeconfig(cm["data"]["kubeconfig"]) == ("https://10.0.0.1:9300", b"CA1")
        rv = cm["metadata"]["resourceVersion"]
        await b.ensure_cluster_info(store, registry, "https://10.0.0.1:9300", b"CA1")  # unchanged: no write
        _, same = await api.json("GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info")
        assert same["metadata"]["resourceVersion"] == rv
        # A new CA (rotation): the kubeconfig is replaced, stale signatures dropped.
        same["data"]["jws-kubeconfig-abcdef"] = "stale"
        await api.json("PUT", "/api/v1/namespaces/kube-public/configmaps/cluster-info", same)
        await b.ensure_cluster_info(store, registry, "https://10.0.0.1:9300", b"CA2")
        _, new = await api.json("GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info")
        assert set(new["data"]) == {"kubeconfig"}
        assert b.parse_cluster_info_kubeconfig(new["data"]["kubeconfig"])[1] == b"CA2"


async def test_secret_source_reads_the_store_on_a_cache_miss(tmp_path: Any) -> None:
    import trio

    from fleet.testing.apiserver import open_api

    async with open_api(tmp_path, namespace_controller=False) as api:
        source = b.SecretSource(api.store)
        async with trio.open_nursery() as n:
            await n.start(source.run)
            secret = b.token_secret(TOKEN)
            code, _ = await api.json("POST", "/api/v1/namespaces/kube-system/secrets", secret)
            assert code == 201
            got = await source(b.secret_name("abcdef"))  # cache or store: either way, at once
            assert got is not None and b.secret_data(got)["token-id"] == "abcdef"
            assert await source(b.secret_name("zzzzzz")) is None
            user = await b.BootstrapTokenAuthenticator(source).authenticate(creds(TOKEN))
            assert user is not None and user.name == "system:bootstrap:abcdef"
            n.cancel_scope.cancel()
