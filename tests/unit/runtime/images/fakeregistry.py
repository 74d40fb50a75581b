"""An in-memory distribution-API registry behind httpx.MockTransport, for unit tests.

It serves manifests and blobs from dicts and can demand Basic or Bearer auth
(with its own token endpoint), so the registry client's protocol handling is
tested without sockets.  It records every request it saw.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"errors": [{"code": code, "message": message, "detail": None}]}
    return httpx.Response(status, json=body, headers=headers or {})


@dataclass
class FakeRegistry:
    host: str = "registry.test"
    # "none" | "basic" | "bearer"
    auth: str = "none"
    username: str = "alice"
    password: str = "secret"
    anonymous_tokens: bool = False
    # An OAuth2 refresh token the token endpoint accepts (POST, grant_type=refresh_token).
    identity_token: str = ""
    manifests: dict[tuple[str, str], tuple[bytes, str]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)
    tokens_issued: int = 0
    # Serve wrong bytes for these digests (to test verification).
    corrupt: set[str] = field(default_factory=set)
    # Without TLS, https requests fail to connect (as against a plain-HTTP registry).
    tls: bool = True

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def add_manifest(self, repo: str, tag: str | None, body: bytes, media_type: str) -> str:
        d = digest_of(body)
        self.manifests[(repo, d)] = (body, media_type)
        if tag:
            self.manifests[(repo, tag)] = (body, media_type)
        return d

    def add_blob(self, data: bytes) -> str:
        d = digest_of(data)
        self.blobs[d] = data
        return d

    def add_image(self, repo: str, tag: str, image: Any) -> str:
        """Serve a fleet.testing.oci_image.OciImage as repo:tag."""
        for data in image.blobs().values():
            self.add_blob(data)
        return self.add_manifest(repo, tag, image.manifest_bytes, json.loads(image.manifest_bytes)["mediaType"])

    # -- auth ------------------------------------------------------------------
    def _basic_ok(self, header: str) -> bool:
        want = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return header == f"Basic {want}"

    def _token_for(self, scope: str) -> str:
        return "tok-" + scope.replace(":", "_").replace("/", "_").replace(",", "_")

    def _authorized(self, request: httpx.Request, repo: str) -> httpx.Response | None:
        header = request.headers.get("authorization", "")
        if self.auth == "none":
            return None
        if self.auth == "basic":
            if self._basic_ok(header):
                return None
            return _error(401, "UNAUTHORIZED", "authentication required",
                          {"WWW-Authenticate": 'Basic realm="fake"'})
        scope = f"repository:{repo}:pull"
        if header == f"Bearer {self._token_for(scope)}":
            return None
        challenge = (
            f'Bearer realm="https://auth.test/token",service="{self.host}",scope="{scope}"'
        )
        return _error(401, "UNAUTHORIZED", "authentication required",
                      {"WWW-Authenticate": challenge})

    def _token(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return self._oauth_token(request)
        header = request.headers.get("authorization", "")
        if not self._basic_ok(header) and not (self.anonymous_tokens and not header):
            return httpx.Response(401, json={"details": "incorrect username or password"})
        scope = request.url.params.get("scope", "")
        if request.url.params.get("service") != self.host:
            return httpx.Response(400, json={"details": "wrong service"})
        self.tokens_issued += 1
        return httpx.Response(200, json={"token": self._token_for(scope), "expires_in": 300})

    def _oauth_token(self, request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode()))
        if (form.get("grant_type") != "refresh_token" or not self.identity_token
                or form.get("refresh_token") != self.identity_token):
            return httpx.Response(401, json={"details": "invalid refresh token"})
        if form.get("service") != self.host:
            return httpx.Response(400, json={"details": "wrong service"})
        self.tokens_issued += 1
        return httpx.Response(200, json={"access_token": self._token_for(form.get("scope", "")),
                                         "expires_in": 300})

    # -- routes ----------------------------------------------------------------
    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        url = request.url
        if url.scheme == "https" and not self.tls and url.host != "auth.test":
            raise httpx.ConnectError("[SSL: WRONG_VERSION_NUMBER] wrong version number", request=request)
        if url.host == "auth.test" and url.path == "/token":
            return self._token(request)
        if url.host != self.host.split(":")[0]:
            return httpx.Response(502)
        path = url.path
        if path == "/v2/":
            return self._authorized(request, "") or httpx.Response(200, json={})
        if "/manifests/" in path:
            repo, ref = path[len("/v2/"):].split("/manifests/")
            denied = self._authorized(request, repo)
            if denied:
                return denied
            if (repo, ref) not in self.manifests:
                return _error(404, "MANIFEST_UNKNOWN", "manifest unknown")
            body, media_type = self.manifests[(repo, ref)]
            return httpx.Response(
                200, content=body,
                headers={"Content-Type": media_type, "Docker-Content-Digest": digest_of(body)},
            )
        if "/blobs/" in path:
            repo, digest = path[len("/v2/"):].split("/blobs/")
            denied = self._authorized(request, repo)
            if denied:
                return denied
            if digest not in self.blobs:
                return _error(404, "BLOB_UNKNOWN", "blob unknown to registry")
            data = self.blobs[digest]
            if digest in self.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            return httpx.Response(200, content=data)
        return httpx.Response(404)

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.scheme}://{r.url.host}{r.url.path}" for r in self.requests]
