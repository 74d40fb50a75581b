"""fleet.auth.oidc against a real HTTPS provider on loopback (fleet/testing/oidc.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import rsa

from fleet.auth import AuthenticationError, Credentials
from fleet.auth.oidc import OIDCAuthenticator, OIDCConfig, OIDCKeys, parse_required_claims
from fleet.testing.oidc import OIDCProvider


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OIDCProvider]:
    with OIDCProvider(tmp_path_factory.mktemp("oidc")) as p:
        yield p


def authenticator(provider: OIDCProvider, **kw: Any) -> OIDCAuthenticator:
    cfg = OIDCConfig(issuer_url=provider.issuer, client_id=provider.client_id, ca_file=str(provider.ca_file), **kw)
    return OIDCAuthenticator(cfg)


def bearer(token: str) -> Credentials:
    return Credentials({"authorization": f"Bearer {token}"})


async def authn(a: OIDCAuthenticator, token: str) -> Any:
    return await a.authenticate(bearer(token))


async def test_user_name_prefixed_with_the_issuer_and_groups(provider: OIDCProvider) -> None:
    a = authenticator(provider, groups_claim="groups", groups_prefix="oidc:")
    user = await authn(a, provider.token(sub="alice", groups=["dev", "ops"]))
    assert user.name == f"{provider.issuer}#alice"
    assert user.groups == ("oidc:dev", "oidc:ops")
    user = await authn(a, provider.token(sub="bob", groups="dev"))
    assert user.groups == ("oidc:dev",)
    with pytest.raises(AuthenticationError, match='parse groups claim "groups"'):
        await authn(a, provider.token(sub="bob", groups=[1, 2]))


async def test_username_claims_and_prefixes(provider: OIDCProvider) -> None:
    token = provider.token(sub="alice", email="alice@example.com", email_verified=True, name="Alice")
    assert (await authn(authenticator(provider, username_prefix="-"), token)).name == "alice"
    assert (await authn(authenticator(provider, username_prefix="corp:"), token)).name == "corp:alice"
    assert (await authn(authenticator(provider, username_claim="email"), token)).name == "alice@example.com"
    assert (await authn(authenticator(provider, username_claim="name"), token)).name == \
        f"{provider.issuer}#Alice"
    with pytest.raises(AuthenticationError, match="^oidc: email not verified$"):
        await authn(authenticator(provider, username_claim="email"),
                        provider.token(sub="x", email="x@example.com", email_verified=False))
    with pytest.raises(AuthenticationError, match='parse username claims "email": claim not present'):
        await authn(authenticator(provider, username_claim="email"), provider.token(sub="x"))


async def test_expired_wrong_audience_future_and_required_claims(provider: OIDCProvider) -> None:
    a = authenticator(provider, required_claims=parse_required_claims(["hd=example.com"]))
    now = int(time.time())
    assert (await authn(a, provider.token(sub="a", hd="example.com"))).name.endswith("#a")
    with pytest.raises(AuthenticationError, match="^oidc: token is expired"):
        await authn(a, provider.token(sub="a", hd="example.com", iat=now - 7200, exp=now - 3600))
    with pytest.raises(AuthenticationError, match='expected audience "fleet" got \\["other"\\]'):
        await authn(a, provider.token(sub="a", hd="example.com", aud="other"))
    with pytest.raises(AuthenticationError, match="before the nbf"):
        await authn(a, provider.token(sub="a", hd="example.com", nbf=now + 3600))
    with pytest.raises(AuthenticationError, match="^oidc: required claim hd not present in ID token$"):
        await authn(a, provider.token(sub="a"))
    with pytest.raises(AuthenticationError, match="required claim hd value does not match. Got = evil.com"):
        await authn(a, provider.token(sub="a", hd="evil.com"))
    with pytest.raises(AuthenticationError, match="no valid exp"):
        await authn(a, provider.token(sub="a", hd="example.com", exp=None))
    with pytest.raises(ValueError, match="expected key=value"):
        parse_required_claims(["hd"])


async def test_signature_and_algorithm(provider: OIDCProvider) -> None:
    a = authenticator(provider)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(AuthenticationError, match="failed to verify id token signature"):
        await authn(a, provider.token(sub="a", key=stranger))
    with pytest.raises(AuthenticationError, match="unsupported algorithm"):
        await authn(a, provider.token(sub="a", key="k" * 32, algorithm="HS256"))
    unsigned = jwt.encode({"iss": provider.issuer, "aud": "fleet", "sub": "a", "exp": time.time() + 60},
                          None, algorithm="none")
    with pytest.raises(AuthenticationError, match="unsupported algorithm"):
        await authn(a, unsigned)


async def test_other_issuers_and_non_jwts_are_not_ours(provider: OIDCProvider) -> None:
    a = authenticator(provider)
    assert await a.authenticate(Credentials({})) is None
    assert await authn(a, "fleet-admin-xyz") is None
    assert await authn(a, provider.token(sub="a", iss="https://elsewhere.example.com")) is None
    assert a.keys.fetches == 0  # nothing of ours: the provider was never asked


async def test_rotation_at_the_issuer_is_picked_up(tmp_path: Path) -> None:
    with OIDCProvider(tmp_path) as p:
        a = authenticator(p, username_prefix="-", min_refresh_interval=0.5)
        assert (await authn(a, p.token(sub="a"))).name == "a"
        fetches = p.key_fetches()
        old_kid = p.kid
        old_token = p.token(sub="a")
        p.rotate()
        # A token with the new kid: the unknown kid triggers a refresh (once the rate
        # limit allows), then it verifies.
        await trio.sleep(0.6)
        assert (await authn(a, p.token(sub="b"))).name == "b"
        assert p.key_fetches() == fetches + 1
        # The old key is gone from the provider, and from the cache after that refresh.
        assert old_kid not in a.keys.keys
        with pytest.raises(AuthenticationError, match="failed to verify id token signature"):
            await authn(a, old_token)


async def test_unknown_kids_refresh_at_most_once_per_interval(tmp_path: Path) -> None:
    with OIDCProvider(tmp_path) as p:
        a = authenticator(p, min_refresh_interval=60)
        assert await authn(a, p.token(sub="a"))
        fetches = p.key_fetches()
        for i in range(5):
            with pytest.raises(AuthenticationError, match="no key with kid"):
                await authn(a, p.token(sub="a", kid=f"garbage-{i}"))
        assert p.key_fetches() == fetches


async def test_periodic_refresh_drops_retired_keys(tmp_path: Path) -> None:
    with OIDCProvider(tmp_path) as p:
        a = authenticator(p, refresh_interval=0.2, min_refresh_interval=0.1)
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            with trio.fail_after(10):
                while set(a.keys.keys) != {p.kid}:
                    await trio.sleep(0.05)
            new_kid = p.rotate()
            with trio.fail_after(10):
                while set(a.keys.keys) != {new_kid}:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()


async def test_provider_problems_leave_the_authenticator_uninitialized(tmp_path: Path) -> None:
    with OIDCProvider(tmp_path) as p:
        # Without the provider's CA the TLS handshake fails.
        no_ca = OIDCAuthenticator(OIDCConfig(issuer_url=p.issuer, client_id="fleet"))
        with pytest.raises(AuthenticationError, match="^oidc: authenticator not initialized$"):
            await authn(no_ca, p.token(sub="a"))
        # A discovery document naming another issuer is refused.
        p.advertised_issuer = "https://evil.example.com"
        keys = OIDCKeys(OIDCConfig(issuer_url=p.issuer, client_id="fleet", ca_file=str(p.ca_file)))
        with pytest.raises(ValueError, match="issuer did not match the issuer returned by provider"):
            await keys.fetch()


def test_config_validation() -> None:
    assert OIDCConfig(issuer_url="http://x", client_id="c").validate() == [
        "--oidc-issuer-url ('http://x') has invalid scheme, require 'https'"]
    assert OIDCConfig(issuer_url="https://x", client_id="").validate() == [
        "--oidc-client-id must be set when --oidc-issuer-url is"]
    assert "unsupported algorithm(s) HS256" in OIDCConfig(issuer_url="https://x", client_id="c",
                                                          signing_algs=("HS256",)).validate()[0]
