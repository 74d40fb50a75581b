"""The async Kubernetes REST client shared by kfleet, agents and controllers.

`Client` wraps one `httpx.AsyncClient` (httpx runs on Trio through anyio), so
connections are pooled and every call is a plain `await`.  It knows the
Kubernetes wire conventions and nothing about particular kinds: paths are built
generically from (apiVersion, plural, namespace, name, subresource), non-2xx
answers become `ApiException` carrying the server's `Status`, and `watch`
hides the fact that a watch is a series of HTTP streams (it reconnects from the
last resourceVersion it saw and only stops on a real error such as 410
Expired).  Discovery is fetched once per `Client` and cached, because kfleet
resolves several typed names per command and controllers never need a refresh
mid-run.
"""

from __future__ import annotations

import json as _json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import trio

import fleet
from fleet.client.discovery import (
    APIResource,
    parse_resource_list,
    resolve_resource,
    resource_path,
)
from fleet.client.kubeconfig import ClientConfig

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

Params = Mapping[str, str | int | bool | None]


class ApiException(Exception):
    """A non-2xx answer from the API server.

    `status` is the server's `Status` object (or a synthesized one when the body
    was not a Status), `code` the HTTP status and `reason` the Kubernetes reason
    (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`, ...).  `str()` is the
    server's message, so callers can print it as kubectl does.
    """

    def __init__(self, status: dict[str, Any], code: int | None = None) -> None:
        self.status = status
        self.code = int(code if code is not None else status.get("code") or 500)
        self.reason = str(status.get("reason") or _default_reason(self.code))
        self.message = str(status.get("message") or self.reason)
        super().__init__(self.message)

    @property
    def details(self) -> dict[str, Any]:
        return self.status.get("details") or {}

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiException:
        body: Any = None
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("kind") == "Status":
            return cls(body, response.status_code)
        text = response.text.strip()
        message = text or f"the server responded with status {response.status_code}"
        return cls({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": _default_reason(response.status_code),
            "code": response.status_code,
        }, response.status_code)


def _default_reason(code: int) -> str:
    return {
        400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
        405: "MethodNotAllowed", 406: "NotAcceptable", 409: "Conflict", 410: "Expired",
        413: "RequestEntityTooLarge", 415: "UnsupportedMediaType", 422: "Invalid",
        429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
        504: "Timeout",
    }.get(code, "Unknown")


def _clean_params(params: Params | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (params or {}).items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def ssl_context(cfg: ClientConfig) -> ssl.SSLContext | bool:
    """TLS settings (for httpx `verify=`) from the kubeconfig's CA and client certificate.

    Public so other transports (websockets for exec, sync probes in tests)
    trust the server exactly as `Client` does.
    """
    if not cfg.server.startswith("https"):
        return True
    if cfg.ssl_context is not None:
        return cfg.ssl_context
    if cfg.insecure_skip_tls_verify:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.ca_data or cfg.ca_file:
        ctx = ssl.create_default_context(
            cafile=cfg.ca_file,
            cadata=cfg.ca_data.decode() if cfg.ca_data else None,
        )
    else:
        ctx = ssl.create_default_context()
    if cfg.client_cert_file or cfg.client_cert_data:
        _load_client_cert(ctx, cfg)
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, cfg: ClientConfig) -> None:
    # ssl only loads certificate chains from files; inline kubeconfig data is
    # written to a private temporary directory just long enough to load it.
    with tempfile.TemporaryDirectory(prefix="fleet-client-") as tmp:
        cert = cfg.client_cert_file
        key = cfg.client_key_file
        if cfg.client_cert_data:
            cert = os.path.join(tmp, "cert.pem")
            with open(os.open(cert, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(cfg.client_cert_data)
        if cfg.client_key_data:
            key = os.path.join(tmp, "key.pem")
            with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(cfg.client_key_data)
        assert cert is not None
        ctx.load_cert_chain(cert, key)


class Client:
    """Async client for a Kubernetes-compatible API server.

    Use as `async with Client(config) as c: ...`.  All object bodies are plain
    dicts in the Kubernetes shape.
    """

    def __init__(self, config: ClientConfig, *, timeout: float = 30.0,
                 user_agent: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        headers = {"User-Agent": user_agent or f"kfleet/{fleet.__version__}",
                   "Accept": "application/json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._ssl = ssl_context(config)
        self._http = httpx.AsyncClient(
            base_url=config.server,
            headers=headers,
            verify=self._ssl,
            timeout=httpx.Timeout(timeout),
            # Watches hold connections too: past httpx's default 20 kept-alive ones the
            # pool closes every returned connection, and each request then pays a TLS
            # handshake (a controller manager with ~25 informers did).
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=200),
            transport=transport,  # tests pass an httpx.MockTransport
        )
        self._discovery: list[APIResource] | None = None
        self._discovery_lock = trio.Lock()

    def reload_client_certificate(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Present a new client certificate from now on (a node's rotated one): new
        connections use it; pooled ones keep the old, still valid, certificate."""
        from dataclasses import replace

        if not isinstance(self._ssl, ssl.SSLContext):
            raise ValueError("client certificates need an https server")
        self.config = replace(self.config, client_cert_data=cert_pem, client_key_data=key_pem,
                              client_cert_file=None, client_key_file=None)
        _load_client_cert(self._ssl, self.config)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- raw requests -------------------------------------------------------

    async def request(self, method: str, path: str, params: Params | None = None,
                      json: Any = None, headers: Mapping[str, str] | None = None,
                      content: bytes | str | None = None) -> httpx.Response:
        """Send one request; raise `ApiException` unless the answer is 2xx."""
        resp = await self._http.request(method, path, params=_clean_params(params),
                                        json=json, content=content,
                                        headers=dict(headers or {}))
        if resp.status_code >= 400:
            raise ApiException.from_response(resp)
        return resp

    async def get(self, resource_path: str, params: Params | None = None,
                  headers: Mapping[str, str] | None = None) -> Any:
        """GET a path and decode the JSON body."""
        resp = await self.request("GET", resource_path, params=params, headers=headers)
        return resp.json()

    async def version(self) -> dict[str, Any]:
        return await self.get("/version")

    # -- objects --------------------------------------------------------------

    async def get_object(self, api_version: str, plural: str, name: str,
                         namespace: str | None = None, *, subresource: str | None = None,
                         headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self.get(resource_path(api_version, plural, namespace, name, subresource),
                              headers=headers)

    async def list(self, api_version: str, plural: str, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   limit: int | None = None, continue_token: str | None = None,
                   resource_version: str | None = None,
                   headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """One page of a collection (everything, unless `limit` is given)."""
        params = {"labelSelector": label_selector, "fieldSelector": field_selector,
                  "limit": limit, "continue": continue_token,
                  "resourceVersion": resource_version}
        return await self.get(resource_path(api_version, plural, namespace),
                              params=params, headers=headers)

    async def list_all(self, api_version: str, plural: str, namespace: str | None = None, *,
                       label_selector: str | None = None, field_selector: str | None = None,
                       page_size: int = 500) -> dict[str, Any]:
        """Follow `continue` tokens and return one list holding every item."""
        first = await self.list(api_version, plural, namespace, label_selector=label_selector,
                                field_selector=field_selector, limit=page_size)
        items = list(first.get("items") or [])
        token = (first.get("metadata") or {}).get("continue")
        while token:
            page = await self.list(api_version, plural, namespace, label_selector=label_selector,
                                   field_selector=field_selector, limit=page_size,
                                   continue_token=token)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
        first["items"] = items
        first.setdefault("metadata", {}).pop("continue", None)
        return first

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, *, params: Params | None = None,
                     subresource: str | None = None, name: str | None = None) -> dict[str, Any]:
        """POST to the collection (or to `name/subresource`, e.g. pods/x/eviction)."""
        path = resource_path(api_version, plural, namespace, name, subresource)
        resp = await self.request("POST", path, params=params, json=body)
        return resp.json()

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, *, subresource: str | None = None,
                      params: Params | None = None) -> dict[str, Any]:
        path = resource_path(api_version, plural, namespace, name, subresource)
        resp = await self.request("PUT", path, params=params, json=body)
        return resp.json()

    async def patch(self, api_version: str, plural: str, name: str, patch: Any,
                    content_type: str = MERGE_PATCH, namespace: str | None = None, *,
                    subresource: str | None = None,
                    params: Params | None = None) -> dict[str, Any]:
        """PATCH with the given patch type (`MERGE_PATCH`, `STRATEGIC_MERGE_PATCH`, `JSON_PATCH`)."""
        path = resource_path(api_version, plural, namespace, name, subresource)
        resp = await self.request("PATCH", path, params=params,
                                  content=_json.dumps(patch),
                                  headers={"Content-Type": content_type})
        return resp.json()

    async def delete(self, api_version: str, plural: str, name: str,
                     namespace: str | None = None, *, body: dict[str, Any] | None = None,
                     params: Params | None = None) -> dict[str, Any]:
        """DELETE one object; `body` is a DeleteOptions (propagationPolicy, gracePeriodSeconds)."""
        path = resource_path(api_version, plural, namespace, name)
        resp = await self.request("DELETE", path, params=params, json=body)
        return resp.json() if resp.content else {}

    async def watch(self, api_version: str, plural: str, namespace: str | None = None, *,
                    resource_version: str | None = None, label_selector: str | None = None,
                    field_selector: str | None = None, timeout_seconds: int | None = None,
                    headers: Mapping[str, str] | None = None, reconnect: bool = True,
                    bookmarks: bool = False, max_failures: int = 8) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events (`{"type": ..., "object": ...}`) for a collection.

        The server ends each stream now and then (timeouts, restarts); with
        `reconnect` the iterator resumes from the last resourceVersion seen
        (events and bookmarks both advance it), so the caller sees one
        gap-free sequence.  An `ERROR` event raises `ApiException` (code 410,
        reason `Expired`, when the revision was compacted: re-list and watch
        again).  Transport failures are retried with back-off; `max_failures`
        in a row raise.  Without a `resource_version` the first stream starts
        "now" (servers send the existing objects as ADDED first).

        Close it deterministically when stopping early:
        `async with contextlib.aclosing(client.watch(...)) as events:`.
        """
        path = resource_path(api_version, plural, namespace)
        rv = resource_version
        failures = 0
        backoff = 0.2
        while True:
            params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": True,
                      "labelSelector": label_selector, "fieldSelector": field_selector,
                      "timeoutSeconds": timeout_seconds}
            got_any = False
            try:
                async with self._http.stream(
                    "GET", path, params=_clean_params(params), headers=dict(headers or {}),
                    timeout=httpx.Timeout(self._http.timeout.connect, read=None),
                ) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        raise ApiException.from_response(resp)
                    async for line in resp.aiter_lines():
                        line = line.strip()
                        if not line:
                            continue
                        event = _json.loads(line)
                        got_any = True
                        etype = event.get("type")
                        obj = event.get("object") or {}
                        if etype == "ERROR":
                            raise ApiException(obj)
                        new_rv = _event_rv(obj)
                        if new_rv:
                            rv = new_rv
                        if etype == "BOOKMARK" and not bookmarks:
                            continue
                        yield event
            except (httpx.TransportError, _json.JSONDecodeError):
                failures += 1
                if failures >= max_failures or not reconnect:
                    raise
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if not reconnect:
                return
            if got_any:
                failures, backoff = 0, 0.2
            else:
                # An empty stream that ends at once must not become a busy loop.
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    # -- discovery ------------------------------------------------------------

    async def discover(self, *, refresh: bool = False) -> list[APIResource]:
        """Every served resource at every served version (cached per Client).

        Core group first, then groups in the server's order; each group's
        preferred version is marked `preferred`.
        """
        async with self._discovery_lock:
            if self._discovery is not None and not refresh:
                return self._discovery
            docs: list[tuple[int, bool, dict[str, Any]]] = []
            targets: list[tuple[str, bool]] = []
            core = await self.get("/api")
            for v in core.get("versions") or []:
                targets.append((f"/api/{v}", v == (core.get("versions") or [v])[0]))
            groups = await self.get("/apis")
            for g in groups.get("groups") or []:
                preferred = (g.get("preferredVersion") or {}).get("groupVersion")
                versions = g.get("versions") or []
                if not preferred and versions:
                    preferred = versions[0].get("groupVersion")
                for v in versions:
                    gv = v.get("groupVersion")
                    if gv:
                        targets.append((f"/apis/{gv}", gv == preferred))

            async def fetch(idx: int, path: str, preferred: bool) -> None:
                try:
                    docs.append((idx, preferred, await self.get(path)))
                except ApiException:
                    # A group version that fails discovery (an aggregated API
                    # that is down) must not hide every other resource.
                    pass

            async with trio.open_nursery() as nursery:
                for idx, (path, preferred) in enumerate(targets):
                    nursery.start_soon(fetch, idx, path, preferred)
            out: list[APIResource] = []
            for _, preferred, doc in sorted(docs, key=lambda d: d[0]):
                out.extend(parse_resource_list(doc, preferred=preferred))
            self._discovery = out
            return out

    async def resolve(self, typed: str) -> APIResource:
        """The resource a user means by `pods`, `po`, `Deployment`, `deployments.apps`, ..."""
        return resolve_resource(await self.discover(), typed)

    async def resource_for_kind(self, api_version: str, kind: str) -> APIResource:
        """The resource serving objects of `apiVersion`/`kind` (used for manifests)."""
        group, _, version = api_version.rpartition("/")
        for res in await self.discover():
            if res.group == group and res.version == version and res.kind == kind:
                return res
        raise ApiException({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'no matches for kind "{kind}" in version "{api_version}"',
            "reason": "NotFound", "code": 404,
        }, 404)


def _event_rv(obj: dict[str, Any]) -> str | None:
    if obj.get("kind") == "Table":
        # Table watch events carry the object in the row (PartialObjectMetadata).
        for row in obj.get("rows") or []:
            rv = _event_rv(row.get("object") or {})
            if rv:
                return rv
    md = obj.get("metadata")
    if isinstance(md, dict):
        rv = md.get("resourceVersion")
        if rv:
            return str(rv)
    return None
