"""A throwaway OpenID Connect provider on loopback, for tests of OIDC authentication.

`OIDCProvider()` (a context manager) makes a CA and a serving certificate for
127.0.0.1, and serves over HTTPS, from a thread:

* `/.well-known/openid-configuration` (issuer = `provider.issuer`, jwks_uri), and
* `/keys`, the JSON Web Key Set of its current signing keys.

`provider.token(**claims)` signs an ID token (iss, aud, iat, exp filled in unless
given); `provider.rotate()` replaces the signing key (new kid) and publishes only
the new one; `provider.ca_file` is what `--oidc-ca-file` should name.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from jwt.algorithms import RSAAlgorithm


def _cert(subject: str, key: Any, issuer_key: Any, issuer_name: x509.Name | None, *, ca: bool,
          dns_names: tuple[str, ...] = ()) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        b = b.add_extension(x509.SubjectAlternativeName(sans + [x509.DNSName(n) for n in dns_names]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def loopback_tls(directory: Path, name: str, *, dns_names: tuple[str, ...] = ()) -> tuple[Path, Path, Path]:
    """A fresh test CA and a server certificate for 127.0.0.1 (and `dns_names`) signed by
    it, written to `directory` as `<name>-ca.crt`, `<name>.crt`, `<name>.key`: (ca, cert,
    key) files."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _cert(f"fleet-test-{name}-ca", ca_key, ca_key, None, ca=True)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv_cert = _cert("127.0.0.1", srv_key, ca_key, ca_cert.subject, ca=False, dns_names=dns_names)
    ca_file = directory / f"{name}-ca.crt"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(srv_cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(srv_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return ca_file, cert_file, key_file


class OIDCProvider:
    """See the module docstring."""

    def __init__(self, directory: Path, *, client_id: str = "fleet") -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.client_id = client_id
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "key-1"
        self._serial = 1
        self.published: list[tuple[str, Any]] = [(self.kid, self.key.public_key())]
        # A discovery document with another issuer (to test the issuer check), when set.
        self.advertised_issuer: str | None = None
        self.ca_file, cert_file, key_file = loopback_tls(self.dir, "oidc")
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with provider._lock:
                    provider.requests.append(self.path)
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": provider.advertised_issuer or provider.issuer,
                            "jwks_uri": provider.issuer + "/keys",
                            "id_token_signing_alg_values_supported": ["RS256"]}
                elif self.path == "/keys":
                    body = provider.jwks()
                else:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.issuer = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="oidc-provider", daemon=True)

    def __enter__(self) -> OIDCProvider:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def jwks(self) -> dict[str, Any]:
        with self._lock:
            published = list(self.published)
        keys = []
        for kid, pub in published:
            k = RSAAlgorithm.to_jwk(pub, as_dict=True)
            keys.append({**k, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": keys}

    def rotate(self, *, keep_old: bool = False) -> str:
        """A new signing key (returns its kid); the old one stays published if `keep_old`."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        with self._lock:
            self._serial += 1
            self.key, self.kid = key, f"key-{self._serial}"
            self.published = ([*self.published] if keep_old else []) + [(self.kid, key.public_key())]
        return self.kid

    def key_fetches(self) -> int:
        with self._lock:
            return sum(1 for p in self.requests if p == "/keys")

    def token(self, *, key: Any = None, kid: str | None = None, algorithm: str = "RS256",
              **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.issuer, "aud": self.client_id, "iat": now, "exp": now + 600, **claims}
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, key if key is not None else self.key, algorithm=algorithm,
                          headers={"kid": kid or self.kid})
