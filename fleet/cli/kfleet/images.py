"""kfleet image import/list: archives streamed to a node's image store and its
images listed, both through the API server's node proxy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import httpx
import trio
from cyclopts import App, Parameter

import fleet
from fleet.cli import printing
from fleet.cli.kfleet.base import Globals, Session, _err, _out, _run, commands
from fleet.client.kubeconfig import ClientConfig
from fleet.client.rest import ApiException, Client, ssl_context

# -- image import / list ----------------------------------------------------------------

image = App(name="image", help="Manage images on a node (through the API server's node proxy).")
commands.command(image)

UPLOAD_CHUNK = 1 << 20


async def _pick_node(client: Client, node: str | None) -> str | None:
    """The node to act on: the given one, else the cluster's only node.  None (after a
    kubectl-style error listing the candidates) when that is ambiguous."""
    if node:
        return node
    names = sorted(n["metadata"]["name"] for n in (await client.get("/api/v1/nodes")).get("items", []))
    if len(names) == 1:
        return names[0]
    if not names:
        _err("error: the cluster has no nodes")
    else:
        _err(f"error: a node must be specified with --node, choose one of: [{' '.join(names)}]")
    return None


# How long an upload waits for a node's agent API to come up, and the proxy's words
# for an agent it cannot reach (fleet.server.proxy).
AGENT_WAIT = 30.0
UNREACHABLE_AGENT = "error trying to reach the agent"


def _node_proxy_path(node: str, path: str) -> str:
    return f"/api/v1/nodes/{quote(node, safe='')}/proxy/{path}"


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    async with await trio.open_file(path, "rb") as f:
        while chunk := await f.read(UPLOAD_CHUNK):
            yield chunk


async def upload_archive(config: ClientConfig, node: str, path: Path,
                         name: str | None = None) -> list[str]:
    """POST one archive to the node's agent (nodes/{node}/proxy/images/import), streamed
    from disk with its length declared, so the agent can refuse an oversized one at once
    and tell a cut-off upload from a complete one.  Returns the refs imported."""
    headers = {"User-Agent": f"kfleet/{fleet.__version__}", "Accept": "application/json",
               "Content-Type": "application/x-tar",
               "Content-Length": str(path.stat().st_size)}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    # No read timeout: the agent answers only once the whole image is unpacked.
    timeout = httpx.Timeout(30.0, read=None, write=None)
    async with httpx.AsyncClient(base_url=config.server, verify=ssl_context(config),
                                 timeout=timeout) as http:
        # A node that has just registered may not serve its agent API yet (the proxy's
        # 503 "error trying to reach the agent", sent before any of the body was
        # forwarded): the upload is started again from the file, for a bounded time.
        deadline = trio.current_time() + AGENT_WAIT
        delay = 0.2
        while True:
            resp = await http.post(_node_proxy_path(node, "images/import"),
                                   params={"name": name} if name else None,
                                   content=_file_chunks(path), headers=headers)
            if (resp.status_code != 503 or UNREACHABLE_AGENT not in resp.text
                    or trio.current_time() + delay > deadline):
                break
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)
        if resp.status_code >= 400:
            raise ApiException.from_response(resp)
        return list(resp.json().get("images") or [])


@image.command(name="import")
def image_import(
    files: Annotated[list[Path], Parameter(negative="", help="Archive files (.tar, .tar.gz).")],
    *,
    node: Annotated[str | None, Parameter(help="The node to import into (default: the only node).")] = None,
    name: Annotated[str | None, Parameter(
        help="Name for images the archive leaves unnamed (or only tags).")] = None,
    g: Globals | None = None,
) -> int:
    """Import OCI-layout or `docker save` archives into a node's image store."""
    for f in files:
        if not f.is_file():
            _err(f"error: {f}: no such file")
            return 1

    async def run(client: Client, session: Session) -> int:
        target = await _pick_node(client, node)
        if target is None:
            return 1
        for f in files:
            for ref in await upload_archive(session.config, target, f, name):
                _out(f"imported {ref}")
        return 0

    return _run(g, run)


@image.command(name="list")
def image_list(
    *,
    node: Annotated[str | None, Parameter(help="The node to list (default: the only node).")] = None,
    g: Globals | None = None,
) -> int:
    """List the images in a node's image store."""

    async def run(client: Client, session: Session) -> int:
        target = await _pick_node(client, node)
        if target is None:
            return 1
        doc = await client.get(_node_proxy_path(target, "images"))
        rows = [[i.get("ref", ""), str(i.get("id", "")).removeprefix("sha256:")[:12],
                 _human_size(int(i.get("size") or 0))] for i in doc.get("images") or []]
        _out(printing.format_simple_table(["IMAGE", "ID", "SIZE"], rows))
        return 0

    return _run(g, run)


def _human_size(n: int) -> str:
    """Docker-style sizes (decimal units): 1.2MB."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.3g}{unit}" if unit != "B" else f"{n}B"
        size /= 1000
    return f"{n}B"
