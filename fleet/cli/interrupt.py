"""Ctrl-C for the command-line entry points, whatever the parent process did.

A process inherits its parent's signal dispositions and signal mask through
fork and exec.  A non-interactive shell runs a background command (`cmd &`,
CI runners and supervisors launched that way) with SIGINT set to SIG_IGN,
and CPython installs its KeyboardInterrupt handler only when SIGINT starts
out at SIG_DFL; Trio, in turn, turns SIGINT into KeyboardInterrupt only
when that Python handler is in place.  So a `kfleet get -w` started below
such a parent silently ignored SIGINT and never ended.  A parent that
blocked SIGINT in its signal mask leaves the same trap.

The CLI entry points (`kfleet`, `fleet`) call `restore_interrupt()` first,
so SIGINT ends every Fleet command the same way, as `fleet server` already
did (`trio.open_signal_receiver` installs its handler over an inherited
SIG_IGN): tests, supervisors and users stop these tools with SIGINT, and a
watch or agent that silently outlives it is worse than the old shell rule's
protection of background jobs from the terminal's Ctrl-C (`setsid` gives
that protection without disabling the signal).  kubectl 1.32's `get -w`
keeps an inherited SIG_IGN; this is a deliberate difference.
In-process callers (`fleet.cli.kfleet.run`, tests) do not call it: changing
signal dispositions is the entry point's decision, not the library's.
"""

from __future__ import annotations

import signal


def restore_interrupt() -> None:
    """Make SIGINT raise KeyboardInterrupt even if the parent ignored or blocked it.

    Call from the main thread, before starting any thread, at program start."""
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
