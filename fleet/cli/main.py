"""`fleet`: every role of Fleet by subcommand (server now; agent in a later issue).

`fleet ctl ...` is the same CLI as `kfleet`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import cyclopts
import trio

from fleet import __version__

app = cyclopts.App(name="fleet", help="Fleet: a Kubernetes-class orchestrator in one program.",
                   version=__version__)


@app.command
def server(
    *,
    data_dir: Annotated[Path | None, cyclopts.Parameter(help="State directory (default /var/lib/fleet as root, "
                                                             "else ~/.local/share/fleet).")] = None,
    port: Annotated[int, cyclopts.Parameter(help="API port.")] = 9300,
    metrics_port: Annotated[int, cyclopts.Parameter(help="Prometheus metrics port.")] = 9302,
    address: Annotated[str, cyclopts.Parameter(help="Address to listen on.")] = "127.0.0.1",
    retention: Annotated[int, cyclopts.Parameter(help="Revisions of history kept for watches.")] = 10000,
    log_level: str = "INFO",
) -> None:
    """Run the control plane: API server, store, metrics."""
    from fleet.server.run import ServerConfig, ServerInfo, default_data_dir, run
    from fleet.store import StoreCorrupt

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = ServerConfig(data_dir=data_dir or default_data_dir(), port=port, metrics_port=metrics_port,
                       address=address, retention=retention)

    async def main() -> None:
        async with trio.open_nursery() as n:
            info: ServerInfo = await n.start(lambda task_status: run(cfg, task_status=task_status,
                                                                     handle_signals=True))
            print(f"Fleet API server listening on {info.url}", flush=True)
            print(f"Metrics on {info.metrics_url}", flush=True)
            print(f"Wrote kubeconfig to {info.kubeconfig}", flush=True)
            print(f"Use it: export KUBECONFIG={info.kubeconfig}", flush=True)

    try:
        trio.run(main)
    except* (StoreCorrupt, OSError) as group:
        # Start-up failures (a foreign or damaged database, a port in use) end the
        # process with one clear line instead of a traceback.
        for e in _leaves(group):
            print(f"fleet server: error: {e}", file=sys.stderr)
        sys.exit(1)
    except* KeyboardInterrupt:
        pass


@app.command(show=False)
def shim(*, bundle: Path, id: str, log: Path | None = None, foreground: bool = False) -> None:
    """Run one container under its shim (launched by the runtime drivers, not by people)."""
    from fleet.cli.shim import run_shim

    sys.exit(run_shim(bundle, id, log, foreground=foreground))


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in _leaves(e)]
    return [group]


def main() -> None:
    from fleet.cli.kfleet import app as kfleet_app

    app.command(kfleet_app, name="ctl")
    app()


if __name__ == "__main__":
    main()
