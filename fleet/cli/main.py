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
    cluster_cidr: Annotated[str, cyclopts.Parameter(help="Pod address range; each node gets a /24.")] = "10.42.0.0/16",
    no_agent: Annotated[bool, cyclopts.Parameter(help="Do not run the built-in node agent.", negative=())] = False,
    agent_port: Annotated[int, cyclopts.Parameter(help="Port of the built-in agent's API.")] = 9301,
    agent_driver: Annotated[str, cyclopts.Parameter(help="Runtime driver of the built-in agent: auto, oci or process.")] = "auto",
    agent_network: Annotated[str | None, cyclopts.Parameter(
        help="Pod network of the built-in agent: bridge or none (default: bridge as root, else none).")] = None,
    agent_bridge: Annotated[str | None, cyclopts.Parameter(help="Bridge name of the built-in agent (default fleet0).")] = None,
    log_level: str = "INFO",
) -> None:
    """Run the control plane: API server, store, scheduler, controllers, metrics, and a node agent."""
    from fleet.server.run import ServerConfig, ServerInfo, default_data_dir, run
    from fleet.store import StoreCorrupt

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = ServerConfig(data_dir=data_dir or default_data_dir(), port=port, metrics_port=metrics_port,
                       address=address, retention=retention, cluster_cidr=cluster_cidr,
                       agent=not no_agent, agent_port=agent_port, agent_driver=agent_driver,
                       agent_bridge=agent_bridge)
    if agent_network is not None:
        cfg.agent_network = None if agent_network in ("none", "host", "") else agent_network
    logging.getLogger("httpx").setLevel(logging.WARNING)

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


@app.command
def agent(
    *,
    server: Annotated[str | None, cyclopts.Parameter(help="API server URL.")] = None,
    token: Annotated[str | None, cyclopts.Parameter(help="Bearer token.")] = None,
    ca_file: Annotated[str | None, cyclopts.Parameter(help="CA bundle to trust the server with.")] = None,
    kubeconfig: Annotated[str | None, cyclopts.Parameter(help="Read server, token and CA from here.")] = None,
    insecure: bool = False,
    data_dir: Annotated[Path, cyclopts.Parameter(help="Agent state directory.")] = Path("/var/lib/fleet-agent"),
    node_name: Annotated[str | None, cyclopts.Parameter(help="Node name (default: host name).")] = None,
    port: Annotated[int, cyclopts.Parameter(help="Agent API port.")] = 9301,
    address: Annotated[str, cyclopts.Parameter(help="Node address (default: first non-loopback IPv4).")] = "",
    driver: Annotated[str, cyclopts.Parameter(help="Runtime driver: auto, oci or process.")] = "auto",
    network: Annotated[str, cyclopts.Parameter(help="Pod network driver: bridge, or none.")] = "bridge",
    pod_cidr: Annotated[str | None, cyclopts.Parameter(help="This node's pod CIDR if the server assigns none.")] = None,
    bridge_name: str | None = None,
    insecure_registry: Annotated[list[str] | None, cyclopts.Parameter(help="Registry reachable over plain HTTP.")] = None,
    log_level: str = "INFO",
) -> None:
    """Run a node agent: register the node and run the pods bound to it."""
    from fleet.agent.config import AgentConfig
    from fleet.agent.run import run

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per API request (heartbeats, status patches) drowns what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = AgentConfig(server_url=server or "", token=token, ca_file=ca_file, kubeconfig=kubeconfig,
                      insecure=insecure, data_dir=data_dir, port=port, address=address, driver=driver,
                      network_driver=None if network in ("none", "host", "") else network,
                      pod_cidr=pod_cidr, bridge_name=bridge_name,
                      insecure_registries=list(insecure_registry or []))
    if node_name:
        cfg.node_name = node_name
    try:
        trio.run(run, cfg)
    except* KeyboardInterrupt:
        pass


@app.command(show=False)
def shim(*, bundle: Path | None = None, id: str | None = None, log: Path | None = None,
         foreground: bool = False, serve: bool = False) -> None:
    """Run one container under its shim, or (--serve) the agent's shim launcher server.

    Launched by the runtime drivers, not by people."""
    if serve:
        from fleet.runtime.shim import serve as serve_launcher

        sys.exit(serve_launcher())
    if bundle is None or id is None:
        sys.exit("fleet shim: --bundle and --id are required")
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
