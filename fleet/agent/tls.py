"""The agent API's TLS: its serving certificate and who may call it.

Like the kubelet's port 10250, the agent API serves HTTPS with a certificate
issued by the cluster's server CA (so the API server verifies the node it talks
to) and authenticates callers by client certificate against the cluster's
client CA bundle (kubelet's --client-ca-file).  Only the API server calls it:
its certificate (CN=fleet-apiserver-kubelet-client) is in `system:masters`, and a
caller with a valid certificate outside that group is refused (403), a bad or
unknown certificate is a 401.  A bearer token (`fleet agent --token`) is still
accepted when the agent was given one and the request has no certificate: the
path of remote agents started before node join existed.

Where the certificate comes from is a `ServingSource`: the built-in agent's is the
server's PKI (issued directly); a joined node's is a `FileSource` over the
kubelet-serving certificate its CSR obtained and the client CA bundle the server
publishes (fleet/agent/bootstrap.py keeps both files current); and
`fleet agent --tls-cert-file/--tls-private-key-file/--client-ca-file` reads files
(reloaded when they change).  The listener keeps one SSL context, so a renewed
certificate serves new connections at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import trio
from cryptography import x509

from fleet.auth import SYSTEM_MASTERS, AuthenticationError, UserInfo
from fleet.auth.pki import load_pem_chain, needs_renewal, write_private
from fleet.auth.x509 import X509Authenticator
from fleet.server.tlsconn import TLSConfig

log = logging.getLogger(__name__)


class ServingSource(Protocol):
    def issue(self, names: list[str]) -> tuple[bytes, bytes]:
        """(certificate chain PEM, key PEM) for the agent's names and addresses."""
        ...

    def due(self, cert: x509.Certificate, now: dt.datetime) -> bool:
        """Whether `cert` should be replaced now."""
        ...

    def client_ca_bundle(self) -> bytes:
        """The CAs whose client certificates may call the agent (PEM)."""
        ...


class FileSource:
    """Certificate, key and client CA bundle from files (re-read when they change)."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None) -> None:
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self._mtimes: tuple[float, ...] = ()

    def _stat(self) -> tuple[float, ...]:
        return tuple(os.stat(p).st_mtime for p in (self.cert_file, self.key_file) if p)

    def issue(self, names: list[str]) -> tuple[bytes, bytes]:
        self._mtimes = self._stat()
        return Path(self.cert_file).read_bytes(), Path(self.key_file).read_bytes()

    def due(self, cert: x509.Certificate, now: dt.datetime) -> bool:
        try:
            return self._stat() != self._mtimes
        except OSError:
            return False

    def client_ca_bundle(self) -> bytes:
        return Path(self.client_ca_file).read_bytes() if self.client_ca_file else b""


def decide(user: UserInfo | None, token_ok: bool) -> int:
    """The agent's authorization (pure): 0 = allowed, else the HTTP status to refuse
    with.  Certificate users must be in system:masters (the API server's identity)."""
    if user is not None:
        return 0 if SYSTEM_MASTERS in user.groups else 403
    return 0 if token_ok else 401


class AgentTLS:
    """The agent API's live TLS settings (module docstring)."""

    def __init__(self, source: ServingSource, state_dir: Path, names: list[str] | None = None,
                 check_interval: float = 30.0) -> None:
        self.source = source
        self.dir = Path(state_dir)
        self.names = list(names or [])
        self.check_interval = check_interval
        self.config = TLSConfig()
        self.cert: x509.Certificate | None = None
        self.authenticator = X509Authenticator(self._bundle)
        self._bundle_pem = b""
        self._bundle_certs: list[x509.Certificate] = []

    def _bundle(self) -> Sequence[x509.Certificate]:
        pem = self.source.client_ca_bundle()
        if pem != self._bundle_pem:
            self._bundle_pem, self._bundle_certs = pem, load_pem_chain(pem)
        return self._bundle_certs

    @property
    def cert_file(self) -> Path:
        return self.dir / "agent-serving.crt"

    @property
    def key_file(self) -> Path:
        return self.dir / "agent-serving.key"

    def set_certificate(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve this certificate (chain PEM) and key from now on, to new connections."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(self.key_file, key_pem)
        write_private(self.cert_file, cert_pem)
        self.cert = load_pem_chain(cert_pem)[0]
        self.config.reload(str(self.cert_file), str(self.key_file))

    def start(self, names: list[str]) -> TLSConfig:
        """Issue the first certificate for `names`; the config for the listener."""
        self.names = list(dict.fromkeys(names))
        self.config.client_ca_fallback = self.source.client_ca_bundle() or None
        self.set_certificate(*self.source.issue(self.names))
        return self.config

    def authenticate(self, peer_certs: Sequence[bytes]) -> UserInfo | None:
        """The caller's certificate user, None without one; AuthenticationError if bad."""
        return self.authenticator.verify(peer_certs)

    def check(self, now: dt.datetime | None = None) -> bool:
        now = now or dt.datetime.now(dt.UTC)
        if self.cert is None:
            return False
        if self.source.due(self.cert, now) or needs_renewal(
                self.cert.not_valid_before_utc, self.cert.not_valid_after_utc, now):
            self.set_certificate(*self.source.issue(self.names))
            log.info("agent API serving certificate renewed (valid until %s)",
                     self.cert.not_valid_after_utc)
            return True
        return False

    async def run(self) -> None:
        """Renew the serving certificate when due, for as long as the agent runs."""
        while True:
            await trio.sleep(self.check_interval)
            try:
                self.check()
            except (OSError, ValueError) as e:
                log.warning("renewing the agent API serving certificate failed: %s", e)


def authorize_request(tls: AgentTLS | None, peer_certs: Sequence[bytes],
                      token_ok: Callable[[], bool]) -> int:
    """0 if the request may proceed, else 401/403 (see `decide`)."""
    user = None
    if tls is not None and peer_certs:
        try:
            user = tls.authenticate(peer_certs)
        except AuthenticationError as e:
            log.info("agent API: client certificate refused: %s", e)
            return 401
    return decide(user, token_ok())
