"""Pulling images from OCI / Docker registries (distribution API v2) into the ImageStore.

A pull is: resolve the reference's tag (or digest) to a manifest, asking for all
four manifest dialects; if it is an index, pick this node's platform and fetch that
manifest; fetch the config and every layer the store lacks, each verified against
its digest and size while it streams to disk; unpack the layers; record the image.
Nothing is recorded until every blob is verified and every layer unpacked, so a
failed or cancelled pull leaves at most some reusable blobs behind.

Transport follows Docker's rules: HTTPS always, except for registries on loopback
or listed as insecure, where HTTPS is tried without certificate checks and plain
HTTP is the fallback.  `docker.io` is served by `registry-1.docker.io`.

Every failure surfaces as `ImagePullError` whose message carries the registry's
own error text (`manifest unknown`, `unauthorized: authentication required`), for
the agent's ErrImagePull / ImagePullBackOff status.

The HTTP client is httpx's AsyncClient, which runs on Trio through anyio.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable
from typing import Any

import httpx
import trio

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
from fleet.runtime.images.policy import should_pull
from fleet.runtime.images.reference import Reference, parse_reference
from fleet.runtime.images.store import ImageRecord, ImageStore, LayerRecord

# Manifests are small; refuse anything that is clearly not one.
MAX_MANIFEST_BYTES = 4 << 20
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


def is_loopback_host(host: str) -> bool:
    """True for `localhost`, 127.0.0.0/8 and ::1 (with or without a port)."""
    h = host
    if h.startswith("["):
        h = h[1:].split("]", 1)[0]
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def is_insecure(host: str, insecure_registries: Iterable[str]) -> bool:
    """Whether plain HTTP may be used for `host` (loopback, or listed: `host[:port]` or a CIDR)."""
    if is_loopback_host(host):
        return True
    bare = host.split(":", 1)[0] if host.count(":") == 1 else host.strip("[]")
    for entry in insecure_registries:
        entry = entry.strip().lower()
        if "://" in entry:
            entry = entry.split("://", 1)[1]
        entry = entry.rstrip("/")
        if entry in (host.lower(), bare.lower()):
            return True
        if "/" in entry:
            try:
                if ipaddress.ip_address(bare) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
    return False


class RegistryClient:
    """Pulls images into one ImageStore; reuse one client for many pulls (connection reuse)."""

    def __init__(
        self,
        store: ImageStore,
        *,
        platform: Platform | str | tuple[str, ...] | None = None,
        insecure_registries: Iterable[str] = (),
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_concurrent_blobs: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.platform = Platform.parse(platform) if platform is not None else Platform.host()
        self.insecure_registries = tuple(insecure_registries)
        self._blob_limit = trio.CapacityLimiter(max_concurrent_blobs)
        common: dict[str, Any] = {"timeout": timeout, "follow_redirects": True}
        self._secure = httpx.AsyncClient(transport=transport, **common)
        # Insecure registries get TLS without certificate checks (Docker's behaviour).
        self._unverified = httpx.AsyncClient(transport=transport, verify=False, **common)
        self._endpoints: dict[str, tuple[str, httpx.AsyncClient]] = {}

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._secure.aclose()
            await self._unverified.aclose()

    # -- endpoints -----------------------------------------------------------
    async def _endpoint(self, host: str) -> tuple[str, httpx.AsyncClient]:
        """The base URL and client for `host`, probing https → http for insecure registries."""
        if host in self._endpoints:
            return self._endpoints[host]
        if not is_insecure(host, self.insecure_registries):
            chosen = (f"https://{host}", self._secure)
        else:
            chosen = (f"http://{host}", self._secure)
            try:
                # Any HTTP answer (200, 401, 404) proves the registry speaks TLS here.
                await self._unverified.get(f"https://{host}/v2/", timeout=5.0)
                chosen = (f"https://{host}", self._unverified)
            except httpx.TransportError:
                pass  # no TLS listener: plain HTTP is allowed for this registry
        self._endpoints[host] = chosen
        return chosen

    # -- pull -----------------------------------------------------------------
    async def pull(self, image: str, *, auth: Credentials | None = None) -> ImageRecord:
        """Pull `image` for this client's platform; returns the stored record."""
        ref = parse_reference(image)
        try:
            return await self._pull(ref, RegistryAuth(auth))
        except httpx.TransportError as e:
            raise ImagePullError(
                ERR_IMAGE_PULL, f'pulling "{ref}": registry {ref.registry_host} unreachable: {e}'
            ) from e
        except DigestMismatchError as e:
            raise ImagePullError(ERR_IMAGE_PULL, f'pulling "{ref}": {e}') from e
        except ImagePullError:
            raise
        except ImageError as e:
            raise ImagePullError(ERR_IMAGE_PULL, f'pulling "{ref}": {e}') from e

    async def _pull(self, ref: Reference, auth: RegistryAuth) -> ImageRecord:
        base, client = await self._endpoint(ref.registry_host)
        repo_url = f"{base}/v2/{ref.path}"
        scope = f"repository:{ref.path}:pull"

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
        store, platform=platform, insecure_registries=insecure_registries, transport=transport
    ) as client:
        return await client.pull(image, auth=auth)
