"""`fleet shim`: the per-container supervisor the runtime drivers launch (not for people).

Kept apart from the cyclopts app so a shim starts with nothing but the standard library
and fleet.runtime.shim: the drivers run `python -m fleet.cli.shim` (or `fleet shim` in
the frozen one-file build), one per container.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fleet shim",
                                description="Run one container and record its exit.")
    p.add_argument("--serve", action="store_true",
                   help="run the launcher server: one request per stdin line (the agent's)")
    p.add_argument("--bundle", type=Path, help="the container's directory")
    p.add_argument("--id", help="the container id")
    p.add_argument("--log", type=Path, default=None, help="CRI-format log file")
    p.add_argument("--foreground", action="store_true",
                   help="do not detach (debugging)")
    args = p.parse_args(argv)
    if args.serve:
        from fleet.runtime.shim import serve

        return serve()
    if args.bundle is None or args.id is None:
        p.error("--bundle and --id are required")
    return run_shim(args.bundle, args.id, args.log, foreground=args.foreground)


def run_shim(bundle: Path, container_id: str, log: Path | None = None, *,
             foreground: bool = False) -> int:
    """Launch the shim for the container in `bundle`; the launcher's exit code."""
    from fleet.runtime.shim import run

    return run(bundle, container_id, log, foreground=foreground)


if __name__ == "__main__":
    sys.exit(main())
