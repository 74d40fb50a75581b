"""The `oci` driver: containers under runc (or crun), one bundle and one shim each.

A container's directory <state>/containers/<id>/ is its OCI bundle:

    config.json   from fleet.runtime.spec.build_config
    rootfs/       overlayfs: lowerdir = the image's layer dirs (top first),
                  upperdir/workdir = upper/ and work/ beside it (writes stay per container)
    upper/ work/
    + the shim's files (fleet.runtime.shim)

The runtime keeps its own state under <state>/runc (`--root`), so agents with different
state dirs on one machine never see each other's containers, and nothing depends on
/run surviving.  The container's cgroup is <pod cgroup parent>/<id>; limits are in
config.json and the runtime applies them on cgroup v1 or v2.

What this module adds to the shared `ShimDriver` (fleet.runtime.driver): building the
bundle (overlay mount, config), `runc exec` for exec, and unmounting on remove.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import uuid
from collections.abc import AsyncIterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from fleet.runtime import cgroups
from fleet.runtime.driver import (
    ContainerHandle,
    ContainerNotFound,
    ContainerSpec,
    ContainerStatus,
    InputSource,
    OutputSink,
    RuntimeDriverError,
    Sandbox,
    ShimDriver,
    run_with_stdio,
)
from fleet.runtime.spec import SpecError, build_config

RUNTIMES = ("runc", "crun")
# Where runtimes live on distributions whose non-root PATH lacks sbin.
EXTRA_PATHS = ("/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/bin")
MNT_DETACH = 2
PAGE = os.sysconf("SC_PAGE_SIZE")


def find_runtime() -> str | None:
    """runc, else crun: first on PATH, then in the usual sbin directories."""
    for name in RUNTIMES:
        found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(EXTRA_PATHS))
        if found:
            return found
    return None


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def mount_overlay(layers: Sequence[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount an overlayfs at `target` (blocking; run it in a thread)."""
    if not layers:
        raise RuntimeDriverError("a container needs at least one image layer")
    for layer in layers:
        if not Path(layer).is_dir():
            raise RuntimeDriverError(f"image layer {layer} is not a directory")
    opts = (f"lowerdir={':'.join(str(p) for p in layers)},upperdir={upper},"
            f"workdir={work}")
    if len(opts) < PAGE - 1:
        if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, opts.encode()) != 0:
            e = ctypes.get_errno()
            raise RuntimeDriverError(f"mount overlay on {target}: {os.strerror(e)}")
        return
    # The options must fit in one page; with many deep layer paths they do not.  The
    # kernel resolves relative lowerdirs against the caller's cwd, so mount from a child
    # process whose cwd is the layers' common parent (a thread cannot chdir alone).
    common = Path(os.path.commonpath([str(p) for p in layers]))
    rel = ":".join(os.path.relpath(p, common) for p in layers)
    opts = f"lowerdir={rel},upperdir={upper},workdir={work}"
    import subprocess
    res = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(target)],
                         cwd=common, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeDriverError(f"mount overlay on {target}: {res.stderr.strip()}")


def unmount(target: Path) -> None:
    """Lazily unmount `target`; not mounted is fine (blocking)."""
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            raise RuntimeDriverError(f"umount {target}: {os.strerror(e)}")


class OciDriver(ShimDriver):
    """Containers with namespaces, cgroups and an overlay root, run by runc or crun."""

    name = "oci"
    mode = "oci"

    def __init__(self, state_dir: Path, *, runtime: str | None = None,
                 cgroup_root: Path = cgroups.DEFAULT_ROOT) -> None:
        super().__init__(state_dir, cgroup_root=cgroup_root)
        rt = runtime or find_runtime()
        if rt is None:
            raise RuntimeDriverError("no OCI runtime: install runc or crun")
        self.runtime = rt
        self.runtime_root = self.state_dir / "runc"
        self.runtime_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._swap = cgroups.swap_accounting(cgroup_root)

    def _use_cgroups(self) -> bool:
        # The runtime needs cgroups; on a machine without them it fails loudly itself.
        return True

    def _runtime_argv(self, *args: str) -> list[str]:
        return [self.runtime, "--root", str(self.runtime_root), *args]

    async def _prepare(self, bundle: Path, sandbox: Sandbox, container: ContainerSpec,
                       cid: str, cgroup_path: str | None) -> dict[str, Any]:
        rootfs, upper, work = bundle / "rootfs", bundle / "upper", bundle / "work"
        try:
            config = build_config(container, sandbox, rootfs=rootfs,
                                  cgroups_path=cgroup_path or f"{sandbox.cgroup_parent}/{cid}",
                                  swap_accounting=self._swap)
        except SpecError as e:
            raise RuntimeDriverError(str(e)) from e

        def build() -> None:
            for d in (rootfs, upper, work):
                d.mkdir()
            mount_overlay(container.layers, upper, work, rootfs)
            with open(bundle / "config.json", "w") as f:
                json.dump(config, f, indent=1)

        await trio.to_thread.run_sync(build)
        return {"runtime": self.runtime, "runtime_root": str(self.runtime_root)}

    async def _cleanup(self, handle: ContainerHandle) -> None:
        # The shim normally deleted the runtime's container; force it in case the shim
        # died first (e.g. the machine rebooted).
        res = await trio.run_process(self._runtime_argv("delete", "--force", handle.id),
                                     check=False, capture_stdout=True, capture_stderr=True)
        if res.returncode != 0 and (self.runtime_root / handle.id).exists():
            # "does not exist" is the usual, fine answer; a container runc still keeps is not.
            raise RuntimeDriverError(f"{self.runtime} delete --force {handle.id}: "
                                     f"{res.stderr.decode(errors='replace').strip()}")
        await trio.to_thread.run_sync(unmount, handle.bundle / "rootfs")

    async def exec(self, handle: ContainerHandle, argv: Sequence[str], *,
                   stdin: InputSource | None = None, stdout: OutputSink | None = None,
                   stderr: OutputSink | None = None, tty: bool = False,
                   env: Mapping[str, str] | None = None,
                   resize: AsyncIterable[tuple[int, int]] | None = None) -> int:
        """Run `argv` inside the running container (`runc exec`); its exit code.

        The process inherits the container's env, cwd, user and capabilities (runc
        copies the container's process spec); `env` adds to it."""
        if not argv:
            raise RuntimeDriverError("exec needs a command")
        state = await self.inspect(handle)
        if state.status is not ContainerStatus.RUNNING:
            raise ContainerNotFound(f"container {handle.id} is not running")
        # runc writes the exec'd process's (host) pid here: if the client goes away
        # mid-exec, that process is killed too, not only `runc exec`.
        pid_file = handle.bundle / f"exec-{uuid.uuid4().hex[:12]}.pid"
        args = ["exec", "--pid-file", str(pid_file)]
        if tty:
            args.append("--tty")
        for k, v in (env or {}).items():
            args += ["--env", f"{k}={v}"]
        args += [handle.id, *argv]

        def kill_exec(_runtime_pid: int) -> None:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)

        try:
            return await run_with_stdio(self._runtime_argv(*args), env=None, cwd=None,
                                        stdin=stdin, stdout=stdout, stderr=stderr, tty=tty,
                                        resize=resize, on_abandon=kill_exec)
        finally:
            with contextlib.suppress(OSError):
                pid_file.unlink()

    def bundle_config(self, handle: ContainerHandle) -> dict[str, Any]:
        """The container's config.json (for inspection and tests)."""
        return json.loads((handle.bundle / "config.json").read_text())
