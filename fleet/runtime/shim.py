"""`fleet shim`: the small process that owns one container, and its on-disk contract.

Why a shim: the agent must be able to die (SIGKILL, upgrade, crash) without taking its
containers along, and a restarted agent must find out what happened meanwhile.  So the
agent never parents a container.  It runs `fleet shim --bundle DIR --id ID --log PATH`,
which forks a detached child (new session, stdio on /dev/null) and exits once that child
reports the container started (or failed to).  The child:

- becomes a child subreaper (PR_SET_CHILD_SUBREAPER), so the container's main process —
  forked by `runc create`, which then exits — is re-parented to the shim and reaped by it:
  exact exit code and signal, no polling;
- pipes the container's stdout/stderr (or its pty, for `tty`) into the log file in the
  Kubernetes CRI format, `<RFC3339Nano> <stdout|stderr> <F|P> <text>`, P marking a
  partial line (split because it exceeded MAX_LINE; `fleet/runtime/crilog.py`);
- connects a FIFO in the bundle (`stdin`) to the container's stdin, so attach can write
  to it later;
- when the container exits, reads the cgroup's OOM-kill counter, writes `status.json`
  atomically, runs `runc delete`, and exits.

Files in the container directory (the "bundle"):

    shim.json       ShimConfig, written by the driver before launch
    meta.json       container name, sandbox, labels, env (the driver's, for recovery/exec)
    handle.json     the driver's ContainerHandle once start() returned
    shim.pid        "<pid> <start time>" of the shim
    container.pid   "<pid> <start time>" of the container's main process
    status.json     StatusRecord, once the container has exited (or failed to start)
    stdin           FIFO feeding the container's stdin (only with stdin: true)
    resize          FIFO of "<cols> <rows>" lines resizing the container's terminal
                    (only with tty: true; attach writes to it)
    runtime.log     runc's own JSON log (its error messages)

Everything here is stdlib only: one shim runs per container, so it must start fast and
stay small.  The shim itself is synchronous with a few threads; it never runs in the
agent's process.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleet.runtime import cgroups
from fleet.runtime.crilog import CriLog, pump_to_log
from fleet.runtime.procfs import all_stats, proc_start_time

CONFIG_FILE = "shim.json"
META_FILE = "meta.json"
HANDLE_FILE = "handle.json"
SHIM_PID_FILE = "shim.pid"
CONTAINER_PID_FILE = "container.pid"
STATUS_FILE = "status.json"
STDIN_FIFO = "stdin"
RESIZE_FIFO = "resize"
RUNTIME_LOG = "runtime.log"
CONSOLE_SOCKET = "console.sock"

# Exit code reported when the process never ran (containerd uses 128 for StartError).
START_ERROR_CODE = 128
PR_SET_CHILD_SUBREAPER = 36


# ---------------------------------------------------------------------------------------
# On-disk records


@dataclass
class ShimConfig:
    mode: str  # "oci" | "process"
    id: str
    log_path: str
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    # Container cgroup, relative to cgroup_root (None: no cgroup, process mode only).
    cgroup: str | None = None
    cgroup_root: str = str(cgroups.DEFAULT_ROOT)
    # oci mode
    runtime: str = "runc"
    runtime_root: str = ""
    # process mode
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    uid: int | None = None
    gid: int | None = None
    # cgroup limits the shim writes before placing the process (process mode).
    limits: dict[str, Any] = field(default_factory=dict)

    def save(self, bundle: Path) -> None:
        write_json_atomic(bundle / CONFIG_FILE, asdict(self))

    @classmethod
    def load(cls, bundle: Path) -> ShimConfig:
        return cls(**json.loads((bundle / CONFIG_FILE).read_text()))


@dataclass
class StatusRecord:
    exit_code: int
    signal: int | None
    oom_killed: bool
    started_at: float
    finished_at: float
    reason: str
    message: str = ""


@dataclass
class Ready:
    pid: int
    pid_start: int
    shim_pid: int
    shim_start: int
    started_at: float


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write-then-rename with fsync: a reader (or a crash) never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_status(bundle: Path, rec: StatusRecord) -> None:
    write_json_atomic(bundle / STATUS_FILE, asdict(rec))


def read_status(bundle: Path) -> StatusRecord | None:
    try:
        return StatusRecord(**json.loads((bundle / STATUS_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        return None  # cannot happen with atomic writes; treat as not yet written


def parse_ready(out: bytes) -> Ready | None:
    """The launcher's stdout: one JSON line, {"ok": true, ...}."""
    for line in reversed(out.decode(errors="replace").splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("ok"):
            return Ready(pid=d["pid"], pid_start=d["pid_start"], shim_pid=d["shim_pid"],
                         shim_start=d["shim_start"], started_at=d["started_at"])
    return None


def write_pid_file(path: Path, pid: int) -> int:
    start = proc_start_time(pid) or 0
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{pid} {start}\n")
    os.replace(tmp, path)
    return start


def read_pid_file(path: Path) -> tuple[int, int]:
    try:
        pid, start = path.read_text().split()
        return int(pid), int(start)
    except (OSError, ValueError):
        return 0, 0


@dataclass
class GroupUsage:
    cpu_ns: int
    rss_bytes: int
    count: int


def process_group_usage(pgid: int) -> GroupUsage | None:
    """CPU time, RSS and count of the processes in process group `pgid` (for containers
    without a cgroup)."""
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    cpu = rss = count = 0
    for st in all_stats():
        if st.pgid != pgid:
            continue
        count += 1
        cpu += (st.utime + st.stime) * 1_000_000_000 // tick
        rss += st.rss_pages * page
    return GroupUsage(cpu, rss, count) if count else None


# ---------------------------------------------------------------------------------------
# stdin plumbing


def _pump_bytes(src: int, dst: int) -> None:
    """Copy src → dst until EOF; closes src (dst belongs to the caller)."""
    try:
        while chunk := os.read(src, 65536):
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view):]
    except OSError:
        pass
    finally:
        os.close(src)


# ---------------------------------------------------------------------------------------
# The shim process


class Shim:
    """Runs one container (oci: runc create/start; process: a plain argv) to its end."""

    def __init__(self, bundle: Path, cfg: ShimConfig, log_path: Path) -> None:
        self.bundle = bundle
        self.cfg = cfg
        self.log = CriLog(log_path)
        self.cgroups = cgroups.Cgroups(Path(cfg.cgroup_root))
        self.threads: list[threading.Thread] = []
        self.started_at = time.time()
        self._after_spawn: list[Any] = []

    # -- helpers ----------------------------------------------------------------------
    def _thread(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _stdin_fd(self) -> int:
        """The fd to give the container as its stdin (the shim closes or pumps it)."""
        if not self.cfg.stdin:
            return os.open(os.devnull, os.O_RDONLY)
        fifo = self.bundle / STDIN_FIFO
        with contextlib.suppress(FileExistsError):
            os.mkfifo(fifo, 0o600)
        if not self.cfg.stdin_once:
            # Read-write open: never blocks, and the shim's own write side keeps the
            # container from seeing EOF between attaches (stdin stays open, as in k8s).
            return os.open(fifo, os.O_RDWR)
        # stdinOnce: the container reads a pipe the shim fills from the first writer of
        # the FIFO, then closes — EOF for the container when that writer goes away.
        # (The thread starts after the container is spawned: no fork with threads.)
        r, w = os.pipe()

        def first_writer() -> None:
            try:
                src = os.open(fifo, os.O_RDONLY)  # blocks until someone attaches
            except OSError:
                os.close(w)
                return
            _pump_bytes(src, w)
            os.close(w)

        self._after_spawn.append(first_writer)
        return r

    def _serve_resize(self, master: int) -> None:
        """Apply "<cols> <rows>" lines from the resize FIFO to the terminal `master`.

        The shim owns the container's pty, so only it can change the window size for
        `kubectl attach -t`; the kernel then sends SIGWINCH to the terminal's
        foreground process group, as for a real terminal."""
        fifo = self.bundle / RESIZE_FIFO
        with contextlib.suppress(FileExistsError):
            os.mkfifo(fifo, 0o600)
        fd = os.open(fifo, os.O_RDWR)  # read-write: no EOF between writers

        def loop() -> None:
            buf = b""
            while chunk := os.read(fd, 4096):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError, OSError):
                        cols, rows = (int(x) for x in line.split())
                        if 0 < cols < 65536 and 0 < rows < 65536:
                            fcntl.ioctl(master, termios.TIOCSWINSZ,
                                        struct.pack("HHHH", rows, cols, 0, 0))

        self._thread(loop)

    def _spawned(self) -> None:
        for fn in self._after_spawn:
            self._thread(fn)
        self._after_spawn.clear()

    def _start_error(self, message: str) -> StatusRecord:
        now = time.time()
        return StatusRecord(exit_code=START_ERROR_CODE, signal=None, oom_killed=False,
                            started_at=now, finished_at=now, reason="StartError",
                            message=message.strip())

    def _runtime(self, *args: str) -> list[str]:
        return [self.cfg.runtime, "--root", self.cfg.runtime_root, "--log",
                str(self.bundle / RUNTIME_LOG), "--log-format", "json", *args]

    def _runtime_error(self, stderr: bytes) -> str:
        # runc logs {"level": "error", "msg": "..."} lines; the last error is the cause.
        msg = ""
        with contextlib.suppress(OSError):
            for line in (self.bundle / RUNTIME_LOG).read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    d = json.loads(line)
                    if d.get("level") in ("error", "fatal") and d.get("msg"):
                        msg = d["msg"]
        return msg or stderr.decode(errors="replace").strip() or "the runtime failed"

    # -- start ------------------------------------------------------------------------
    def start(self) -> tuple[int, StatusRecord | None]:
        """Start the container; (pid, None) or (0, start error)."""
        return self._start_oci() if self.cfg.mode == "oci" else self._start_process()

    def _start_oci(self) -> tuple[int, StatusRecord | None]:
        stdin_fd = self._stdin_fd()
        pid_file = self.bundle / "runtime.pid"
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        console: socket.socket | None = None
        master: list[int] = []
        if self.cfg.tty:
            sock_path = self.bundle / CONSOLE_SOCKET
            with contextlib.suppress(FileNotFoundError):
                sock_path.unlink()
            console = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # A unix socket path is limited to 107 bytes and bundles can live deeper
            # than that: bind (and let runc connect) relative to the bundle, which is
            # both processes' working directory.
            os.chdir(self.bundle)
            console.bind(CONSOLE_SOCKET)
            console.listen(1)
            console.settimeout(30)

            def receive_master() -> None:
                # runc connects and passes the pty master (SCM_RIGHTS) during create.
                with contextlib.suppress(OSError):
                    conn, _ = console.accept()
                    with conn:
                        _, fds, _, _ = socket.recv_fds(conn, 4096, 1)
                        master.extend(fds)

            receiver = threading.Thread(target=receive_master, daemon=True)
            receiver.start()
            out_r = out_w = err_r = err_w = -1
            argv = self._runtime("create", "--bundle", str(self.bundle), "--pid-file",
                                 str(pid_file), "--console-socket", CONSOLE_SOCKET,
                                 self.cfg.id)
            stdio = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}
        else:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            argv = self._runtime("create", "--bundle", str(self.bundle), "--pid-file",
                                 str(pid_file), self.cfg.id)
            # In non-tty mode runc hands its own stdio to the container process.
            stdio = {"stdin": stdin_fd, "stdout": out_w}
        # runc's own stderr is kept apart when it is not the container's (tty): in
        # pipe mode it IS the container's stderr, and runc's messages go to runtime.log.
        proc = subprocess.Popen(argv, **stdio, stderr=err_w if err_w >= 0 else subprocess.PIPE,
                                cwd=self.bundle, close_fds=True)
        _, create_err = proc.communicate()
        for fd in (out_w, err_w):
            if fd >= 0:
                os.close(fd)
        if proc.returncode != 0:
            for fd in (out_r, err_r):
                if fd >= 0:
                    os.close(fd)
            os.close(stdin_fd)
            if console is not None:
                console.close()
            return 0, self._start_error(self._runtime_error(create_err or b""))
        pid = int(pid_file.read_text().strip())
        self._spawned()
        if self.cfg.tty:
            receiver.join(5)
            assert console is not None
            console.close()
            if not master:
                self._delete()
                return 0, self._start_error("the runtime did not pass the console")
            self._thread(pump_to_log, os.dup(master[0]), self.log, "stdout")
            self._serve_resize(master[0])
            if self.cfg.stdin:
                self._thread(_pump_bytes, stdin_fd, master[0])
            else:
                os.close(stdin_fd)
        else:
            os.close(stdin_fd)
            self._thread(pump_to_log, out_r, self.log, "stdout")
            self._thread(pump_to_log, err_r, self.log, "stderr")
        start = subprocess.run(self._runtime("start", self.cfg.id), capture_output=True,
                               cwd=self.bundle)
        if start.returncode != 0:
            err = self._runtime_error(start.stderr)
            self._delete()
            self._reap(pid)
            return 0, self._start_error(err)
        return pid, None

    def _start_process(self) -> tuple[int, StatusRecord | None]:
        cfg = self.cfg
        path = cfg.env.get("PATH", os.defpath)
        exe = cfg.argv[0]
        if "/" not in exe:
            import shutil
            found = shutil.which(exe, path=path)
            if found is None:
                return 0, self._start_error(
                    f'exec: "{exe}": executable file not found in $PATH')
            exe = found
        cg_procs: list[str] = []
        if cfg.cgroup and self.cgroups.version:
            try:
                self.cgroups.create(cfg.cgroup)
                self.cgroups.set_limits(cfg.cgroup, **cfg.limits)
                cg_procs = [str(p / "cgroup.procs")
                            for p in self.cgroups.paths(cfg.cgroup).values() if p.is_dir()]
            except OSError as e:
                return 0, self._start_error(f"cgroup {cfg.cgroup}: {e}")

        def enter_cgroup() -> None:
            # Runs in the child between fork and exec (the shim has no other threads
            # yet), so the process is limited from its first instruction.
            for procs in cg_procs:
                with open(procs, "w") as f:
                    f.write("0")

        stdin_fd = self._stdin_fd()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        master = slave = -1
        if cfg.tty:
            master, slave = os.openpty()
        try:
            proc = subprocess.Popen(
                [exe, *cfg.argv[1:]], executable=exe, env=cfg.env, cwd=cfg.cwd,
                stdin=slave if cfg.tty else stdin_fd,
                stdout=slave if cfg.tty else out_w, stderr=slave if cfg.tty else err_w,
                process_group=0, close_fds=True,
                user=cfg.uid if cfg.uid is not None and os.geteuid() == 0 else None,
                group=cfg.gid if cfg.gid is not None and os.geteuid() == 0 else None,
                preexec_fn=enter_cgroup if cg_procs else None)
        except (OSError, subprocess.SubprocessError) as e:
            for fd in (out_r, out_w, err_r, err_w, master, slave, stdin_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if isinstance(e, FileNotFoundError) and e.filename == cfg.cwd:
                return 0, self._start_error(f"chdir to cwd ({cfg.cwd!r}): {e.strerror}")
            return 0, self._start_error(f'exec: "{cfg.argv[0]}": {getattr(e, "strerror", e)}')
        # The shim reaps with waitid/waitpid itself; keep subprocess from also trying.
        proc.returncode = 0
        self._spawned()
        for fd in (out_w, err_w, slave):
            if fd >= 0:
                os.close(fd)
        if cfg.tty:
            os.close(out_r)
            os.close(err_r)
            self._thread(pump_to_log, os.dup(master), self.log, "stdout")
            self._serve_resize(master)
            if cfg.stdin:
                self._thread(_pump_bytes, stdin_fd, master)
            else:
                os.close(stdin_fd)
        else:
            os.close(stdin_fd)
            self._thread(pump_to_log, out_r, self.log, "stdout")
            self._thread(pump_to_log, err_r, self.log, "stderr")
        return proc.pid, None

    # -- run to the end ---------------------------------------------------------------
    def _reap(self, pid: int) -> int | None:
        """Reap children (we are a subreaper) until `pid` exits; its wait status."""
        while True:
            try:
                # WNOWAIT first: while `pid` is an unreaped zombie its pid and process
                # group cannot be reused, so the group kill below cannot hit a stranger.
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                # Not (or no longer) our child: cannot get its status, only its end.
                while os.path.exists(f"/proc/{pid}"):
                    time.sleep(0.05)
                return None
            except InterruptedError:
                continue
            if info is None:
                continue
            if info.si_pid != pid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.si_pid, 0)
                continue
            if self.cfg.mode == "process":
                # The main process is the container: take the rest of its group with
                # it (as the kernel does to a pid namespace when its init exits).
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return status

    def _delete(self) -> None:
        if self.cfg.mode == "oci":
            subprocess.run(self._runtime("delete", "--force", self.cfg.id),
                           capture_output=True, cwd=self.bundle)

    def finish(self, pid: int) -> StatusRecord:
        status = self._reap(pid)
        finished = time.time()
        # The pipes reach EOF once every process holding them is gone; bounded, in case
        # something escaped the group and keeps them open.
        deadline = time.monotonic() + 5
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        _reap_orphans()
        oom = 0
        if self.cfg.cgroup and self.cgroups.version:
            with contextlib.suppress(OSError):
                oom = self.cgroups.oom_kills(self.cfg.cgroup)
        if status is None:
            code, sig = 255, None
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            code = 128 + sig
        else:
            code, sig = os.waitstatus_to_exitcode(status), None
        if oom:
            reason = "OOMKilled"
        elif code == 0:
            reason = "Completed"
        else:
            reason = "Error"
        msg = ""
        if sig is not None:
            msg = f"killed by signal {sig} ({signal.Signals(sig).name})"
        if oom:
            msg = "the container exceeded its memory limit and was killed"
        return StatusRecord(exit_code=code, signal=sig, oom_killed=bool(oom),
                            started_at=self.started_at, finished_at=finished,
                            reason=reason, message=msg)

    def cleanup(self) -> None:
        self._delete()
        if self.cfg.mode == "process" and self.cfg.cgroup and self.cgroups.version:
            with contextlib.suppress(OSError):
                self.cgroups.remove(self.cfg.cgroup, timeout=2.0)
        self.log.close()


def _reap_orphans() -> None:
    """Reap whatever exited and was re-parented to us (we are a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _ignore_signal(signum: int, frame: Any) -> None:
    pass


def _set_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _detach_stdio() -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _report(w: int, obj: dict[str, Any]) -> None:
    os.write(w, json.dumps(obj).encode() + b"\n")
    os.close(w)


def _supervise(bundle: Path, container_id: str, log_path: Path | None, w: int) -> int:
    """The detached shim itself: start the container, report on `w`, wait, record.

    Runs in the shim process (already in its own session, stdio on /dev/null unless
    --foreground).  Whatever goes wrong before the container starts is reported on
    `w` as {"ok": false, "error": ...} instead of dying silently."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        # Signals for the agent's terminal or session are not for the shim; it ends
        # when its container does.  A no-op handler rather than SIG_IGN: an ignored
        # disposition would be inherited through exec by the container itself.
        signal.signal(sig, _ignore_signal)
    try:
        cfg = ShimConfig.load(bundle)
        if cfg.id != container_id:
            raise ValueError(f"bundle {bundle} is for {cfg.id}, not {container_id}")
        log = Path(log_path or cfg.log_path)
        _set_subreaper()
        shim_start = write_pid_file(bundle / SHIM_PID_FILE, os.getpid())
        shim = Shim(bundle, cfg, log)
        pid, error = shim.start()
    except Exception as e:  # report why to the agent instead of dying silently
        _report(w, {"ok": False, "error": repr(e)})
        return 1
    if error is not None:
        write_status(bundle, error)
        shim.cleanup()
        _report(w, {"ok": True, "pid": 0, "pid_start": 0, "shim_pid": os.getpid(),
                    "shim_start": shim_start, "started_at": error.started_at})
        return 0
    pid_start = write_pid_file(bundle / CONTAINER_PID_FILE, pid)
    _report(w, {"ok": True, "pid": pid, "pid_start": pid_start, "shim_pid": os.getpid(),
                "shim_start": shim_start, "started_at": shim.started_at})
    rec = shim.finish(pid)
    write_status(bundle, rec)
    shim.cleanup()
    return 0


def run(bundle: Path, container_id: str, log_path: Path | None = None, *,
        foreground: bool = False) -> int:
    """Entry point of `fleet shim`.  Returns the launcher's exit code: 0 once the container
    started (or its start failure was recorded), 1 if the shim itself failed."""
    bundle = bundle.resolve()
    r, w = os.pipe()
    if foreground:
        os.close(r)
        return _supervise(bundle, container_id, log_path, w)
    child = os.fork()
    if child:
        # The launcher: relay the child's report, then exit (the agent waits on us).
        os.close(w)
        data = _read_all(r)
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
        return 0 if parse_ready(data) is not None else 1
    os.close(r)
    os.setsid()
    _detach_stdio()
    os._exit(_supervise(bundle, container_id, log_path, w))


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data


# ---------------------------------------------------------------------------------------
# The launcher server ("zygote")
#
# Starting a Python interpreter for every container costs tens of milliseconds, the
# largest single step of a pod start.  So the agent keeps one `fleet shim --serve`
# process running: it has already imported this module, reads one request per line on
# stdin — {"req": N, "bundle": ..., "id": ..., "log": ...} — and for each forks (no
# exec) a detached shim exactly like `run` does: an intermediate child that calls
# setsid() and forks the shim, then exits, so the shim belongs to no one but init (or
# the nearest subreaper) and survives both the server and the agent.  The shim's ready
# report comes back on a private pipe and is relayed as one line, "N <report>", on
# stdout.  Forked shims also share the server's pages copy-on-write, so each costs less
# memory than a separately started interpreter.  The server exits when its stdin closes
# (the agent went away); running shims are unaffected.  It is single-threaded, so
# forking is safe, and it never blocks on one request while others are pending.


def _fork_shim(req: dict[str, Any], inherited: list[int]) -> int:
    """Fork a detached shim for one request; return the read end of its report pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # intermediate child
        code = 1
        try:
            os.close(r)
            for fd in inherited:
                with contextlib.suppress(OSError):
                    os.close(fd)
            os.setsid()
            if os.fork():
                os._exit(0)
            _detach_stdio()
            bundle = Path(req["bundle"]).resolve()
            os.chdir(bundle)
            log = Path(req["log"]) if req.get("log") else None
            code = _supervise(bundle, str(req["id"]), log, w)
        except BaseException as e:  # noqa: BLE001 - nothing may escape into the server loop
            with contextlib.suppress(OSError):
                _report(w, {"ok": False, "error": repr(e)})
        finally:
            os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)  # the intermediate child exits right after its fork
    return r


def serve(stdin: int = 0, stdout: int = 1) -> int:
    """Run the launcher server until `stdin` closes (see above)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ, None)
    pending: dict[int, tuple[Any, bytearray]] = {}  # report pipe -> (request id, data)
    inbuf = b""
    reading = True
    while reading or pending:  # after EOF, still answer the starts in progress
        for key, _ in sel.select():
            fd = int(key.fd)
            if key.data is None:
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    reading = False
                    continue
                inbuf += chunk
                *lines, inbuf = inbuf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    req: Any = None
                    try:
                        req = json.loads(line)
                        r = _fork_shim(req, [stdin, stdout, sel.fileno(), *pending])
                    except Exception as e:  # noqa: BLE001 - answer, do not die
                        rid = req.get("req") if isinstance(req, dict) else None
                        try:
                            _send_line(stdout, rid,
                                       json.dumps({"ok": False, "error": repr(e)}).encode())
                        except BrokenPipeError:
                            return 0
                        continue
                    pending[r] = (req.get("req"), bytearray())
                    sel.register(r, selectors.EVENT_READ, "report")
            else:
                rid, data = pending[fd]
                chunk = os.read(fd, 65536)
                if chunk:
                    data += chunk
                    continue
                sel.unregister(fd)
                os.close(fd)
                del pending[fd]
                line = bytes(data).strip().replace(b"\n", b" ")
                try:
                    _send_line(stdout, rid, line)
                except BrokenPipeError:
                    return 0  # the agent is gone; the shims are not ours to wait for
    return 0


def _send_line(fd: int, rid: Any, payload: bytes) -> None:
    out = json.dumps(rid).encode() + b" " + payload + b"\n"
    while out:
        out = out[os.write(fd, out):]


def is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False
