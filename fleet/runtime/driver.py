"""The runtime `Driver` protocol, its data types, and the shim-backed base both drivers share.

Starting shims (the command line and the warm launcher) lives in
`fleet.runtime.launcher`, exec stdio plumbing in `fleet.runtime.stdio`; both are
re-exported here.

The agent's pod workers talk to containers only through `Driver`; two implementations
exist: `fleet.runtime.oci.OciDriver` (runc/crun, real isolation) and
`fleet.runtime.process.ProcessDriver` (plain host processes, like Nomad's raw_exec, for
unprivileged machines).  `select_driver(state_dir)` picks one.

Every container runs under its own `fleet shim` process (see `fleet.runtime.shim`),
which owns the container's stdio, writes its log in the CRI format and records its exit
status in the container's directory.  The shim is detached from the agent (own session,
re-parented to init), so containers keep running when the agent dies; a restarted agent
calls `recover()` and re-attaches by reading those files back.

Lifecycle of one container, as the driver sees it::

        start()                     shim: runtime create+start
    ─────────────►  [starting] ──────────────────────────────► [running]
                        │ command not found, bad mount...          │
                        │ (shim records StartError)                │ exits / OOM / stop()
                        ▼                                           ▼ (shim records the status,
                    [exited] ◄──────────────────────────────────────   then `runc delete`)
                        │
                        │ remove()    unmount rootfs, delete cgroup and directory
                        ▼
                    [removed]

    stop(grace) = SIGTERM → wait up to `grace` → SIGKILL → wait for the recorded status.
    recover()   = scan <state>/containers/*: running ones (shim and container pids alive and
                  still the same processes, by /proc start time) and exited ones (status
                  file present; or shim gone without one → reason "Unknown").

Pids are never trusted bare: each one is stored with its /proc start time and every
signal goes through a pidfd opened after checking it, so a recycled pid is never hit.

Sandboxes are pods: a pod cgroup parent (`fleet/pod<uid>`) that the containers' cgroups
nest under, plus the pod's network namespace path (made by the network driver) that OCI
containers join.  `create_sandbox` is idempotent, so a restarted agent gets its existing
sandbox back by calling it again with the same spec.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import errno
import json
import logging
import os
import shutil
import signal
import time
import uuid
from collections.abc import AsyncIterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import trio

from fleet.runtime import cgroups, shim
from fleet.runtime.launcher import ShimLauncher, shim_command, shim_env
from fleet.runtime.procfs import proc_start_time
from fleet.runtime.stdio import InputSource, OutputSink, run_with_stdio

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# Data


class RuntimeDriverError(Exception):
    """The runtime could not do what was asked (bad spec, runtime missing, I/O failure)."""


class ContainerNotFound(RuntimeDriverError):
    """No container with that id exists (any more) in this driver's state dir."""


Propagation = Literal["private", "host-to-container", "bidirectional"]


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host path into the container (volumes, configMaps, /etc/hosts...)."""

    host_path: Path
    container_path: str
    read_only: bool = False
    # Kubernetes mountPropagation: None → private, HostToContainer, Bidirectional.
    propagation: Propagation = "private"


@dataclass(frozen=True)
class Device:
    """A block or character device node made available in the container at
    `container_path` (a pod's `volumeDevices`: a raw block volume).  `major`/`minor`
    are the host device's numbers; `host_path` the node it was published at."""

    host_path: Path
    container_path: str
    major: int
    minor: int
    kind: str = "b"          # "b" block, "c" character
    read_only: bool = False
    file_mode: int = 0o660


@dataclass(frozen=True)
class Resources:
    """Kubernetes-style container resources; None means "not set"."""

    cpu_request_millis: int | None = None
    cpu_limit_millis: int | None = None
    memory_limit_bytes: int | None = None
    pids_limit: int | None = None


@dataclass(frozen=True)
class User:
    uid: int = 0
    gid: int = 0
    additional_gids: tuple[int, ...] = ()


@dataclass(frozen=True)
class SandboxSpec:
    """What a pod needs from the runtime before its containers start."""

    pod_uid: str
    namespace: str
    name: str
    log_dir: Path
    hostname: str = ""
    # The pod's network namespace (a bind-mounted nsfs file from the network driver);
    # None = host network.
    netns_path: Path | None = None
    # Files bind-mounted at /etc/resolv.conf and /etc/hosts when given.
    dns_file: Path | None = None
    hosts_file: Path | None = None
    # Cgroup parent, relative to the cgroup root; default fleet/pod<uid>.
    cgroup_parent: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("log_dir", "netns_path", "dns_file", "hosts_file"):
            d[k] = str(d[k]) if d[k] is not None else None
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxSpec:
        paths = {k: Path(d[k]) if d.get(k) else None
                 for k in ("netns_path", "dns_file", "hosts_file")}
        return cls(pod_uid=d["pod_uid"], namespace=d["namespace"], name=d["name"],
                   log_dir=Path(d["log_dir"]), hostname=d.get("hostname", ""),
                   cgroup_parent=d.get("cgroup_parent"), **paths)


@dataclass(frozen=True)
class Sandbox:
    id: str
    spec: SandboxSpec
    # Relative cgroup path (e.g. "fleet/pod<uid>") the containers' cgroups nest under.
    cgroup_parent: str
    state_dir: Path


@dataclass
class ContainerSpec:
    """One container to run.  Image defaults (entrypoint/cmd, env, user, workdir) are
    resolved by the caller; `layers` are read-only layer directories, top layer first."""

    name: str
    layers: list[Path]
    command: list[str]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str = "/"
    user: User = field(default_factory=User)
    capabilities_add: list[str] = field(default_factory=list)
    capabilities_drop: list[str] = field(default_factory=list)
    read_only_root: bool = False
    mounts: list[Mount] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    resources: Resources = field(default_factory=Resources)
    tty: bool = False
    stdin: bool = False
    # Kubernetes stdinOnce: stdin closes (EOF) after the first attached writer leaves.
    stdin_once: bool = False
    # Where the shim writes the CRI-format log; default <sandbox log dir>/<name>/<attempt>.log
    log_path: Path | None = None
    attempt: int = 0
    # Opaque to the driver; kept with the container so recover() can hand them back.
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


@dataclass(frozen=True)
class ContainerHandle:
    id: str
    name: str
    sandbox_id: str
    pid: int  # host pid of the container's main process; 0 if it never started
    shim_pid: int
    started_at: datetime
    bundle: Path
    log_path: Path
    attempt: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    # /proc start times, to tell our processes from recycled pids.
    pid_start: int = 0
    shim_start: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "sandbox_id": self.sandbox_id,
                "pid": self.pid, "shim_pid": self.shim_pid,
                "started_at": self.started_at.timestamp(), "bundle": str(self.bundle),
                "log_path": str(self.log_path), "attempt": self.attempt,
                "labels": dict(self.labels), "pid_start": self.pid_start,
                "shim_start": self.shim_start}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ContainerHandle:
        return cls(id=d["id"], name=d["name"], sandbox_id=d["sandbox_id"], pid=d["pid"],
                   shim_pid=d["shim_pid"],
                   started_at=datetime.fromtimestamp(d["started_at"], UTC),
                   bundle=Path(d["bundle"]), log_path=Path(d["log_path"]),
                   attempt=d.get("attempt", 0), labels=d.get("labels", {}),
                   pid_start=d.get("pid_start", 0), shim_start=d.get("shim_start", 0))


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int
    signal: int | None
    oom_killed: bool
    finished_at: datetime
    # Kubernetes' terminated reasons: Completed, Error, OOMKilled, StartError, Unknown.
    reason: str
    message: str = ""

    @classmethod
    def from_record(cls, rec: shim.StatusRecord) -> ExitStatus:
        return cls(exit_code=rec.exit_code, signal=rec.signal, oom_killed=rec.oom_killed,
                   finished_at=datetime.fromtimestamp(rec.finished_at, UTC),
                   reason=rec.reason, message=rec.message)


class ContainerStatus(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"


@dataclass(frozen=True)
class ContainerState:
    status: ContainerStatus
    pid: int
    started_at: datetime
    exit: ExitStatus | None = None


@dataclass(frozen=True)
class ContainerStats:
    timestamp: datetime
    cpu_usage_ns: int | None
    memory_usage_bytes: int | None
    memory_working_set_bytes: int | None
    pids: int | None


# exec stdio types: fleet.runtime.stdio (re-exported here).


@runtime_checkable
class Driver(Protocol):
    """What the agent needs from a container runtime (see the module docstring)."""

    name: str
    state_dir: Path

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background work the driver needs while an agent runs (started before any pod)."""

    async def create_sandbox(self, spec: SandboxSpec) -> Sandbox: ...

    async def start(self, sandbox: Sandbox, container: ContainerSpec) -> ContainerHandle: ...

    async def wait(self, handle: ContainerHandle) -> ExitStatus: ...

    async def stop(self, handle: ContainerHandle, grace: float) -> ExitStatus: ...

    async def signal(self, handle: ContainerHandle, sig: int) -> None: ...

    async def exec(self, handle: ContainerHandle, argv: Sequence[str], *,
                   stdin: InputSource | None = None, stdout: OutputSink | None = None,
                   stderr: OutputSink | None = None, tty: bool = False,
                   env: Mapping[str, str] | None = None,
                   resize: AsyncIterable[tuple[int, int]] | None = None) -> int: ...

    async def inspect(self, handle: ContainerHandle) -> ContainerState: ...

    async def recover(self) -> list[ContainerHandle]: ...

    async def remove(self, handle: ContainerHandle) -> None: ...

    async def remove_sandbox(self, sandbox: Sandbox) -> None: ...

    async def stats(self, handle: ContainerHandle) -> ContainerStats: ...


class ShimDriver(abc.ABC):
    """What both drivers share: container directories, launching the shim, waiting on
    and signalling pids safely, recovery, stats.  Subclasses prepare the container
    directory (`_prepare`) and tear down what they added (`_cleanup`)."""

    name = "shim"
    mode: str = "process"

    def __init__(self, state_dir: Path, *, cgroup_root: Path = cgroups.DEFAULT_ROOT) -> None:
        self.state_dir = Path(state_dir)
        self.containers_dir = self.state_dir / "containers"
        self.sandboxes_dir = self.state_dir / "sandboxes"
        self.cgroups = cgroups.Cgroups(cgroup_root)
        self.launcher = ShimLauncher()
        for d in (self.containers_dir, self.sandboxes_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The driver's long-running helper: the warm shim launcher (until cancelled)."""
        await self.launcher.run(task_status=task_status)

    # -- sandboxes --------------------------------------------------------------------
    def _use_cgroups(self) -> bool:
        return self.cgroups.writable()

    async def create_sandbox(self, spec: SandboxSpec) -> Sandbox:
        sid = spec.pod_uid
        if not sid or "/" in sid or sid.startswith("."):
            raise RuntimeDriverError(f"bad pod uid {sid!r}")
        parent = (spec.cgroup_parent or f"fleet/pod{sid.replace('-', '_')}").strip("/")
        sandbox = Sandbox(id=sid, spec=spec, cgroup_parent=parent,
                          state_dir=self.sandboxes_dir / sid)

        def create() -> None:
            sandbox.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            spec.log_dir.mkdir(parents=True, exist_ok=True)
            if self._use_cgroups():
                self.cgroups.create(parent)
            shim.write_json_atomic(sandbox.state_dir / "sandbox.json",
                                   {"spec": spec.to_json(), "cgroup_parent": parent})

        await trio.to_thread.run_sync(create)
        return sandbox

    async def remove_sandbox(self, sandbox: Sandbox) -> None:
        # Containers first: their cgroups nest under the pod's and keep it busy.
        for handle in await self.recover():
            if handle.sandbox_id == sandbox.id:
                await self.remove(handle)

        def remove() -> None:
            if self.cgroups.version and self.cgroups.exists(sandbox.cgroup_parent):
                if not self.cgroups.remove(sandbox.cgroup_parent, timeout=5.0):
                    raise RuntimeDriverError(
                        f"pod cgroup {sandbox.cgroup_parent} still busy after 5s")
            # An error here is raised, not ignored: the sandbox record is what lets the
            # agent's inventory find (and retry) what is left of the pod.
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(sandbox.state_dir)

        await trio.to_thread.run_sync(remove)

    async def sandboxes(self) -> list[Sandbox]:
        """Sandboxes whose state is on disk (for cleanup after an agent restart)."""
        def scan() -> list[Sandbox]:
            out = []
            for d in sorted(self.sandboxes_dir.iterdir()):
                try:
                    rec = json.loads((d / "sandbox.json").read_text())
                except (OSError, ValueError):
                    continue
                out.append(Sandbox(id=d.name, spec=SandboxSpec.from_json(rec["spec"]),
                                   cgroup_parent=rec["cgroup_parent"], state_dir=d))
            return out
        return await trio.to_thread.run_sync(scan)

    # -- start ------------------------------------------------------------------------
    @abc.abstractmethod
    async def _prepare(self, bundle: Path, sandbox: Sandbox, container: ContainerSpec,
                       cid: str, cgroup_path: str | None) -> dict[str, Any]:
        """Build the container directory; returns mode-specific shim.json fields."""

    async def _cleanup(self, handle: ContainerHandle) -> None:  # noqa: B027 - optional hook
        """Undo `_prepare` (mounts); runs in remove() after the container is gone.

        Nothing to undo by default (the process driver mounts nothing)."""

    def _container_cgroup(self, sandbox: Sandbox, cid: str) -> str | None:
        return f"{sandbox.cgroup_parent}/{cid}" if self._use_cgroups() else None

    async def start(self, sandbox: Sandbox, container: ContainerSpec) -> ContainerHandle:
        if not container.argv:
            raise RuntimeDriverError(f"container {container.name!r} has no command")
        cid = uuid.uuid4().hex
        bundle = self.containers_dir / cid
        log_path = container.log_path or (sandbox.spec.log_dir / container.name
                                          / f"{container.attempt}.log")
        cgroup_path = self._container_cgroup(sandbox, cid)
        await trio.to_thread.run_sync(lambda: bundle.mkdir(parents=True, mode=0o700))
        try:
            extra = await self._prepare(bundle, sandbox, container, cid, cgroup_path)
            cfg = shim.ShimConfig(
                mode=self.mode, id=cid, log_path=str(log_path), stdin=container.stdin,
                stdin_once=container.stdin_once, tty=container.tty,
                cgroup=cgroup_path, cgroup_root=str(self.cgroups.root), **extra)
            meta = {"id": cid, "name": container.name, "sandbox_id": sandbox.id,
                    "attempt": container.attempt, "labels": container.labels,
                    "log_path": str(log_path), "env": container.env,
                    "working_dir": container.working_dir}

            def write() -> None:
                log_path.parent.mkdir(parents=True, exist_ok=True)
                shim.write_json_atomic(bundle / shim.META_FILE, meta)
                cfg.save(bundle)

            await trio.to_thread.run_sync(write)
            report = await self.launcher.launch(bundle, cid, log_path)
            if report is None:
                argv = [*shim_command(), "--bundle", str(bundle), "--id", cid,
                        "--log", str(log_path)]
                res = await trio.run_process(argv, stdin=b"", capture_stdout=True,
                                             capture_stderr=True, check=False,
                                             env=shim_env(), cwd=str(bundle))
                report = res.stdout
                failure = (f"exit {res.returncode}: "
                           f"{(res.stderr or res.stdout).decode(errors='replace').strip()[-2000:]}")
            else:
                failure = report.decode(errors="replace")[-2000:]
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._abandon(bundle, cid, container.name, sandbox.id, log_path)
            raise
        ready = shim.parse_ready(report)
        if ready is None:
            with trio.CancelScope(shield=True):
                await self._abandon(bundle, cid, container.name, sandbox.id, log_path)
            raise RuntimeDriverError(f"shim for {container.name!r} failed ({failure})")
        handle = ContainerHandle(
            id=cid, name=container.name, sandbox_id=sandbox.id, pid=ready.pid,
            shim_pid=ready.shim_pid, started_at=datetime.fromtimestamp(ready.started_at, UTC),
            bundle=bundle, log_path=log_path, attempt=container.attempt,
            labels=dict(container.labels), pid_start=ready.pid_start,
            shim_start=ready.shim_start)
        await trio.to_thread.run_sync(
            shim.write_json_atomic, bundle / shim.HANDLE_FILE, handle.to_json())
        return handle

    async def _abandon(self, bundle: Path, cid: str, name: str, sandbox_id: str,
                       log_path: Path) -> None:
        h = ContainerHandle(id=cid, name=name, sandbox_id=sandbox_id, pid=0, shim_pid=0,
                            started_at=datetime.now(UTC), bundle=bundle, log_path=log_path)
        try:
            await self._cleanup(h)
            await trio.to_thread.run_sync(shutil.rmtree, bundle)
        except FileNotFoundError:
            pass
        except (RuntimeDriverError, OSError) as e:
            # The start failed anyway (its own error is what the caller sees); what is
            # left is logged here and found again by the agent's inventory (GC, killall).
            log.warning("cleaning up the failed start of container %s (%s): %s", cid, name, e)

    # -- pids -------------------------------------------------------------------------
    @staticmethod
    def _open_pidfd(pid: int, start: int) -> int | None:
        """A pidfd for `pid` if it is still the process that started at `start`."""
        if pid <= 0:
            return None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        # Checked after opening: from here on the fd pins this exact process.
        if proc_start_time(pid) != start:
            os.close(fd)
            return None
        return fd

    def _alive(self, pid: int, start: int) -> bool:
        fd = self._open_pidfd(pid, start)
        if fd is None:
            return False
        os.close(fd)
        return True

    @staticmethod
    async def _wait_pidfd(fd: int) -> None:
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            os.close(fd)

    def _status(self, handle: ContainerHandle) -> ExitStatus | None:
        rec = shim.read_status(handle.bundle)
        return ExitStatus.from_record(rec) if rec else None

    async def wait(self, handle: ContainerHandle) -> ExitStatus:
        st = await trio.to_thread.run_sync(self._status, handle)
        if st is not None:
            return st
        fd = self._open_pidfd(handle.shim_pid, handle.shim_start)
        if fd is not None:
            # The shim exits right after recording the status (and `runc delete`).
            await self._wait_pidfd(fd)
        st = await trio.to_thread.run_sync(self._status, handle)
        if st is not None:
            return st
        if not handle.bundle.exists():
            raise ContainerNotFound(handle.id)
        # The shim died without writing a status (killed, machine rebooted): the
        # container's fate is unknown.  Record that, so every later wait() agrees.
        rec = shim.StatusRecord(exit_code=137 if handle.pid else 128, signal=None,
                                oom_killed=False, started_at=handle.started_at.timestamp(),
                                finished_at=time.time(), reason="Unknown",
                                message="the container's shim exited without recording "
                                        "its exit status")
        await trio.to_thread.run_sync(shim.write_status, handle.bundle, rec)
        return ExitStatus.from_record(rec)

    async def _signal_container(self, handle: ContainerHandle, sig: int) -> bool:
        """Deliver `sig`; False if the container had already exited."""
        fd = self._open_pidfd(handle.pid, handle.pid_start)
        if fd is None:
            return False
        try:
            signal.pidfd_send_signal(fd, sig)
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)
        return True

    async def signal(self, handle: ContainerHandle, sig: int) -> None:
        if not handle.bundle.exists():
            raise ContainerNotFound(handle.id)
        await self._signal_container(handle, sig)

    async def stop(self, handle: ContainerHandle, grace: float) -> ExitStatus:
        fd = self._open_pidfd(handle.pid, handle.pid_start)
        if fd is not None:
            try:
                with contextlib.suppress(ProcessLookupError):
                    await self._signal_container(handle, signal.SIGTERM)
                exited = False
                with trio.move_on_after(max(grace, 0.0)):
                    await trio.lowlevel.wait_readable(fd)
                    exited = True
                if not exited:
                    await self._signal_container(handle, signal.SIGKILL)
            finally:
                os.close(fd)
        return await self.wait(handle)

    async def inspect(self, handle: ContainerHandle) -> ContainerState:
        st = await trio.to_thread.run_sync(self._status, handle)
        if st is not None:
            return ContainerState(ContainerStatus.EXITED, handle.pid, handle.started_at, st)
        if self._alive(handle.pid, handle.pid_start):
            return ContainerState(ContainerStatus.RUNNING, handle.pid, handle.started_at)
        if self._alive(handle.shim_pid, handle.shim_start):
            # Main process gone, shim still recording the exit: a moment from EXITED.
            return ContainerState(ContainerStatus.CREATED, handle.pid, handle.started_at)
        return ContainerState(ContainerStatus.EXITED, handle.pid, handle.started_at,
                              await self.wait(handle))

    async def recover(self) -> list[ContainerHandle]:
        def scan() -> list[ContainerHandle]:
            out = []
            for d in sorted(self.containers_dir.iterdir()):
                try:
                    out.append(ContainerHandle.from_json(
                        json.loads((d / shim.HANDLE_FILE).read_text())))
                except (OSError, ValueError, KeyError):
                    continue
            return out

        handles = await trio.to_thread.run_sync(scan)
        handles.extend(await self._recover_unacknowledged())
        return handles

    async def _recover_unacknowledged(self) -> list[ContainerHandle]:
        """Containers whose shim started but whose agent died before writing the handle:
        rebuild the handle from the shim's own pid files."""
        def scan() -> list[ContainerHandle]:
            out = []
            for d in sorted(self.containers_dir.iterdir()):
                if (d / shim.HANDLE_FILE).exists():
                    continue
                try:
                    meta = json.loads((d / shim.META_FILE).read_text())
                except (OSError, ValueError):
                    continue
                shim_pid, shim_start = shim.read_pid_file(d / shim.SHIM_PID_FILE)
                pid, pid_start = shim.read_pid_file(d / shim.CONTAINER_PID_FILE)
                if not shim_pid:
                    continue
                h = ContainerHandle(
                    id=meta["id"], name=meta["name"], sandbox_id=meta["sandbox_id"],
                    pid=pid, shim_pid=shim_pid,
                    started_at=datetime.fromtimestamp(d.stat().st_mtime, UTC), bundle=d,
                    log_path=Path(meta["log_path"]), attempt=meta.get("attempt", 0),
                    labels=meta.get("labels", {}), pid_start=pid_start,
                    shim_start=shim_start)
                shim.write_json_atomic(d / shim.HANDLE_FILE, h.to_json())
                out.append(h)
            return out
        return await trio.to_thread.run_sync(scan)

    async def remove(self, handle: ContainerHandle) -> None:
        if self._alive(handle.pid, handle.pid_start) or self._alive(handle.shim_pid,
                                                                      handle.shim_start):
            await self.stop(handle, 0)
        await self._cleanup(handle)

        def rm() -> None:
            # The shim may be removing the same cgroup (process mode) as it exits: a
            # directory vanishing under us is the outcome we want, not an error.
            busy = None
            with contextlib.suppress(FileNotFoundError):
                cg = shim.ShimConfig.load(handle.bundle).cgroup if (
                    handle.bundle / shim.CONFIG_FILE).exists() else None
                if cg and self.cgroups.version and self.cgroups.exists(cg):
                    if not self.cgroups.remove(cg, timeout=5.0):
                        busy = cg
            if busy:
                raise RuntimeDriverError(f"container cgroup {busy} still busy after 5s")
            # Raised, not ignored: a bundle left behind is a leak the caller must see.
            # The shim records the exit in the bundle as it ends: a write landing while
            # rmtree walks the directory fails it with ENOTEMPTY, so the shim is given
            # a moment to finish, then the removal is tried again.
            for attempt in range(5):
                try:
                    shutil.rmtree(handle.bundle)
                    return
                except FileNotFoundError:
                    return
                except OSError as e:
                    if e.errno != errno.ENOTEMPTY or attempt == 4:
                        raise
                    time.sleep(0.05 * (attempt + 1))

        # Wait (bounded) for the shim to finish writing the exit record and go.
        for _ in range(100):
            if not self._alive(handle.shim_pid, handle.shim_start):
                break
            await trio.sleep(0.02)
        await trio.to_thread.run_sync(rm)

    async def stats(self, handle: ContainerHandle) -> ContainerStats:
        def read() -> ContainerStats:
            now = datetime.now(UTC)
            cfg = shim.ShimConfig.load(handle.bundle) if (
                handle.bundle / shim.CONFIG_FILE).exists() else None
            if cfg and cfg.cgroup and self.cgroups.version and self.cgroups.exists(cfg.cgroup):
                s = self.cgroups.stats(cfg.cgroup)
                return ContainerStats(now, s.cpu_usage_ns, s.memory_usage_bytes,
                                      s.memory_working_set_bytes, s.pids_current)
            # No cgroup (process driver without cgroup access): add up the process group.
            p = shim.process_group_usage(handle.pid) if handle.pid else None
            if p is None:
                return ContainerStats(now, None, None, None, None)
            return ContainerStats(now, p.cpu_ns, p.rss_bytes, p.rss_bytes, p.count)

        return await trio.to_thread.run_sync(read)

    def stdin_path(self, handle: ContainerHandle) -> Path:
        """The FIFO feeding a `stdin: true` container's stdin (attach writes here)."""
        return handle.bundle / shim.STDIN_FIFO

    def _meta(self, handle: ContainerHandle) -> dict[str, Any]:
        try:
            return json.loads((handle.bundle / shim.META_FILE).read_text())
        except (OSError, ValueError) as e:
            raise ContainerNotFound(handle.id) from e


def select_driver(state_dir: Path, *, prefer: str | None = None) -> Driver:
    """The OCI driver when running as root with runc or crun on PATH, else the process
    driver.  `prefer` ("oci" / "process") forces one (oci still needs root and a runtime)."""
    from fleet.runtime.oci import OciDriver, find_runtime
    from fleet.runtime.process import ProcessDriver

    runtime = find_runtime()
    if prefer == "process":
        return ProcessDriver(state_dir)
    if os.geteuid() == 0 and runtime is not None:
        return OciDriver(state_dir, runtime=runtime)
    if prefer == "oci":
        why = "not running as root" if os.geteuid() != 0 else "neither runc nor crun on PATH"
        raise RuntimeDriverError(f"the oci driver needs root and runc or crun: {why}")
    return ProcessDriver(state_dir)


__all__ = [
    "ContainerHandle", "ContainerNotFound", "ContainerSpec", "ContainerState",
    "ContainerStats", "ContainerStatus", "Driver", "ExitStatus", "InputSource", "Mount",
    "OutputSink", "Resources", "RuntimeDriverError", "Sandbox", "SandboxSpec", "ShimDriver",
    "ShimLauncher", "User", "run_with_stdio", "select_driver", "shim_command",
]
