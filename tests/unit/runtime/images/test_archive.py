"""Importing OCI-layout and docker-save archives (images built in memory, no busybox needed)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from fleet.runtime.images import ImageImportError, ImageStore, Platform, import_archive
from fleet.testing.oci_image import OciImage, build_layer, write_docker_archive, write_oci_archive

AMD64 = Platform("linux", "amd64")


def image(cmd: str = "run") -> OciImage:
    layers = [build_layer({"bin/tool": b"tool"}), build_layer({"bin/tool": None, "app/x": b"x"})]
    return OciImage(layers=layers, config={"architecture": "amd64", "os": "linux",
                                           "config": {"Cmd": [cmd]}}, platform=AMD64)


async def test_oci_archive(tmp_path: Path) -> None:
    img = image()
    arc = write_oci_archive(img, tmp_path / "img.tar", "registry.test/team/app:v1")
    store = ImageStore(tmp_path / "store")
    assert await import_archive(store, arc) == ["registry.test/team/app:v1"]
    rec = store.get("registry.test/team/app:v1")
    assert rec is not None and rec.manifest_digest == img.manifest_digest
    assert await store.image_config(rec.ref) == {"Cmd": ["run"]}
    layers = await store.layers_for(rec.ref)
    assert (layers[0] / "bin/tool").read_bytes() == b"tool"
    assert (layers[1] / "app/x").exists()


async def test_oci_archive_with_only_a_tag_needs_a_name(tmp_path: Path) -> None:
    img = image()
    arc = tmp_path / "tagonly.tar"
    write_oci_archive(img, arc, None)
    # Rewrite index.json to carry only a bare tag, as skopeo does for "oci-archive:x.tar:v2".
    with tarfile.open(arc) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]
    index = json.loads(members["index.json"])
    index["manifests"][0]["annotations"] = {"org.opencontainers.image.ref.name": "v2"}
    members["index.json"] = json.dumps(index).encode()
    gz = tmp_path / "tagonly.tar.gz"
    with tarfile.open(gz, "w:gz") as tf:  # compressed archives are fine too
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageImportError, match="give a name"):
        await import_archive(store, gz)
    assert await import_archive(store, gz, name="registry.test/app") == ["registry.test/app:v2"]


async def test_docker_save_archive(tmp_path: Path) -> None:
    img = image("docker")
    arc = write_docker_archive(img, tmp_path / "save.tar", ["app:v1", "registry.test/app:latest"])
    store = ImageStore(tmp_path / "store")
    refs = await import_archive(store, arc)
    assert refs == ["docker.io/library/app:v1", "registry.test/app:latest"]
    a, b = store.get(refs[0]), store.get(refs[1])
    assert a is not None and b is not None and a.manifest_digest == b.manifest_digest
    assert a.config_digest == img.config_digest
    # docker save layers are plain tars: their digest is their diff_id.
    assert [la.digest for la in a.layers] == [la.diff_id for la in img.layers]
    assert await store.image_config(refs[0]) == {"Cmd": ["docker"]}
    layers = await store.layers_for(refs[1])
    assert (layers[1] / "app/x").read_bytes() == b"x"
    manifest = json.loads(store.read_blob_sync(a.manifest_digest))
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"


async def test_not_an_image_archive(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    junk = tmp_path / "junk.tar"
    with tarfile.open(junk, "w") as tf:
        tf.add(__file__, arcname="readme.txt")
    with pytest.raises(ImageImportError, match="neither an OCI image layout"):
        await import_archive(store, junk)
    notatar = tmp_path / "x.tar"
    notatar.write_bytes(gzip.compress(b"nope"))
    with pytest.raises(ImageImportError, match="not a readable tar"):
        await import_archive(store, notatar)


async def test_tampered_archive_blob_is_refused(tmp_path: Path) -> None:
    img = image()
    arc = write_oci_archive(img, tmp_path / "img.tar", "registry.test/app:v1")
    data = bytearray(arc.read_bytes())
    # Flip a byte inside the config blob's content.
    pos = data.find(img.config_bytes)
    data[pos + 5] ^= 0x01
    arc.write_bytes(bytes(data))
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageImportError, match="hashes to"):
        await import_archive(store, arc)
    assert store.list() == []
