"""A throwaway admission webhook on loopback, for tests and benchmarks of dynamic admission.

`WebhookServer(cert_file, key_file, answer)` serves HTTPS on 127.0.0.1 (an ephemeral
port, `.port`) from threads (`http.server`): every POSTed AdmissionReview is kept in
`.reviews` (with the URL path it came to) and answered by `answer(path, review)` — a
dict sent as JSON, or bytes sent as they are (to answer garbage), with status 200; a
`(status, dict | bytes)` pair answers with that status.  The server serves any review
kind (AdmissionReview, ConversionReview).  Its certificate comes
from `fleet.testing.oidc.loopback_tls`; the configurations carry that CA as their
`caBundle`.

`configmap_hook(...)` is one webhook entry of a Mutating/ValidatingWebhookConfiguration
for ConfigMap creates and updates in one namespace only (a namespaceSelector on
`kubernetes.io/metadata.name`), so tests and benchmarks sharing a server never see each
other's webhooks.  `review_response(review, **fields)` wraps a decision in the
AdmissionReview a webhook answers with; `json_patch(ops)` is the patch fields of a
mutating answer.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

API = "admissionregistration.k8s.io/v1"

Answer = Callable[[str, dict[str, Any]], "dict[str, Any] | bytes | tuple[int, dict[str, Any] | bytes]"]


class WebhookServer:
    """See the module docstring.  Started on construction; `close()` (or leaving the
    `with` block) stops it."""

    def __init__(self, cert_file: Path, key_file: Path, answer: Answer) -> None:
        self.reviews: list[dict[str, Any]] = []
        # The client (address, port) of each review, in order: one per connection reused.
        self.peers: list[tuple[str, int]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real webhook server offers
            # The head and the body go out as two writes: without TCP_NODELAY the body
            # waits for the client's delayed ACK of the head (40 ms on Linux).
            disable_nagle_algorithm = True

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.reviews.append({"path": self.path, **review})  # list.append: thread-safe
                outer.peers.append(self.client_address[:2])
                out = answer(self.path, review)
                code, out = out if isinstance(out, tuple) else (200, out)
                body = out if isinstance(out, bytes) else json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="webhook-server", daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def __enter__(self) -> WebhookServer:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def configmap_hook(name: str, namespace: str, url: str, ca: bytes, **kw: Any) -> dict[str, Any]:
    """A webhook entry for ConfigMap CREATE and UPDATE in `namespace` only, called at `url`
    (its certificate signed by `ca`, PEM); `kw` adds or overrides fields."""
    return {"name": name, "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], **kw}


def review_response(review: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The AdmissionReview answering `review`: allowed unless `fields` say otherwise."""
    resp: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True, **fields}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}


def json_patch(ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The response fields of a mutating answer applying the JSONPatch `ops`."""
    return {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
