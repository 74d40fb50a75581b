"""An admission webhook server for end-to-end tests: HTTPS on 127.0.0.1 with a test CA.

`make_tls(tmp, dns_names)` makes a CA and a certificate for 127.0.0.1 (and the DNS
names given, e.g. a Service's `<svc>.<ns>.svc`) with `cryptography`, and returns the
CA PEM (a webhook configuration's `caBundle`) and a server SSL context.
`WebhookServer(ctx, answer)` serves it (threading `http.server`): every POST body is
decoded as an AdmissionReview, kept in `reviews` (with the URL path), and answered
with the bytes `answer(path, review)` returns.  Used by
tests/e2e/test_admission_webhooks.py (well-behaved and failing webhooks) and
tests/e2e/test_fuzz_webhooks.py (hostile ones).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import ssl
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Answer = Callable[[str, dict[str, Any]], bytes]


def _cert(subject: str, key: Any, issuer: x509.Name, issuer_key: Any, *, ca: bool,
          dns_names: Sequence[str] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                         *(x509.DNSName(n) for n in dns_names)]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_tls(tmp: Path, dns_names: Sequence[str] = ()) -> tuple[bytes, ssl.SSLContext]:
    """(CA PEM, server context for 127.0.0.1 and `dns_names`)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook-test-ca")])
    ca = _cert("webhook-test-ca", ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("127.0.0.1", key, ca_name, ca_key, ca=False, dns_names=dns_names)
    (tmp / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    return ca.public_bytes(serialization.Encoding.PEM), ctx


class WebhookServer:
    def __init__(self, ctx: ssl.SSLContext, answer: Answer) -> None:
        self.reviews: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.reviews.append({"path": self.path, **review})
                body = answer(self.path, review)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
