"""fleet.storage.mounts: the pure parsers (mountinfo, losetup, superblocks, bind lookup)
and the unprivileged measurements (directory usage, statvfs, commands)."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from fleet.storage import mounts
from fleet.storage.mounts import MountEntry

MOUNTINFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "30 22 8:1 /srv/data/volumes/pvc-1 /var/pods/a/vol rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "31 22 8:1 /srv/data/volumes/pvc-10 /var/pods/b/vol ro,relatime - ext4 /dev/vda rw\n"
    "32 22 8:1 /srv/data/volumes/pvc-1/sub /var/pods/c/with\\040space ro - ext4 /dev/vda rw\n"
    "33 22 7:0 / /var/plugins/x/globalmount rw - ext4 /dev/loop0 rw\n"
    "34 22 7:0 / /var/plugins/x/globalmount rw - ext4 /dev/loop0 rw\n"
    "garbage line\n"
)


def test_parse_mountinfo_reads_fields_escapes_and_skips_junk() -> None:
    entries = mounts.parse_mountinfo(MOUNTINFO)
    assert [e.mount_id for e in entries] == [22, 30, 31, 32, 33, 34]
    e = entries[3]
    assert e.mount_point == "/var/pods/c/with space" and e.root == "/srv/data/volumes/pvc-1/sub"
    assert e.dev == (8, 1) and e.read_only and e.fstype == "ext4" and e.source == "/dev/vda"
    assert not entries[1].read_only
    assert entries[4].source == "/dev/loop0"


def test_mount_at_is_the_topmost_of_stacked_mounts() -> None:
    entries = mounts.parse_mountinfo(MOUNTINFO)
    top = mounts.mount_at(Path("/var/plugins/x/globalmount"), entries)
    assert top is not None and top.mount_id == 34
    assert mounts.mount_at(Path("/var/plugins/x"), entries) is None


def test_binds_in_finds_binds_of_a_directory_and_below_it_only() -> None:
    entries = mounts.parse_mountinfo(MOUNTINFO)
    home = entries[0]
    found = mounts.binds_in(entries, home, "/srv/data/volumes/pvc-1")
    assert [e.mount_id for e in found] == [30, 32]  # not pvc-10, not the loop mounts
    assert mounts.binds_in(entries, home, "/srv/data/volumes/pvc-2") == []
    # A path inside a bind-mounted tree is translated through that mount's root.
    inner = MountEntry(40, 22, (8, 1), "/srv/data", "/data", frozenset({"rw"}), "ext4", "/dev/vda")
    found = mounts.binds_in([*entries, inner], inner, "/data/volumes/pvc-10")
    assert [e.mount_id for e in found] == [31]


def test_parse_losetup() -> None:
    out = "/dev/loop3 1\n/dev/loop1 0\nnot a device\n"
    assert mounts.parse_losetup(out) == [mounts.Loop("/dev/loop1", False),
                                         mounts.Loop("/dev/loop3", True)]


def _ext4_head(blocks: int, log_block: int, hi: int = 0) -> bytes:
    sb = bytearray(1024)
    struct.pack_into("<I", sb, 0x04, blocks)
    struct.pack_into("<I", sb, 0x18, log_block)
    struct.pack_into("<H", sb, 0x38, 0xEF53)
    if hi:
        struct.pack_into("<I", sb, 0x60, 0x80)
        struct.pack_into("<I", sb, 0x150, hi)
    return bytes(1024) + bytes(sb) + bytes(2048)


def test_parse_superblock_ext4_xfs_and_neither() -> None:
    assert mounts.parse_superblock(_ext4_head(16384, 0)) == ("ext4", 16 << 20)
    assert mounts.parse_superblock(_ext4_head(1, 2, hi=1)) == ("ext4", ((1 << 32) + 1) * 4096)
    xfs = b"XFSB" + struct.pack(">IQ", 4096, 76800) + bytes(4080)
    assert mounts.parse_superblock(xfs) == ("xfs", 4096 * 76800)
    assert mounts.parse_superblock(bytes(4096)) is None
    assert mounts.parse_superblock(b"") is None


@pytest.mark.parametrize(("fstype", "tool", "size"), [("ext4", "mkfs.ext4", 24 << 20),
                                                      ("xfs", "mkfs.xfs", 300 << 20)])
def test_real_mkfs_images_read_back(tmp_path: Path, fstype: str, tool: str, size: int) -> None:
    if not shutil.which(tool):
        pytest.skip(f"{tool} is not installed")
    img = tmp_path / "v.img"
    with open(img, "wb") as f:
        f.truncate(size)
    mounts.mkfs(fstype, img)
    assert mounts.fs_size(img) == (fstype, size)
    assert mounts.allocated_bytes(img) < size  # still sparse


def test_dir_usage_counts_hard_links_once_and_follows_no_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_bytes(os.urandom(64 * 1024))
    os.link(root / "a" / "b" / "f", root / "hard")
    outside = tmp_path / "outside"
    outside.write_bytes(os.urandom(256 * 1024))
    (root / "link").symlink_to(outside)
    usage = mounts.dir_usage(root)
    assert 64 * 1024 <= usage.bytes < 200 * 1024
    assert usage.inodes == 5  # vol, a, b, f (= hard), link
    assert mounts.dir_usage(tmp_path / "missing") == mounts.DirUsage(0, 0)


def test_fs_stats_is_consistent(tmp_path: Path) -> None:
    st = mounts.fs_stats(tmp_path)
    assert 0 < st.available_bytes <= st.capacity_bytes
    assert 0 <= st.used_bytes <= st.capacity_bytes and st.inodes_used >= 0


def test_run_reports_the_tools_words() -> None:
    assert mounts.run(["sh", "-c", "echo out"]) == "out\n"
    with pytest.raises(mounts.CommandError) as e:
        mounts.run(["sh", "-c", "echo broken >&2; exit 3"])
    assert e.value.returncode == 3 and "broken" in str(e.value)
    assert mounts.run(["sh", "-c", "exit 1"], ok=(0, 1)) == ""
