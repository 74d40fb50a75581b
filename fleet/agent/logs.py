"""Reading container logs the way the kubelet serves them: parse, tail, filter, follow.

The shim (`fleet.runtime.shim`) writes each container attempt's output to its own file
in the CRI format, one record per line::

    2026-11-29T16:00:00.123456789Z stdout F a whole line
    2026-11-29T16:00:00.223456789Z stderr P the first 16 KiB of a very long li
    2026-11-29T16:00:00.223456790Z stderr F ne, ended here

This module turns such a file into what `kubectl logs` prints: the message parts, a
partial (P) record joined with the records that follow it up to the closing F, each
line optionally prefixed by its timestamp in Go's RFC3339Nano form (trailing zeros of
the fraction dropped, as the kubelet formats it).  It owns the query options
(`tailLines`, `sinceSeconds`/`sinceTime`, `timestamps`, `limitBytes`, `follow`) and
nothing about HTTP, so the agent API and tests drive it directly.

Semantics follow the kubelet (`pkg/kubelet/kuberuntime/logs`):

* tail counts whole lines from the end — a P..P F group is one line — and finds its
  start by reading the file backwards in blocks, so tailing a big log reads only its
  end;
* since drops lines older than the given instant, judged by a line's first record;
* limitBytes caps everything written, timestamp prefixes included, cutting mid-line;
* follow polls the file (a short `trio.sleep`; no inotify dependency, and the same
  code works for every driver) until the container has exited *and* a read after that
  found nothing new — the shim may flush its last lines just after the exit — or the
  caller stops iterating (the client went away).  A file replaced under the same name
  (another inode) or truncated is re-read from its start, as for a rotated log.

Blocking file I/O runs in worker threads; the pure parts (`parse_record`,
`LineFormatter`, `tail_offset`) are synchronous and tested on their own.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import trio

STDOUT = "stdout"
STDERR = "stderr"
# Reading backwards for tail, and forwards while streaming, in blocks of this size.
BLOCK = 64 * 1024
# How often follow looks at the file again when it has nothing new.
POLL_INTERVAL = 0.1

_TS_RE = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"
    r"(Z|z|[+-]\d\d:\d\d)$")


# ---------------------------------------------------------------------------------------
# Timestamps


def parse_timestamp(text: str) -> int:
    """An RFC 3339 timestamp (with up to nanosecond fraction, any offset) as Unix ns.

    Integers in nanoseconds, because Python's datetime stops at microseconds and the
    CRI timestamps carry nine digits that `--timestamps` must reproduce exactly."""
    m = _TS_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, sec = (int(g) for g in m.groups()[:6])
    frac = (m.group(7) or "").ljust(9, "0")
    secs = calendar.timegm((year, month, day, hour, minute, sec, 0, 0, 0))
    zone = m.group(8)
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        secs -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return secs * 1_000_000_000 + int(frac)


def format_timestamp(ns: int) -> str:
    """Unix ns as Go's time.RFC3339Nano in UTC: fraction without trailing zeros, no
    fraction at all when it is zero (what the kubelet prints for `timestamps=true`)."""
    sec, frac = divmod(ns, 1_000_000_000)
    y, mo, d, h, mi, s = time.gmtime(sec)[:6]
    out = f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}"
    if frac:
        out += "." + f"{frac:09d}".rstrip("0")
    return out + "Z"


# ---------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class CriRecord:
    """One line of a CRI log file."""

    timestamp_ns: int
    stream: str  # "stdout" | "stderr"
    partial: bool  # P: the line continues in the next record
    content: bytes


def parse_record(line: bytes) -> CriRecord | None:
    """One CRI record (without its trailing newline); None if it is malformed — the
    kubelet skips such lines rather than failing the whole request."""
    parts = line.split(b" ", 3)
    if len(parts) < 3:
        return None
    ts, stream, tag = parts[0], parts[1], parts[2]
    content = parts[3] if len(parts) == 4 else b""
    if stream not in (b"stdout", b"stderr") or tag not in (b"F", b"P"):
        return None
    try:
        ns = parse_timestamp(ts.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    return CriRecord(ns, stream.decode(), tag == b"P", content)


@dataclass(frozen=True)
class LogOptions:
    """The `containerLogs` query, in the units this module works in."""

    follow: bool = False
    # Whole lines from the end; None = all.  0 = none (with follow: only new lines).
    tail_lines: int | None = None
    # Drop lines whose first record is older than this (Unix ns).
    since_ns: int | None = None
    timestamps: bool = False
    # Stop after this many bytes of output; None = no limit.
    limit_bytes: int | None = None


class LineFormatter:
    """Turns records into output bytes: joins partial records, adds timestamp prefixes,
    applies `since`.  One instance per output stream: it remembers whether the next
    record starts a line."""

    def __init__(self, opts: LogOptions) -> None:
        self.opts = opts
        self._at_line_start = True
        self._skipping = False

    def format(self, rec: CriRecord) -> bytes:
        starts_line = self._at_line_start
        if starts_line:
            # A line is in or out as a whole, judged by its first record's time.
            since = self.opts.since_ns
            self._skipping = since is not None and rec.timestamp_ns < since
        self._at_line_start = not rec.partial
        if self._skipping:
            return b""
        out = rec.content if rec.partial else rec.content + b"\n"
        if self.opts.timestamps and starts_line:
            out = format_timestamp(rec.timestamp_ns).encode() + b" " + out
        return out


class ByteLimit:
    """What is left of `limitBytes`; `take` cuts output to fit."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit

    @property
    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0

    def take(self, data: bytes) -> bytes:
        if self.left is None:
            return data
        data = data[: self.left]
        self.left -= len(data)
        return data


# ---------------------------------------------------------------------------------------
# Tail


def _records_backward(f: BinaryIO, end: int, block: int) -> Iterator[tuple[int, bytes]]:
    """(start offset, bytes) of each newline-separated record of f[0:end], last first."""
    if end > 0:
        f.seek(end - 1)
        if f.read(1) == b"\n":
            end -= 1  # the final newline terminates the last record, it opens none
    pos = end
    buf = b""  # f[pos:end]
    while True:
        nl = buf.rfind(b"\n")
        if nl >= 0:
            yield pos + nl + 1, buf[nl + 1:]
            buf = buf[:nl]
            continue
        if pos == 0:
            if end > 0:
                yield 0, buf
            return
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        buf = f.read(step) + buf


def tail_offset(f: BinaryIO, lines: int, *, block: int = BLOCK) -> int:
    """The offset where the last `lines` whole lines of a CRI log start.

    Reads backwards from the end in `block`-sized pieces and stops as soon as it has
    seen one complete (F) record more than asked for: a P..P F group is one line, so
    the answer is just past the F record that ends the line before them."""
    size = f.seek(0, os.SEEK_END)
    if lines <= 0:
        return size
    seen = 0
    for start, rec in _records_backward(f, size, block):
        parsed = parse_record(rec)
        if parsed is None or parsed.partial:
            continue
        seen += 1
        if seen > lines:
            return start + len(rec) + 1
    return 0


# ---------------------------------------------------------------------------------------
# Reading and following


IsRunning = Callable[[], Awaitable[bool]]


def log_size(path: Path) -> int:
    """The log's current size (0 if not created yet): an offset for `follow_records`."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class _File:
    """The log file as followed: reopens it when it was replaced or truncated."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f: BinaryIO | None = None
        self.ino: int | None = None
        self.pos = 0

    def open(self, tail: int | None, at_end: bool, offset: int | None = None) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except FileNotFoundError:
            return False
        self.f = f
        self.ino = os.fstat(f.fileno()).st_ino
        if offset is not None:
            self.pos = min(offset, f.seek(0, os.SEEK_END))
        elif at_end:
            self.pos = f.seek(0, os.SEEK_END)
        elif tail is not None and tail >= 0:
            self.pos = tail_offset(f, tail)
        else:
            self.pos = 0
        f.seek(self.pos)
        return True

    def read(self) -> bytes:
        assert self.f is not None
        data = self.f.read(BLOCK)
        self.pos += len(data)
        return data

    def replaced(self) -> bool:
        """True if the name now points at another file, or ours shrank (truncation)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return st.st_ino != self.ino or st.st_size < self.pos

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


async def follow_records(path: Path, *, tail_lines: int | None = None, from_end: bool = False,
                         from_offset: int | None = None,
                         follow: bool = False, is_running: IsRunning | None = None,
                         poll_interval: float = POLL_INTERVAL) -> AsyncIterator[CriRecord]:
    """The records of a CRI log, then (with `follow`) the new ones as they are written.

    `from_end` starts at the end as it is when iteration begins; `from_offset` at a
    byte offset taken earlier (attach: everything written since the client connected,
    even before the output pump got going — see `log_size`).
    Following ends once `is_running()` says the container is gone and one more read
    found nothing; without `is_running` it ends only when the caller stops iterating.
    A record is yielded only once its newline is on disk — the shim writes each record
    with one append, so a missing newline means "not finished yet"."""
    lf = _File(path)
    opened = await trio.to_thread.run_sync(lf.open, tail_lines, from_end, from_offset)
    pending = b""
    exited = False
    try:
        while True:
            if not opened and follow:
                # Not created yet (the container is starting): wait for it, unless the
                # container is already gone.
                if is_running is not None and not await is_running():
                    # It may have written its log and exited between our last look
                    # and that answer: one more look before giving up.
                    opened = await trio.to_thread.run_sync(lf.open, tail_lines, from_end, from_offset)
                    if not opened:
                        return
                    continue
                await trio.sleep(poll_interval)
                opened = await trio.to_thread.run_sync(lf.open, tail_lines, from_end, from_offset)
                continue
            if not opened:
                return
            data = await trio.to_thread.run_sync(lf.read)
            if data:
                pending += data
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    rec = parse_record(line)
                    if rec is not None:
                        yield rec
                continue
            if not follow:
                if pending:
                    # An unterminated last record of a finished read: show it if whole.
                    rec = parse_record(pending)
                    if rec is not None:
                        yield rec
                return
            if await trio.to_thread.run_sync(lf.replaced):
                # Rotated or truncated: what is left in the old file was read; start
                # over at the beginning of the new one.
                lf.close()
                pending = b""
                opened = await trio.to_thread.run_sync(lf.open, None, False)
                continue
            if exited:
                return
            if is_running is not None and not await is_running():
                # One more read after the exit catches lines the shim flushed late.
                exited = True
                continue
            await trio.sleep(poll_interval)
    finally:
        lf.close()


async def stream_log(path: Path, opts: LogOptions, *, is_running: IsRunning | None = None,
                     poll_interval: float = POLL_INTERVAL) -> AsyncIterator[bytes]:
    """`kubectl logs` output for one log file, in chunks, honouring every option."""
    fmt = LineFormatter(opts)
    limit = ByteLimit(opts.limit_bytes)
    if limit.exhausted:
        return
    async for rec in follow_records(path, tail_lines=opts.tail_lines, follow=opts.follow,
                                    is_running=is_running, poll_interval=poll_interval):
        out = limit.take(fmt.format(rec))
        if out:
            yield out
        if limit.exhausted:
            return


def read_log(path: Path, opts: LogOptions) -> bytes:
    """The whole (non-follow) answer at once; synchronous, for callers in threads."""
    fmt = LineFormatter(opts)
    limit = ByteLimit(opts.limit_bytes)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return b""
    with f:
        start = tail_offset(f, opts.tail_lines) if opts.tail_lines is not None and \
            opts.tail_lines >= 0 else 0
        f.seek(start)
        out = []
        for line in f.read().split(b"\n"):
            rec = parse_record(line)
            if rec is None:
                continue
            piece = limit.take(fmt.format(rec))
            out.append(piece)
            if limit.exhausted:
                break
    return b"".join(out)
