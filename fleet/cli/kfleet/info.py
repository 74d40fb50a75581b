"""kfleet api-resources and version: what the server serves and which versions
client and server run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import httpx
from cyclopts import Parameter

import fleet
from fleet.cli import printing
from fleet.cli.kfleet.base import Globals, Session, _out, _run, commands
from fleet.client.rest import ApiException, Client

# -- api-resources, version -----------------------------------------------------------


@commands.command(name="api-resources")
def api_resources(
    *,
    output: Annotated[Literal["wide", "name"] | None, Parameter(name=["--output", "-o"])] = None,
    namespaced: bool | None = None,
    api_group: str | None = None,
    verbs: Annotated[list[str] | None, Parameter(name="--verbs")] = None,
    g: Globals | None = None,
) -> int:
    """List the resource types the server serves."""

    async def run(client: Client, session: Session) -> int:
        resources = [r for r in await client.discover() if r.preferred]
        if namespaced is not None:
            resources = [r for r in resources if r.namespaced == namespaced]
        if api_group is not None:
            resources = [r for r in resources if r.group == api_group]
        if verbs:
            resources = [r for r in resources if all(v in r.verbs for v in verbs)]
        group_order: dict[str, int] = {}
        for r in resources:
            group_order.setdefault(r.group, len(group_order))
        resources.sort(key=lambda r: (group_order[r.group], r.name))
        if output == "name":
            for r in resources:
                _out(r.group_resource)
        else:
            _out(printing.api_resources_table(resources, wide=output == "wide"))
        return 0

    return _run(g, run)


@commands.command
def version(
    *,
    client_only: Annotated[bool, Parameter(name="--client", negative="")] = False,
    output: Annotated[Literal["yaml", "json"] | None, Parameter(name=["--output", "-o"])] = None,
    g: Globals | None = None,
) -> int:
    """Print the client and server versions."""
    client_version = {"gitVersion": f"v{fleet.__version__}", "major": "", "minor": ""}
    major, _, rest = fleet.__version__.partition(".")
    client_version.update(major=major, minor=rest.partition(".")[0])

    def show(server: dict[str, Any] | None) -> None:
        if output:
            doc: dict[str, Any] = {"clientVersion": client_version}
            if server is not None:
                doc["serverVersion"] = server
            _out(printing.to_json(doc) if output == "json" else printing.to_yaml(doc).rstrip())
            return
        _out(f"Client Version: {client_version['gitVersion']}")
        if server is not None:
            _out(f"Server Version: {server.get('gitVersion', '<unknown>')}")

    if client_only:
        show(None)
        return 0

    async def run(client: Client, session: Session) -> int:
        try:
            server = await client.version()
        except (ApiException, httpx.TransportError):
            show(None)
            raise
        show(server)
        return 0

    return _run(g, run)
