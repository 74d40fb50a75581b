"""Network namespaces for pods: create, enter and delete them by path.

A pod's network namespace has to outlive every process in it — the pause-less design
means the sandbox exists before its first container starts and after its last one
exits — so, like `ip netns add`, we pin each namespace by bind-mounting its nsfs
handle onto a file: `/run/fleet/netns/<pod-uid>`.  The runtime joins that path
(runc's `namespaces: [{type: network, path: ...}]`) and the network driver configures
the interfaces behind it.

Everything here works on *threads*, not processes: `setns(CLONE_NEWNET)` and
`unshare(CLONE_NEWNET)` change only the calling thread's namespace on Linux, so a
worker thread can step into a namespace, open netlink sockets there (a socket stays
bound to the namespace it was created in) and step back, without forking the agent.
`enter_netns` always restores the thread's original namespace, which matters because
Trio reuses its worker threads.  The blocking calls are exposed as async functions
that run them in a worker thread.

Why the run directory is made a *shared* mount of itself (as iproute2 does with
/run/netns): a container's mount namespace is copied from ours, bind mounts and all.
Without shared propagation a copy would keep a pod's nsfs mount — and so the whole
network namespace with its veth — alive after we unmount it here.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import re
import threading
from collections.abc import Iterator

import trio

#: Where pod namespaces are pinned unless the caller says otherwise.
DEFAULT_NETNS_DIR = "/run/fleet/netns"
#: Where `ip netns` keeps named namespaces (used by `named_netns_path`).
IP_NETNS_DIR = "/run/netns"

_CLONE_NEWNET = 0x40000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_SHARED = 1 << 20
_MNT_DETACH = 2

# A uid names a file: keep it to the characters Kubernetes uids (and test names) use,
# so no uid can climb out of the run directory.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")

_libc_lock = threading.Lock()
_libc: ctypes.CDLL | None = None
# Serialises the mount-propagation setup of a run directory between threads.
_rundir_lock = threading.Lock()


class NetnsError(OSError):
    """A namespace could not be created, entered or removed."""


def _get_libc() -> ctypes.CDLL:
    global _libc
    with _libc_lock:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return _libc


def _check(rc: int, what: str, path: str | os.PathLike[str] = "") -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise NetnsError(err, f"{what}: {os.strerror(err)}", str(path))


def _thread_netns_path() -> str:
    # /proc/self is the thread-group leader; the namespace that matters is this thread's.
    return f"/proc/self/task/{threading.get_native_id()}/ns/net"


def _setns(fd: int) -> None:
    _check(_get_libc().setns(fd, _CLONE_NEWNET), "setns")


def named_netns_path(name: str) -> str:
    """The path `ip netns add NAME` pins a namespace at (`/run/netns/NAME`)."""
    if not _SAFE_NAME.match(name):
        raise ValueError(f"invalid network namespace name {name!r}")
    return os.path.join(IP_NETNS_DIR, name)


def pod_netns_path(uid: str, base_dir: str | os.PathLike[str] = DEFAULT_NETNS_DIR) -> str:
    """Where the namespace of the pod with this uid is pinned."""
    if not _SAFE_NAME.match(uid):
        raise ValueError(f"invalid pod uid for a namespace file name: {uid!r}")
    return os.path.join(os.fspath(base_dir), uid)


def is_netns(path: str | os.PathLike[str]) -> bool:
    """True if `path` is a pinned network namespace (an nsfs mount), not just a file."""
    # A pinned namespace stats as an nsfs inode; compare its device with our own handle's.
    try:
        return os.stat(path).st_dev == os.stat(_thread_netns_path()).st_dev
    except OSError:
        return False


def _is_mountpoint(path: str) -> bool:
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            # Field 5 is the mount point, with spaces etc. octal-escaped.
            mp = line.split(" ", 5)[4].encode().decode("unicode_escape")
            if mp == path:
                return True
    return False


def _prepare_run_dir(run_dir: str) -> None:
    """Create `run_dir` and make it a shared mount (ported from iproute2's netns_add)."""
    libc = _get_libc()
    with _rundir_lock:
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        rd = run_dir.encode()
        if libc.mount(b"", rd, b"none", _MS_SHARED | _MS_REC, None) == 0:
            return
        # Several agents on one machine share the run dir: a file lock keeps two of
        # them from both binding it onto itself (a stacked mount nobody removes).
        lock = os.open(run_dir.rstrip("/") + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # Not a mount point yet: bind it onto itself, then it can be made shared.
            if not _is_mountpoint(run_dir):
                _check(libc.mount(rd, rd, b"none", _MS_BIND | _MS_REC, None), "bind run dir",
                       run_dir)
            _check(libc.mount(b"", rd, b"none", _MS_SHARED | _MS_REC, None), "share run dir",
                   run_dir)
        finally:
            os.close(lock)


def create_netns_sync(path: str | os.PathLike[str]) -> str:
    """Create a network namespace pinned at `path`; idempotent if it is already there.

    Blocking (mount syscalls); call it from a worker thread, or use `create_netns`.
    """
    path = os.fspath(path)
    if is_netns(path):
        return path
    _prepare_run_dir(os.path.dirname(path) or ".")
    libc = _get_libc()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0)
        os.close(fd)
    except FileExistsError:
        # A leftover file from a crash between creating and mounting it: reuse it.
        pass
    orig = os.open(_thread_netns_path(), os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            _check(libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)", path)
            _check(
                libc.mount(_thread_netns_path().encode(), path.encode(), b"none", _MS_BIND, None),
                "bind-mount netns",
                path,
            )
        finally:
            # Always go home: this thread will run other work afterwards.
            _setns(orig)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(orig)
    return path


def delete_netns_sync(path: str | os.PathLike[str]) -> None:
    """Unpin and remove the namespace at `path`; a missing path is not an error.

    The namespace itself (and any veth end inside it) goes away once nothing else —
    no process, no open fd — still holds it.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    rc = _get_libc().umount2(path.encode(), _MNT_DETACH)
    if rc != 0:
        err = ctypes.get_errno()
        # EINVAL: not a mount point (a file left by an interrupted create).
        if err not in (errno.EINVAL, errno.ENOENT):
            raise NetnsError(err, f"umount: {os.strerror(err)}", path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def enter_netns(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Run the body with the *calling thread* in the namespace at `path`.

    `None` means "stay where you are" (the agent's own namespace), so code can take an
    optional namespace without branching.  Blocking; use it in worker threads only —
    never on the Trio thread, whose namespace would leak into the event loop.  Threads
    started from inside the body inherit the namespace, so start none there.
    """
    if path is None:
        yield
        return
    orig = os.open(_thread_netns_path(), os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            target = os.open(os.fspath(path), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as e:
            raise NetnsError(errno.ENOENT, "no such network namespace", os.fspath(path)) from e
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(orig)
    finally:
        os.close(orig)


async def create_netns(path: str | os.PathLike[str]) -> str:
    """Create (idempotently) a network namespace pinned at `path`; returns the path."""
    return await trio.to_thread.run_sync(create_netns_sync, path)


async def delete_netns(path: str | os.PathLike[str]) -> None:
    """Remove the namespace pinned at `path` (idempotent)."""
    await trio.to_thread.run_sync(delete_netns_sync, path)


async def create_pod_netns(uid: str, base_dir: str | os.PathLike[str] = DEFAULT_NETNS_DIR) -> str:
    """Create the pod's namespace at `<base_dir>/<uid>` and return that path.

    Idempotent: a retry for the same pod returns the same, already pinned namespace.
    """
    return await create_netns(pod_netns_path(uid, base_dir))


async def delete_pod_netns(path: str | os.PathLike[str]) -> None:
    """Remove a pod namespace created by `create_pod_netns` (idempotent)."""
    await delete_netns(path)


def list_netns(base_dir: str | os.PathLike[str] = DEFAULT_NETNS_DIR) -> list[str]:
    """Paths of the namespaces pinned in `base_dir` (for recovery after a restart)."""
    try:
        names = sorted(os.listdir(base_dir))
    except FileNotFoundError:
        return []
    return [p for p in (os.path.join(os.fspath(base_dir), n) for n in names) if is_netns(p)]


__all__ = [
    "DEFAULT_NETNS_DIR",
    "IP_NETNS_DIR",
    "NetnsError",
    "create_netns",
    "create_netns_sync",
    "create_pod_netns",
    "delete_netns",
    "delete_netns_sync",
    "delete_pod_netns",
    "enter_netns",
    "is_netns",
    "list_netns",
    "named_netns_path",
    "pod_netns_path",
]
