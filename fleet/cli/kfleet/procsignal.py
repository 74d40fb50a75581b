"""kfleet signal: send a signal to a container's main process through Fleet's
`pods/{name}/signal` (fleet/server/processcontrol.py) — the audited replacement for
`ssh node kill -HUP pid`.  Needs RBAC's `signal` verb on pods/signal and, where the
server's consent gate is on, a ProcessControl allowing it.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from cyclopts import Parameter

from fleet.api.kinds.processcontrol import API_VERSION, SIGNAL_KIND, parse_signal, signal_name
from fleet.cli.kfleet.base import Globals, Session, _err, _out, _run, commands
from fleet.cli.kfleet.streams import _default_container, _pod_name
from fleet.client.rest import Client


@commands.command
def signal(
    pod: str,
    sig: Annotated[str, Parameter(name="SIGNAL", help="SIGHUP, HUP, hup or a number.")],
    *,
    container: Annotated[str | None, Parameter(name=["--container", "-c"])] = None,
    g: Globals | None = None,
) -> int:
    """Send a signal to a container's main process: kfleet signal POD [-c CONTAINER] SIGNAL."""
    name = _pod_name(pod)
    if name is None:
        _err(f"error: signals are only sent to pods (got {pod!r})")
        return 1
    num = parse_signal(sig)
    if num is None:
        _err(f"error: unknown signal {sig!r}; use a name such as SIGHUP or SIGTERM")
        return 1

    async def run(client: Client, session: Session) -> int:
        chosen = container or await _default_container(client, session.namespace, name)
        body = {"apiVersion": API_VERSION, "kind": SIGNAL_KIND, "signal": signal_name(num)}
        if chosen:
            body["container"] = chosen
        path = f"/api/v1/namespaces/{quote(session.namespace, safe='')}/pods/{quote(name, safe='')}/signal"
        await client.request("POST", path, json=body)
        _out(f"pod/{name} signalled ({signal_name(num)}{f', container {chosen}' if chosen else ''})")
        return 0

    return _run(g, run)
