"""The audit log backend: audit events as JSON lines, in a file rotated like
kube-apiserver's (lumberjack) or on stdout (`--audit-log-path -`).

Why a buffer and a writer task: the request path must not wait on the disk.
`AuditLog.emit` only appends the event (a dict) to a list — no encoding, no
system call — and wakes the writer task, which, every `flush_interval`, hands
the whole batch to a worker thread that encodes it and writes it with plain
`os.write` calls (so nothing sits in a userspace buffer that a failed write
could leave half-flushed).  A request only ever waits when `max_pending`
events are queued (the disk has stalled): then it blocks until the writer
drains, as kube-apiserver's default "blocking" log mode does, rather than the
log silently dropping events.

Nothing is lost on an orderly shutdown: when the writer task is cancelled it
writes what is queued (shielded), and from then on `emit` writes synchronously
— requests still finishing during the shutdown are on the log too.  Before
`run` starts (tests, tools) writes are synchronous as well.

A failed write is logged (rate-limited) and counted: `apiserver_audit_error_total`
(`counters.audit_error(n)`), beside `apiserver_audit_event_total`.  The events
of a failed batch are dropped, as kube-apiserver's log backend drops them.

Rotation (`RotatingFile`) is lumberjack's, which kube-apiserver uses: when a
line would take the file past `--audit-log-maxsize` megabytes (0: 100 MB) the
file is renamed to `<name>-<UTC time 2006-01-02T15-04-05.000><ext>` and a new
one opened (mode 0600); backups beyond `--audit-log-maxbackup` (0: all kept)
or older than `--audit-log-maxage` days (by the time in their name; 0: kept)
are removed after each rotation, at open, and every `prune_interval` seconds.
Like lumberjack, the active file is rotated by size only, never by age.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import trio

log = logging.getLogger(__name__)

MEGABYTE = 1024 * 1024
DEFAULT_MAX_SIZE_MB = 100  # lumberjack's default when MaxSize is 0
BACKUP_TIME_FORMAT = "%Y-%m-%dT%H-%M-%S.%f"  # written with milliseconds: 2006-01-02T15-04-05.000


class AuditCounters(Protocol):
    """The metrics the log reports to (fleet/server/metrics.py Metrics)."""

    def audit_event(self) -> None: ...

    def audit_error(self, n: int) -> None: ...


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def backup_name(path: Path, t: datetime) -> Path:
    """lumberjack's backupName: `audit.log` → `audit-2026-12-03T10-27-05.123.log` (UTC)."""
    stem, ext = os.path.splitext(path.name)
    stamp = t.astimezone(UTC).strftime(BACKUP_TIME_FORMAT)[:-3]
    return path.with_name(f"{stem}-{stamp}{ext}")


def parse_backup_time(path: Path, candidate: str) -> datetime | None:
    """The time in a backup's name (None: not a backup of `path`)."""
    stem, ext = os.path.splitext(path.name)
    prefix = stem + "-"
    if not candidate.startswith(prefix) or not candidate.endswith(ext) or candidate == path.name:
        return None
    stamp = candidate[len(prefix):len(candidate) - len(ext)] if ext else candidate[len(prefix):]
    try:
        return datetime.strptime(stamp, BACKUP_TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


class RotatingFile:
    """An append-only file rotated by size, its backups pruned by count and age
    (lumberjack.Logger).  Not thread-safe: one writer at a time (AuditLog sees to it)."""

    def __init__(self, path: str | Path, *, max_size_mb: int = 0, max_age_days: int = 0,
                 max_backups: int = 0, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.path = Path(path)
        self.max_bytes = (max_size_mb or DEFAULT_MAX_SIZE_MB) * MEGABYTE
        self.max_age = timedelta(days=max_age_days) if max_age_days > 0 else None
        self.max_backups = max_backups
        self.now = now
        self.fd: int | None = None
        self.size = 0

    def open(self) -> None:
        """Open the existing file to append (rotating it first if full) or a new one;
        create the directory (0700) if needed.  OSError if the path is unusable."""
        if self.fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.prune()
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size >= self.max_bytes:
            self._open_new(rotate=True)
            return
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.size = os.fstat(self.fd).st_size

    def write_lines(self, lines: list[bytes]) -> None:
        """Append whole lines, rotating between two lines when the next would not fit.
        A line larger than the limit gets a file of its own (lumberjack refuses it;
        an audit event is not dropped for its size)."""
        if self.fd is None:
            self.open()
        chunk: list[bytes] = []
        chunk_size = 0
        for line in lines:
            if self.size + chunk_size > 0 and self.size + chunk_size + len(line) > self.max_bytes:
                self._write(b"".join(chunk))
                chunk, chunk_size = [], 0
                self.rotate()
            chunk.append(line)
            chunk_size += len(line)
        if chunk:
            self._write(b"".join(chunk))

    def _write(self, data: bytes) -> None:
        if not data:
            return
        assert self.fd is not None
        _write_all(self.fd, data)
        self.size += len(data)

    def rotate(self) -> None:
        """Rename the current file to its backup name, open a fresh one, prune."""
        self.close()
        self._open_new(rotate=True)

    def _open_new(self, *, rotate: bool) -> None:
        mode = 0o600
        if rotate and self.path.exists():
            mode = self.path.stat().st_mode & 0o777
            t = self.now()
            target = backup_name(self.path, t)
            while target.exists():  # two rotations within a millisecond: never overwrite a backup
                t += timedelta(milliseconds=1)
                target = backup_name(self.path, t)
            os.rename(self.path, target)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                          mode)
        self.size = 0
        self.prune()

    def backups(self) -> list[tuple[datetime, Path]]:
        """The backups of this file, newest first."""
        found = []
        try:
            names = os.listdir(self.path.parent)
        except FileNotFoundError:
            return []
        for name in names:
            t = parse_backup_time(self.path, name)
            if t is not None:
                found.append((t, self.path.parent / name))
        found.sort(reverse=True)
        return found

    def prune(self) -> list[Path]:
        """Remove backups beyond max_backups and older than max_age; the removed paths."""
        if not self.max_backups and self.max_age is None:
            return []
        backups = self.backups()
        remove = []
        if self.max_backups and len(backups) > self.max_backups:
            remove += [p for _, p in backups[self.max_backups:]]
            backups = backups[:self.max_backups]
        if self.max_age is not None:
            cutoff = self.now() - self.max_age
            remove += [p for t, p in backups if t < cutoff]
        for p in remove:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("audit log: cannot remove old backup %s: %s", p, e)
        return remove

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


class StdoutTarget:
    """`--audit-log-path -`: lines to the process' standard output, never rotated."""

    path = Path("-")

    def open(self) -> None:
        pass

    def write_lines(self, lines: list[bytes]) -> None:
        _write_all(1, b"".join(lines))

    def prune(self) -> list[Path]:
        return []

    def close(self) -> None:
        pass


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class AuditLog:
    """The buffered audit sink (see the module docstring)."""

    def __init__(self, path: str, *, max_size_mb: int = 0, max_age_days: int = 0, max_backups: int = 0,
                 flush_interval: float = 0.1, max_pending: int = 50_000, prune_interval: float = 600.0,
                 now: Callable[[], datetime] | None = None) -> None:
        kw = {"now": now} if now is not None else {}
        self.target: RotatingFile | StdoutTarget = StdoutTarget() if path == "-" else RotatingFile(
            path, max_size_mb=max_size_mb, max_age_days=max_age_days, max_backups=max_backups, **kw)
        self.flush_interval = flush_interval
        self.max_pending = max_pending
        self.prune_interval = prune_interval
        self.counters: AuditCounters | None = None
        self.events_total = 0
        self.errors_total = 0
        self._pending: list[dict[str, Any]] = []
        self._direct = True  # no writer task running: write synchronously
        self._wakeup: trio.Event | None = None
        self._room: trio.Event | None = None
        self._last_error_log = 0.0
        self._unlogged_errors = 0

    def open(self) -> None:
        """Open the file now (at start-up: an unusable path stops the server)."""
        self.target.open()

    def emit(self, event: dict[str, Any]) -> None:
        self.events_total += 1
        if self.counters is not None:
            self.counters.audit_event()
        if self._direct:
            self._write_batch([event])
            return
        self._pending.append(event)
        if self._wakeup is not None:
            self._wakeup.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def wait_room(self) -> None:
        """Block while `max_pending` events wait for the writer (a stalled disk)."""
        while not self._direct and len(self._pending) >= self.max_pending:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer: batches to a worker thread every flush_interval; on
        cancellation, writes what is left and falls back to synchronous writes."""
        self._direct = False
        task_status.started()
        next_prune = trio.current_time() + self.prune_interval
        try:
            while True:
                if not self._pending:
                    self._wakeup = trio.Event()
                    with trio.move_on_at(next_prune):
                        await self._wakeup.wait()
                    self._wakeup = None
                if self._pending:
                    if len(self._pending) < self.max_pending // 2:
                        await trio.sleep(self.flush_interval)  # gather a batch
                    await self._flush()
                if trio.current_time() >= next_prune:
                    await trio.to_thread.run_sync(self._prune)
                    next_prune = trio.current_time() + self.prune_interval
        finally:
            with trio.CancelScope(shield=True):
                await self._flush()
            self._direct = True
            self._drain_sync()

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if self._room is not None:
            self._room.set()
            self._room = None
        if batch:
            await trio.to_thread.run_sync(self._write_batch, batch)

    def _drain_sync(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            self._write_batch(batch)
        if self._room is not None:
            self._room.set()
            self._room = None

    def close(self) -> None:
        """Write what is queued and close the file (synchronous)."""
        self._direct = True
        self._drain_sync()
        self.target.close()

    def _prune(self) -> None:
        try:
            self.target.prune()
        except OSError as e:
            log.warning("audit log: pruning backups of %s failed: %s", self.target.path, e)

    def _write_batch(self, batch: list[dict[str, Any]]) -> None:
        lines = []
        for ev in batch:
            try:
                lines.append(encode(ev))
            except (TypeError, ValueError) as e:  # an object that is not JSON: never expected
                self._failed(1, f"cannot encode event {ev.get('auditID')}: {e}")
        try:
            self.target.write_lines(lines)
        except OSError as e:
            self._failed(len(lines), f"writing to {self.target.path}: {e}")

    def _failed(self, n: int, why: str) -> None:
        """Count `n` lost events; log, at most every 10 s (a full disk fails every batch)."""
        self.errors_total += n
        if self.counters is not None:
            self.counters.audit_error(n)
        self._unlogged_errors += n
        now = time.monotonic()
        if now - self._last_error_log >= 10.0:
            log.error("audit log: %d event(s) could not be written: %s", self._unlogged_errors, why)
            self._last_error_log = now
            self._unlogged_errors = 0
