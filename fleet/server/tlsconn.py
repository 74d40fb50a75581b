"""TLS listeners that ask for a client certificate without verifying it, and hand the
chain the client sent to the application (the ASGI TLS extension).

kube-apiserver asks every TLS client for a certificate and verifies it only in
its x509 authenticator, so a bad certificate is a 401 (with the reason in the
log), not a failed handshake, and a client without one still gets to present a
bearer token.  Python's `ssl` has no such mode (CERT_OPTIONAL verifies what is
sent), so `request_client_cert` sets OpenSSL's own verify mode and a callback
that accepts everything on the context (`SSL_CTX_set_verify` through ctypes; the
`SSL_CTX *` sits right after PyObject_HEAD in `_ssl._SSLContext`).  It checks
itself before and after (the pointer must give back the context's options and
verify mode); if anything is off it falls back to CERT_OPTIONAL with the client
CA bundle (valid certificates still authenticate; others fail the handshake)
and logs a warning.

`TLSConfig` is a hypercorn Config whose SSL context is built once and kept, so
`load_cert_chain` on it (`reload`) serves a renewed certificate to new
connections without a restart.  `ChainTCPServer` (installed into hypercorn's trio
worker by `enable`) reads the peer chain after the handshake and puts it into
each request's scope as `scope["extensions"]["tls"]["client_cert_chain"]` (PEM,
leaf first) — what `scope_peer_certs(scope)` below reads.  A connection
whose client certificate expires is closed then: the client reconnects with its
renewed certificate instead of sending requests that would be refused.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import logging
import math
import ssl
from typing import Any

import hypercorn.trio.run as hypercorn_run
import trio
from cryptography import x509
from hypercorn.config import Config as HyperConfig
from hypercorn.trio.tcp_server import TCPServer

log = logging.getLogger(__name__)

SSL_VERIFY_NONE = 0
SSL_VERIFY_PEER = 1
SSL_VERIFY_FAIL_IF_NO_PEER_CERT = 2

_VERIFY_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


@_VERIFY_CB
def _accept_any(preverify_ok: int, store_ctx: int | None) -> int:
    return 1


def _libssl() -> ctypes.CDLL:
    lib = ctypes.CDLL(ssl._ssl.__file__)  # type: ignore[attr-defined]
    lib.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VERIFY_CB]
    lib.SSL_CTX_set_verify.restype = None
    lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
    lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
    lib.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
    lib.SSL_CTX_get_options.restype = ctypes.c_uint64
    return lib


def _ssl_ctx_ptr(ctx: ssl.SSLContext) -> int | None:
    return ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value


def request_client_cert(ctx: ssl.SSLContext, fallback_cadata: bytes | None = None) -> bool:
    """Make a server context ask for a client certificate and accept any (see the module
    docstring).  False (and CERT_OPTIONAL with `fallback_cadata`) if that cannot be done."""
    try:
        lib = _libssl()
        ptr = _ssl_ctx_ptr(ctx)
        if not ptr:
            raise RuntimeError("no SSL_CTX pointer")
        # Self-check before writing anything: the pointer must be this context's.
        if (lib.SSL_CTX_get_options(ptr) & 0xFFFFFFFFFFFFFFFF) != (int(ctx.options) & 0xFFFFFFFFFFFFFFFF):
            raise RuntimeError("SSL_CTX options do not match the context's")
        if lib.SSL_CTX_get_verify_mode(ptr) != SSL_VERIFY_NONE or ctx.verify_mode != ssl.CERT_NONE:
            raise RuntimeError("the context already verifies peers")
        lib.SSL_CTX_set_verify(ptr, SSL_VERIFY_PEER, _accept_any)
        if lib.SSL_CTX_get_verify_mode(ptr) != SSL_VERIFY_PEER or ctx.verify_mode != ssl.CERT_OPTIONAL:
            raise RuntimeError("the verify mode did not take")
        return True
    except (OSError, AttributeError, RuntimeError, ValueError) as e:
        log.warning("cannot request client certificates without verifying them (%s): "
                    "verifying them in the TLS handshake against the client CA instead", e)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        if fallback_cadata:
            ctx.load_verify_locations(cadata=fallback_cadata.decode())
        return False


def peer_chain_pem(stream: Any) -> list[str]:
    """The certificate chain the TLS peer sent (PEM, leaf first); [] without one.

    `SSLObject` has no public accessor for the unverified chain before 3.13; the
    C object under it (`_sslobj.get_unverified_chain`, 3.10+) has.  Without it the
    leaf alone (`getpeercert(binary_form=True)`)."""
    obj = getattr(stream, "_ssl_object", None)
    if obj is None:
        return []
    inner = getattr(obj, "_sslobj", None)
    getter = getattr(inner, "get_unverified_chain", None)
    if getter is not None:
        try:
            chain = getter() or []
            return [c.public_bytes(ssl._ssl.ENCODING_PEM) for c in chain]  # type: ignore[attr-defined]
        except (ValueError, ssl.SSLError, AttributeError):
            pass
    der = obj.getpeercert(binary_form=True)
    return [ssl.DER_cert_to_PEM_cert(der)] if der else []


class TLSConfig(HyperConfig):
    """A hypercorn Config whose SSL context is made once, asks for (and does not verify)
    client certificates, and can load a renewed certificate (`reload`)."""

    client_ca_fallback: bytes | None = None
    _ctx: ssl.SSLContext | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        if self._ctx is None:
            enable()
            ctx = super().create_ssl_context()
            if ctx is None:
                return None
            request_client_cert(ctx, self.client_ca_fallback)
            self._ctx = ctx
            setattr(self, CONFIG_ATTR, True)
        return self._ctx

    def reload(self, certfile: str, keyfile: str) -> None:
        """Serve this certificate to new connections (existing ones keep theirs)."""
        self.certfile, self.keyfile = certfile, keyfile
        if self._ctx is not None:
            self._ctx.load_cert_chain(certfile, keyfile)


CONFIG_ATTR = "fleet_client_cert_chain"


class _WithChain:
    """The connection's app: every scope gets the TLS extension with the peer chain."""

    def __init__(self, app: Any, chain: list[str]) -> None:
        self.app, self.chain = app, chain

    async def __call__(self, scope: dict[str, Any], *args: Any) -> Any:
        ext = scope.setdefault("extensions", {})
        ext.setdefault("tls", {})["client_cert_chain"] = list(self.chain)
        return await self.app(scope, *args)


def _not_after(pem: str) -> dt.datetime | None:
    try:
        return x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc
    except ValueError:
        return None


class ChainTCPServer(TCPServer):
    """hypercorn's trio connection handler, plus the peer chain in the scope."""

    async def run(self) -> None:
        if not getattr(self.config, CONFIG_ATTR, False) or not isinstance(self.stream, trio.SSLStream):
            await super().run()
            return
        try:
            with trio.fail_after(self.config.ssl_handshake_timeout):
                await self.stream.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError):
            await trio.aclose_forcefully(self.stream)
            return
        chain = peer_chain_pem(self.stream)
        deadline = math.inf
        if chain:
            self.app = _WithChain(self.app, chain)  # type: ignore[assignment]
            not_after = _not_after(chain[0])
            now = dt.datetime.now(dt.UTC)
            if not_after is not None and not_after > now:
                deadline = trio.current_time() + (not_after - now).total_seconds()
        with trio.move_on_at(deadline):
            await super().run()  # the handshake is done: do_handshake returns at once
        if deadline != math.inf:
            await trio.aclose_forcefully(self.stream)


def scope_peer_certs(scope: dict[str, Any]) -> tuple[bytes, ...]:
    """The client certificate chain (DER, leaf first) a request's scope carries."""
    chain = ((scope.get("extensions") or {}).get("tls") or {}).get("client_cert_chain") or ()
    return tuple(ssl.PEM_cert_to_DER_cert(c) if isinstance(c, str) else bytes(c) for c in chain)


def enable() -> None:
    """Install ChainTCPServer into hypercorn's trio worker (it changes nothing for
    listeners whose config is not a TLSConfig)."""
    hypercorn_run.TCPServer = ChainTCPServer  # type: ignore[misc]
