"""The content-addressed store: verified blob writes, the index, layers, removal and GC."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import trio

from fleet.runtime.images import (
    DigestMismatchError,
    ImageNotFoundError,
    ImageRecord,
    ImageStore,
    LayerRecord,
    plan_gc,
)
from fleet.runtime.images.manifest import OCI_LAYER_GZIP
from fleet.testing.oci_image import build_layer


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def add_image(
    store: ImageStore, ref: str, layers: list[dict], *, last_used: float = 0.0, cmd: list[str] | None = None
) -> ImageRecord:
    """Put a small image straight into the store (what a pull or import ends with)."""
    built = [build_layer(files) for files in layers]
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Cmd": cmd or ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": [b.diff_id for b in built]},
    }).encode()
    config_digest = store.put_bytes_sync(config)
    manifest = json.dumps({"config": config_digest, "layers": [b.digest for b in built]}).encode()
    manifest_digest = store.put_bytes_sync(manifest)
    for b in built:
        store.put_bytes_sync(b.gz)
    rec = ImageRecord(
        ref=ref, repo_digest=manifest_digest, manifest_digest=manifest_digest,
        config_digest=config_digest,
        layers=[LayerRecord(b.digest, OCI_LAYER_GZIP, len(b.gz), b.diff_id) for b in built],
        platform="linux/amd64", size=sum(len(b.gz) for b in built), last_used=last_used,
    )
    store.add_image_sync(rec)
    rec.last_used = last_used  # add_image_sync keeps what we passed; tests pin LRU order
    return rec


async def test_blob_write_verifies_digest_and_size(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    data = b"hello blob" * 1000

    async def chunks():
        for i in range(0, len(data), 777):
            yield data[i:i + 777]

    path = await store.ingest(sha(data), chunks(), len(data))
    assert path.read_bytes() == data and store.has_blob(sha(data))
    assert path == tmp_path / "blobs" / "sha256" / sha(data).removeprefix("sha256:")

    wrong = "sha256:" + "0" * 64
    with pytest.raises(DigestMismatchError):
        await store.ingest(wrong, chunks())
    with pytest.raises(DigestMismatchError, match="larger than"):
        store.ingest_sync(sha(b"other"), io.BytesIO(b"other-but-longer"), size=5)
    assert not store.has_blob(wrong)
    assert os.listdir(tmp_path / "tmp") == [], "failed writes leave no temp files"
    with pytest.raises(DigestMismatchError):
        store.put_bytes_sync(b"abc", wrong)


async def test_index_persists_and_lookups(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    rec = add_image(store, "busybox", [{"bin/x": b"x"}])
    assert rec.ref == "docker.io/library/busybox:latest"
    again = ImageStore(tmp_path)  # a restarted agent sees the same images
    for ref in ("busybox", "docker.io/library/busybox:latest", "busybox:latest",
                rec.config_digest, rec.manifest_digest,
                f"busybox@{rec.manifest_digest}"):
        got = again.get(ref)
        assert got is not None and got.manifest_digest == rec.manifest_digest, ref
    assert again.get("busybox:other") is None
    assert again.get("alpine@" + rec.manifest_digest) is None
    assert [r.ref for r in again.list()] == [rec.ref]
    assert (await again.image_config("busybox")) == {"Cmd": ["sh"]}
    with pytest.raises(ImageNotFoundError):
        await again.image_config("nothere")


async def test_layers_unpacked_once_and_shared(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    base = {"bin/tool": b"tool", "etc/passwd": b"root:x:0:0::/:/bin/sh\n"}
    a = add_image(store, "reg.test/a:1", [base, {"app/a": b"a"}])
    b = add_image(store, "reg.test/b:1", [base, {"app/b": b"b"}])
    la = await store.layers_for(a.ref)
    lb = await store.layers_for(b.ref)
    assert la[0] == lb[0], "a shared base layer is unpacked once"
    assert (la[0] / "bin/tool").read_bytes() == b"tool"
    assert (la[1] / "app/a").exists() and (lb[1] / "app/b").exists()
    assert la[0].name == a.layers[0].diff_id.removeprefix("sha256:")
    inode = os.stat(la[0] / "bin/tool").st_ino
    # Concurrent callers get the same directories; nothing is unpacked twice.
    async with trio.open_nursery() as n:
        for _ in range(4):
            n.start_soon(store.layers_for, a.ref)
    assert os.stat(la[0] / "bin/tool").st_ino == inode
    assert store.get(a.ref).last_used > 0  # type: ignore[union-attr]


async def test_remove_deletes_only_unshared_content(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    base = {"bin/tool": b"t" * 5000}
    a = add_image(store, "reg.test/a:1", [base, {"a": b"a" * 3000}])
    b = add_image(store, "reg.test/b:1", [base])
    la = await store.layers_for(a.ref)
    await store.layers_for(b.ref)
    freed = await store.remove("reg.test/a:1")
    assert freed > 3000
    assert store.get(a.ref) is None and store.get(b.ref) is not None
    assert la[0].exists() and not la[1].exists()
    assert not store.has_blob(a.layers[1].digest) and not store.has_blob(a.config_digest)
    assert store.has_blob(b.layers[0].digest)
    with pytest.raises(ImageNotFoundError):
        await store.remove("reg.test/a:1")


def _rec(ref: str, last_used: float, layers: list[tuple[str, int]]) -> ImageRecord:
    return ImageRecord(
        ref=ref, repo_digest=f"m-{ref}", manifest_digest=f"m-{ref}", config_digest=f"c-{ref}",
        layers=[LayerRecord(d, OCI_LAYER_GZIP, size, f"diff-{d}") for d, size in layers],
        platform="linux/amd64", size=sum(s for _, s in layers), last_used=last_used,
    )


IMAGES = [
    _rec("r/old:1", 10, [("base", 100), ("old", 50)]),
    _rec("r/mid:1", 20, [("base", 100), ("mid", 30)]),
    _rec("r/new:1", 30, [("new", 70)]),
    _rec("r/used:1", 5, [("used", 500)]),
]
SIZES = {"base": 100, "old": 50, "mid": 30, "new": 70, "used": 500}


@pytest.mark.parametrize(
    ("keep", "to_free", "want"),
    [
        # Everything unkept, least recently used first.
        ({"r/used:1"}, None, ["r/old:1", "r/mid:1", "r/new:1"]),
        # Removing old frees only its own layer (base is shared with mid): 50 ≥ 40.
        ({"r/used:1"}, 40, ["r/old:1"]),
        # 60 needs more: old (50) + mid (30 + the now-unshared base 100).
        ({"r/used:1"}, 60, ["r/old:1", "r/mid:1"]),
        ({"r/used:1"}, 10_000, ["r/old:1", "r/mid:1", "r/new:1"]),
        ({"r/used:1"}, 0, []),
        # keep matches by digest too; used (oldest) is first when not kept.
        ({"m-r/old:1"}, 400, ["r/used:1"]),
        (set(), None, ["r/used:1", "r/old:1", "r/mid:1", "r/new:1"]),
    ],
)
def test_plan_gc_order(keep: set[str], to_free: int | None, want: list[str]) -> None:
    assert plan_gc(IMAGES, keep, to_free, SIZES) == want


async def test_gc_removes_lru_unkept_images(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    big = os.urandom(20_000)  # incompressible, so its layer is worth freeing
    old = add_image(store, "reg.test/old:1", [{"f": big}], last_used=1)
    add_image(store, "reg.test/new:1", [{"g": os.urandom(20_000)}], last_used=2)
    add_image(store, "reg.test/kept:1", [{"h": b"h"}], last_used=0)
    for r in store.list():
        store.unpack_sync(r.layers[0])
    before = store.disk_usage()
    freed = await store.gc(keep={"reg.test/kept:1"}, bytes_to_free=1000)
    assert freed >= 20_000 + len(big) // 2
    assert [r.ref for r in store.list()] == ["reg.test/kept:1", "reg.test/new:1"]
    assert not store.has_blob(old.layers[0].digest)
    assert store.disk_usage() == before - freed
    freed_all = await store.gc(keep={"kept:1", "reg.test/kept:1"})
    assert freed_all > 0
    assert [r.ref for r in store.list()] == ["reg.test/kept:1"]
    assert await store.gc(keep={"reg.test/kept:1"}) == 0


async def test_leftover_temp_files_are_cleaned_on_open(tmp_path: Path) -> None:
    store = await ImageStore.open(tmp_path)
    (tmp_path / "tmp" / "blob-crashed").write_bytes(b"half a blob")
    (tmp_path / "tmp" / "layer-crashed").mkdir()
    await ImageStore.open(tmp_path)
    assert os.listdir(tmp_path / "tmp") == []
    assert store.list() == []
