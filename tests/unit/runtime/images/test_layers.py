"""Layer unpacking: whiteouts, opaque dirs, path-traversal refusal, digests, codecs.

The tars are made by hand, entry by entry, so each test states exactly what a
hostile or unusual layer contains.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from fleet.runtime.images import DigestMismatchError, LayerError, flatten_layers
from fleet.runtime.images.layers import (
    FORMAT_OCI,
    FORMAT_OVERLAY,
    OPAQUE_XATTR,
    is_overlay_whiteout,
    unpack_layer,
    zstd_available,
)

ROOT = os.geteuid() == 0


def make_tar(*entries: tuple) -> bytes:
    """Entries: ("file", name, data[, mode]) | ("dir", name[, mode]) | ("sym", name, target)
    | ("link", name, target) | ("fifo", name)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for kind, name, *rest in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1_700_000_000
            if kind == "file":
                data = rest[0]
                ti.size = len(data)
                ti.mode = rest[1] if len(rest) > 1 else 0o644
                tf.addfile(ti, io.BytesIO(data))
                continue
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, rest[0] if rest else 0o755
            elif kind == "sym":
                ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, rest[0], 0o777
            elif kind == "link":
                ti.type, ti.linkname = tarfile.LNKTYPE, rest[0]
            elif kind == "fifo":
                ti.type, ti.mode = tarfile.FIFOTYPE, 0o600
            tf.addfile(ti)
    return buf.getvalue()


def write_blob(tmp_path: Path, data: bytes, name: str = "blob") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def diff_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_files_dirs_links_and_modes(tmp_path: Path) -> None:
    tar = make_tar(
        ("dir", "bin"),
        ("file", "bin/tool", b"#!/bin/sh\n", 0o755),
        ("sym", "bin/sh", "/bin/tool"),  # absolute targets are normal in images
        ("sym", "bin/up", "../../../../etc"),  # stored verbatim, never followed
        ("link", "bin/tool2", "bin/tool"),
        ("file", "./etc/conf", b"x=1\n"),
        ("file", "/abs/inside", b"leading slash stays in the layer"),
        ("dir", "ro", 0o555),
        ("file", "ro/f", b"in a read-only dir"),
        ("fifo", "run/fifo"),
    )
    dest = tmp_path / "layer"
    unpack_layer(write_blob(tmp_path, tar), dest, diff_id=diff_id(tar), fmt=FORMAT_OCI)
    assert (dest / "bin/tool").read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE(os.stat(dest / "bin/tool").st_mode) == 0o755
    assert os.readlink(dest / "bin/sh") == "/bin/tool"
    assert os.readlink(dest / "bin/up") == "../../../../etc"
    assert os.stat(dest / "bin/tool2").st_ino == os.stat(dest / "bin/tool").st_ino
    assert (dest / "etc/conf").read_text() == "x=1\n"
    assert (dest / "abs/inside").exists()
    assert stat.S_IMODE(os.stat(dest / "ro").st_mode) == 0o555
    assert (dest / "ro/f").read_bytes() == b"in a read-only dir"
    assert stat.S_ISFIFO(os.lstat(dest / "run/fifo").st_mode)
    assert os.stat(dest / "etc/conf").st_mtime == 1_700_000_000
    assert not list(tmp_path.glob("etc*")), "nothing may land outside the layer"


@pytest.mark.parametrize(
    "entries",
    [
        [("file", "../evil", b"x")],
        [("file", "a/../../evil", b"x")],
        [("dir", "a"), ("sym", "a/out", "/tmp"), ("file", "a/out/evil", b"x")],
        [("sym", "up", "../../.."), ("file", "up/evil", b"x")],
        [("file", "a", b"x"), ("file", "a/b", b"y")],
        [("link", "evil", "../../etc/passwd")],
        [("link", "dangling", "not/there")],
        [("sym", "s", "/etc/passwd"), ("link", "hl", "s")],
        [("file", "a/.wh...", b"")],
    ],
    ids=[
        "dotdot", "nested-dotdot", "write-through-absolute-symlink",
        "write-through-relative-symlink", "file-as-parent", "hardlink-escape",
        "hardlink-dangling", "hardlink-to-symlink", "whiteout-of-dotdot",
    ],
)
def test_unsafe_layers_are_refused(tmp_path: Path, entries: list[tuple]) -> None:
    tar = make_tar(*entries)
    dest = tmp_path / "root" / "layer"
    dest.parent.mkdir()
    with pytest.raises(LayerError):
        unpack_layer(write_blob(tmp_path, tar), dest, fmt=FORMAT_OCI)
    assert not dest.exists(), "a refused layer leaves nothing behind"
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()
    assert not Path("/tmp/evil").exists()


def test_whiteouts_oci_format(tmp_path: Path) -> None:
    tar = make_tar(
        ("dir", "etc"),
        ("file", "etc/.wh.passwd", b""),
        ("dir", "var/cache"),
        ("file", "var/cache/.wh..wh..opq", b""),
        ("file", "var/cache/new", b"n"),
    )
    dest = tmp_path / "layer"
    unpack_layer(write_blob(tmp_path, tar), dest, fmt=FORMAT_OCI)
    assert (dest / "etc/.wh.passwd").is_file()
    assert (dest / "var/cache/.wh..wh..opq").is_file()
    assert (dest / "var/cache/new").read_text() == "n"


@pytest.mark.skipif(not ROOT, reason="needs root (mknod whiteouts, trusted.* xattrs)")
def test_whiteouts_overlay_format(tmp_path: Path) -> None:
    tar = make_tar(
        ("dir", "etc"),
        ("file", "etc/.wh.passwd", b""),
        ("file", "var/cache/.wh..wh..opq", b""),  # marker before its directory's entry
        ("dir", "var/cache", 0o700),
        ("file", "var/cache/new", b"n"),
    )
    dest = tmp_path / "layer"
    unpack_layer(write_blob(tmp_path, tar), dest, fmt=FORMAT_OVERLAY)
    st = os.lstat(dest / "etc/passwd")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)
    assert is_overlay_whiteout(st)
    assert not (dest / "etc/.wh.passwd").exists()
    assert os.getxattr(dest / "var/cache", OPAQUE_XATTR) == b"y"
    assert not (dest / "var/cache/.wh..wh..opq").exists()
    assert stat.S_IMODE(os.stat(dest / "var/cache").st_mode) == 0o700
    assert (dest / "var/cache/new").read_text() == "n"


def test_diff_id_is_verified(tmp_path: Path) -> None:
    tar = make_tar(("file", "f", b"data"))
    blob = write_blob(tmp_path, gzip.compress(tar))
    with pytest.raises(DigestMismatchError, match="unpacked to"):
        unpack_layer(blob, tmp_path / "bad", diff_id="sha256:" + "0" * 64, fmt=FORMAT_OCI)
    assert not (tmp_path / "bad").exists()
    # The diff_id covers the whole uncompressed stream, trailing padding included.
    unpack_layer(blob, tmp_path / "good", diff_id=diff_id(tar), fmt=FORMAT_OCI)
    assert (tmp_path / "good/f").read_bytes() == b"data"


def test_gzip_and_plain_layers(tmp_path: Path) -> None:
    tar = make_tar(("file", "f", b"same"))
    for name, data in (("plain", tar), ("gz", gzip.compress(tar))):
        dest = tmp_path / name
        unpack_layer(write_blob(tmp_path, data, name + ".blob"), dest, diff_id=diff_id(tar),
                     fmt=FORMAT_OCI)
        assert (dest / "f").read_bytes() == b"same"


@pytest.mark.skipif(not zstd_available(), reason="needs the zstandard module")
def test_zstd_layer(tmp_path: Path) -> None:
    import zstandard

    tar = make_tar(("file", "f", b"zstd"))
    blob = write_blob(tmp_path, zstandard.ZstdCompressor().compress(tar))
    unpack_layer(blob, tmp_path / "z", diff_id=diff_id(tar), fmt=FORMAT_OCI)
    assert (tmp_path / "z/f").read_bytes() == b"zstd"


def test_zstd_without_the_module_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail
    blob = write_blob(tmp_path, b"\x28\xb5\x2f\xfd" + b"\0" * 32)
    with pytest.raises(LayerError, match="zstandard module is not installed"):
        unpack_layer(blob, tmp_path / "z", fmt=FORMAT_OCI)


def test_not_a_tar(tmp_path: Path) -> None:
    with pytest.raises(LayerError):
        unpack_layer(write_blob(tmp_path, gzip.compress(b"hello " * 200)), tmp_path / "x",
                     fmt=FORMAT_OCI)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("fmt", [FORMAT_OCI, FORMAT_OVERLAY])
def test_flatten_layers_applies_whiteouts(tmp_path: Path, fmt: str) -> None:
    if fmt == FORMAT_OVERLAY and not ROOT:
        pytest.skip("needs root (overlay-format whiteouts)")
    lower = make_tar(
        ("file", "a/x", b"x"), ("file", "a/y", b"y"), ("file", "b", b"b"),
        ("file", "c/old1", b"1"), ("file", "c/sub/old2", b"2"), ("sym", "d", "b"),
    )
    upper = make_tar(
        ("file", "a/.wh.x", b""), ("file", ".wh.b", b""),
        ("dir", "c"), ("file", "c/.wh..wh..opq", b""), ("file", "c/new", b"n"),
        ("file", "a/y", b"Y2"), ("file", "e", b"e"),
    )
    dirs = []
    for i, data in enumerate((lower, upper)):
        d = tmp_path / f"l{i}"
        unpack_layer(write_blob(tmp_path, data, f"b{i}"), d, fmt=fmt)
        dirs.append(d)
    out = tmp_path / "rootfs"
    flatten_layers(dirs, out)
    files = sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() or p.is_symlink()
    )
    assert files == ["a/y", "c/new", "d", "e"]
    assert (out / "a/y").read_bytes() == b"Y2"
    assert os.readlink(out / "d") == "b"
