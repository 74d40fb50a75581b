"""Webhook calls reuse pooled, kept-alive connections (one client per caBundle)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from fleet.admission.webhook import WebhookClients, call_webhook
from fleet.testing.oidc import loopback_tls
from fleet.testing.webhook import WebhookServer, review_response


def _hook(srv: WebhookServer, ca: Path) -> dict[str, Any]:
    return {"name": "pool.example.com", "timeoutSeconds": 5,
            "clientConfig": {"url": srv.url("/v"),
                             "caBundle": base64.b64encode(ca.read_bytes()).decode()}}


def _review(uid: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": uid}}


async def test_pooled_calls_share_one_connection(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "hook")
    with WebhookServer(cert, key, lambda _p, r: review_response(r, allowed=True)) as srv:
        hook = _hook(srv, ca)
        clients = WebhookClients()
        try:
            for i in range(3):
                assert b'"allowed": true' in await call_webhook(None, hook, _review(f"u{i}"),  # type: ignore[arg-type]
                                                                clients=clients)
        finally:
            await clients.aclose()
        pooled = list(srv.peers)
        for i in range(2):  # without a pool, every call is a connection of its own
            await call_webhook(None, hook, _review(f"v{i}"))  # type: ignore[arg-type]
    assert len(pooled) == 3 and len(set(pooled)) == 1, pooled
    assert len(set(srv.peers[3:])) == 2, srv.peers


async def test_least_recently_used_client_is_closed(tmp_path: Path) -> None:
    bundles = [base64.b64encode(loopback_tls(tmp_path, f"t{i}")[0].read_bytes()).decode() for i in range(2)]
    clients = WebhookClients(size=2)
    system = await clients.get(None)
    first = await clients.get(bundles[0])
    assert await clients.get(None) is system  # used again: now the most recent
    await clients.get(bundles[1])  # a third trust: the least recently used (bundles[0]) goes
    assert first.is_closed and not system.is_closed
    assert await clients.get(bundles[0]) is not first
    await clients.aclose()
    assert system.is_closed
