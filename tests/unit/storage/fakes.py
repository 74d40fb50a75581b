"""Fakes for the provisioner's loop tests: an in-memory API and a scriptable driver.

`FakeAPI` is the client surface the provisioner uses (create with generateName,
merge and JSON patches with the status subresource, delete with finalizers,
get_object), over plain dicts with resourceVersions and uids, feeding every change
straight into the informers handed out by its `InformerFactory` — a watch with no
delay.  It needs no kind registry, so the tests run before the storage kinds exist.
`fail[(verb, plural)] = [exc, ...]` makes the next calls raise.

`FakeDriver` keeps its volumes in a dict and raises, per method, the DriverErrors
queued in `errors[method]`; `calls` records every call.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from fleet.api.errors import Invalid
from fleet.api.patch import json_merge_patch, json_patch
from fleet.client import JSON_PATCH, ApiException
from fleet.client.discovery import APIResource
from fleet.controllers.runtime import Context, InformerFactory
from fleet.storage.driver import (
    Capabilities,
    Code,
    CreateVolumeRequest,
    DriverEnv,
    DriverError,
    Volume,
    VolumeStats,
)


def api_error(code: int, message: str) -> ApiException:
    return ApiException({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "message": message, "code": code}, code)


class Events:
    """Collects what the provisioner's recorders queue: (component, name, type, reason, message)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str, str, str]] = []

    def reasons(self, name: str | None = None) -> list[str]:
        return [r for _, n, _, r, _ in self.items if name is None or n == name]

    def messages(self, reason: str) -> list[str]:
        return [m for _, _, _, r, m in self.items if r == reason]


class FakeAPI:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self._names = itertools.count(1)
        self.informers = InformerFactory(self)  # type: ignore[arg-type]
        self.ctx = Context(client=self, informers=self.informers)  # type: ignore[arg-type]
        self.calls: list[tuple[str, str, str]] = []
        self.fail: dict[tuple[str, str], list[Exception]] = {}
        self.events = Events()
        self.served: list[APIResource] = []  # what discover() answers

    # -- informers --------------------------------------------------------------------------
    def start(self) -> None:
        for (api_version, plural, _), inf in self.informers._informers.items():
            for obj in self.objects.get((api_version, plural), {}).values():
                inf._apply("ADDED", copy.deepcopy(obj))
            inf.synced.set()

    def _publish(self, api_version: str, plural: str, etype: str, obj: dict[str, Any]) -> None:
        for (av, pl, _), inf in self.informers._informers.items():
            if (av, pl) == (api_version, plural):
                inf._apply(etype, copy.deepcopy(obj))

    # -- direct access (what other components would write) --------------------------------------
    def bucket(self, api_version: str, plural: str) -> dict[str, dict[str, Any]]:
        return self.objects.setdefault((api_version, plural), {})

    def get(self, api_version: str, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        obj = self.bucket(api_version, plural).get(f"{namespace}/{name}")
        return copy.deepcopy(obj) if obj is not None else None

    def put(self, api_version: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as another component would (uid kept)."""
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        key = f"{md.get('namespace', '')}/{md['name']}"
        old = self.bucket(api_version, plural).get(key)
        md.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or f"uid-{next(self._uid)}")
        return self._store(api_version, plural, obj, "MODIFIED" if old else "ADDED")

    def _store(self, api_version: str, plural: str, obj: dict[str, Any], etype: str) -> dict[str, Any]:
        md = obj["metadata"]
        md["resourceVersion"] = str(next(self._rv))
        self.bucket(api_version, plural)[f"{md.get('namespace', '')}/{md['name']}"] = obj
        self._publish(api_version, plural, etype, obj)
        return copy.deepcopy(obj)

    def _remove(self, api_version: str, plural: str, obj: dict[str, Any]) -> None:
        md = obj["metadata"]
        self.bucket(api_version, plural).pop(f"{md.get('namespace', '')}/{md['name']}", None)
        self._publish(api_version, plural, "DELETED", obj)

    def _maybe_fail(self, verb: str, plural: str) -> None:
        errs = self.fail.get((verb, plural))
        if errs:
            raise errs.pop(0)

    # -- the client surface ------------------------------------------------------------------
    async def list_all(self, api_version: str, plural: str, namespace: str | None = None,
                       **_: Any) -> dict[str, Any]:
        """An informer's list; its watch then waits forever (changes are pushed by _publish)."""
        await trio.lowlevel.checkpoint()
        items = [copy.deepcopy(o) for k, o in sorted(self.bucket(api_version, plural).items())
                 if namespace is None or k.startswith(f"{namespace}/")]
        return {"items": items, "metadata": {"resourceVersion": "0"}}

    async def watch(self, *_: Any, **__: Any) -> Any:
        await trio.sleep_forever()
        yield {}  # pragma: no cover - an async generator that never yields

    async def discover(self, *, refresh: bool = False) -> list[APIResource]:
        await trio.lowlevel.checkpoint()
        return list(self.served)

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("create", plural)
        obj = copy.deepcopy(body)
        md = obj.setdefault("metadata", {})
        if namespace:
            md["namespace"] = namespace
        if not md.get("name"):
            md["name"] = f"{md['generateName']}{next(self._names):05d}"
        self.calls.append(("create", plural, md["name"]))
        if f"{md.get('namespace', '')}/{md['name']}" in self.bucket(api_version, plural):
            raise api_error(409, f'{plural} "{md["name"]}" already exists')
        md["uid"] = f"uid-{next(self._uid)}"
        return self._store(api_version, plural, obj, "ADDED")

    async def patch(self, api_version: str, plural: str, name: str, patch: Any,
                    content_type: str = "", namespace: str | None = None, *,
                    subresource: str | None = None, **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("patch", plural)
        self.calls.append(("patch" + (f"/{subresource}" if subresource else ""), plural, name))
        cur = self.bucket(api_version, plural).get(f"{namespace or ''}/{name}")
        if cur is None:
            raise api_error(404, f'{plural} "{name}" not found')
        if content_type == JSON_PATCH:
            try:
                new = json_patch(copy.deepcopy(cur), patch)
            except Invalid as e:
                raise api_error(422, str(e)) from None
        else:
            new = json_merge_patch(copy.deepcopy(cur), patch)
        if subresource == "status":
            new = {**copy.deepcopy(cur), "status": new.get("status")}
        elif "status" in cur:
            new["status"] = copy.deepcopy(cur["status"])
        new["metadata"]["uid"] = cur["metadata"]["uid"]
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._remove(api_version, plural, new)
            return copy.deepcopy(new)
        return self._store(api_version, plural, new, "MODIFIED")

    async def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None,
                     **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("delete", plural)
        self.calls.append(("delete", plural, name))
        cur = self.bucket(api_version, plural).get(f"{namespace or ''}/{name}")
        if cur is None:
            raise api_error(404, f'{plural} "{name}" not found')
        if cur["metadata"].get("finalizers"):
            new = copy.deepcopy(cur)
            new["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            return self._store(api_version, plural, new, "MODIFIED")
        self._remove(api_version, plural, copy.deepcopy(cur))
        return {}

    async def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None,
                         **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        obj = self.get(api_version, plural, name, namespace or "")
        if obj is None:
            raise api_error(404, f'{plural} "{name}" not found')
        return obj


class FakeDriver:
    """A CSI-style driver over a dict; `errors[method]` queues DriverErrors to raise."""

    def __init__(self, name: str = "fake.fleet.test", capabilities: Capabilities | None = None,
                 *, env: DriverEnv | None = None, free_bytes: int = 10 * 2**30,
                 node_expansion: bool = True,
                 topology: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.capabilities = capabilities or Capabilities()
        self.env = env
        self.free_bytes = free_bytes
        self.node_expansion = node_expansion
        self.topology = topology
        self.volumes: dict[str, int] = {}
        self.published: dict[tuple[str, str], dict[str, str]] = {}
        self.errors: dict[str, list[BaseException]] = {}
        self.calls: list[tuple[str, Any]] = []

    def _call(self, method: str, arg: Any) -> None:
        self.calls.append((method, arg))
        errs = self.errors.get(method)
        if errs:
            raise errs.pop(0)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    async def create_volume(self, req: CreateVolumeRequest) -> Volume:
        await trio.lowlevel.checkpoint()
        self._call("create_volume", req)
        if req.name not in self.volumes:
            if req.capacity_bytes > self.free_bytes:
                raise DriverError(Code.RESOURCE_EXHAUSTED,
                                  f"not enough space on node: {req.capacity_bytes} bytes asked, "
                                  f"{self.free_bytes} free")
            self.free_bytes -= req.capacity_bytes
            self.volumes[req.name] = req.capacity_bytes
        topology = self.topology
        if topology is None and self.capabilities.node_local and req.node:
            topology = {"kubernetes.io/hostname": req.node}
        return Volume(volume_id=f"vol-{req.name}", capacity_bytes=self.volumes[req.name],
                      accessible_topology=topology, context={"path": f"/data/{req.name}"})

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None:
        await trio.lowlevel.checkpoint()
        self._call("delete_volume", volume_id)
        size = self.volumes.pop(volume_id.removeprefix("vol-"), 0)
        self.free_bytes += size

    async def controller_publish(self, volume_id: str, node: str,
                                 context: Mapping[str, str]) -> Mapping[str, str]:
        await trio.lowlevel.checkpoint()
        self._call("controller_publish", (volume_id, node))
        self.published[(volume_id, node)] = {"device": "/dev/fake0"}
        return self.published[(volume_id, node)]

    async def controller_unpublish(self, volume_id: str, node: str) -> None:
        await trio.lowlevel.checkpoint()
        self._call("controller_unpublish", (volume_id, node))
        self.published.pop((volume_id, node), None)

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        await trio.lowlevel.checkpoint()
        self._call("controller_expand", (volume_id, capacity_bytes))
        self.volumes[volume_id.removeprefix("vol-")] = capacity_bytes
        return capacity_bytes, self.node_expansion

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        await trio.lowlevel.checkpoint()
        self._call("get_capacity", node)
        return self.free_bytes

    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: Any, publish_context: Mapping[str, str]) -> None:
        raise DriverError(Code.UNIMPLEMENTED, "not in these tests")

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None:
        raise DriverError(Code.UNIMPLEMENTED, "not in these tests")

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *,
                           read_only: bool, volume_mode: Any, context: Mapping[str, str]) -> None:
        raise DriverError(Code.UNIMPLEMENTED, "not in these tests")

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None:
        raise DriverError(Code.UNIMPLEMENTED, "not in these tests")

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        raise DriverError(Code.UNIMPLEMENTED, "not in these tests")

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        raise DriverError(Code.UNIMPLEMENTED, "not in these tests")


class StubRecorder:
    """Stands in for an EventRecorder: keeps what is recorded in `events`."""

    def __init__(self, component: str, events: Events) -> None:
        self.component = component
        self.events = events

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str,
               field_path: str | None = None) -> None:
        self.events.items.append((self.component, str((obj.get("metadata") or {}).get("name")),
                                  type_, reason, message))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()


def stub_events(prov: Any, api: FakeAPI) -> None:
    """Route a set-up Provisioner's events into `api.events`."""
    prov.recorders = {c: StubRecorder(c, api.events) for c in prov.recorders}
