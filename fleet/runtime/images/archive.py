"""Importing image archives into the ImageStore (backs `kfleet image import`).

Two formats, told apart by what the tar holds:

* **OCI image layout** (`oci-layout`, `index.json`, `blobs/sha256/...`), as written
  by `skopeo copy oci-archive:`, `buildah push`, `docker buildx --output type=oci`.
  Image names come from the index's `io.containerd.image.name` annotation (a full
  reference) or `org.opencontainers.image.ref.name` (a full reference, or just a
  tag — then the caller's `name` supplies the repository).
* **`docker save`** (`manifest.json` listing `Config`, `RepoTags`, `Layers`), whose
  layers are tar files and which carries no registry manifest; we write a Docker
  schema 2 manifest for it so stored images all look alike.

Docker 25+ writes both at once; the OCI index is preferred when it names images.
Every blob is verified against its digest as it is copied into the store, layers
are unpacked, and only then is the image recorded.  The work is blocking tar
reading, so `import_archive` runs it in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
from pathlib import Path
from typing import Any, BinaryIO

import trio

from fleet.runtime.images.errors import ImageError, ImageImportError
from fleet.runtime.images.manifest import (
    DOCKER_CONFIG,
    DOCKER_LAYER_GZIP,
    DOCKER_LAYER_TAR,
    DOCKER_MANIFEST,
    INDEX_TYPES,
    OCI_LAYER_ZSTD,
    Descriptor,
    Platform,
    index_entries,
    media_type_of,
    parse_manifest,
    select_platform,
)
from fleet.runtime.images.reference import parse_reference
from fleet.runtime.images.store import ImageRecord, ImageStore, LayerRecord

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
_MAX_JSON = 16 << 20
_CHUNK = 1 << 20


async def import_archive(
    store: ImageStore,
    path: Path,
    *,
    name: str | None = None,
    platform: Platform | str | tuple[str, ...] | None = None,
) -> list[str]:
    """Import an OCI-layout or `docker save` tar (optionally gzipped); returns the refs added.

    `name` names images the archive leaves unnamed (or only tags).
    """
    plat = Platform.parse(platform) if platform is not None else Platform.host()
    return await trio.to_thread.run_sync(import_archive_sync, store, Path(path), name, plat)


def import_archive_sync(
    store: ImageStore, path: Path, name: str | None = None, platform: Platform | None = None
) -> list[str]:
    """The blocking half of `import_archive`."""
    plat = platform or Platform.host()
    try:
        tf = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise ImageImportError(f"{path}: not a readable tar archive: {e}") from e
    with tf:
        arc = _Archive(tf)
        try:
            if arc.has("oci-layout") and arc.has("index.json"):
                refs = _import_oci(store, arc, name, plat)
                if refs or not arc.has("manifest.json"):
                    return refs
            if arc.has("manifest.json"):
                return _import_docker(store, arc, name)
        except ImageImportError:
            raise
        except (ImageError, ValueError, KeyError, tarfile.TarError) as e:
            raise ImageImportError(f"{path}: {e}") from e
    raise ImageImportError(
        f"{path}: neither an OCI image layout (oci-layout + index.json) "
        "nor a docker save archive (manifest.json)"
    )


class _Archive:
    """Random access to an archive's regular files by normalized path."""

    def __init__(self, tf: tarfile.TarFile) -> None:
        self.tf = tf
        self.members: dict[str, tarfile.TarInfo] = {}
        for m in tf.getmembers():
            if m.isreg() or m.islnk() or m.issym():
                self.members[posixpath.normpath(m.name.lstrip("/")).removeprefix("./")] = m

    def has(self, name: str) -> bool:
        return posixpath.normpath(name) in self.members

    def open(self, name: str) -> BinaryIO:
        key = posixpath.normpath(name.lstrip("/"))
        if key.startswith("../"):
            raise ImageImportError(f"archive refers outside itself: {name!r}")
        member = self.members.get(key)
        if member is None:
            raise ImageImportError(f"archive has no {name!r}")
        f = self.tf.extractfile(member)
        if f is None:
            raise ImageImportError(f"archive entry {name!r} is not a file")
        return f  # type: ignore[return-value]

    def read_json(self, name: str) -> Any:
        with self.open(name) as f:
            data = f.read(_MAX_JSON + 1)
        if len(data) > _MAX_JSON:
            raise ImageImportError(f"{name} is too large to be image metadata")
        return json.loads(data)

    def read(self, name: str) -> bytes:
        with self.open(name) as f:
            return f.read()

    def digest_of(self, name: str) -> tuple[str, int]:
        h = hashlib.sha256()
        n = 0
        with self.open(name) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                n += len(chunk)
        return "sha256:" + h.hexdigest(), n


def _blob_name(digest: str) -> str:
    algo, _, hex_ = digest.partition(":")
    return f"blobs/{algo}/{hex_}"


# -- OCI layout ---------------------------------------------------------------
def _oci_ref(desc: Descriptor, name: str | None) -> str | None:
    ann = desc.annotations or {}
    full = ann.get(CONTAINERD_NAME)
    if full:
        return str(parse_reference(full))
    ref_name = ann.get(REF_NAME)
    if ref_name:
        # A bare tag has no '/', and no ':' after the last '/' other than itself.
        if "/" not in ref_name and ":" not in ref_name and "@" not in ref_name:
            if name is None:
                raise ImageImportError(
                    f"the archive only tags an image {ref_name!r}; give a name to import it under"
                )
            return str(parse_reference(f"{parse_reference(name).repository}:{ref_name}"))
        return str(parse_reference(ref_name))
    return str(parse_reference(name)) if name else None


def _import_oci(store: ImageStore, arc: _Archive, name: str | None, plat: Platform) -> list[str]:
    layout = arc.read_json("oci-layout")
    if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
        raise ImageImportError("oci-layout has no imageLayoutVersion")
    refs: list[str] = []
    for desc in index_entries(arc.read_json("index.json")):
        ref = _oci_ref(desc, name)
        if ref is None:
            continue
        top = _copy_blob(store, arc, desc.digest, desc.size)
        body = store.read_blob_sync(top)
        media_type = media_type_of(body, desc.media_type)
        manifest_digest = desc.digest
        if media_type in INDEX_TYPES:
            chosen = select_platform(index_entries(json.loads(body)), plat)
            _copy_blob(store, arc, chosen.digest, chosen.size)
            manifest_digest = chosen.digest
            body = store.read_blob_sync(chosen.digest)
            media_type = media_type_of(body, chosen.media_type)
        manifest = parse_manifest(json.loads(body), media_type)
        _copy_blob(store, arc, manifest.config.digest, manifest.config.size)
        for layer in manifest.layers:
            _copy_blob(store, arc, layer.digest, layer.size)
        _record(store, ref, desc.digest, manifest_digest, manifest.config, list(manifest.layers))
        refs.append(ref)
    return refs


def _copy_blob(store: ImageStore, arc: _Archive, digest: str, size: int | None) -> str:
    with arc.open(_blob_name(digest)) as f:
        store.ingest_sync(digest, f, size)
    return digest


# -- docker save --------------------------------------------------------------
def _import_docker(store: ImageStore, arc: _Archive, name: str | None) -> list[str]:
    entries = arc.read_json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise ImageImportError("manifest.json lists no images")
    refs: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("Config"), str):
            raise ImageImportError("manifest.json entry has no Config")
        tags = [t for t in entry.get("RepoTags") or [] if isinstance(t, str)]
        if not tags:
            if name is None:
                raise ImageImportError("the archive has an untagged image; give a name for it")
            tags = [name]
        config_bytes = arc.read(entry["Config"])
        config_digest = store.put_bytes_sync(config_bytes)
        layer_descs: list[Descriptor] = []
        for layer_path in entry.get("Layers") or []:
            digest, size = arc.digest_of(layer_path)
            with arc.open(layer_path) as f:
                store.ingest_sync(digest, f, size)
            layer_descs.append(Descriptor(_layer_media_type(store, digest), digest, size))
        config_desc = Descriptor(DOCKER_CONFIG, config_digest, len(config_bytes))
        manifest = {
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": config_desc.to_json(),
            "layers": [d.to_json() for d in layer_descs],
        }
        manifest_digest = store.put_bytes_sync(
            json.dumps(manifest, separators=(",", ":")).encode()
        )
        for tag in tags:
            ref = str(parse_reference(tag))
            _record(store, ref, manifest_digest, manifest_digest, config_desc, layer_descs)
            refs.append(ref)
    return refs


def _layer_media_type(store: ImageStore, digest: str) -> str:
    with open(store.blob_path(digest), "rb") as f:
        head = f.read(4)
    if head.startswith(b"\x1f\x8b"):
        return DOCKER_LAYER_GZIP
    if head == b"\x28\xb5\x2f\xfd":
        return OCI_LAYER_ZSTD
    return DOCKER_LAYER_TAR


def _record(
    store: ImageStore,
    ref: str,
    repo_digest: str,
    manifest_digest: str,
    config: Descriptor,
    layers: list[Descriptor],
) -> None:
    doc = json.loads(store.read_blob_sync(config.digest))
    diff_ids = (doc.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(layers):
        raise ImageImportError(
            f"{ref}: config lists {len(diff_ids)} diff_ids for {len(layers)} layers"
        )
    records = [
        LayerRecord(d.digest, d.media_type, d.size, diff_id)
        for d, diff_id in zip(layers, diff_ids, strict=True)
    ]
    for layer in records:
        store.unpack_sync(layer)
    store.add_image_sync(
        ImageRecord(
            ref=ref,
            repo_digest=repo_digest,
            manifest_digest=manifest_digest,
            config_digest=config.digest,
            layers=records,
            platform=str(
                Platform(
                    str(doc.get("os") or "linux"),
                    str(doc.get("architecture") or "unknown"),
                    str(doc.get("variant") or ""),
                )
            ),
            size=config.size + sum(d.size for d in layers),
        )
    )

