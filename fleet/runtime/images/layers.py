"""Unpacking layer tarballs into directories the runtime can stack with overlayfs.

Each layer is unpacked once, on its own, into an empty directory; the runtime
later mounts `overlay` with those directories as lowerdirs.  So a layer's
deletions have to be written the way overlayfs reads them, not the way OCI ships
them:

* `dir/.wh.name` (OCI whiteout: "name was deleted") becomes a character device
  0/0 at `dir/name`;
* `dir/.wh..wh..opq` (opaque dir: "hide everything below from lower layers")
  becomes the `trusted.overlay.opaque=y` xattr on `dir`.

Both need root (mknod, trusted.* xattrs).  Without root the OCI markers are kept
as plain empty files (the "oci" format) and `flatten_layers` understands both
forms, so an unprivileged runtime can still copy layers into a plain rootfs.

Safety: a layer is untrusted input.  Every entry's path is normalized and must
stay inside the layer directory; no `..` escapes, and nothing is ever written
*through* a symlink — each parent component is checked with lstat and files are
opened with O_NOFOLLOW — so a symlink entry whose target is absolute or climbs
out (`/etc`, `../../..`) is stored verbatim (inside the container it resolves
against the container's root, which is where it belongs) but cannot redirect a
later write onto the host.  Hard links must point at a regular file already
unpacked in the same layer.  Anything else aborts the layer with `LayerError`.

While unpacking, the uncompressed stream is hashed and compared with the layer's
diff_id from the image config, so a layer on disk is exactly what the image says.

Everything here is blocking; callers run it in a worker thread.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import IO, BinaryIO

from fleet.runtime.images.errors import DigestMismatchError, LayerError

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"

FORMAT_OVERLAY = "overlay"  # whiteouts as 0/0 char devices + opaque xattr (needs root)
FORMAT_OCI = "oci"  # whiteouts kept as the OCI `.wh.` marker files

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20


def zstd_available() -> bool:
    """True when the optional `zstandard` module is importable (zstd layers need it)."""
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def default_format() -> str:
    """overlay when we may mknod and set trusted.* xattrs (root), else oci."""
    return FORMAT_OVERLAY if os.geteuid() == 0 else FORMAT_OCI


class _HashingReader(io.RawIOBase):
    """Passes reads through while hashing them, so we verify the diff_id in one pass."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self.hash = hashlib.sha256()
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(len(b))
        n = len(data)
        b[:n] = data
        self.hash.update(data)
        self.count += n
        return n

    def drain(self) -> None:
        """Read to the end: tar's trailing zero blocks count towards the diff_id."""
        while self._inner is not None:
            data = self._inner.read(_CHUNK)
            if not data:
                return
            self.hash.update(data)
            self.count += len(data)


def open_decompressed(raw: BinaryIO) -> IO[bytes]:
    """A reader of the uncompressed tar, choosing the codec by magic bytes, not media type.

    `docker save` layers are plain tars whatever anyone calls them, and some
    registries mislabel media types; the first bytes never lie.
    """
    head = raw.read(4)
    raw.seek(0)
    if head.startswith(_GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if head == _ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raise LayerError(
                "layer is zstd-compressed and the zstandard module is not installed"
            ) from None
        return zstandard.ZstdDecompressor().stream_reader(raw)  # type: ignore[return-value]
    return raw


def unpack_layer(
    blob: Path, dest: Path, *, diff_id: str | None = None, fmt: str | None = None
) -> int:
    """Unpack the layer tarball `blob` into the new directory `dest`; returns bytes written.

    `dest` must not exist; on any failure it is removed again.  When `diff_id` is
    given, the uncompressed stream must hash to it.
    """
    fmt = fmt or default_format()
    dest.mkdir(mode=0o755)
    try:
        with open(blob, "rb") as raw:
            reader = _HashingReader(open_decompressed(raw))
            buffered = io.BufferedReader(reader, _CHUNK)
            size = _Extractor(dest, fmt).run(buffered)
            # BufferedReader may hold read-ahead bytes already hashed; draining the
            # raw reader completes the hash of the whole stream.
            reader.drain()
        if diff_id is not None:
            got = "sha256:" + reader.hash.hexdigest()
            if got != diff_id:
                raise DigestMismatchError(
                    f"layer {blob.name} unpacked to {got}, but the image config says {diff_id}"
                )
        return size
    except BaseException:
        remove_tree(dest)
        raise


class _Extractor:
    def __init__(self, root: Path, fmt: str) -> None:
        self.root = root
        self.fmt = fmt
        self.as_root = os.geteuid() == 0
        # Directory modes and times are applied last: a read-only directory must
        # still accept its children, and writing children bumps a dir's mtime.
        self.dirs: list[tuple[Path, tarfile.TarInfo]] = []
        self.written = 0

    def run(self, stream: IO[bytes]) -> int:
        try:
            tf = tarfile.open(fileobj=stream, mode="r|")
        except tarfile.TarError as e:
            raise LayerError(f"layer is not a tar archive: {e}") from None
        with tf:
            try:
                for member in tf:
                    self._entry(tf, member)
            except tarfile.TarError as e:
                raise LayerError(f"corrupt layer tar: {e}") from None
        for path, member in reversed(self.dirs):
            self._set_meta(path, member)
        return self.written

    # -- paths -------------------------------------------------------------
    def _clean(self, name: str) -> tuple[str, ...]:
        """The entry's path as components inside the layer; refuses escapes."""
        parts: list[str] = []
        for part in name.replace("\\", "/").split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise LayerError(f"refusing tar entry {name!r}: path escapes the layer")
            parts.append(part)
        return tuple(parts)

    def _parent(self, parts: tuple[str, ...], name: str) -> Path:
        """The (created) parent directory of `parts`, never reached through a symlink."""
        cur = self.root
        for part in parts[:-1]:
            cur = cur / part
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                os.mkdir(cur, 0o755)
                continue
            if stat.S_ISLNK(st.st_mode):
                raise LayerError(f"refusing tar entry {name!r}: its parent {part!r} is a symlink")
            if not stat.S_ISDIR(st.st_mode):
                raise LayerError(f"refusing tar entry {name!r}: parent {part!r} is not a directory")
        return cur

    def _clear(self, path: Path, *, keep_dir: bool = False) -> None:
        """Make room at `path` (a later entry replaces an earlier one)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            remove_tree(path)
        else:
            os.unlink(path)

    # -- entries -----------------------------------------------------------
    def _entry(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        parts = self._clean(m.name)
        if not parts:
            if m.isdir():  # "./" itself: its metadata applies to the layer root
                self.dirs.append((self.root, m))
            return
        parent = self._parent(parts, m.name)
        base = parts[-1]
        if base == OPAQUE_MARKER:
            self._opaque(parent)
            return
        if base.startswith(WHITEOUT_PREFIX):
            self._whiteout(parent, base[len(WHITEOUT_PREFIX):], m.name)
            return
        path = parent / base
        if m.isdir():
            self._clear(path, keep_dir=True)
            if not path.exists():
                os.mkdir(path, 0o755)
            self.dirs.append((path, m))
            return
        self._clear(path)
        if m.isreg():
            src = tf.extractfile(m)
            assert src is not None
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
            self.written += m.size
        elif m.issym():
            # Stored verbatim; never followed while unpacking (see module docstring).
            os.symlink(m.linkname, path)
        elif m.islnk():
            self._hardlink(path, m)
            return  # a hard link shares its target's inode and metadata
        elif m.ischr() or m.isblk():
            if not self.as_root:
                return  # device nodes need root; an unprivileged unpack leaves them out
            kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
            os.mknod(path, kind | 0o600, os.makedev(m.devmajor, m.devminor))
        elif m.isfifo():
            os.mkfifo(path, 0o600)
        else:
            return  # sparse/unknown entry types carry nothing a rootfs needs
        self._set_meta(path, m)

    def _hardlink(self, path: Path, m: tarfile.TarInfo) -> None:
        tparts = self._clean(m.linkname)
        if not tparts:
            raise LayerError(f"refusing hard link {m.name!r} to the layer root")
        target = self._parent(tparts, m.linkname) / tparts[-1]
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            raise LayerError(
                f"hard link {m.name!r} points at {m.linkname!r}, which is not in the layer"
            ) from None
        if not stat.S_ISREG(st.st_mode):
            raise LayerError(f"refusing hard link {m.name!r} to non-regular file {m.linkname!r}")
        os.link(target, path, follow_symlinks=False)

    def _whiteout(self, parent: Path, name: str, entry: str) -> None:
        if not name or name in (".", ".."):
            raise LayerError(f"refusing malformed whiteout {entry!r}")
        target = parent / name
        if self.fmt == FORMAT_OVERLAY:
            self._clear(target)
            os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        else:
            self._clear(parent / (WHITEOUT_PREFIX + name))
            (parent / (WHITEOUT_PREFIX + name)).touch(0o600)

    def _opaque(self, directory: Path) -> None:
        if self.fmt == FORMAT_OVERLAY:
            os.setxattr(directory, OPAQUE_XATTR, b"y", follow_symlinks=False)
        else:
            (directory / OPAQUE_MARKER).touch(0o600)

    def _set_meta(self, path: Path, m: tarfile.TarInfo) -> None:
        link = m.issym()
        if self.as_root:
            try:
                os.lchown(path, m.uid, m.gid)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EINVAL):
                    raise
            for key, value in (m.pax_headers or {}).items():
                # File capabilities (security.capability) and friends travel as PAX xattrs.
                if key.startswith("SCHILY.xattr.") and not link:
                    try:
                        os.setxattr(
                            path, key[len("SCHILY.xattr."):],
                            value.encode("utf-8", "surrogateescape"), follow_symlinks=False,
                        )
                    except OSError:
                        pass  # filesystems without xattr support: the file still works
        if not link:
            os.chmod(path, m.mode & 0o7777)
        try:
            os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)
        except (OSError, NotImplementedError, OverflowError):
            pass  # timestamps are cosmetic; never fail a layer over them


def is_overlay_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)


def flatten_layers(layers: list[Path], dest: Path) -> None:
    """Copy `layers` (bottom first) into the plain directory `dest`, applying whiteouts.

    For runtimes that cannot mount overlayfs (unprivileged nodes); understands
    both the overlay and the OCI form of whiteouts and opaque directories.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for layer in layers:
        for dirpath, dirnames, filenames in os.walk(layer):
            rel = Path(dirpath).relative_to(layer)
            out_dir = dest / rel
            src_dir = Path(dirpath)
            opaque = OPAQUE_MARKER in filenames
            if not opaque:
                try:
                    opaque = os.getxattr(src_dir, OPAQUE_XATTR, follow_symlinks=False) == b"y"
                except OSError:
                    opaque = False
            if opaque and str(rel) != ".":
                remove_tree(out_dir)
            out_dir.mkdir(exist_ok=True)
            shutil.copystat(src_dir, out_dir, follow_symlinks=False)
            for name in list(dirnames) + filenames:
                src = src_dir / name
                st = os.lstat(src)
                if name == OPAQUE_MARKER:
                    continue
                if name.startswith(WHITEOUT_PREFIX):
                    _remove_any(out_dir / name[len(WHITEOUT_PREFIX):])
                    continue
                if is_overlay_whiteout(st):
                    _remove_any(out_dir / name)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    target = out_dir / name
                    if target.is_symlink() or (target.exists() and not target.is_dir()):
                        _remove_any(target)
                    continue  # os.walk descends into it next
                _remove_any(out_dir / name)
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(src), out_dir / name)
                elif stat.S_ISREG(st.st_mode):
                    shutil.copy2(src, out_dir / name, follow_symlinks=False)
                elif stat.S_ISFIFO(st.st_mode):
                    os.mkfifo(out_dir / name, stat.S_IMODE(st.st_mode))
                else:
                    os.mknod(out_dir / name, st.st_mode, st.st_rdev)


def _remove_any(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        remove_tree(path)
    else:
        os.unlink(path)


def remove_tree(path: Path) -> None:
    """rm -rf that also copes with read-only directories inside unpacked layers."""

    def onerror(func, p, exc):  # type: ignore[no-untyped-def]
        # A read-only parent stops unlink; make it writable and retry once.
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except FileNotFoundError:
            pass

    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=onerror)
    else:
        os.unlink(path)


def tree_size(path: Path) -> int:
    """Bytes used by regular files under `path` (each hard-linked inode counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total
