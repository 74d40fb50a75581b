"""The writing side of the CRI container log format, as the shim produces it.

Each record is `<RFC3339Nano> <stdout|stderr> <F|P> <text>` on its own line: F a
whole line, P a MAX_LINE piece of a longer one (containerd's 16 KiB default), so a
reader joins P records up to the next F.  `CriLog` appends records to a container
attempt's file (one writer shared by the stdout and stderr pump threads),
`split_lines` cuts a byte buffer into records, `pump_to_log` copies a pipe or pty
into the log until EOF.  Stdlib only, like the shim (`fleet/runtime/shim.py`) that
runs it, one process per container; the reading side is `fleet/agent/logs.py`.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

# Longest log line written whole; longer ones are split into P(artial) records, as
# containerd does (its default max container log line is 16 KiB).
MAX_LINE = 16 * 1024


def cri_timestamp(ns: int) -> str:
    sec, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:09d}Z"


class CriLog:
    """Appends CRI-format records; shared by the stdout and stderr pump threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        self._lock = threading.Lock()

    def write(self, stream: str, tag: str, content: bytes) -> None:
        record = f"{cri_timestamp(time.time_ns())} {stream} {tag} ".encode() + content + b"\n"
        with self._lock:
            os.write(self._fd, record)

    def close(self) -> None:
        os.close(self._fd)


def split_lines(buf: bytearray, *, final: bool) -> list[tuple[str, bytes]]:
    """Take complete records out of `buf`: ("F", line) per newline-terminated line,
    ("P", chunk) for MAX_LINE pieces of an over-long line; at `final`, the rest as F
    (containerd does the same for output that ends without a newline)."""
    out: list[tuple[str, bytes]] = []
    while True:
        nl = buf.find(b"\n")
        if nl == -1 or nl > MAX_LINE:
            if len(buf) > MAX_LINE:
                out.append(("P", bytes(buf[:MAX_LINE])))
                del buf[:MAX_LINE]
                continue
            break
        line = bytes(buf[:nl])
        del buf[:nl + 1]
        if line.endswith(b"\r"):  # ptys write \r\n; the log keeps plain lines
            line = line[:-1]
        out.append(("F", line))
    if final and buf:
        out.append(("F", bytes(buf)))
        buf.clear()
    return out


def pump_to_log(fd: int, log: CriLog, stream: str) -> None:
    buf = bytearray()
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO from a pty master whose slave closed = EOF
                chunk = b""
            if not chunk:
                break
            buf += chunk
            for tag, content in split_lines(buf, final=False):
                log.write(stream, tag, content)
        for tag, content in split_lines(buf, final=True):
            log.write(stream, tag, content)
    finally:
        os.close(fd)
