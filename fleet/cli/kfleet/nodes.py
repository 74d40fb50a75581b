"""kfleet node maintenance: cordon, uncordon and schedulable (Fleet's
nodes/{name}/schedulable subresource), and drain / drain-status, which start
and follow the drain the server runs (nodes/{name}/drain).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal
from urllib.parse import quote

import trio
from cyclopts import Parameter

from fleet.cli import printing
from fleet.cli.kfleet.base import Globals, Session, _err, _out, _run, commands
from fleet.client.rest import Client
from fleet.client.streams import parse_duration

# -- node maintenance -------------------------------------------------------------------
# cordon/uncordon/schedulable use Fleet's nodes/{name}/schedulable subresource; drain and
# drain-status its nodes/{name}/drain, which drains in the server (fleet/server/drain.py):
# the drain goes on if kfleet exits, and `drain-status` (or --wait) follows it.

DRAIN_POLL = 1.0


def _node_path(node: str, sub: str) -> str:
    return f"/api/v1/nodes/{quote(node, safe='')}/{sub}"


async def _set_schedulable(client: Client, node: str, schedulable: bool) -> None:
    """Print kubectl's `node/x cordoned` / `already cordoned` / `uncordoned` lines."""
    before = await client.get_object("v1", "nodes", node)
    was = (before.get("spec") or {}).get("unschedulable") is True
    await client.request("POST", _node_path(node, "schedulable"), json={"schedulable": schedulable})
    if schedulable:
        _out(f"node/{node} uncordoned" if was else f"node/{node} already uncordoned")
    else:
        _out(f"node/{node} already cordoned" if was else f"node/{node} cordoned")


@commands.command
def cordon(node: str, *, g: Globals | None = None) -> int:
    """Mark a node unschedulable (new pods are not placed on it)."""

    async def run(client: Client, session: Session) -> int:
        await _set_schedulable(client, node, False)
        return 0

    return _run(g, run)


@commands.command
def uncordon(node: str, *, g: Globals | None = None) -> int:
    """Mark a node schedulable again (also cancels a drain of it that is still running)."""

    async def run(client: Client, session: Session) -> int:
        await _set_schedulable(client, node, True)
        return 0

    return _run(g, run)


@commands.command
def schedulable(node: str, value: Literal["true", "false"], *, g: Globals | None = None) -> int:
    """Set whether new pods may be scheduled on a node: kfleet schedulable NODE true|false."""

    async def run(client: Client, session: Session) -> int:
        await _set_schedulable(client, node, value == "true")
        return 0

    return _run(g, run)


def _drain_lines(doc: dict[str, Any]) -> list[str]:
    """A drain's progress as `Key: value` lines (what drain-status prints)."""
    def joined(key: str) -> str:
        return ", ".join(doc.get(key) or []) or "<none>"

    opts = doc.get("options") or {}
    flags = [f for f, on in (("ignoreDaemonSets", opts.get("ignoreDaemonSets")),
                             ("deleteEmptyDirData", opts.get("deleteEmptyDirData")),
                             ("force", opts.get("force"))) if on]
    grace = opts.get("gracePeriodSeconds")
    if isinstance(grace, int) and grace >= 0:
        flags.append(f"gracePeriodSeconds={grace}")
    if opts.get("timeoutSeconds"):
        flags.append(f"timeoutSeconds={opts['timeoutSeconds']}")
    rows = [("Node", (doc.get("metadata") or {}).get("name", "")), ("Phase", doc.get("phase", "")),
            ("Options", ", ".join(flags) or "<none>"), ("Started", doc.get("startTime") or "<none>"),
            ("Completed", doc.get("completionTime") or "<none>"), ("Evicted", joined("evicted")),
            ("Remaining", joined("remaining")), ("Blocked by budget", joined("blockedByBudget")),
            ("Skipped", joined("skipped"))]
    width = max(len(k) for k, _ in rows) + 2
    out = [f"{k + ':':<{width}}{v}" for k, v in rows]
    for key, title in (("warnings", "Warnings"), ("errors", "Errors")):
        items = doc.get(key) or []
        if items:
            out.append(f"{title}:")
            out.extend(f"  {x}" for x in items)
    return out


async def _follow_drain(client: Client, node: str, timeout: float | None) -> int:
    """Print evictions as they happen (kubectl's `evicting pod ns/p`, `pod/p evicted`)
    until the drain ends; 0 only when it is Complete."""
    shown: set[str] = set()
    done: set[str] = set()
    blocked_seen: set[str] = set()
    with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
        while True:
            doc = await client.get(_node_path(node, "drain"))
            for key in doc.get("evicted") or []:
                if key not in shown:
                    shown.add(key)
                    _out(f"evicting pod {key}")
            for key in doc.get("blockedByBudget") or []:
                if key not in blocked_seen:
                    blocked_seen.add(key)
                    _err(f'error when evicting pods/"{key.partition("/")[2]}" -n "{key.partition("/")[0]}" '
                         "(will retry after 5s): Cannot evict pod as it would violate the pod's "
                         "disruption budget.")
            remaining = set(doc.get("remaining") or [])
            for key in sorted(shown - remaining - done):
                done.add(key)
                _out(f"pod/{key.partition('/')[2]} evicted")
            phase = doc.get("phase")
            if phase != "Running":
                break
            await trio.sleep(DRAIN_POLL)
    if scope.cancelled_caught:
        _err(f"error: timed out waiting for the drain of node/{node}; it goes on in the server "
             f"(kfleet drain-status {node})")
        return 1
    if phase == "Complete":
        _out(f"node/{node} drained")
        return 0
    for problem in doc.get("errors") or []:
        _err(f"error: {problem}")
    _err(f'error: unable to drain node "{node}": drain {phase}')
    return 1


@commands.command
def drain(
    node: str,
    *,
    ignore_daemonsets: Annotated[bool, Parameter(negative="", help="Leave DaemonSet-managed pods.")] = False,
    delete_emptydir_data: Annotated[bool, Parameter(
        negative="", help="Evict pods with emptyDir volumes (their data is lost).")] = False,
    force: Annotated[bool, Parameter(negative="", help="Also evict pods no controller manages.")] = False,
    grace_period: Annotated[int, Parameter(
        help="Seconds each pod gets to stop; negative: the pod's own terminationGracePeriodSeconds.")] = -1,
    timeout: Annotated[str, Parameter(help="Give up after this long (e.g. 5m); 0: never.")] = "0s",
    wait: Annotated[bool, Parameter(negative="", help="Follow the drain until it ends.")] = False,
    g: Globals | None = None,
) -> int:
    """Drain a node in the server: cordon it, then evict its pods (as kubectl drain does).

    Without --wait, kfleet returns once the server has started the drain; follow it
    with `kfleet drain-status NODE`.
    """
    try:
        # A bare number is seconds; otherwise a Go duration, as kubectl's --timeout takes.
        timeout_s = float(timeout) if timeout.replace(".", "", 1).isdigit() else parse_duration(timeout)
    except ValueError as exc:
        _err(f"error: {exc}")
        return 1
    body: dict[str, Any] = {"ignoreDaemonSets": ignore_daemonsets, "deleteEmptyDirData": delete_emptydir_data,
                            "force": force, "gracePeriodSeconds": grace_period,
                            "timeoutSeconds": math.ceil(timeout_s)}

    async def run(client: Client, session: Session) -> int:
        before = await client.get_object("v1", "nodes", node)
        await client.request("POST", _node_path(node, "drain"), json=body)
        was = (before.get("spec") or {}).get("unschedulable") is True
        _out(f"node/{node} already cordoned" if was else f"node/{node} cordoned")
        if not wait:
            _out(f"node/{node} drain started (kfleet drain-status {node})")
            return 0
        # The server enforces timeoutSeconds; the client waits a little longer to see the end.
        return await _follow_drain(client, node, timeout_s + 10 if timeout_s > 0 else None)

    return _run(g, run)


@commands.command(name="drain-status")
def drain_status(
    node: str,
    *,
    output: Annotated[Literal["yaml", "json"] | None, Parameter(name=["--output", "-o"])] = None,
    g: Globals | None = None,
) -> int:
    """Show the progress of a node's drain (phase, evicted, remaining, blocked by budget)."""

    async def run(client: Client, session: Session) -> int:
        doc = await client.get(_node_path(node, "drain"))
        if output == "json":
            _out(printing.to_json(doc))
        elif output == "yaml":
            _out(printing.to_yaml(doc).rstrip())
        else:
            _out("\n".join(_drain_lines(doc)))
        return 0

    return _run(g, run)
