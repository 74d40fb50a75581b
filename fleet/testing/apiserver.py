"""An in-process API server for tests: the real pipeline without sockets.

`open_api(tmp_path)` opens a SQLite store, registers the built-in kinds,
creates the default namespaces and yields an `InProcessAPI` whose `call`
runs one request through `APIServer.handle` — authentication included (it
sends the admin token unless told otherwise).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from fleet.admission import AdmissionChain, builtin_chain
from fleet.api.registry import default_registry
from fleet.auth import ADMIN, AllowAll, TokenAuthenticator
from fleet.server import nslifecycle
from fleet.server.app import APIServer
from fleet.server.drain import NodeMaintenance
from fleet.server.http import Req, Resp
from fleet.server.metrics import Metrics
from fleet.server.nscache import NamespaceCache
from fleet.server.rest import ResourceAPI
from fleet.server.run import ensure_default_namespaces, ensure_system_priority_classes
from fleet.server.watch import WatchCounter
from fleet.store import open_store

TOKEN = "test-token"


class InProcessAPI:
    def __init__(self, server: APIServer) -> None:
        self.server = server
        self.store = server.store

    async def call(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
                   headers: dict[str, str] | None = None, token: str | None = TOKEN,
                   content_type: str = "application/json") -> Resp:
        h = {"accept": "application/json"}
        if token is not None:
            h["authorization"] = f"Bearer {token}"
        raw = b""
        if body is not None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            h["content-type"] = content_type
        h.update({k.lower(): v for k, v in (headers or {}).items()})
        resp, _, _ = await self.server.handle(Req(method, path, dict(query or {}), h, raw))
        return resp

    async def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        resp = await self.call(method, path, body, **kw)
        assert isinstance(resp.body, bytes), "streaming response; use call()"
        return resp.status, json.loads(resp.body) if resp.body and resp.content_type.startswith("application/json") else resp.body


@asynccontextmanager
async def open_api(data_dir: Path, *, builtin_admission: bool = False, maintenance: bool = False,
                   **store_kw: Any) -> AsyncIterator[InProcessAPI]:
    """The API over a fresh store.  `builtin_admission` runs `fleet server`'s admission
    chain (Priority, DefaultTolerationSeconds) instead of an empty one;
    `maintenance` runs the node drain runner (nodes/{name}/drain) with short intervals."""
    async with open_store(Path(data_dir) / "fleet.db", **store_kw) as store:
        registry = default_registry()
        await ensure_default_namespaces(store, registry)
        await ensure_system_priority_classes(store, registry)
        async with trio.open_nursery() as nursery:
            send, recv = trio.open_memory_channel[str](100)
            await nursery.start(nslifecycle.run, store, registry, recv)
            namespaces = NamespaceCache()
            await nursery.start(namespaces.run, store)
            watches = WatchCounter()
            admission = builtin_chain(store) if builtin_admission else AdmissionChain()
            resources = ResourceAPI(store, registry, admission, send, namespaces)
            server = APIServer(store, registry, TokenAuthenticator({TOKEN: ADMIN}), AllowAll(), admission,
                               resources, Metrics(store.stats, lambda: watches.open), watches, "127.0.0.1:0",
                               maintenance=NodeMaintenance(resources, poll_interval=0.05, retry_interval=0.2))
            if maintenance:
                await nursery.start(server.maintenance.run)
            yield InProcessAPI(server)
            nursery.cancel_scope.cancel()
