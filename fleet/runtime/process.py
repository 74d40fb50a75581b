"""The `process` driver: containers as plain host processes (like Nomad's raw_exec).

For machines where Fleet cannot isolate (not root, no runc): the command runs directly
on the host under the same `fleet shim` as OCI containers, so logs, exit statuses,
stop/grace and agent-restart recovery behave identically.  What it gives up:

- no namespaces and no root filesystem: `layers` are ignored and the command is looked
  up on the host PATH (the container's PATH env if set); `mounts` are not applied
  (there is no private mount namespace to put them in);
- a process group instead of a pid namespace: stop/signal go to the whole group, and when
  the main process exits the shim SIGKILLs what is left of the group;
- cgroups (limits, stats, OOM detection) only where this process may create them (root,
  or a delegated cgroup v2 subtree); otherwise stats add up /proc of the process group;
- user/group switching only when running as root.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


class ProcessDriver(ShimDriver):
    """Unisolated host processes, one shim each."""

    name = "process"
    # Its processes live in the node's network namespace, whatever the sandbox has
    # (port forwarding then connects on the node's loopback).
    joins_pod_netns = False
    mode = "process"

    def __init__(self, state_dir: Path, *, cgroup_root: Path = cgroups.DEFAULT_ROOT,
                 use_cgroups: bool | None = None) -> None:
        super().__init__(state_dir, cgroup_root=cgroup_root)
        # None = whenever the cgroup tree is writable.
        self._cgroups_wanted = use_cgroups

    def _use_cgroups(self) -> bool:
        if self._cgroups_wanted is False:
            return False
        return self.cgroups.writable()

    def _env(self, container_env: Mapping[str, str]) -> dict[str, str]:
        env = dict(container_env)
        env.setdefault("PATH", os.environ.get("PATH", DEFAULT_PATH))
        return env

    async def _prepare(self, bundle: Path, sandbox: Sandbox, container: ContainerSpec,
                       cid: str, cgroup_path: str | None) -> dict[str, Any]:
        r = container.resources
        root = os.geteuid() == 0
        return {
            "argv": container.argv,
            "env": self._env(container.env),
            "cwd": container.working_dir or "/",
            "uid": container.user.uid if root else None,
            "gid": container.user.gid if root else None,
            "limits": {"cpu_request_millis": r.cpu_request_millis,
                       "cpu_limit_millis": r.cpu_limit_millis,
                       "memory_limit_bytes": r.memory_limit_bytes,
                       "pids_limit": r.pids_limit},
        }

    async def _signal_container(self, handle: ContainerHandle, sig: int) -> bool:
        # The container is the process group led by its main process; the pidfd check
        # on the leader proves the group id still belongs to us.
        fd = self._open_pidfd(handle.pid, handle.pid_start)
        if fd is None:
            return False
        try:
            os.killpg(handle.pid, sig)
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)
        return True

    async def exec(self, handle: ContainerHandle, argv: Sequence[str], *,
                   stdin: InputSource | None = None, stdout: OutputSink | None = None,
                   stderr: OutputSink | None = None, tty: bool = False,
                   env: Mapping[str, str] | None = None,
                   resize: AsyncIterable[tuple[int, int]] | None = None) -> int:
        """Run `argv` on the host with the container's env and working dir."""
        if not argv:
            raise RuntimeDriverError("exec needs a command")
        state = await self.inspect(handle)
        if state.status is not ContainerStatus.RUNNING:
            raise ContainerNotFound(f"container {handle.id} is not running")
        meta = self._meta(handle)
        full_env = self._env({**meta.get("env", {}), **(env or {})})
        cwd = meta.get("working_dir") or "/"
        try:
            # Its own session and process group: if the client goes away mid-exec, the
            # whole group goes, not only the process we started.
            return await run_with_stdio(argv, env=full_env, cwd=cwd, stdin=stdin,
                                        stdout=stdout, stderr=stderr, tty=tty, resize=resize,
                                        new_session=True,
                                        on_abandon=lambda pid: os.killpg(pid, signal.SIGKILL))
        except FileNotFoundError as e:
            # Same answer a shell (and runc exec) gives for a missing command.
            msg = f'exec: "{argv[0]}": executable file not found in $PATH\n'.encode()
            if e.filename == cwd:
                msg = f"chdir to cwd ({cwd!r}): no such file or directory\n".encode()
            if stderr is not None:
                with contextlib.suppress(Exception):
                    if callable(stderr):
                        await stderr(msg)
                    else:
                        await stderr.send_all(msg)
            return 127


__all__ = ["ProcessDriver"]
