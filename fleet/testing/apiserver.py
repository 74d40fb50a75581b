"""An in-process API server for tests: the real pipeline without sockets.

`open_api(tmp_path)` opens a SQLite store, registers the built-in kinds,
creates the default namespaces and yields an `InProcessAPI` whose `call`
runs one request through `APIServer.handle` — authentication included (it
sends the admin token unless told otherwise).  `InProcessAPI.client()` is a
real `fleet.client.Client` over the same path (no watches: a streamed answer
is refused).

Unless told otherwise, `open_api` also runs the namespace controller
(fleet/controllers/namespace.py) over that client, fed from a store watch on
namespaces instead of an informer — what the controller manager does for a
real server — so that deleting a namespace ends as it does in a cluster.
With the built-in admission chain it also gives every namespace its `default`
ServiceAccount, as the ServiceAccount controller does (the ServiceAccount admission
plugin refuses pods whose account does not exist).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.admission import AdmissionChain, builtin_chain
from fleet.api import meta
from fleet.api.registry import default_registry
from fleet.auth import ADMIN, AllowAll, TokenAuthenticator, UserInfo
from fleet.client import Client, ClientConfig
from fleet.controllers.namespace import NamespaceController
from fleet.controllers.runtime import Context
from fleet.server.app import APIServer
from fleet.server.drain import NodeMaintenance
from fleet.server.http import Req, Resp
from fleet.server.metrics import Metrics
from fleet.server.nscache import NamespaceCache
from fleet.server.rest import ResourceAPI
from fleet.server.run import ensure_default_namespaces, ensure_system_priority_classes
from fleet.server.security import SecurityConfig
from fleet.server.security import build as build_security
from fleet.server.svcalloc import ServiceAllocator
from fleet.server.watch import WatchCounter
from fleet.store import DELETED, Store, open_store

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

    def client(self, token: str = TOKEN) -> Client:
        """A `fleet.client.Client` whose requests run through `APIServer.handle`."""
        async def handle(request: httpx.Request) -> httpx.Response:
            headers = {k.lower(): v for k, v in request.headers.items()}
            req = Req(request.method, request.url.path, dict(request.url.params), headers, await request.aread(),
                      raw_query=request.url.query.decode())
            resp, _, _ = await self.server.handle(req)
            if not isinstance(resp.body, bytes):
                raise NotImplementedError("streamed answers (watch, log) are not served in process")
            return httpx.Response(resp.status, headers={"content-type": resp.content_type, **resp.headers},
                                  content=resp.body)

        return Client(ClientConfig(server="http://in-process", token=token),
                      transport=httpx.MockTransport(handle))

    async def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        resp = await self.call(method, path, body, **kw)
        assert isinstance(resp.body, bytes), "streaming response; use call()"
        return resp.status, json.loads(resp.body) if resp.body and resp.content_type.startswith("application/json") else resp.body


@asynccontextmanager
async def open_api(data_dir: Path, *, builtin_admission: bool = False, maintenance: bool = False,
                   namespace_controller: bool = True, service_allocator: Callable[[Store], ServiceAllocator] | None = None,
                   security: SecurityConfig | None = None, tokens: Mapping[str, UserInfo] | None = None,
                   **store_kw: Any) -> AsyncIterator[InProcessAPI]:
    """The API over a fresh store.  `builtin_admission` runs `fleet server`'s admission
    chain (Priority, DefaultTolerationSeconds) instead of an empty one;
    `maintenance` runs the node drain runner (nodes/{name}/drain) with short intervals;
    `namespace_controller` runs the namespace controller (see the module docstring);
    `service_allocator(store)` builds the Services' ClusterIP/NodePort allocator
    (fleet/server/svcalloc.py) to run, as `fleet server` does (None: Services get none).
    `security` assembles authentication and authorization as `fleet server` does
    (fleet/server/security.py, its tasks started first) instead of allowing all;
    `tokens` are extra static bearer tokens (token → user), e.g. a node's identity."""
    async with open_store(Path(data_dir) / "fleet.db", **store_kw) as store:
        registry = default_registry()
        await ensure_default_namespaces(store, registry)
        await ensure_system_priority_classes(store, registry)
        async with trio.open_nursery() as nursery:
            namespaces = NamespaceCache()
            await nursery.start(namespaces.run, store)
            watches = WatchCounter()
            admission = builtin_chain(store) if builtin_admission else AdmissionChain()
            resources = ResourceAPI(store, registry, admission, namespaces)
            if service_allocator is not None:
                allocator = service_allocator(store)
                await nursery.start(allocator.run, store)
                resources.allocators[("", "services")] = allocator
            authenticator: Any = TokenAuthenticator({TOKEN: ADMIN, **(tokens or {})})
            authorizer: Any = AllowAll()
            if security is not None:
                sec = await build_security(security, data_dir=Path(data_dir), store=store, registry=registry,
                                           admin_token=TOKEN)
                for _name, task in sec.tasks:
                    await nursery.start(task)
                sec.authenticator.authenticators.append(TokenAuthenticator(dict(tokens or {})))
                authenticator, authorizer = sec.authenticator, sec.authorizer
            server = APIServer(store, registry, authenticator, authorizer, admission,
                               resources, Metrics(store.stats, lambda: watches.open), watches, "127.0.0.1:0",
                               maintenance=NodeMaintenance(resources, poll_interval=0.05, retry_interval=0.2))
            if maintenance:
                await nursery.start(server.maintenance.run)
            api = InProcessAPI(server)
            if namespace_controller:
                await nursery.start(run_namespace_controller, api)
            if builtin_admission:
                await nursery.start(run_default_service_accounts, api)
            yield api
            nursery.cancel_scope.cancel()


async def run_namespace_controller(api: InProcessAPI, controller: NamespaceController | None = None, *,
                                   task_status: trio.TaskStatus[NamespaceController] = trio.TASK_STATUS_IGNORED
                                   ) -> None:
    """The namespace controller over `api.client()`, its events from a store watch:
    the namespaces stored now (a Terminating one is resumed), then every change."""
    controller = controller or NamespaceController()
    async with api.client() as client:
        controller.ctx = Context(client=client, informers=None)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_feed_namespaces, api.store, controller)
            nursery.start_soon(controller.run, controller.ctx)
            task_status.started(controller)


async def run_default_service_accounts(api: InProcessAPI, *,
                                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                                       ) -> None:
    """The ServiceAccount controller's job, fed from a store watch: each active
    namespace gets a `default` ServiceAccount (fleet/controllers/serviceaccount.py)."""
    from fleet.controllers.serviceaccount import DEFAULT, needs_default

    prefix = meta.store_key("", "namespaces", None)

    async def ensure(ns: dict[str, Any]) -> None:
        name = ns["metadata"]["name"]
        if not needs_default(ns, []):
            return
        await api.call("POST", f"/api/v1/namespaces/{name}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT, "namespace": name}})  # 409: there already

    listed = await api.store.list(prefix)
    watch = await api.store.watch(prefix, from_revision=listed.revision)
    for ns in listed.items:
        await ensure(ns)
    task_status.started()
    async for ev in watch:
        if ev.type != DELETED:
            await ensure(ev.obj)


async def _feed_namespaces(store: Store, controller: NamespaceController) -> None:
    prefix = meta.store_key("", "namespaces", None)
    listed = await store.list(prefix)
    watch = await store.watch(prefix, from_revision=listed.revision)
    for ns in listed.items:
        controller.on_namespace("ADDED", None, ns)
    async for ev in watch:
        if ev.type == DELETED:
            controller.on_namespace(ev.type, ev.obj, None)
        else:
            controller.on_namespace(ev.type, ev.prev, ev.obj)
