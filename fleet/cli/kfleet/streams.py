"""kfleet logs, exec and attach: the pod's container picked like kubectl does,
log streams followed, and remote commands with stdin, a raw terminal and its
window-size changes wired to `fleet.client.streams`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any

import trio
from cyclopts import Parameter

from fleet.cli.kfleet.base import Globals, Session, _err, _run, commands
from fleet.client.rest import Client
from fleet.client.streams import (
    STDIN_CHUNK,
    ExecOptions,
    LogOptions,
    open_log_stream,
    parse_duration,
    run_remote_command,
)

# -- logs, exec ---------------------------------------------------------------------


def _pod_name(arg: str) -> str | None:
    """`p`, `pod/p` or `pods/p` → `p` (None for another type)."""
    typ, sep, name = arg.partition("/")
    if not sep:
        return arg
    return name if typ in ("pod", "pods", "po") and name else None


async def _default_container(client: Client, namespace: str, pod: str) -> str | None:
    """kubectl's choice when -c is not given: the default-container annotation, else the first.

    Reading the pod first also turns a missing pod into the plain NotFound error.
    """
    obj = await client.get_object("v1", "pods", pod, namespace)
    names = [c.get("name") for c in (obj.get("spec") or {}).get("containers") or []]
    if len(names) <= 1:
        return None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    chosen = annotations.get("kubectl.kubernetes.io/default-container")
    if chosen not in names:
        chosen = names[0]
        _err(f'Defaulted container "{chosen}" out of: {", ".join(str(n) for n in names)}')
    return chosen


@commands.command
def logs(
    pod: str,
    *,
    container: Annotated[str | None, Parameter(name=["--container", "-c"])] = None,
    follow: Annotated[bool, Parameter(name=["--follow", "-f"], negative="")] = False,
    tail: Annotated[int, Parameter(help="Lines of recent log to show; -1 for all.")] = -1,
    since: Annotated[str | None, Parameter(help="Only logs newer than a duration, e.g. 10s, 5m.")] = None,
    since_time: Annotated[str | None, Parameter(help="Only logs after an RFC3339 time.")] = None,
    timestamps: Annotated[bool, Parameter(negative="")] = False,
    previous: Annotated[bool, Parameter(name=["--previous", "-p"], negative="")] = False,
    limit_bytes: int | None = None,
    g: Globals | None = None,
) -> int:
    """Print the logs of a container in a pod (-f to follow)."""
    name = _pod_name(pod)
    if name is None:
        _err(f"error: logs are only served for pods (got {pod!r})")
        return 1
    since_seconds = None
    if since is not None:
        if since_time:
            _err("error: at most one of `sinceTime` or `sinceSeconds` may be specified")
            return 1
        try:
            # The API takes whole seconds; round up so nothing asked for is cut off.
            since_seconds = max(1, math.ceil(parse_duration(since)))
        except ValueError as exc:
            _err(f"error: {exc}")
            return 1

    async def run(client: Client, session: Session) -> int:
        chosen = container or await _default_container(client, session.namespace, name)
        opts = LogOptions(container=chosen, follow=follow, tail_lines=tail if tail >= 0 else None,
                          since_seconds=since_seconds, since_time=since_time,
                          timestamps=timestamps, previous=previous, limit_bytes=limit_bytes)
        out = sys.stdout.buffer
        async with open_log_stream(session.config, session.namespace, name, opts) as chunks:
            async for chunk in chunks:
                out.write(chunk)
                out.flush()
        return 0

    return _run(g, run)


async def _read_stdin() -> bytes:
    # A worker thread: putting fd 0 in non-blocking mode for Trio would also
    # change the terminal's stdout, which shares the open file description.
    return await trio.to_thread.run_sync(os.read, sys.stdin.fileno(), STDIN_CHUNK,
                                         abandon_on_cancel=True)


def _terminal_size() -> tuple[int, int] | None:
    """(columns, rows) of the terminal on stdout, else on stdin; None without one."""
    for stream in (sys.stdout, sys.stdin):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError):
            continue
        if size.columns > 0 and size.lines > 0:
            return size.columns, size.lines
    return None


async def _terminal_sizes() -> AsyncIterator[tuple[int, int]]:
    """The terminal size now, then again after every SIGWINCH."""
    with trio.open_signal_receiver(signal.SIGWINCH) as winch:
        size = _terminal_size()
        if size:
            yield size
        async for _ in winch:
            new = _terminal_size()
            if new and new != size:
                size = new
                yield size


@contextlib.contextmanager
def _raw_terminal(enabled: bool) -> Iterator[None]:
    """The local terminal in raw mode (keys go to the remote tty as typed), restored after."""
    if not enabled:
        yield
        return
    import termios
    import tty as ttymod

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        ttymod.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _write(stream: Any) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def _remote_command(subresource: str, pod: str, command: tuple[str, ...], container: str | None,
                    stdin: bool, tty: bool, g: Globals | None) -> int:
    name = _pod_name(pod)
    if name is None:
        _err(f"error: {subresource} works on pods only (got {pod!r})")
        return 1
    if subresource == "exec" and not command:
        _err("error: you must specify at least one command for the container")
        return 1
    # As kubectl: a tty only makes sense for a terminal on stdin, which then
    # goes raw; -t alone (no -i) is ignored.
    raw = tty and stdin and sys.stdin.isatty()
    if tty and stdin and not raw:
        _err("Unable to use a TTY - input is not a terminal or the right kind of file")

    async def run(client: Client, session: Session) -> int:
        chosen = container or await _default_container(client, session.namespace, name)
        opts = ExecOptions(command=command, container=chosen, stdin=stdin, tty=raw)
        with _raw_terminal(raw):
            result = await run_remote_command(
                session.config, session.namespace, name, subresource, opts,
                read_stdin=_read_stdin if stdin else None,
                write_stdout=_write(sys.stdout.buffer), write_stderr=_write(sys.stderr.buffer),
                sizes=_terminal_sizes() if opts.tty else None)
        if result.exit_code != 0 and result.message:
            _err(result.message)
        return result.exit_code

    return _run(g, run)


@commands.command(name="exec")
def exec_(
    pod: str,
    *command: str,
    container: Annotated[str | None, Parameter(name=["--container", "-c"])] = None,
    stdin: Annotated[bool, Parameter(name=["--stdin", "-i"], negative="")] = False,
    tty: Annotated[bool, Parameter(name=["--tty", "-t"], negative="")] = False,
    g: Globals | None = None,
) -> int:
    """Run a command in a container: kfleet exec POD [-c C] [-i] [-t] -- CMD [ARG...]."""
    return _remote_command("exec", pod, command, container, stdin, tty, g)


@commands.command
def attach(
    pod: str,
    *,
    container: Annotated[str | None, Parameter(name=["--container", "-c"])] = None,
    stdin: Annotated[bool, Parameter(name=["--stdin", "-i"], negative="")] = False,
    tty: Annotated[bool, Parameter(name=["--tty", "-t"], negative="")] = False,
    g: Globals | None = None,
) -> int:
    """Attach to the main process of a running container."""
    return _remote_command("attach", pod, (), container, stdin, tty, g)
