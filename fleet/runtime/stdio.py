"""Running a helper process wired to exec-style stdio: `run_with_stdio`.

Split from `fleet.runtime.driver` (which re-exports these names): both drivers' `exec`
(`runc exec`, or a process in the container's namespaces) feed a source into the
process's stdin and drain its stdout/stderr into sinks — or, with a tty, one pty
master both ways with window resizes — and kill it if the caller goes away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import termios
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence

import trio

# exec stdio: a source is bytes, a trio ReceiveStream or an async iterable of chunks; a
# sink is a trio SendStream or an async callback.  That is enough to wire a WebSocket.
InputSource = bytes | trio.abc.ReceiveStream | AsyncIterable[bytes]
OutputSink = trio.abc.SendStream | Callable[[bytes], Awaitable[None]]


async def _feed(src: InputSource, dst: trio.abc.SendStream) -> None:
    try:
        if isinstance(src, bytes):
            if src:
                await dst.send_all(src)
        elif isinstance(src, trio.abc.ReceiveStream):
            while chunk := await src.receive_some(65536):
                await dst.send_all(chunk)
        else:
            async for chunk in src:
                if chunk:
                    await dst.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the process closed its stdin or exited: nothing more to deliver
    finally:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await dst.aclose()


async def _drain(src: trio.abc.ReceiveStream, sink: OutputSink | None) -> None:
    while True:
        try:
            chunk = await src.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            # A pty master reads EIO once the slave side is closed: that is EOF.
            return
        if not chunk:
            return
        if sink is None:
            continue
        if isinstance(sink, trio.abc.SendStream):
            await sink.send_all(chunk)
        else:
            await sink(chunk)


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    import fcntl
    import struct
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def run_with_stdio(argv: Sequence[str], *, env: Mapping[str, str] | None,
                         cwd: str | None, stdin: InputSource | None,
                         stdout: OutputSink | None, stderr: OutputSink | None, tty: bool,
                         resize: AsyncIterable[tuple[int, int]] | None,
                         new_session: bool = False,
                         on_abandon: Callable[[int], None] | None = None) -> int:
    """Run `argv` with its stdio pumped to/from the given sources and sinks.

    With `tty`, the process gets a fresh pty (stdout and stderr merged, as a terminal
    does); `resize` events set the window size and nudge the process with SIGWINCH
    (runc forwards it to the container's own pty).

    If the caller gives up before the process ends (cancelled: the exec client went
    away), `on_abandon(pid)` runs before `argv` itself is killed: killing `runc exec`
    alone would leave the process it started running inside the container."""
    if not tty:
        proc = await trio.lowlevel.open_process(
            list(argv), env=dict(env) if env is not None else None, cwd=cwd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=new_session)
        try:
            async with trio.open_nursery() as n:
                if stdin is not None:
                    assert proc.stdin is not None
                    n.start_soon(_feed, stdin, proc.stdin)
                assert proc.stdout is not None and proc.stderr is not None
                n.start_soon(_drain, proc.stdout, stdout)
                n.start_soon(_drain, proc.stderr, stderr)
                rc = await proc.wait()
                # Output may still sit in the pipes; the drains end at EOF.  Stdin has
                # nobody left to read it.
                if stdin is not None:
                    n.cancel_scope.deadline = trio.current_time() + 5
        finally:
            _abandon(proc, on_abandon)
            await _reap(proc)
        return _exit_code(proc.returncode if proc.returncode is not None else rc)

    master, slave = os.openpty()
    _set_winsize(master, 80, 24)
    try:
        proc = await trio.lowlevel.open_process(
            list(argv), env=dict(env) if env is not None else None, cwd=cwd,
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    os.close(slave)  # only the child holds it now: its exit makes the master read EIO
    master_stream = trio.lowlevel.FdStream(master)
    try:
        async with trio.open_nursery() as n:
            if stdin is not None:
                n.start_soon(_feed_pty, stdin, master_stream)
            if resize is not None:
                n.start_soon(_apply_resizes, resize, master, proc.pid)
            out_done = trio.Event()

            async def drain_out() -> None:
                await _drain(master_stream, stdout)
                out_done.set()

            n.start_soon(drain_out)
            rc = await proc.wait()
            with trio.move_on_after(5):
                await out_done.wait()
            n.cancel_scope.cancel()
    finally:
        _abandon(proc, on_abandon)
        await _reap(proc)
        with contextlib.suppress(OSError, trio.ClosedResourceError):
            await master_stream.aclose()
    return _exit_code(rc)


async def _feed_pty(src: InputSource, master: trio.lowlevel.FdStream) -> None:
    # Unlike a pipe, a pty has no "close the write side": end of input is ^D (VEOF).
    try:
        if isinstance(src, bytes):
            await master.send_all(src)
        elif isinstance(src, trio.abc.ReceiveStream):
            while chunk := await src.receive_some(65536):
                await master.send_all(chunk)
        else:
            async for chunk in src:
                await master.send_all(chunk)
        await master.send_all(b"\x04")
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


async def _apply_resizes(resize: AsyncIterable[tuple[int, int]], fd: int, pid: int) -> None:
    async for cols, rows in resize:
        with contextlib.suppress(OSError):
            _set_winsize(fd, cols, rows)
            os.kill(pid, signal.SIGWINCH)


def _abandon(proc: trio.Process, on_abandon: Callable[[int], None] | None) -> None:
    if proc.returncode is None and proc.poll() is None and on_abandon is not None:
        with contextlib.suppress(OSError):
            on_abandon(proc.pid)


async def _reap(proc: trio.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


def _exit_code(rc: int) -> int:
    # subprocess reports death by signal N as -N; shells and runc say 128+N.
    return 128 - rc if rc < 0 else rc


__all__ = ["InputSource", "OutputSink", "run_with_stdio"]
