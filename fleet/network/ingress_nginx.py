"""The `nginx` ingress engine: Debian's nginx as the data plane, driven from a RouteTable.

`NginxEngine(options)` follows the `fleet.network.routetable.Engine` protocol:

* `run()` prepares `options.runtime_dir`, listens on a unix datagram socket for
  nginx' access log (syslog format, one line per request carrying the config stamp,
  route id, status and `$request_time`, fed to `options.observe`), renders an empty
  table and starts `nginx -p <runtime_dir> -c nginx.conf -g 'daemon off; master_process on;'`
  as a child in its own process group.  It reports started once nginx serves that
  configuration; if nginx later dies it is started again after an exponential
  back-off (why it died — exit status and the error log's tail — is logged).  On
  cancellation the master gets SIGQUIT (graceful: workers finish open requests),
  then SIGTERM after `stop_grace` seconds, then SIGKILL to the process group.
* `apply(table)` renders (`fleet.network.nginx_conf`), writes this generation's
  files into their own directory (certificates and keys mode 0600), checks the whole
  configuration with `nginx -t` — a refusal raises `EngineError` and the previous
  configuration stays in force, on disk and in nginx — then moves it into place and
  sends SIGHUP.  nginx starts new workers on the new configuration and lets the old
  ones finish their open connections, so nothing in flight is dropped.  `apply`
  returns once the new configuration answers on the internal status socket with
  its stamp (new listening ports are open by then); a reload nginx refuses (a port
  already in use) raises `EngineError` and restores the previous nginx.conf.

`runtime_dir` holds private keys: it must be on a tmpfs such as /run (the default is
/run/fleet/ingress) so keys never land on disk.  When the engine runs as root,
nginx' workers run as `nobody` if they can reach the runtime directory (else as
root, with a warning), and only the files they need are theirs.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

import trio

from fleet._core.supervise import Backoff
from fleet.network.nginx_conf import ConfigError, NginxPaths, RenderedConfig, render
from fleet.network.routetable import EngineError, EngineOptions, RouteTable, Source

log = logging.getLogger(__name__)

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
# The route is empty for a request nginx answered before routing (400, 431).
_ACCESS = re.compile(r"fleet (\d+) (\S*) (\d{3}) (\d+(?:\.\d+)?)\s*$")
# nginx's [emerg] when a listen socket cannot be bound: `bind() to 0.0.0.0:8081 failed (98: ...)`.
_BIND_FAILED = re.compile(r"bind\(\) to \S+:(\d+) failed")
_KEEP_STAMPS = 8  # access-log lines of old workers still name routes of recent configs


@dataclass(frozen=True)
class AccessRecord:
    stamp: int
    route: str  # "-" or "" when the request reached no route
    status: int
    seconds: float


def parse_access_line(data: bytes) -> AccessRecord | None:
    """One syslog datagram from nginx (`<190>Dec  2 10:00:00 nginx: fleet 3 fleet_r1 200 0.004`)."""
    m = _ACCESS.search(data.decode("utf-8", "replace"))
    if m is None:
        return None
    return AccessRecord(int(m[1]), m[2], int(m[3]), float(m[4]))


class NginxEngine:
    """nginx, configured from route tables and reloaded gracefully (see the module docstring)."""

    name = "nginx"

    def __init__(self, options: EngineOptions | None = None, *, nginx: str = NGINX,
                 workers: int | str = "auto", stop_grace: float = 10.0, reload_timeout: float = 15.0,
                 backoff: Backoff = Backoff(initial=0.5, maximum=30.0, healthy_after=30.0)) -> None:
        self.options = options or EngineOptions()
        self.nginx = nginx
        self.workers = workers  # nginx worker processes: "auto" is one per core
        self.stop_grace = stop_grace
        self.reload_timeout = reload_timeout
        self.backoff = backoff
        self.runtime_dir = os.path.abspath(self.options.runtime_dir)
        self._lock = trio.Lock()
        self._stamp = 0
        self._ports: frozenset[int] = frozenset()  # what the installed configuration listens on
        self._sources: dict[int, Mapping[str, Source]] = {}
        self._proc: _NginxProcess | None = None
        self._ready = False
        self._worker_user: str | None = None
        self._worker_uid: int | None = None

    # ------------------------------------------------------------ paths

    @property
    def conf_path(self) -> str:
        return f"{self.runtime_dir}/nginx.conf"

    def _paths(self, stamp: int) -> NginxPaths:
        return NginxPaths(self.runtime_dir, f"{self.runtime_dir}/gen/{stamp}", self._worker_user)

    # ------------------------------------------------------------ run

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self._prepare)
        await trio.to_thread.run_sync(self._stop_stale)
        paths = self._paths(0)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(paths.access_socket)
        sock.bind(paths.access_socket)
        os.chmod(paths.access_socket, 0o600)
        if self._worker_uid is not None:
            os.chown(paths.access_socket, self._worker_uid, -1)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_access_log, sock)
                async with self._lock:
                    await self._install(RouteTable())
                await nursery.start(self._supervise)
                self._ready = True
                task_status.started()
        finally:
            # nginx is stopped by now (the supervisor's own finally): its keys can go.
            self._ready = False
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(paths.access_socket)
            shutil.rmtree(f"{self.runtime_dir}/gen", ignore_errors=True)

    def _prepare(self) -> None:
        rt = self.runtime_dir
        os.makedirs(rt, exist_ok=True)
        os.chmod(rt, 0o755)  # workers reach tmp/ and log/ through it; keys sit in gen/ (0700)
        for sub, mode in (("gen", 0o700), ("tmp", 0o755), ("empty", 0o755), ("log", 0o700)):
            os.makedirs(f"{rt}/{sub}", exist_ok=True)
            os.chmod(f"{rt}/{sub}", mode)
        for entry in os.listdir(f"{rt}/empty"):  # the try_files probe must never find a file
            shutil.rmtree(f"{rt}/empty/{entry}", ignore_errors=True)
        if os.geteuid() != 0:
            return
        if _reachable_by_others(rt):
            pw = pwd.getpwnam("nobody")
            self._worker_user = f"nobody {grp.getgrgid(pw.pw_gid).gr_name}"
            self._worker_uid = pw.pw_uid
            os.chown(f"{rt}/log", pw.pw_uid, -1)
        else:
            log.warning("nginx engine: %s is not reachable by 'nobody' (a parent directory is private); "
                        "nginx workers run as root", rt)
            self._worker_user = "root root"

    def _stop_stale(self) -> None:
        """An nginx left behind by an earlier engine on this runtime dir (a crash)."""
        try:
            with open(f"{self.runtime_dir}/nginx.pid") as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                # nginx retitles itself: "nginx: master process /usr/sbin/nginx -p <dir>/ ..."
                cmdline = f.read().replace(b"\0", b" ")
        except (OSError, ValueError):
            return
        if b"nginx" not in cmdline or f" {self.runtime_dir}/ ".encode() not in cmdline:
            return
        log.warning("nginx engine: stopping nginx pid %d left over in %s", pid, self.runtime_dir)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    async def _supervise(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        failures = 0
        started = False
        while True:
            # A master that was killed leaves its unix socket behind; nginx cannot bind over it.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._paths(0).status_socket)
            proc = _NginxProcess([self.nginx, "-p", self.runtime_dir + "/", "-c", self.conf_path,
                                  "-e", self._paths(0).error_log, "-g", "daemon off; master_process on;"])
            up_since = trio.current_time()
            try:
                try:
                    live = self._stamp
                    await self._wait_live(live, proc)
                    # An apply while nginx was starting changed the file but could not
                    # signal: bring nginx up to date before taking reloads ourselves.
                    while self._stamp != live:
                        live = self._stamp
                        proc.send_signal(signal.SIGHUP)
                        await self._wait_live(live, proc)
                except EngineError as exc:
                    if not started:
                        raise
                    code: int | str = f"not serving ({exc})"
                else:
                    self._proc = proc
                    if not started:
                        started = True
                        task_status.started()
                    log.info("nginx engine: nginx running (pid %d, stamp %d)", proc.pid, live)
                    code = await proc.wait()
            finally:
                self._proc = None
                with trio.CancelScope(shield=True):
                    await self._stop(proc)
            if trio.current_time() - up_since >= self.backoff.healthy_after:
                failures = 0
            failures += 1
            delay = self.backoff.delay(failures)
            log.error("nginx engine: nginx (pid %d) exited with status %s; restarting in %.1fs; error log: %s",
                      proc.pid, code, delay, self._error_tail())
            await trio.sleep(delay)

    async def _stop(self, proc: _NginxProcess) -> None:
        """SIGQUIT (graceful), SIGTERM after the grace, SIGKILL to the group at last."""
        if proc.returncode is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # orphaned workers, if any
            return
        for sig, wait in ((signal.SIGQUIT, self.stop_grace), (signal.SIGTERM, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            with trio.move_on_after(wait):
                await proc.wait()
                break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()

    # ------------------------------------------------------------ apply

    async def apply(self, table: RouteTable) -> None:
        if not self._ready:
            raise EngineError("the nginx engine is not running")
        async with self._lock:
            await self._install(table)

    async def _install(self, table: RouteTable) -> None:
        # A port another process holds makes nginx refuse the whole reload (or not
        # start): find such ports first, so the controller can leave them out.
        wanted = frozenset(lst.port for lst in table.listeners)
        busy = await trio.to_thread.run_sync(
            unbindable_ports, wanted - self._ports, self.options.bind_address)
        if busy:
            raise EngineError(f"cannot listen on {self.options.bind_address} port(s) "
                              f"{', '.join(map(str, sorted(busy)))}: in use or not permitted",
                              ports=busy)
        stamp = self._stamp + 1
        try:
            rendered = render(table, self.options, paths=self._paths(stamp), stamp=stamp, workers=self.workers)
        except (ConfigError, ValueError) as exc:
            raise EngineError(f"route table generation {table.generation} cannot be rendered: {exc}") from exc
        candidate = await trio.to_thread.run_sync(self._write, rendered)
        result = await trio.run_process([self.nginx, "-t", "-q", "-p", self.runtime_dir + "/", "-c", candidate],
                                        capture_stdout=True, capture_stderr=True, check=False)
        if result.returncode != 0:
            await trio.to_thread.run_sync(self._discard, stamp)
            message = result.stderr.decode("utf-8", "replace").strip()
            raise EngineError(f"nginx refused the configuration for table generation {table.generation}: {message}")
        previous = await trio.to_thread.run_sync(_read_or_none, self.conf_path)
        os.replace(candidate, self.conf_path)
        self._stamp = stamp
        old_ports, self._ports = self._ports, wanted
        self._sources[stamp] = rendered.sources
        for old in sorted(self._sources)[:-_KEEP_STAMPS]:
            del self._sources[old]
        proc = self._proc
        if proc is None:
            return  # the first config (nginx starts on it), or nginx is between restarts
        offset = _size(self._paths(0).error_log)
        old_workers = _children(proc.pid)
        proc.send_signal(signal.SIGHUP)
        try:
            await self._wait_live(stamp, proc, error_offset=offset)
            await self._wait_old_workers_closed(old_workers)
        except EngineError as exc:
            if previous is not None:
                await trio.to_thread.run_sync(_write_atomic, self.conf_path, previous, 0o600)
            self._stamp, self._ports = stamp - 1, old_ports
            await trio.to_thread.run_sync(self._discard, stamp)
            busy = frozenset(int(p) for p in _BIND_FAILED.findall(str(exc)))
            if busy and not exc.ports:
                raise EngineError(str(exc), ports=busy) from exc
            raise
        await trio.to_thread.run_sync(self._discard_older, stamp)

    def _write(self, rendered: RenderedConfig) -> str:
        for f in rendered.files:
            os.makedirs(os.path.dirname(f.path), mode=0o700, exist_ok=True)
            _write_atomic(f.path, f.data, f.mode)
        candidate = f"{self.runtime_dir}/nginx-{rendered.stamp}.conf"
        _write_atomic(candidate, rendered.text.encode(), 0o600)
        return candidate

    def _discard(self, stamp: int) -> None:
        shutil.rmtree(f"{self.runtime_dir}/gen/{stamp}", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self.runtime_dir}/nginx-{stamp}.conf")

    def _discard_older(self, stamp: int) -> None:
        # nginx read every file at the reload; older generations are not needed any more.
        for entry in os.listdir(f"{self.runtime_dir}/gen"):
            if entry.isdigit() and int(entry) < stamp:
                shutil.rmtree(f"{self.runtime_dir}/gen/{entry}", ignore_errors=True)

    async def _wait_live(self, stamp: int, proc: _NginxProcess, *, error_offset: int | None = None) -> None:
        """Until the status socket answers `stamp`; EngineError if nginx exits, logs an
        emergency (a reload it refused) or the deadline passes."""
        with trio.move_on_after(self.reload_timeout):
            while True:
                if proc.returncode is not None:
                    raise EngineError(f"nginx exited with status {proc.returncode}: {self._error_tail()}")
                if await self._status() == str(stamp):
                    return
                if error_offset is not None:
                    emerg = _emergencies(self._paths(0).error_log, error_offset)
                    if emerg:
                        raise EngineError(f"nginx refused to reload: {emerg}")
                await trio.sleep(0.02)
        raise EngineError(f"nginx did not serve configuration {stamp} within {self.reload_timeout}s: "
                          f"{self._error_tail()}")

    async def _wait_old_workers_closed(self, pids: set[int]) -> None:
        """Until every worker of the previous configuration stopped accepting.

        The master signals the old workers only after the new ones run, so the status
        socket can answer the new stamp while an old worker still takes a connection
        or two.  A worker closes its listening sockets in the same step that retitles
        it "worker process is shutting down"; it then only finishes open requests."""
        with trio.move_on_after(self.reload_timeout):
            while not all(_closed_listeners(pid) for pid in pids):
                await trio.sleep(0.01)
            return
        raise EngineError(f"nginx's old workers did not stop accepting within {self.reload_timeout}s")

    async def _status(self) -> str | None:
        try:
            with trio.move_on_after(1.0):
                stream = await trio.open_unix_socket(self._paths(0).status_socket)
                async with stream:
                    await stream.send_all(b"GET /generation HTTP/1.0\r\nHost: fleet\r\n\r\n")
                    data = b""
                    while chunk := await stream.receive_some(4096):
                        data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                if head.split(b" ", 2)[1:2] == [b"200"]:
                    return body.decode("ascii", "replace")
        except (OSError, trio.BrokenResourceError):
            pass
        return None

    def _error_tail(self) -> str:
        try:
            with open(self._paths(0).error_log, "rb") as f:
                f.seek(max(0, _size(self._paths(0).error_log) - 2000))
                lines = f.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return "(no error log)"
        return " | ".join(lines[-5:]) or "(empty error log)"

    # ------------------------------------------------------------ metrics

    async def _read_access_log(self, sock: socket.socket) -> None:
        # One wake-up drains every datagram queued: under load that is hundreds per
        # wake-up instead of a scheduler round trip each.
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                self._observe(data)

    def _observe(self, data: bytes) -> None:
        record = parse_access_line(data)
        if record is None or self.options.observe is None:
            return
        source = self._sources.get(record.stamp, {}).get(record.route)
        try:
            self.options.observe(source, record.status, record.seconds)
        except Exception:  # noqa: BLE001 - a metrics callback must not stop the engine
            log.exception("nginx engine: the request observer raised")


_SETPRIV = shutil.which("setpriv")


class _NginxProcess:
    """nginx' master as our child: its own process group (we signal exactly our nginx),
    and — through util-linux `setpriv --pdeathsig` — sent SIGTERM by the kernel if this
    process dies without stopping it (a SIGKILLed engine must not leave nginx holding
    the ports).  The parent-death signal belongs to the *thread* that forked, so the
    child is started from the event loop's thread (a fork of a few milliseconds), not
    from a worker thread as `trio.lowlevel.open_process` would, and waited for with a
    pidfd."""

    def __init__(self, argv: list[str]) -> None:
        if _SETPRIV:
            argv = [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]
        self._popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = self._popen.pid
        try:
            self._pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def send_signal(self, sig: int) -> None:
        if self._popen.poll() is None:
            self._popen.send_signal(sig)

    async def wait(self) -> int:
        try:
            while self._popen.poll() is None:
                if self._pidfd is not None:
                    await trio.lowlevel.wait_readable(self._pidfd)
                else:
                    await trio.sleep(0.1)
        finally:
            if self._popen.returncode is not None and self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self._popen.returncode


def _reachable_by_others(path: str) -> bool:
    """Whether every directory above `path` lets anyone traverse it."""
    parent = os.path.dirname(path)
    while True:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        if parent == os.path.dirname(parent):
            return True
        parent = os.path.dirname(parent)


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (nginx' workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(c) for c in f.read().split()}
    except OSError:
        pass
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # "pid (comm) state ppid ...": comm may hold spaces, so split after ')'
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.add(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _closed_listeners(pid: int) -> bool:
    """Whether an nginx worker is gone or shutting down (its listening sockets closed)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read()
    except OSError:
        return True
    return b"shutting down" in title or b"worker process" not in title


def _write_atomic(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _read_or_none(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def unbindable_ports(ports: frozenset[int], address: str) -> frozenset[int]:
    """The ports of `ports` no TCP socket can listen on at `address` right now (another
    process holds them, or binding them is not permitted) — as nginx would find."""
    busy = set()
    for port in ports:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as nginx does
            try:
                sock.bind((address, port))
            except OSError:
                busy.add(port)
    return frozenset(busy)


def _emergencies(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read(65536).decode("utf-8", "replace")
    except OSError:
        return ""
    return " | ".join(line for line in text.splitlines() if "[emerg]" in line)
