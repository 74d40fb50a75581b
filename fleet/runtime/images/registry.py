"""Pulling images from OCI / Docker registries (distribution API v2) into the ImageStore.

A pull is: resolve the reference's tag (or digest) to a manifest, asking for all
four manifest dialects; if it is an index, pick this node's platform and fetch that
manifest; fetch the config and every layer the store lacks, each verified against
its digest and size while it streams to disk; unpack the layers; record the image.
Nothing is recorded until every blob is verified and every layer unpacked, so a
failed or cancelled pull leaves at most some reusable blobs behind.

Where from: `mirrors.endpoints_for` lists an image's endpoints — the node's
registry mirrors (registries.yaml) in order, then the registry itself — and a
pull tries them in turn until one delivers the whole image.  Transport follows
Docker's rules for a registry's own endpoint: HTTPS always, except for registries
on loopback or listed as insecure, where HTTPS is tried without certificate
checks and plain HTTP is the fallback; a mirror uses the scheme its URL says.
`docker.io` is served by `registry-1.docker.io`.

Every failure surfaces as `ImagePullError` whose message carries the registry's
own error text (`manifest unknown`, `unauthorized: authentication required`), for
the agent's ErrImagePull / ImagePullBackOff status.

The HTTP client is httpx's AsyncClient, which runs on Trio through anyio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
from collections.abc import Iterable
from typing import Any

import httpx
import trio
from prometheus_client import Counter

from fleet._core.supervise import REGISTRY
from fleet.client.errors import explain
from fleet.runtime.images.auth import Credentials, RegistryAuth, registry_error_message
from fleet.runtime.images.errors import (
    ERR_IMAGE_PULL,
    DigestMismatchError,
    ImageError,
    ImagePullError,
)
from fleet.runtime.images.manifest import (
    INDEX_TYPES,
    MANIFEST_ACCEPT,
    Descriptor,
    Platform,
    index_entries,
    media_type_of,
    parse_manifest,
    select_platform,
)
from fleet.runtime.images.mirrors import (
    Endpoint,
    RegistriesConfig,
    TLSConfig,
    endpoints_for,
)
from fleet.runtime.images.policy import should_pull
from fleet.runtime.images.reference import Reference, parse_reference
from fleet.runtime.images.store import ImageRecord, ImageStore, LayerRecord

log = logging.getLogger(__name__)

_TLS_HINT = ("the certificate of {host} is not signed by a CA this node trusts: name its CA in "
             "the registries file's configs.\"{host}\".tls.ca_file")

# Fall-backs from one endpoint of an image to the next (mirror or the registry's own).
ENDPOINT_FAILURES = Counter(
    "fleet_image_pull_endpoint_failures",
    "Image pull attempts that failed at one of an image's several endpoints (a mirror, or "
    "the registry itself); the next one is tried.", ["endpoint"], registry=REGISTRY)

# Manifests are small; refuse anything that is clearly not one.
MAX_MANIFEST_BYTES = 4 << 20
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class RegistryClient:
    """Pulls images into one ImageStore; reuse one client for many pulls (connection reuse)."""

    def __init__(
        self,
        store: ImageStore,
        *,
        platform: Platform | str | tuple[str, ...] | None = None,
        insecure_registries: Iterable[str] = (),
        registries: RegistriesConfig | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_concurrent_blobs: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.platform = Platform.parse(platform) if platform is not None else Platform.host()
        self.insecure_registries = tuple(insecure_registries)
        self.registries = registries
        self._blob_limit = trio.CapacityLimiter(max_concurrent_blobs)
        self._common: dict[str, Any] = {
            "timeout": timeout, "follow_redirects": True, "transport": transport,
        }
        self._secure = httpx.AsyncClient(**self._common)
        # Insecure registries get TLS without certificate checks (Docker's behaviour).
        self._unverified = httpx.AsyncClient(verify=False, **self._common)
        # One client per distinct TLS setting of registries.yaml (CA, client cert).
        self._tls_clients: dict[TLSConfig, httpx.AsyncClient] = {}
        self._endpoints: dict[str, tuple[str, httpx.AsyncClient]] = {}

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._secure.aclose()
            await self._unverified.aclose()
            for c in self._tls_clients.values():
                await c.aclose()

    # -- endpoints -----------------------------------------------------------
    def _client_for(self, tls: TLSConfig | None) -> httpx.AsyncClient:
        """The client verifying TLS as `tls` says (the default client without settings)."""
        if tls is None or tls == TLSConfig():
            return self._secure
        if tls.insecure_skip_verify and not tls.cert_file:
            return self._unverified
        client = self._tls_clients.get(tls)
        if client is None:
            client = httpx.AsyncClient(verify=_ssl_context(tls), **self._common)
            self._tls_clients[tls] = client
        return client

    async def _endpoint(self, ep: Endpoint) -> tuple[str, httpx.AsyncClient]:
        """The API root URL and client for `ep`, probing https → http for insecure hosts."""
        if ep.url in self._endpoints:
            return self._endpoints[ep.url]
        client = self._client_for(ep.tls)
        chosen = (ep.url, client)
        if ep.plain_http_fallback:
            plain = "http://" + ep.url.split("://", 1)[1]
            chosen = (plain, client)
            try:
                # Any HTTP answer (200, 401, 404) proves the registry speaks TLS here.
                await self._unverified.get(f"{ep.url}/", timeout=5.0)
                chosen = (ep.url, self._unverified if ep.tls is None else client)
            except httpx.TransportError:
                pass  # no TLS listener: plain HTTP is allowed for this registry
        self._endpoints[ep.url] = chosen
        return chosen

    # -- pull -----------------------------------------------------------------
    async def pull(self, image: str, *, auth: Credentials | None = None) -> ImageRecord:
        """Pull `image` for this client's platform; returns the stored record.

        The image's endpoints (`mirrors.endpoints_for`) are tried in order until one
        delivers the whole image; `auth` (from the pod's pull secrets, matched to the
        image's registry) applies to the registry's own endpoint, the registries
        file's credentials to the rest.  Content already verified into the store
        is kept when an endpoint fails half-way, so the next one fetches only the rest.
        """
        ref = parse_reference(image)
        endpoints = endpoints_for(ref, self.registries,
                                  insecure_registries=self.insecure_registries)
        errors: list[ImagePullError] = []
        for ep in endpoints:
            creds = ep.credentials if ep.mirror else (auth or ep.credentials)
            try:
                return await self._pull_from(ref, ep, creds)
            except ImagePullError as e:
                if len(endpoints) > 1:
                    # Not the last word: the next endpoint may serve it.  Logged and
                    # counted here; the final error carries every endpoint's reason.
                    log.warning("%s: %s", ep.describe(), e.message)
                    ENDPOINT_FAILURES.labels("mirror" if ep.mirror else "default").inc()
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        status = next((e.status for e in errors if e.status is not None), None)
        raise ImagePullError(
            ERR_IMAGE_PULL,
            f'pulling "{ref}": every endpoint failed: '
            + "; ".join(_reason(ep, e.message, ref)
                        for ep, e in zip(endpoints, errors, strict=True)),
            status=status,
        )

    async def _pull_from(self, ref: Reference, ep: Endpoint,
                         creds: Credentials | None) -> ImageRecord:
        try:
            return await self._pull(ref, ep, RegistryAuth(creds))
        except httpx.TransportError as e:
            # httpx's own text is empty for TLS failures; explain() finds the cause.
            why = str(e) or explain(e, tls_hint=_TLS_HINT.format(host=ep.host))
            raise ImagePullError(
                ERR_IMAGE_PULL, f'pulling "{ref}": {ep.describe()} unreachable: {why}'
            ) from e
        except DigestMismatchError as e:
            raise ImagePullError(ERR_IMAGE_PULL, f'pulling "{ref}": {e}') from e
        except ImagePullError:
            raise
        except ImageError as e:
            raise ImagePullError(ERR_IMAGE_PULL, f'pulling "{ref}": {e}') from e

    async def _pull(self, ref: Reference, ep: Endpoint, auth: RegistryAuth) -> ImageRecord:
        base, client = await self._endpoint(ep)
        repo_url = f"{base}/{ep.repository}"
        scope = f"repository:{ep.repository}:pull"

        body, media_type, top_digest = await self._manifest(
            client, auth, repo_url, scope, ref, ref.target
        )
        await self.store.put_bytes(body, top_digest)
        manifest_digest = top_digest
        if media_type in INDEX_TYPES:
            chosen = select_platform(index_entries(json.loads(body)), self.platform)
            body, media_type, manifest_digest = await self._manifest(
                client, auth, repo_url, scope, ref, chosen.digest
            )
            await self.store.put_bytes(body, manifest_digest)
        manifest = parse_manifest(json.loads(body), media_type)

        await self._blob(client, auth, repo_url, scope, ref, manifest.config)
        config = json.loads(await self.store.read_blob(manifest.config.digest))
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        if len(diff_ids) != len(manifest.layers):
            raise ImagePullError(
                ERR_IMAGE_PULL,
                f'pulling "{ref}": config lists {len(diff_ids)} diff_ids '
                f"for {len(manifest.layers)} layers",
            )
        # Layers download side by side; the first failure cancels the rest and is
        # re-raised on its own (not wrapped in an ExceptionGroup) for a clear message.
        failures: list[Exception] = []
        async with trio.open_nursery() as nursery:

            async def fetch(layer: Descriptor) -> None:
                try:
                    await self._blob(client, auth, repo_url, scope, ref, layer)
                except (ImageError, httpx.HTTPError) as e:
                    failures.append(e)
                    nursery.cancel_scope.cancel()

            for layer in manifest.layers:
                nursery.start_soon(fetch, layer)
        if failures:
            raise failures[0]

        layers = [
            LayerRecord(d.digest, d.media_type, d.size, diff_id)
            for d, diff_id in zip(manifest.layers, diff_ids, strict=True)
        ]
        for layer in layers:
            # Unpack now, so a container start never waits on it (and a bad layer fails the pull).
            await trio.to_thread.run_sync(self.store.unpack_sync, layer)
        record = ImageRecord(
            ref=str(ref),
            repo_digest=top_digest,
            manifest_digest=manifest_digest,
            config_digest=manifest.config.digest,
            layers=layers,
            platform=str(
                Platform(
                    str(config.get("os") or self.platform.os),
                    str(config.get("architecture") or self.platform.architecture),
                    str(config.get("variant") or ""),
                )
            ),
            size=manifest.config.size + sum(d.size for d in manifest.layers),
        )
        return await self.store.add_image(record)

    async def _manifest(
        self,
        client: httpx.AsyncClient,
        auth: RegistryAuth,
        repo_url: str,
        scope: str,
        ref: Reference,
        target: str,
    ) -> tuple[bytes, str, str]:
        """GET one manifest; returns (body, media type, digest), the digest verified."""
        req = client.build_request(
            "GET", f"{repo_url}/manifests/{target}", headers={"Accept": MANIFEST_ACCEPT}
        )
        resp = await auth.send(client, req, scope=scope)
        if resp.status_code != 200:
            raise _http_error(ref, "manifest", resp)
        body = resp.content
        if len(body) > MAX_MANIFEST_BYTES:
            raise ImagePullError(ERR_IMAGE_PULL, f'pulling "{ref}": manifest is too large')
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        header = resp.headers.get("docker-content-digest", "")
        if target.startswith("sha256:") and digest != target:
            raise ImagePullError(
                ERR_IMAGE_PULL, f'pulling "{ref}": manifest hashes to {digest}, expected {target}'
            )
        if header.startswith("sha256:") and header != digest:
            raise ImagePullError(
                ERR_IMAGE_PULL,
                f'pulling "{ref}": manifest hashes to {digest}, registry says {header}',
            )
        try:
            media_type = media_type_of(body, resp.headers.get("content-type", ""))
        except ValueError as e:
            raise ImagePullError(ERR_IMAGE_PULL, f'pulling "{ref}": manifest is not JSON: {e}') from e
        return body, media_type, digest

    async def _blob(
        self,
        client: httpx.AsyncClient,
        auth: RegistryAuth,
        repo_url: str,
        scope: str,
        ref: Reference,
        desc: Descriptor,
    ) -> None:
        """Fetch one blob into the store unless it is already there (verified while streaming)."""
        if self.store.has_blob(desc.digest):
            return
        async with self._blob_limit:
            req = client.build_request("GET", f"{repo_url}/blobs/{desc.digest}")
            resp = await auth.send(client, req, scope=scope, stream=True)
            try:
                if resp.status_code != 200:
                    await resp.aread()
                    raise _http_error(ref, f"blob {desc.digest}", resp)
                await self.store.ingest(desc.digest, resp.aiter_bytes(), desc.size)
            finally:
                await resp.aclose()


def _reason(ep: Endpoint, message: str, ref: Reference) -> str:
    """One endpoint's part of the combined error: named once, without the `pulling "<ref>": `
    the combined message already starts with."""
    reason = message.removeprefix(f'pulling "{ref}": ')
    return reason if reason.startswith(ep.describe()) else f"{ep.describe()}: {reason}"


def _ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """An SSL context for registries.yaml's tls settings (CA, client cert, skip-verify)."""
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_file or None)
        if tls.cert_file:
            ctx.load_cert_chain(tls.cert_file, tls.key_file or None)
    except (OSError, ssl.SSLError) as e:
        raise ImagePullError(
            ERR_IMAGE_PULL, f"registry TLS settings (ca_file {tls.ca_file or '-'}, cert_file "
            f"{tls.cert_file or '-'}, key_file {tls.key_file or '-'}): {e}") from e
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_error(ref: Reference, what: str, resp: httpx.Response) -> ImagePullError:
    return ImagePullError(
        ERR_IMAGE_PULL,
        f'pulling {what} of "{ref}": {registry_error_message(resp)}',
        status=resp.status_code,
    )


async def pull(
    store: ImageStore,
    image: str,
    *,
    policy: str | None = None,
    platform: Platform | str | tuple[str, ...] | None = None,
    auth: Credentials | None = None,
    insecure_registries: Iterable[str] = (),
    registries: RegistriesConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ImageRecord:
    """Make `image` present according to `policy` (`imagePullPolicy`); returns its record.

    A one-shot convenience over `RegistryClient`; raises `ImagePullError`
    (ErrImagePull, ErrImageNeverPull, InvalidImageName).
    """
    existing = store.get(image)
    if not should_pull(policy, existing is not None, image=image):
        assert existing is not None
        return existing
    async with RegistryClient(
        store, platform=platform, insecure_registries=insecure_registries,
        registries=registries, transport=transport,
    ) as client:
        return await client.pull(image, auth=auth)
