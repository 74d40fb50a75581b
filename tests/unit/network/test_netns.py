"""Pinned network namespaces: create, enter, list, delete (needs root)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from fleet.network.netns import (
    NetnsError,
    create_netns_sync,
    create_pod_netns,
    delete_netns_sync,
    delete_pod_netns,
    enter_netns,
    is_netns,
    list_netns,
    named_netns_path,
    pod_netns_path,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mounts)")


def thread_netns() -> str:
    return os.readlink(f"/proc/self/task/{threading.get_native_id()}/ns/net")


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "x" * 300])
def test_unsafe_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        pod_netns_path(bad)
    with pytest.raises(ValueError):
        named_netns_path(bad)


def test_paths() -> None:
    assert pod_netns_path("abc-1") == "/run/fleet/netns/abc-1"
    assert pod_netns_path("abc-1", "/tmp/ns") == "/tmp/ns/abc-1"
    assert named_netns_path("node1") == "/run/netns/node1"


def test_a_plain_file_is_not_a_namespace(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    assert not is_netns(f) and not is_netns(tmp_path / "missing")
    assert list_netns(tmp_path) == [] and list_netns(tmp_path / "missing") == []


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "netns"
    try:
        yield d
    finally:
        for p in list_netns(d):
            delete_netns_sync(p)
        if d.exists():
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


@needs_root
async def test_create_is_idempotent_and_delete_removes(run_dir: Path) -> None:
    path = await create_pod_netns("pod-1", run_dir)
    assert path == str(run_dir / "pod-1") and is_netns(path)
    ino = os.stat(path).st_ino
    assert await create_pod_netns("pod-1", run_dir) == path
    assert os.stat(path).st_ino == ino  # the same namespace, not a new one
    other = await create_pod_netns("pod-2", run_dir)
    assert os.stat(other).st_ino != ino
    assert list_netns(run_dir) == [path, other]
    # The new namespace is empty but for its loopback.
    out = subprocess.run(["nsenter", f"--net={path}", "ip", "-o", "link"],
                         capture_output=True, text=True, check=True).stdout
    assert [line.split(":")[1].strip() for line in out.splitlines()] == ["lo"]

    await delete_pod_netns(path)
    assert not os.path.lexists(path) and list_netns(run_dir) == [other]
    await delete_pod_netns(path)  # idempotent


@needs_root
async def test_creating_leaves_the_worker_thread_where_it_was(run_dir: Path) -> None:
    mine = thread_netns()

    def create_and_report() -> tuple[str, str]:
        before = thread_netns()
        create_netns_sync(run_dir / "p")
        return before, thread_netns()

    before, after = await trio.to_thread.run_sync(create_and_report)
    assert before == after == mine


@needs_root
def test_leftover_file_from_an_interrupted_create_is_reused_or_removed(run_dir: Path) -> None:
    create_netns_sync(run_dir / "seed")  # sets up the run dir
    stale = run_dir / "stale"
    stale.write_text("")
    delete_netns_sync(stale)  # not a mount: just removed
    assert not stale.exists()
    stale.write_text("")
    create_netns_sync(stale)
    assert is_netns(stale)


@needs_root
def test_enter_netns_switches_only_this_thread_and_comes_back(run_dir: Path) -> None:
    path = create_netns_sync(run_dir / "p")
    home = thread_netns()
    target = f"net:[{os.stat(path).st_ino}]"
    # A thread that already runs is unaffected (setns is per thread; only threads
    # started from inside would inherit the namespace).
    go, seen = threading.Event(), []

    def other() -> None:
        go.wait(10)
        seen.append(thread_netns())

    t = threading.Thread(target=other)
    t.start()
    with enter_netns(path):
        assert thread_netns() == target
        go.set()
        t.join()
        assert seen == [home]
    assert thread_netns() == home
    with pytest.raises(RuntimeError), enter_netns(path):
        raise RuntimeError("boom")
    assert thread_netns() == home
    with enter_netns(None):
        assert thread_netns() == home
    with pytest.raises(NetnsError), enter_netns(run_dir / "missing"):
        pass
    assert thread_netns() == home
