"""The HTTPS webhook client shared by admission webhooks and CRD conversion webhooks.

kube-apiserver calls both kinds of webhook through one client manager
(k8s.io/apiserver/pkg/util/webhook); this module is Fleet's one copy of it, used by
fleet/admission/webhook.py (AdmissionReview) and fleet/server/conversion_webhook.py
(ConversionReview):

- a `clientConfig` (`url`, or `service` namespace/name/path/port, and `caBundle`) is
  POSTed to over HTTPS with `post`, verified with the `caBundle` (or the system roots when
  there is none);
- clients are pooled per trust (`WebhookClients`, one per caBundle), so calls reuse
  kept-alive connections instead of paying a TCP and TLS handshake each, as kube's
  client manager keeps its clients;
- a `service` reference is resolved to one of the Service's ready *endpoints* (its
  Endpoints object), not to its ClusterIP: the API server runs on the host, where a
  ClusterIP only works if this host's agent has programmed the service rules, while
  endpoint addresses are reachable from the host whenever the pod network is.  The TLS
  name checked is `<service>.<namespace>.svc`, as kube-apiserver checks it, so the
  webhook's certificate is the same one it would present in Kubernetes;
- failures are `CallError`s worded as Go's net/http and crypto/tls word them (what
  kube-apiserver's messages carry); each caller decides what a failed call means.
"""

from __future__ import annotations

import base64
import functools
import socket
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from fleet.admission.webhook_review import CallError
from fleet.api import meta
from fleet.store import KeyNotFound, Store

# async (service reference) -> (ip, port) of a ready endpoint; raises CallError.
ServiceResolver = Callable[[dict[str, Any]], Awaitable[tuple[str, int]]]


@functools.lru_cache(maxsize=64)
def _ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    """A client context trusting `ca_bundle` (base64 PEM) or the system roots; cached, since
    loading roots costs milliseconds and every call of a webhook uses the same one."""
    if ca_bundle:
        try:
            pem = base64.b64decode(ca_bundle, validate=True).decode()
        except (ValueError, UnicodeDecodeError) as e:
            raise CallError(f"invalid caBundle: {e}") from None
        try:
            return ssl.create_default_context(cadata=pem)
        except ssl.SSLError as e:
            raise CallError(f"invalid caBundle: {e}") from None
    return ssl.create_default_context()


class WebhookClients:
    """Pooled HTTPS clients, one per trust (caBundle; None = the system roots), kept for
    the server's life so connections to a webhook stay open between calls.  At most
    `size` clients: the least recently used one is closed when a new trust needs room.
    Owned by one server's plugins (connections belong to the Trio run that opened them)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._clients: OrderedDict[str | None, httpx.AsyncClient] = OrderedDict()

    async def get(self, ca_bundle: str | None) -> httpx.AsyncClient:
        client = self._clients.get(ca_bundle)
        if client is not None:
            self._clients.move_to_end(ca_bundle)
            return client
        client = httpx.AsyncClient(verify=_ssl_context(ca_bundle),
                                   limits=httpx.Limits(keepalive_expiry=30.0))
        self._clients[ca_bundle] = client
        while len(self._clients) > self.size:
            _, old = self._clients.popitem(last=False)
            await old.aclose()
        return client

    async def aclose(self) -> None:
        while self._clients:
            _, client = self._clients.popitem()
            await client.aclose()


async def resolve_service(store: Store, svc: dict[str, Any]) -> tuple[str, int]:
    """A ready endpoint (ip, port) of the referenced Service, for its `port`."""
    ns, name, port = svc.get("namespace", ""), svc.get("name", ""), int(svc.get("port") or 443)
    try:
        service = await store.get(meta.store_key("", "services", ns, name))
    except KeyNotFound:
        raise CallError(f'service "{name}" not found') from None
    target: Any = port
    port_name = ""
    for p in (service.get("spec") or {}).get("ports") or []:
        if p.get("port") == port:
            target, port_name = p.get("targetPort", port), p.get("name") or ""
            break
    else:
        raise CallError(f'service "{name}" has no port {port}')
    try:
        eps = await store.get(meta.store_key("", "endpoints", ns, name))
    except KeyNotFound:
        raise CallError(f'endpoints "{name}" not found') from None
    for subset in eps.get("subsets") or []:
        addrs = subset.get("addresses") or []
        if not addrs:
            continue
        num = None
        for p in subset.get("ports") or []:
            if (p.get("name") or "") == port_name or len(subset.get("ports") or []) == 1:
                num = p.get("port")
                break
        if num is None and isinstance(target, int):
            num = target
        if num is not None and addrs[0].get("ip"):
            return addrs[0]["ip"], int(num)
    raise CallError(f'service "{ns}/{name}" has no ready endpoints')


def _deepest(e: BaseException) -> BaseException:
    """The root cause: follow __cause__/__context__ and the first member of exception groups."""
    seen: set[int] = set()
    cur = e
    while id(cur) not in seen:
        seen.add(id(cur))
        nxt = cur.__cause__ or cur.__context__
        if isinstance(cur, BaseExceptionGroup) and cur.exceptions:
            nxt = cur.exceptions[0]
        if nxt is None:
            break
        cur = nxt
    return cur


def describe(e: BaseException, host: str, port: int) -> str:
    """Why a call failed, worded as Go's net/http and crypto/tls word it (what
    kube-apiserver's message carries); the root cause's own text otherwise."""
    root = _deepest(e)
    if isinstance(root, ConnectionRefusedError):
        return f"dial tcp {host}:{port}: connect: connection refused"
    if isinstance(root, socket.gaierror):
        return f"dial tcp: lookup {host}: no such host"
    if isinstance(root, ssl.SSLCertVerificationError):
        return f"tls: failed to verify certificate: {root.verify_message or root.reason}"
    return str(root) or str(e) or type(root).__name__


def target(client_config: dict[str, Any], address: tuple[str, int] | None) -> tuple[str, dict[str, Any]]:
    """(url, httpx request extensions) of a clientConfig; `address` is the resolved endpoint
    of a `service` reference (None for a `url`)."""
    if client_config.get("url") or address is None:
        return str(client_config.get("url") or ""), {}
    svc = client_config.get("service") or {}
    ip, port = address
    host = f"[{ip}]" if ":" in ip else ip
    # Verify the certificate for the Service's DNS name, as kube-apiserver does.
    return (f"https://{host}:{port}{svc.get('path') or ''}",
            {"sni_hostname": f"{svc.get('name')}.{svc.get('namespace')}.svc"})


async def post(client_config: dict[str, Any], body: dict[str, Any], *, timeout: float,
               resolve: ServiceResolver | None = None,
               clients: WebhookClients | None = None) -> httpx.Response:
    """POST `body` as JSON to the webhook `client_config` names; its response, whatever the
    status code.  Raises CallError (transport, TLS, timeout, an unresolvable service).
    With `clients`, the call reuses that pool's client for the caBundle (and its open
    connections); without, it opens and closes a client of its own."""
    ctx = _ssl_context(client_config.get("caBundle"))
    address = None
    if not client_config.get("url"):
        if resolve is None:
            raise CallError("service references cannot be resolved here")
        address = await resolve(client_config.get("service") or {})
    url, extensions = target(client_config, address)
    headers = {"Accept": "application/json"}
    try:
        with trio.fail_after(timeout):
            if clients is not None:
                client = await clients.get(client_config.get("caBundle"))
                return await client.post(url, json=body, extensions=extensions, timeout=timeout,
                                         headers=headers)
            async with httpx.AsyncClient(verify=ctx, timeout=timeout) as own:
                return await own.post(url, json=body, extensions=extensions, headers=headers)
    except trio.TooSlowError:
        raise CallError("context deadline exceeded") from None
    except httpx.TimeoutException:
        raise CallError("context deadline exceeded") from None
    except (httpx.HTTPError, OSError, ssl.SSLError) as e:
        u = httpx.URL(url) if url else None
        where = describe(e, u.host, u.port or 443) if u is not None else str(e)
        raise CallError(f'Post "{url}": {where}') from None
