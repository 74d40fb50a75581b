"""Node-side mechanics the storage drivers share: mounts, loop devices, filesystems, usage.

Owns the kernel plumbing so that drivers read as policy:

- mount(2)/umount2(2) through ctypes (`bind_mount`, `mount_fs`, `umount`,
  `umount_all`) — no mount binary, and errno says why a call failed;
- `/proc/self/mountinfo` parsing (`read_mountinfo`, `mount_at`, `mounts_under`);
- loop devices through losetup (`loop_attach`, `loops_of`, `loop_detach`,
  `loop_refresh`): finding the devices already backed by an image is what makes
  node calls survive an agent restart;
- filesystems: `mkfs`, `fs_size` (read straight from the ext4/xfs superblock, a pure
  parser beside a thin read), `grow_ext4_offline`, `grow_xfs`;
- usage: `fs_stats` (statvfs) and `dir_usage` (a walk summing allocated blocks).

Every function here blocks: drivers call them from `trio.to_thread.run_sync`.
`fleet/agent/volumes.py` imports its umount/mountinfo helpers from here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2

_libc: ctypes.CDLL | None = None


def get_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _mount(source: str | None, target: Path, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    rc = get_libc().mount(source.encode() if source is not None else None, os.fsencode(target),
                          fstype.encode() if fstype is not None else None, flags,
                          data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def mount_tmpfs(path: Path, options: str) -> None:
    _mount("tmpfs", path, "tmpfs", 0, options)


def bind_mount(source: Path, target: Path, *, read_only: bool = False) -> None:
    """Bind `source` onto `target`; a read-only bind needs a second, remounting call."""
    _mount(os.fspath(source), target, None, MS_BIND)
    if read_only:
        try:
            _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        except OSError:
            umount(target)
            raise


def mount_fs(device: str, target: Path, fstype: str, options: str = "") -> None:
    _mount(device, target, fstype, 0, options or None)


def umount(path: Path) -> None:
    """Unmount `path`; when busy (a process still has a file open) detach it now and
    let the kernel free it later."""
    libc = get_libc()
    if libc.umount2(os.fsencode(path), 0) != 0:
        if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


def umount_all(path: Path, limit: int = 16) -> None:
    """Unmount every mount stacked on `path` (a bind made twice is two mounts)."""
    for _ in range(limit):
        if mount_at(path) is None:
            return
        umount(path)
    raise OSError(16, f"{path}: still mounted after {limit} unmounts")


# ---------------------------------------------------------------------------------------
# /proc/self/mountinfo


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    dev: tuple[int, int]      # major, minor of the mounted filesystem
    root: str                 # the path inside that filesystem that is mounted here
    mount_point: str
    options: frozenset[str]   # per-mount options (ro/rw, nosuid, ...)
    fstype: str
    source: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def unescape_mountinfo(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """The entries of a mountinfo file, in file order (later mounts stack on earlier)."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ")
        try:
            sep = parts.index("-", 6)
            major, minor = parts[2].split(":")
            out.append(MountEntry(
                mount_id=int(parts[0]), parent_id=int(parts[1]), dev=(int(major), int(minor)),
                root=unescape_mountinfo(parts[3]), mount_point=unescape_mountinfo(parts[4]),
                options=frozenset(parts[5].split(",")), fstype=parts[sep + 1],
                source=unescape_mountinfo(parts[sep + 2]) if len(parts) > sep + 2 else ""))
        except (ValueError, IndexError):
            continue
    return out


def read_mountinfo() -> list[MountEntry]:
    try:
        return parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return []


def mount_at(path: Path, entries: Sequence[MountEntry] | None = None) -> MountEntry | None:
    """The topmost mount whose mount point is exactly `path`, or None."""
    target = os.path.realpath(path)
    found = None
    for e in read_mountinfo() if entries is None else entries:
        if e.mount_point == target:
            found = e
    return found


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below `root` in our mount namespace, deepest first."""
    root_s = os.path.realpath(root)
    found = {Path(e.mount_point) for e in read_mountinfo()
             if e.mount_point == root_s or e.mount_point.startswith(root_s.rstrip("/") + "/")}
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def binds_of(path: Path, entries: Sequence[MountEntry] | None = None) -> list[MountEntry]:
    """Mounts elsewhere that show `path` (or a directory below it): bind mounts of it.

    A bind mount's mountinfo entry names the filesystem (major:minor) and the path
    inside it that is mounted, so `path` is translated into that form through the
    mount that contains it and compared; the containing mount itself is not counted."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return []
    dev = (os.major(st.st_dev), os.minor(st.st_dev))
    entries = read_mountinfo() if entries is None else entries
    home = None
    for e in entries:
        if e.dev == dev and (real == e.mount_point or real.startswith(e.mount_point.rstrip("/") + "/")):
            if home is None or len(e.mount_point) >= len(home.mount_point):
                home = e
    if home is None:
        # st_dev does not name the mount (btrfs subvolumes, overlayfs): compare inodes
        # of the mount points instead — binds of `path` itself, not of directories below.
        return [e for e in entries if e.mount_point != real and same_file(Path(e.mount_point), Path(real))]
    return binds_in(entries, home, real)


def binds_in(entries: Sequence[MountEntry], home: MountEntry, real: str) -> list[MountEntry]:
    """Pure part of `binds_of`: `real` lies in mount `home`."""
    below = os.path.relpath(real, home.mount_point)
    rel = os.path.normpath(os.path.join(home.root, below)) if below != "." else home.root
    return [e for e in entries
            if e.dev == home.dev and e.mount_id != home.mount_id
            and (e.root == rel or e.root.startswith(rel.rstrip("/") + "/"))]


def same_file(a: Path, b: Path) -> bool:
    """`a` and `b` are one inode (a bind mount of `b` on `a` makes this true)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def device_of_mount(path: Path) -> int | None:
    """st_dev of what is mounted at `path` (compare with a block device's st_rdev)."""
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


# ---------------------------------------------------------------------------------------
# Commands


class CommandError(Exception):
    def __init__(self, argv: Sequence[str], returncode: int, output: str) -> None:
        super().__init__(f"{' '.join(argv)}: exit {returncode}: {output.strip()}")
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output


def run(argv: Sequence[str], *, ok: Sequence[int] = (0,), timeout: float = 120.0) -> str:
    """Run a tool; -> its stdout.  Raises CommandError (with stderr) on another exit code,
    FileNotFoundError when the tool is missing."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                           check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise CommandError(argv, -1, f"timed out after {timeout:g}s") from e
    if p.returncode not in ok:
        raise CommandError(argv, p.returncode, (p.stderr or p.stdout))
    return p.stdout


# ---------------------------------------------------------------------------------------
# Loop devices


@dataclass(frozen=True)
class Loop:
    device: str
    read_only: bool


def parse_losetup(text: str) -> list[Loop]:
    """`losetup -l -n --raw -O NAME,RO` output."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith("/dev/"):
            out.append(Loop(parts[0], parts[1] == "1"))
    return sorted(out, key=lambda lo: lo.device)


def loops_of(image: Path) -> list[Loop]:
    """The loop devices backed by `image` (losetup matches the file's device and inode)."""
    if not image.exists():
        return []
    return parse_losetup(run(["losetup", "-l", "-n", "--raw", "-O", "NAME,RO", "-j",
                              os.fspath(image)]))


def loop_attach(image: Path, *, read_only: bool = False) -> str:
    argv = ["losetup", "--find", "--show"] + (["--read-only"] if read_only else []) + [
        os.fspath(image)]
    return run(argv).strip()


def loop_detach(device: str) -> None:
    """Detach; a device still in use is set to clear itself when last closed."""
    run(["losetup", "--detach", device])


def loop_refresh(device: str) -> None:
    """Make the device see its backing file's current size (after the image grew)."""
    run(["losetup", "--set-capacity", device])


def block_size(device: str | Path) -> int:
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def is_block_device(path: Path) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# Filesystems


MKFS = {
    # -m 0: no blocks reserved for root (the claim's size is all the pod's); no discard
    # and lazy init keep a sparse image sparse and mkfs fast.
    "ext4": ["mkfs.ext4", "-q", "-F", "-m", "0", "-E",
             "nodiscard,lazy_itable_init=1,lazy_journal_init=1"],
    "xfs": ["mkfs.xfs", "-q", "-f", "-K"],
}


def mkfs(fstype: str, target: Path | str) -> None:
    run([*MKFS[fstype], os.fspath(target)], timeout=600)


_EXT_MAGIC = 0xEF53
_EXT4_FEATURE_INCOMPAT_64BIT = 0x80


def parse_superblock(head: bytes) -> tuple[str, int] | None:
    """(fstype, filesystem size in bytes) from the first 4 KiB of a device, or None when
    it holds no ext2/3/4 or xfs filesystem.  Pure: unit-tested on crafted bytes."""
    if len(head) >= 16 and head[:4] == b"XFSB":
        block, dblocks = struct.unpack_from(">IQ", head, 4)
        return "xfs", block * dblocks
    if len(head) >= 2048:
        sb = head[1024:2048]
        if struct.unpack_from("<H", sb, 0x38)[0] == _EXT_MAGIC:
            lo = struct.unpack_from("<I", sb, 0x04)[0]
            log_block = struct.unpack_from("<I", sb, 0x18)[0]
            incompat = struct.unpack_from("<I", sb, 0x60)[0]
            hi = struct.unpack_from("<I", sb, 0x150)[0] if incompat & _EXT4_FEATURE_INCOMPAT_64BIT else 0
            return "ext4", ((hi << 32) | lo) * (1024 << log_block)
    return None


def fs_size(device: Path | str) -> tuple[str, int] | None:
    """Read the superblock of `device` (a block device or an image file)."""
    with open(device, "rb") as f:
        return parse_superblock(f.read(4096))


def grow_ext4_offline(device: str) -> None:
    """Grow an unmounted ext4 filesystem to its device: resize2fs wants a fresh fsck."""
    # e2fsck: 0 clean, 1 errors corrected; 2+ need a human (or a reboot).
    run(["e2fsck", "-f", "-y", device], ok=(0, 1), timeout=3600)
    run(["resize2fs", device], timeout=3600)


def grow_ext4_online(device: str) -> None:
    run(["resize2fs", device], timeout=3600)


def grow_xfs(mount_point: Path) -> None:
    run(["xfs_growfs", os.fspath(mount_point)], timeout=3600)


# ---------------------------------------------------------------------------------------
# Usage


@dataclass(frozen=True)
class FsStats:
    capacity_bytes: int
    available_bytes: int
    used_bytes: int
    inodes: int
    inodes_free: int

    @property
    def inodes_used(self) -> int:
        return self.inodes - self.inodes_free


def fs_stats(path: Path) -> FsStats:
    st = os.statvfs(path)
    return FsStats(capacity_bytes=st.f_blocks * st.f_frsize,
                   available_bytes=st.f_bavail * st.f_frsize,
                   used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
                   inodes=st.f_files, inodes_free=st.f_ffree)


@dataclass(frozen=True)
class DirUsage:
    bytes: int    # allocated blocks, each hard-linked inode once
    inodes: int


def dir_usage(root: Path) -> DirUsage:
    """What `du -s --one-file-system` counts: allocated bytes and inodes below `root`,
    not following symlinks nor crossing into other filesystems."""
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return DirUsage(0, 0)
    seen = {(top.st_dev, top.st_ino)}
    total, stack = top.st_blocks * 512, [os.fspath(root)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_dev != top.st_dev:
                    continue
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return DirUsage(total, len(seen))


def allocated_bytes(path: Path) -> int:
    """Bytes a (sparse) file really occupies on disk."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


__all__ = ["MS_BIND", "MS_RDONLY", "MS_REMOUNT", "CommandError", "DirUsage", "FsStats", "Loop",
           "MountEntry", "allocated_bytes", "bind_mount", "binds_in", "binds_of", "block_size", "device_of_mount",
           "dir_usage", "fs_size", "fs_stats", "get_libc", "grow_ext4_offline", "grow_ext4_online",
           "grow_xfs", "is_block_device", "loop_attach", "loop_detach", "loop_refresh", "loops_of",
           "mkfs", "mount_at", "mount_fs", "mount_tmpfs", "mounts_under", "parse_losetup",
           "parse_mountinfo", "parse_superblock", "read_mountinfo", "run", "same_file", "umount",
           "umount_all", "unescape_mountinfo"]
