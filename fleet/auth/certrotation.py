"""Keeping TLS material current while the cluster runs.

* `LiveTLS`: one `ssl.SSLContext` in use (a component's client context, the API
  server's context for calling agents, an agent's serving context) together with
  the certificate it presents and where a fresh one comes from.  `refresh` loads a
  new certificate into the *same* context once the old one is due
  (`fleet.auth.pki.renewal_due`: 2/3 of its life, or a superseded CA) and adds CAs
  that appeared in the trust bundle, so every new connection uses them with no
  restart and nothing to re-wire.
* `CertRotator`: the server's loop (a `Security.tasks` entry).  Each tick re-reads
  the PKI (a `fleet certs rotate` run from the CLI shows up here), re-issues the
  on-disk leaves that are due (`ClusterPKI.refresh`), tells the listeners (serving
  certificate reload, admin.kubeconfig) and refreshes every registered `LiveTLS`.
* `component_client_config`: a `ClientConfig` for a built-in component with its
  own identity (a fresh client certificate, renewed by the rotator).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import tempfile
from collections.abc import Callable

import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from fleet.auth.pki import ClusterPKI, load_pem_chain, now_utc, renewal_due
from fleet.client import ClientConfig

log = logging.getLogger(__name__)

Source = Callable[[], tuple[bytes, bytes]]
_SHA256 = hashes.SHA256()


def load_chain_into(ctx: ssl.SSLContext, chain_pem: bytes, key_pem: bytes) -> None:
    """`ctx.load_cert_chain` from memory (ssl reads only files: a private temp dir)."""
    with tempfile.TemporaryDirectory(prefix="fleet-tls-") as tmp:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        for path, data in ((cert, chain_pem), (key, key_pem)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert, key)


class LiveTLS:
    """An SSLContext kept current (module docstring).  `issuer` gives the CA that
    should have signed the certificate now; `trust` the CA bundle to verify peers
    with (None: the context's trust is not managed)."""

    def __init__(self, name: str, ctx: ssl.SSLContext, source: Source,
                 issuer: Callable[[], x509.Certificate], trust: Callable[[], bytes] | None = None,
                 on_renew: Callable[[bytes, bytes], None] | None = None) -> None:
        self.name, self.ctx, self.source, self.issuer, self.trust = name, ctx, source, issuer, trust
        self.on_renew = on_renew
        self.cert: x509.Certificate | None = None
        self._trusted: set[bytes] = set()
        self.renewals = 0

    def load(self) -> None:
        chain, key = self.source()
        load_chain_into(self.ctx, chain, key)
        self.cert = load_pem_chain(chain)[0]
        if self.on_renew is not None:
            self.on_renew(chain, key)

    def refresh(self, now: dt.datetime | None = None, *, force: bool = False) -> bool:
        """Grow the trust, renew the certificate if due; True if it was renewed."""
        if self.trust is not None:
            bundle = self.trust()
            new = [c for c in load_pem_chain(bundle) if c.fingerprint(_SHA256) not in self._trusted]
            if new:
                self.ctx.load_verify_locations(cadata=bundle.decode())
                self._trusted |= {c.fingerprint(_SHA256) for c in new}
        if force or self.cert is None or renewal_due(self.cert, now or now_utc(), self.issuer()):
            self.load()
            self.renewals += 1
            log.info("renewed the %s certificate (valid until %s)", self.name,
                     self.cert.not_valid_after_utc if self.cert else "?")
            return True
        return False


def client_context(trust: bytes | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if trust:
        ctx.load_verify_locations(cadata=trust.decode())
    return ctx


class CertRotator:
    """The server's certificate loop (module docstring)."""

    def __init__(self, pki: ClusterPKI, interval: float | None = None) -> None:
        self.pki = pki
        lifetime = pki.leaf_lifetime.total_seconds()
        self.interval = interval if interval is not None else max(0.5, min(30.0, lifetime / 20))
        self.live: list[LiveTLS] = []
        self.listeners: list[Callable[[], None]] = []

    def add(self, live: LiveTLS) -> LiveTLS:
        live.refresh()
        self.live.append(live)
        return live

    def on_change(self, fn: Callable[[], None]) -> None:
        """Call `fn` whenever an on-disk leaf or a CA bundle changed."""
        self.listeners.append(fn)

    def tick(self, now: dt.datetime | None = None) -> bool:
        before = self.pki.fingerprint()
        renewed = self.pki.refresh(now=now)
        changed = bool(renewed) or self.pki.fingerprint() != before
        if renewed:
            log.info("renewed certificates: %s", ", ".join(renewed))
        if changed:
            for fn in self.listeners:
                fn()
        for live in list(self.live):
            try:
                live.refresh(now)
            except (OSError, ssl.SSLError, ValueError) as e:
                log.warning("renewing the %s certificate failed: %s", live.name, e)
        return changed

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            self.tick()

    # ----------------------------------------------------------------- helpers

    def client_tls(self, name: str, user: str, groups: list[str] | tuple[str, ...]) -> LiveTLS:
        """A client context for `user` trusting the server CA bundle, kept current."""
        pki = self.pki
        return self.add(LiveTLS(name, client_context(), lambda: pki.issue_client_cert(user, groups),
                                lambda: pki.ca("client").cert, pki.server_ca_bundle_pem))


def component_client_config(pki: ClusterPKI, url: str, user: str, groups: list[str] | tuple[str, ...],
                            rotator: CertRotator | None = None) -> ClientConfig:
    """A ClientConfig authenticating as `user` in `groups` with a fresh client
    certificate (renewed by `rotator` when given)."""
    if rotator is not None:
        live = rotator.client_tls(user, user, groups)
        ctx = live.ctx
    else:
        ctx = client_context(pki.server_ca_bundle_pem())
        load_chain_into(ctx, *pki.issue_client_cert(user, groups))
    return ClientConfig(server=url, ca_data=pki.server_ca_bundle_pem(), ssl_context=ctx)



class PKIServingSource:
    """The built-in agent's serving certificates, issued by the server CA directly
    (fleet/agent/tls.py `ServingSource`); a joined node gets its own by CSR."""

    def __init__(self, pki: ClusterPKI, node_name: str) -> None:
        self.pki, self.node_name = pki, node_name

    def issue(self, names: list[str]) -> tuple[bytes, bytes]:
        return self.pki.issue_serving_cert(names, f"system:node:{self.node_name}")

    def due(self, cert: x509.Certificate, now: dt.datetime) -> bool:
        return renewal_due(cert, now, self.pki.ca("server").cert)

    def client_ca_bundle(self) -> bytes:
        return self.pki.client_ca_bundle_pem()
