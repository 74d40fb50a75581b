"""A test KMS speaking Fleet's KMS plugin protocol (fleet/store/kms.py) over a
unix socket, with optional OAuth2 client-credentials checking.

In-process: `with TestKMS(sock_path) as kms: ...` serves on a thread;
`TestKMS(tls_dir=D)` serves HTTPS on loopback instead (CA in `kms.ca_file`);
`kms.rotate()` makes a new KEK current (old ones still unwrap); `kms.stop()`.
As a process (e2e tests): `python -m fleet.testing.kms --socket PATH [--token T]`
serves until killed.  KEKs live only in memory unless `--key-dir` keeps them
(one file per KEK id, so a restarted KMS still unwraps what it wrapped).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fleet.store.kms import key_id_of, open_with_kek, seal_with_kek


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    kms: TestKMS


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    kms: TestKMS


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet, and no client address on unix sockets
        pass

    def address_string(self) -> str:
        return "unix"

    def _answer(self, code: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        kms = self.server.kms
        if kms.token and self.headers.get("Authorization") != f"Bearer {kms.token}":
            self._answer(401, {"error": "unauthorized"})
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorized():
            return
        kms = self.server.kms
        kms.calls.append("status")
        if self.path != "/v1/status":
            self._answer(404, {"error": "not found"})
            return
        self._answer(200, {"healthz": "ok", "version": "v2", "keyID": kms.current})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        kms = self.server.kms
        try:
            doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path == "/v1/wrap":
                kms.calls.append("wrap")
                dek = base64.b64decode(doc["plaintext"], validate=True)
                kid = kms.current
                wrapped = seal_with_kek(kms.keys[kid], dek, kid)
                self._answer(200, {"ciphertext": base64.b64encode(wrapped).decode(), "keyID": kid})
            elif self.path == "/v1/unwrap":
                kms.calls.append("unwrap")
                kid = doc["keyID"]
                if kid not in kms.keys:
                    self._answer(404, {"error": f"unknown key {kid}"})
                    return
                dek = open_with_kek(kms.keys[kid], base64.b64decode(doc["ciphertext"], validate=True), kid)
                self._answer(200, {"plaintext": base64.b64encode(dek).decode()})
            else:
                self._answer(404, {"error": "not found"})
        except Exception as e:  # a test server: say what went wrong
            self._answer(400, {"error": repr(e)})


class TestKMS:
    """The test KMS; a context manager serving on a background thread."""

    __test__ = False  # not a pytest class

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *, token: str = "",
                 key_dir: str | os.PathLike[str] | None = None,
                 tls_dir: str | os.PathLike[str] | None = None) -> None:
        """On a unix socket, or (socket_path None, tls_dir given) over HTTPS on
        127.0.0.1 with a fresh CA written to `tls_dir/kms-ca.crt` (`ca_file`)."""
        if socket_path is None and tls_dir is None:
            raise ValueError("a socket path or a TLS directory is needed")
        self.socket_path = Path(socket_path) if socket_path is not None else None
        self.tls_dir = Path(tls_dir) if tls_dir is not None else None
        self.ca_file: Path | None = None
        self.port = 0
        self.token = token
        self.key_dir = Path(key_dir) if key_dir else None
        self.keys: dict[str, bytes] = {}
        self.current = ""
        self.calls: list[str] = []
        if self.key_dir and self.key_dir.is_dir():
            for f in sorted(self.key_dir.iterdir(), key=lambda f: f.stat().st_mtime):
                kek = f.read_bytes()
                self.keys[key_id_of(kek)] = kek
                self.current = key_id_of(kek)
        if not self.current:
            self.rotate()
        self._server: _Server | _TLSServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        if self.socket_path is None:
            return f"https://127.0.0.1:{self.port}"
        return f"unix://{self.socket_path}"

    def rotate(self) -> str:
        """A new KEK becomes current; the old ones still unwrap."""
        kek = os.urandom(32)
        kid = key_id_of(kek)
        self.keys[kid] = kek
        self.current = kid
        if self.key_dir:
            self.key_dir.mkdir(parents=True, exist_ok=True)
            (self.key_dir / kid.replace(":", "-")).write_bytes(kek)
        return kid

    def start(self) -> TestKMS:
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
            self._server = _Server(str(self.socket_path), _Handler)
        else:
            self._server = _TLSServer(("127.0.0.1", 0), _Handler)
            self._server.socket = self._tls_context().wrap_socket(self._server.socket, server_side=True)
            self.port = self._server.server_address[1]
        self._server.kms = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)

    def _tls_context(self) -> ssl.SSLContext:

        from fleet.testing.oidc import loopback_tls

        assert self.tls_dir is not None
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        self.ca_file, cert_file, key_file = loopback_tls(self.tls_dir, "kms")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        return ctx

    def __enter__(self) -> TestKMS:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description="Fleet's test KMS (unix socket, JSON protocol).")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--token", default="")
    ap.add_argument("--key-dir")
    a = ap.parse_args()
    kms = TestKMS(a.socket, token=a.token, key_dir=a.key_dir).start()
    print(f"test KMS on {kms.endpoint}, key {kms.current}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
