"""kfleet: the kubectl-like command line for Fleet (also mounted as `fleet ctl`).

A thin synchronous shell over the async `fleet.client`: each command parses
its arguments with cyclopts, opens one `Client` inside `trio.run`, does its
work, and returns an exit code.  Output (tables, yaml/json, describe text)
is formatted by `fleet.cli.printing`; apply logic lives in
`fleet.client.apply` so other tools can reuse it.  Messages follow kubectl's
wording (`deployment.apps/web created`, `Error from server (NotFound): ...`)
because people paste them into searches and scripts grep for them.

Each command group is one module of this package, registered on the shared
`commands` App (`base.py`) when imported here: `get` (get, describe),
`apply` (apply, delete), `streams` (logs, exec, attach), `procsignal` (signal), `images`, `nodes`
(cordon, uncordon, schedulable, drain), `info` (api-resources, version).

Global options (--kubeconfig, --context, -n/--namespace) are accepted both
before the command (`app` is the meta app that takes them) and after it (every
command takes them, flattened from `Globals`), like kubectl.
"""

from __future__ import annotations

import os
import sys

from cyclopts import CycloptsError

from fleet.cli.interrupt import restore_interrupt

# Importing the command modules registers their commands on `commands`.
from fleet.cli.kfleet import apply, get, images, info, nodes, procsignal, streams  # noqa: F401
from fleet.cli.kfleet.base import app, commands

__all__ = ["app", "commands", "main", "run"]


def run(argv: list[str]) -> int:
    """Run kfleet in-process with `argv` (no program name); return the exit code."""
    try:
        result = app(argv, result_action="return_value", exit_on_error=False)
    except CycloptsError:
        return 2  # a usage error; cyclopts has printed it
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(result or 0)


def main() -> None:
    """The `kfleet` console script."""
    restore_interrupt()  # Ctrl-C must end `get -w` even when the parent ignored SIGINT
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # `kfleet get ... | head`: the reader left; exit quietly like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)

