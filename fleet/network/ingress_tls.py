"""TLS termination for the built-in ingress proxy: one SSLContext per certificate, chosen by SNI.

An HTTPS listener's connection starts with the context of the listener's certificate
for "no server name" (what a client without SNI gets); OpenSSL's servername callback
then swaps the SSLObject's context for the one `Listener.certificate_for(name)` picks
from the table in force at that moment, so a certificate change applies to the next
handshake without reopening the port.

Contexts are cached per `Certificate` (a frozen dataclass: equal PEMs share a context),
and the cache is pruned to the certificates of the newest table on every apply.
ssl.SSLContext.load_cert_chain reads only files, so the PEMs pass through a private
temporary file that is removed straight away.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable

from fleet.network.routetable import Certificate, Listener, RouteTable


class TlsContexts:
    """SSLContexts for the listeners of the table in force (`listener_of(port)`)."""

    def __init__(self, listener_of: Callable[[int], Listener | None]) -> None:
        self._listener_of = listener_of
        self._cache: dict[tuple[int, Certificate | None], ssl.SSLContext] = {}

    def context_for(self, port: int, cert: Certificate | None) -> ssl.SSLContext:
        key = (port, cert)
        ctx = self._cache.get(key)
        if ctx is None:
            ctx = self._make(port, cert)
            self._cache[key] = ctx
        return ctx

    def initial(self, port: int) -> ssl.SSLContext:
        """The context a new connection starts with: the certificate for no SNI name."""
        lst = self._listener_of(port)
        return self.context_for(port, lst.certificate_for(None) if lst is not None else None)

    def prune(self, table: RouteTable) -> None:
        """Forget contexts whose (port, certificate) the table no longer has."""
        keep: set[tuple[int, Certificate | None]] = set()
        for lst in table.listeners:
            for cert in (*lst.certificates, lst.default_certificate, None):
                keep.add((lst.port, cert))
        for key in list(self._cache):
            if key not in keep:
                del self._cache[key]

    def _make(self, port: int, cert: Certificate | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.set_alpn_protocols(["http/1.1"])
        if cert is not None:
            load_pem_chain(ctx, cert.cert_pem, cert.key_pem)

        def on_sni(sslobj: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> int | None:
            lst = self._listener_of(port)
            if lst is None:
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            chosen = lst.certificate_for(server_name)
            if chosen is None:
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            if chosen != cert:
                sslobj.context = self.context_for(port, chosen)
            return None

        ctx.sni_callback = on_sni
        return ctx


def load_pem_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """load_cert_chain from memory (a 0600 temporary file, deleted at once)."""
    fd, path = tempfile.mkstemp(prefix="fleet-ingress-", suffix=".pem",
                                dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem.rstrip(b"\n") + b"\n" + cert_pem)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
