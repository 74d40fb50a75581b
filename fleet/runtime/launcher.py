"""Starting shims: the `fleet shim` command line, its environment, and the warm launcher.

Split from `fleet.runtime.driver` (which re-exports these names): how a shim process
is started is one job, what a driver does with containers is another.  `ShimLauncher`
is the agent's side of `fleet shim --serve` (see `fleet.runtime.shim`, "launcher
server"); `shim_command`/`shim_env` start a shim the classic way when it is not
running.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import trio

log = logging.getLogger(__name__)


def shim_command() -> list[str]:
    """argv prefix that runs `fleet shim` with the least start-up cost.

    Frozen (PyInstaller) builds re-enter the one binary; from source we run the shim
    module directly so a shim does not import the whole CLI (it stays small: one per
    container)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "shim"]
    # -S: no site-packages scan at start-up (the shim needs only the standard library
    # and the fleet package, which PYTHONPATH in `_shim_env` provides): ~20 ms less per
    # container start and a smaller resident shim.
    return [sys.executable, "-S", "-m", "fleet.cli.shim"]


def shim_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if not getattr(sys, "frozen", False):
        # Make the fleet package importable wherever it is (editable checkout or not).
        root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                            if p)
    return env


class ShimLauncher:
    """The agent's side of `fleet shim --serve` (see `fleet.runtime.shim`, "launcher
    server"): starting a shim by fork from a warm interpreter instead of a fresh one.

    `run()` is a service: it starts the server, reads its reports and hands each to the
    `launch()` call waiting for it, and stops the server when cancelled.  While it is
    not running (a driver used on its own, or the server died) `launch()` returns None
    and the driver starts `fleet shim` the classic way, so nothing depends on it."""

    def __init__(self) -> None:
        self._stdin: trio.abc.SendStream | None = None
        self._waiting: dict[int, trio.MemorySendChannel[bytes | None]] = {}
        self._next = 0
        self._send_lock = trio.Lock()
        self.pid: int | None = None  # the server's, while it runs
        self.launched = 0  # shims started through the server (tests and metrics read it)

    @property
    def running(self) -> bool:
        return self._stdin is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        proc = await trio.lowlevel.open_process(
            [*shim_command(), "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=shim_env(), start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin = proc.stdin
        self.pid = proc.pid
        try:
            task_status.started()
            buf = b""
            while chunk := await proc.stdout.receive_some(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    rid, _, report = line.partition(b" ")
                    try:
                        waiter = self._waiting.pop(int(rid))
                    except (ValueError, KeyError):
                        continue  # an answer nobody waits for any more (cancelled start)
                    waiter.send_nowait(report)
            log.warning("shim launcher server exited (%s); starting shims directly",
                        proc.returncode)
        finally:
            self._stdin = None
            self.pid = None
            for waiter in self._waiting.values():
                waiter.send_nowait(None)
            self._waiting.clear()
            with trio.CancelScope(shield=True):
                with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                    await proc.stdin.aclose()  # the server's cue to exit
                with trio.move_on_after(5):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    async def launch(self, bundle: Path, cid: str, log_path: Path) -> bytes | None:
        """The shim's ready report, or None when the server is not available."""
        stdin = self._stdin
        if stdin is None:
            return None
        self._next += 1
        rid = self._next
        send, recv = trio.open_memory_channel[bytes | None](1)
        req = json.dumps({"req": rid, "bundle": str(bundle), "id": cid,
                          "log": str(log_path)}).encode() + b"\n"
        self._waiting[rid] = send
        try:
            async with self._send_lock:
                await stdin.send_all(req)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._waiting.pop(rid, None)
            return None  # never sent: the caller may start the shim directly
        try:
            report = await recv.receive()
        finally:
            self._waiting.pop(rid, None)
        if report is None:
            # Sent, but the server died before answering: a shim may or may not have
            # started, so this start fails (and is cleaned up) rather than retried here.
            from fleet.runtime.driver import RuntimeDriverError  # driver imports this module

            raise RuntimeDriverError("the shim launcher server exited during a start")
        self.launched += 1
        return report


__all__ = ["ShimLauncher", "shim_command", "shim_env"]
