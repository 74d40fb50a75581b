"""The node's content-addressed image store: blobs, unpacked layers, and an index of images.

Layout under `root`:

    blobs/sha256/<hex>     manifests, configs and layer tarballs, named by their digest
    layers/<hex>/          one unpacked layer per diff_id (the runtime's overlay lowerdirs)
    index.json             reference → image record (digests, layers, platform, size, last use)
    tmp/                   blobs and layers being written; anything here after a crash is junk

Why this shape: content addressing makes "do we already have it?" a stat, lets
images share layers for free, and makes a half-written file impossible to mistake
for a good one — a blob is written to `tmp/`, hashed while it streams, fsynced,
and only then renamed into place, so a blob at its name always has that digest.
Layers are unpacked the same way (into `tmp/`, renamed when complete), once per
diff_id however many images use them.  The index is small JSON kept in memory and
rewritten atomically on every change.

Threading: the public async methods push file work to worker threads (trio's
event loop never waits on a disk); the `*_sync` methods are the thread-side
halves, safe to call from worker threads (the archive importer does) because the
index is guarded by a lock and blob/layer creation is rename-atomic.

Garbage collection (`gc`) is for disk pressure: it removes images nobody keeps,
least recently used first, until enough bytes are free, then deletes the blobs
and layer directories no remaining image references.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import trio

from fleet.runtime.images.errors import DigestMismatchError, ImageError, ImageNotFoundError
from fleet.runtime.images.layers import default_format, remove_tree, tree_size, unpack_layer
from fleet.runtime.images.reference import is_digest, parse_reference

_INDEX_VERSION = 1
_CHUNK = 1 << 20
# Stream chunks are gathered to about this size before one trip to a worker thread.
_BATCH = 1 << 20


def sha256_hex(digest: str) -> str:
    """The hex part of a `sha256:<hex>` digest; refuses anything else (it names a file)."""
    if not is_digest(digest):
        raise ImageError(f"unsupported or malformed digest {digest!r}")
    return digest[len("sha256:"):]


@dataclass(frozen=True)
class LayerRecord:
    """One layer of an image: the blob we keep and the diff_id its unpacked dir is named by."""

    digest: str
    media_type: str
    size: int
    diff_id: str


@dataclass
class ImageRecord:
    """What the index knows about one image reference."""

    ref: str
    # What the reference resolved to at the registry (an index for multi-platform images).
    repo_digest: str
    # The single-platform manifest chosen for this node.
    manifest_digest: str
    config_digest: str
    layers: list[LayerRecord]
    platform: str
    size: int
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)

    @property
    def id(self) -> str:
        """The image id, as Docker and the kubelet use it: the config digest."""
        return self.config_digest

    def digests(self) -> set[str]:
        """Every blob this image needs kept."""
        return {self.repo_digest, self.manifest_digest, self.config_digest} | {
            layer.digest for layer in self.layers
        }

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["layers"] = [asdict(layer) for layer in self.layers]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ImageRecord:
        d = dict(d)
        d["layers"] = [LayerRecord(**layer) for layer in d.get("layers", [])]
        return cls(**d)


class BlobWriter:
    """Writes one blob to a temp file, hashing as it goes; `commit` verifies and publishes it."""

    def __init__(self, store: ImageStore, digest: str, size: int | None = None) -> None:
        self.store = store
        self.digest = digest
        self.expected_size = size
        self._final = store.blob_path(digest)
        self._tmp = store.root / "tmp" / f"blob-{uuid.uuid4().hex}"
        self._file: BinaryIO | None = open(self._tmp, "xb")  # noqa: SIM115 - closed in commit/abort
        self._hash = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes) -> None:
        assert self._file is not None, "writer already finished"
        self.written += len(data)
        if self.expected_size is not None and self.written > self.expected_size:
            # Stop a misbehaving server from filling the disk with an endless body.
            self.abort()
            raise DigestMismatchError(
                f"blob {self.digest} is larger than its descriptor's {self.expected_size} bytes"
            )
        self._hash.update(data)
        self._file.write(data)

    def commit(self) -> Path:
        assert self._file is not None, "writer already finished"
        got = "sha256:" + self._hash.hexdigest()
        if got != self.digest or (
            self.expected_size is not None and self.written != self.expected_size
        ):
            self.abort()
            raise DigestMismatchError(
                f"blob content hashes to {got} ({self.written} bytes), expected {self.digest}"
                + (f" ({self.expected_size} bytes)" if self.expected_size is not None else "")
            )
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self._tmp, self._final)
        _fsync_dir(self._final.parent)
        return self._final

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass


class ImageStore:
    """A content-addressed image store rooted at `root` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        # Cheap, one-off set-up (a few mkdirs and one small JSON read) done at agent
        # start; use `await ImageStore.open(root)` to keep even that off the event loop.
        self.root = Path(root)
        for sub in ("blobs/sha256", "layers", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._images: dict[str, ImageRecord] = {}
        # Unpacked layers: diff_id hex → {"size": bytes, "format": overlay|oci}.
        self._layers: dict[str, dict[str, Any]] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._load_index()
        self._clean_tmp()

    @classmethod
    async def open(cls, root: Path) -> ImageStore:
        return await trio.to_thread.run_sync(cls, root)

    # -- index -------------------------------------------------------------
    @property
    def _index_path(self) -> Path:
        return self.root / "index.json"

    def _load_index(self) -> None:
        try:
            doc = json.loads(self._index_path.read_text())
        except FileNotFoundError:
            return
        if doc.get("version") != _INDEX_VERSION:
            raise ImageError(f"{self._index_path}: unknown index version {doc.get('version')!r}")
        self._images = {k: ImageRecord.from_json(v) for k, v in doc.get("images", {}).items()}
        self._layers = dict(doc.get("layers", {}))
        # A layer dir that vanished (someone cleaned the disk) is simply unpacked again.
        for hex_ in list(self._layers):
            if not (self.root / "layers" / hex_).is_dir():
                del self._layers[hex_]

    def _save_index(self) -> None:
        with self._lock:
            doc = {
                "version": _INDEX_VERSION,
                "images": {k: v.to_json() for k, v in sorted(self._images.items())},
                "layers": dict(sorted(self._layers.items())),
            }
            tmp = self.root / "tmp" / f"index-{uuid.uuid4().hex}"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._index_path)
            _fsync_dir(self.root)

    def _clean_tmp(self) -> None:
        # Only this store writes tmp/, and only while running; leftovers are from a crash.
        for entry in (self.root / "tmp").iterdir():
            remove_tree(entry)

    # -- blobs -------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / sha256_hex(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def blob_writer(self, digest: str, size: int | None = None) -> BlobWriter:
        """A writer for one blob (blocking calls; use from a worker thread)."""
        return BlobWriter(self, digest, size)

    def ingest_sync(self, digest: str, src: BinaryIO, size: int | None = None) -> Path:
        """Copy a blob from a file object, verifying it; a no-op if we already have it."""
        if self.has_blob(digest):
            return self.blob_path(digest)
        w = self.blob_writer(digest, size)
        try:
            while chunk := src.read(_CHUNK):
                w.write(chunk)
        except BaseException:
            w.abort()
            raise
        return w.commit()

    async def ingest(
        self, digest: str, chunks: AsyncIterable[bytes], size: int | None = None
    ) -> Path:
        """Stream a blob (e.g. an HTTP body) into the store, verified against `digest`."""
        if self.has_blob(digest):
            return self.blob_path(digest)
        w = await trio.to_thread.run_sync(self.blob_writer, digest, size)
        try:
            pending: list[bytes] = []
            pending_len = 0
            async for chunk in chunks:
                pending.append(chunk)
                pending_len += len(chunk)
                if pending_len >= _BATCH:
                    await trio.to_thread.run_sync(w.write, b"".join(pending))
                    pending, pending_len = [], 0
            if pending:
                await trio.to_thread.run_sync(w.write, b"".join(pending))
            return await trio.to_thread.run_sync(w.commit)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(w.abort)
            raise

    def put_bytes_sync(self, data: bytes, digest: str | None = None) -> str:
        """Store a small in-memory blob (manifest, config); returns its digest."""
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if digest is not None and digest != got:
            raise DigestMismatchError(f"content hashes to {got}, expected {digest}")
        if not self.has_blob(got):
            w = self.blob_writer(got, len(data))
            w.write(data)
            w.commit()
        return got

    async def put_bytes(self, data: bytes, digest: str | None = None) -> str:
        return await trio.to_thread.run_sync(self.put_bytes_sync, data, digest)

    def read_blob_sync(self, digest: str) -> bytes:
        return self.blob_path(digest).read_bytes()

    async def read_blob(self, digest: str) -> bytes:
        return await trio.to_thread.run_sync(self.read_blob_sync, digest)

    # -- images ------------------------------------------------------------
    def add_image_sync(self, record: ImageRecord) -> ImageRecord:
        """Record an image whose blobs are all present (verified by the caller's writes)."""
        missing = [d for d in sorted(record.digests()) if not self.has_blob(d)]
        if missing:
            raise ImageError(f"cannot record {record.ref}: blobs missing: {', '.join(missing)}")
        record.ref = str(parse_reference(record.ref))
        with self._lock:
            old = self._images.get(record.ref)
            if old is not None and old.manifest_digest == record.manifest_digest:
                record.created = old.created
            self._images[record.ref] = record
            self._save_index()
        return record

    async def add_image(self, record: ImageRecord) -> ImageRecord:
        return await trio.to_thread.run_sync(self.add_image_sync, record)

    def get(self, ref: str) -> ImageRecord | None:
        """The record for `ref`: a name (normalized), `name@digest`, or a bare image/manifest digest."""
        with self._lock:
            if is_digest(ref):
                for rec in self._images.values():
                    if ref in (rec.config_digest, rec.manifest_digest, rec.repo_digest):
                        return rec
                return None
            parsed = parse_reference(ref)
            rec = self._images.get(str(parsed))
            if rec is not None or parsed.digest is None:
                return rec
            # `name@digest` is present when that content is here under any tag of `name`.
            for rec in self._images.values():
                if parse_reference(rec.ref).repository == parsed.repository and parsed.digest in (
                    rec.repo_digest, rec.manifest_digest,
                ):
                    return rec
            return None

    def has_image(self, ref: str) -> bool:
        return self.get(ref) is not None

    def _require(self, ref: str) -> ImageRecord:
        rec = self.get(ref)
        if rec is None:
            raise ImageNotFoundError(ref)
        return rec

    def list(self) -> list[ImageRecord]:
        with self._lock:
            return sorted(self._images.values(), key=lambda r: r.ref)

    async def image_config(self, ref: str) -> dict[str, Any]:
        """The image's run settings: the `config` object (Env, Cmd, Entrypoint, WorkingDir, ...)."""
        doc = await self.image_document(ref)
        cfg = doc.get("config")
        return dict(cfg) if isinstance(cfg, dict) else {}

    async def image_document(self, ref: str) -> dict[str, Any]:
        """The whole image config JSON (architecture, os, rootfs, history, config)."""
        rec = self._require(ref)
        cached = self._configs.get(rec.config_digest)
        if cached is None:
            raw = await self.read_blob(rec.config_digest)
            cached = json.loads(raw)
            self._configs[rec.config_digest] = cached
        return cached

    async def layers_for(self, ref: str) -> list[Path]:
        """Unpacked layer directories, bottom layer first (overlayfs lowerdir wants them reversed).

        Unpacks any layer not yet on disk and marks the image as just used.
        """
        rec = self._require(ref)
        paths = [
            await trio.to_thread.run_sync(self.unpack_sync, layer) for layer in rec.layers
        ]
        await trio.to_thread.run_sync(self._touch_sync, rec.ref)
        return paths

    def unpack_sync(self, layer: LayerRecord, fmt: str | None = None) -> Path:
        """The unpacked directory of `layer`, unpacking it if needed."""
        fmt = fmt or default_format()
        hex_ = sha256_hex(layer.diff_id)
        final = self.root / "layers" / hex_
        with self._lock:
            info = self._layers.get(hex_)
        if info is not None and info.get("format") == fmt and final.is_dir():
            return final
        if final.exists():
            # Unpacked in another format (e.g. before the agent ran as root) or unindexed.
            remove_tree(final)
        tmp = self.root / "tmp" / f"layer-{uuid.uuid4().hex}"
        size = unpack_layer(self.blob_path(layer.digest), tmp, diff_id=layer.diff_id, fmt=fmt)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another thread finished the same layer first; theirs is as good as ours.
            remove_tree(tmp)
            if not final.is_dir():
                raise
        _fsync_dir(final.parent)
        with self._lock:
            self._layers[hex_] = {"size": size, "format": fmt}
            self._save_index()
        return final

    def _touch_sync(self, ref: str) -> None:
        with self._lock:
            rec = self._images.get(ref)
            if rec is not None:
                rec.last_used = time.time()
                self._save_index()

    # -- removal and garbage collection --------------------------------------
    async def remove(self, ref: str) -> int:
        """Forget `ref` and delete whatever no other image needs; returns bytes freed."""
        rec = self._require(ref)
        return await trio.to_thread.run_sync(self._remove_refs_sync, [rec.ref])

    async def gc(self, keep: Iterable[str] = (), bytes_to_free: int | None = None) -> int:
        """Remove unkept images, least recently used first, until `bytes_to_free` are freed.

        `keep` holds the references (or digests) of images in use — the agent passes
        every container's image.  With `bytes_to_free=None`, removes every unkept
        image.  Returns the bytes actually freed (blobs and unpacked layers).
        """
        with self._lock:
            plan = plan_gc(list(self._images.values()), set(keep), bytes_to_free, self._sizes())
        # Pruning runs even with an empty plan: it also sweeps blobs left by failed pulls.
        return await trio.to_thread.run_sync(self._remove_refs_sync, plan)

    def _sizes(self) -> dict[str, int]:
        """Bytes on disk per blob digest and per unpacked layer (keyed by diff_id)."""
        sizes: dict[str, int] = {}
        for rec in self._images.values():
            for layer in rec.layers:
                sizes[layer.digest] = layer.size
                info = self._layers.get(layer.diff_id.removeprefix("sha256:"))
                if info is not None:
                    sizes["layer:" + layer.diff_id] = int(info.get("size", 0))
        return sizes

    def _remove_refs_sync(self, refs: list[str]) -> int:
        with self._lock:
            for ref in refs:
                self._images.pop(ref, None)
            self._save_index()
        return self.prune_sync()

    def prune_sync(self) -> int:
        """Delete blobs and layer dirs no image references; returns bytes freed."""
        with self._lock:
            live_blobs = {sha256_hex(d) for rec in self._images.values() for d in rec.digests()}
            live_layers = {
                sha256_hex(layer.diff_id) for rec in self._images.values() for layer in rec.layers
            }
            freed = 0
            for blob in (self.root / "blobs" / "sha256").iterdir():
                if blob.name not in live_blobs:
                    freed += blob.stat().st_size
                    blob.unlink()
            for layer_dir in (self.root / "layers").iterdir():
                if layer_dir.name not in live_layers:
                    info = self._layers.pop(layer_dir.name, None)
                    freed += int(info["size"]) if info else tree_size(layer_dir)
                    remove_tree(layer_dir)
            self._save_index()
        return freed

    def disk_usage(self) -> int:
        """Bytes held: blobs plus unpacked layers (as recorded when they were unpacked)."""
        with self._lock:
            blobs = sum(p.stat().st_size for p in (self.root / "blobs" / "sha256").iterdir())
            return blobs + sum(int(v.get("size", 0)) for v in self._layers.values())


def _keep_keys(keep: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for k in keep:
        out.add(k)
        if not is_digest(k):
            try:
                out.add(str(parse_reference(k)))
            except ImageError:
                pass  # not a valid name: it can only match literally
    return out


def _kept(rec: ImageRecord, keys: set[str]) -> bool:
    if rec.ref in keys or keys & {rec.config_digest, rec.manifest_digest, rec.repo_digest}:
        return True
    # `name@digest` keeps a tagged record holding that content.
    repo = parse_reference(rec.ref).repository
    return any(f"{repo}@{d}" in keys for d in (rec.repo_digest, rec.manifest_digest))


def plan_gc(
    images: list[ImageRecord],
    keep: set[str],
    bytes_to_free: int | None,
    sizes: dict[str, int],
) -> list[str]:
    """Which image refs to remove, in order: unkept images, least recently used first.

    Stops as soon as the removed images' *exclusive* content (blobs and unpacked
    layers no remaining image shares) reaches `bytes_to_free`; `None` removes all
    unkept images.  `sizes` maps blob digests and `"layer:" + diff_id` to bytes.
    """
    keys = _keep_keys(keep)
    candidates = sorted(
        (r for r in images if not _kept(r, keys)), key=lambda r: (r.last_used, r.ref)
    )
    if bytes_to_free is None:
        return [r.ref for r in candidates]
    if bytes_to_free <= 0:
        return []

    def content(r: ImageRecord) -> set[str]:
        return r.digests() | {"layer:" + layer.diff_id for layer in r.layers}

    plan: list[str] = []
    removed: set[str] = set()
    for rec in candidates:
        plan.append(rec.ref)
        removed.add(rec.ref)
        still_needed: set[str] = set()
        for other in images:
            if other.ref not in removed:
                still_needed |= content(other)
        gone: set[str] = set()
        for r in images:
            if r.ref in removed:
                gone |= content(r)
        if sum(sizes.get(k, 0) for k in gone - still_needed) >= bytes_to_free:
            break
    return plan


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
