"""fleet/server/tlsconn.py: request-but-not-verify client certificates, the peer chain in
the ASGI scope, hot reload of the serving certificate."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.trio import serve

from fleet.auth.certrotation import load_chain_into
from fleet.auth.pki import ClusterPKI, load_pem_chain, new_ca, subject_for
from fleet.server import tlsconn
from fleet.server.tlsconn import TLSConfig, request_client_cert, scope_peer_certs


def test_request_client_cert_sets_peer_mode_and_keeps_it_unverified() -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    assert ctx.verify_mode == ssl.CERT_NONE
    assert request_client_cert(ctx) is True
    assert ctx.verify_mode == ssl.CERT_OPTIONAL  # OpenSSL's SSL_VERIFY_PEER


def test_request_client_cert_falls_back_when_the_context_already_verifies() -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.verify_mode = ssl.CERT_REQUIRED
    assert request_client_cert(ctx, None) is False
    assert ctx.verify_mode == ssl.CERT_OPTIONAL


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    chain = scope_peer_certs(scope)
    from cryptography import x509

    body = ",".join(x509.load_der_x509_certificate(c).subject.rfc4514_string() for c in chain)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body.encode()})


@pytest.fixture
def pki(tmp_path: Path) -> ClusterPKI:
    p = ClusterPKI(tmp_path)
    p.ensure([])
    return p


def _client(pki: ClusterPKI, cert: tuple[bytes, bytes] | None) -> httpx.AsyncClient:
    ctx = ssl.create_default_context(cadata=pki.server_ca_bundle_pem().decode())
    if cert is not None:
        load_chain_into(ctx, *cert)
    return httpx.AsyncClient(verify=ctx)


def test_peer_chain_reaches_the_app_and_any_certificate_is_accepted(pki: ClusterPKI) -> None:
    other, other_key = new_ca("not-ours")

    async def main() -> None:
        cfg = TLSConfig()
        cfg.bind = ["127.0.0.1:0"]
        cfg.certfile, cfg.keyfile = str(pki.serving_cert_file), str(pki.serving_key_file)
        async with trio.open_nursery() as n:
            url = (await n.start(serve, _app, cfg))[0]
            async with _client(pki, None) as c:
                assert (await c.get(url)).text == ""
            async with _client(pki, pki.issue_client_cert("bob", ["devs"])) as c:
                assert (await c.get(url)).text == "CN=bob,O=devs"
            # Signed by a CA nobody trusts: still through TLS (the authenticator decides).
            import datetime as dt

            from cryptography import x509
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec

            k = ec.generate_private_key(ec.SECP256R1())
            now = dt.datetime.now(dt.UTC)
            foreign = (x509.CertificateBuilder().subject_name(subject_for("eve"))
                       .issuer_name(other.subject).public_key(k.public_key()).serial_number(5)
                       .not_valid_before(now - dt.timedelta(minutes=1))
                       .not_valid_after(now + dt.timedelta(hours=1)).sign(other_key, hashes.SHA256()))
            pem = (foreign.public_bytes(serialization.Encoding.PEM),
                   k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
            async with _client(pki, pem) as c:
                assert (await c.get(url)).text == "CN=eve"
            # Hot reload: a new serving certificate for new connections.
            before = load_pem_chain(pki.serving_cert_file.read_bytes())[0].serial_number
            pki.ensure(["renamed.example"])
            cfg.reload(str(pki.serving_cert_file), str(pki.serving_key_file))
            async with _client(pki, None) as c:
                assert (await c.get(url)).status_code == 200
            host, port = url.removeprefix("https://").rsplit(":", 1)
            pem_now = await trio.to_thread.run_sync(
                lambda: ssl.get_server_certificate((host, int(port))))
            assert load_pem_chain(pem_now.encode())[0].serial_number != before
            n.cancel_scope.cancel()

    trio.run(main)
    assert tlsconn.hypercorn_run.TCPServer is tlsconn.ChainTCPServer
