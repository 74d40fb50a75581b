"""The agent's service proxy loop on fake informer streams: a burst of changes is one
transaction, nothing syncs before every informer listed, and a Node heartbeat that
changes nothing costs nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import trio

from fleet.network.service_proxy import ServiceProxyConfig, ServiceRules, run_service_proxy
from tests.unit.network.proxy_objects import ep, eps, svc


class FakeClient:
    """list_all + watch for the three resources, fed through memory channels."""

    def __init__(self, objs: dict[str, list[dict[str, Any]]]) -> None:
        self.objs = objs
        self.send: dict[str, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._recv: dict[str, trio.MemoryReceiveChannel[dict[str, Any]]] = {}
        for plural in objs:
            self.send[plural], self._recv[plural] = trio.open_memory_channel(100)
        self.listed = trio.Event()

    async def list_all(self, api_version: str, plural: str, namespace: str | None = None,
                       **kw: Any) -> dict[str, Any]:
        if plural == "endpointslices":
            await self.listed.wait()  # the test decides when the last informer has listed
        return {"items": list(self.objs[plural]), "metadata": {"resourceVersion": "1"}}

    async def watch(self, api_version: str, plural: str, namespace: str | None = None,
                    **kw: Any) -> AsyncIterator[dict[str, Any]]:
        async for event in self._recv[plural]:
            yield event


def meta(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    obj["metadata"].update(uid=obj["metadata"]["name"], resourceVersion=str(rv))
    return obj


def node(addr: str, rv: int, heartbeat: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "n1", "resourceVersion": str(rv)},
            "status": {"addresses": [{"type": "InternalIP", "address": addr}],
                       "conditions": [{"type": "Ready", "lastHeartbeatTime": heartbeat}]}}


async def test_bursts_coalesce_into_one_transaction(autojump_clock: Any) -> None:
    scripts: list[str] = []

    async def fake_apply(text: str, netns: str | None) -> None:
        scripts.append(text)

    cfg = ServiceProxyConfig(node_name="n1", min_sync_interval=0.05, check_interval=1e9)
    rules = ServiceRules(cfg.options(), apply=fake_apply, plan_in_thread=False)
    slice_ = meta(eps("web", [ep("10.42.0.2")]), 1)
    client = FakeClient({"services": [meta(svc("web", ip="10.43.0.10"), 1)],
                         "endpointslices": [slice_], "nodes": [node("192.0.2.1", 1, "t0")]})
    async with trio.open_nursery() as n:
        n.start_soon(_start, n, client, cfg, rules)
        await trio.sleep(5)
        assert scripts == []  # not before every informer has listed
        client.listed.set()
        await trio.sleep(1)
        assert len(scripts) == 1 and "delete table" in scripts[0]
        assert "10.42.0.2:8080" in scripts[0]

        # Five slice revisions in a burst (well within the 50 ms window): one transaction.
        for i in range(5):
            slice_ = dict(slice_, endpoints=[*slice_["endpoints"], ep(f"10.42.0.{10 + i}")])
            slice_ = meta({**slice_, "metadata": dict(slice_["metadata"])}, 2 + i)
            await client.send["endpointslices"].send({"type": "MODIFIED", "object": slice_})
        await trio.sleep(1)
        assert len(scripts) == 2, scripts
        assert all(f"10.42.0.{10 + i}:8080" in scripts[1] for i in range(5))
        assert "delete table" not in scripts[1]

        # A heartbeat (same addresses) is no change; a new address is.
        await client.send["nodes"].send({"type": "MODIFIED", "object": node("192.0.2.1", 9, "t1")})
        await trio.sleep(1)
        assert len(scripts) == 2
        await client.send["nodes"].send({"type": "MODIFIED", "object": node("192.0.2.9", 10, "t2")})
        await trio.sleep(1)
        assert rules.opts.node_ips == ("192.0.2.9",)
        n.cancel_scope.cancel()


async def _start(n: trio.Nursery, client: FakeClient, cfg: ServiceProxyConfig, rules: ServiceRules) -> None:
    await n.start(lambda task_status: run_service_proxy(client, cfg, rules=rules, task_status=task_status))


async def test_shared_informers_are_used_waited_for_and_detached(autojump_clock: Any) -> None:
    """The agent hands its own Service and EndpointSlice informers over (shared with the
    service-link variables and the NetworkPolicy enforcer): the proxy neither runs
    second copies nor syncs before they have listed, and detaches from them when it ends."""
    from fleet.client.informer import Informer

    scripts: list[str] = []

    async def fake_apply(text: str, netns: str | None) -> None:
        scripts.append(text)

    cfg = ServiceProxyConfig(node_name="n1", min_sync_interval=0.05, check_interval=1e9)
    rules = ServiceRules(cfg.options(), apply=fake_apply, plan_in_thread=False)
    client = FakeClient({"services": [meta(svc("web", ip="10.43.0.10"), 1)],
                         "endpointslices": [meta(eps("web", [ep("10.42.0.2")]), 1)],
                         "nodes": [node("192.0.2.1", 1, "t0")]})
    listed: list[str] = []
    real_list_all = client.list_all

    async def list_all(api_version: str, plural: str, namespace: str | None = None, **kw: Any) -> Any:
        listed.append(plural)
        return await real_list_all(api_version, plural, namespace, **kw)

    client.list_all = list_all  # type: ignore[method-assign]
    services = Informer(client, "v1", "services")  # type: ignore[arg-type]
    slices = Informer(client, "discovery.k8s.io/v1", "endpointslices")  # type: ignore[arg-type]
    async with trio.open_nursery() as n:
        await n.start(services.run)
        proxy_scope = trio.CancelScope()

        async def proxy() -> None:
            with proxy_scope:
                await run_service_proxy(client, cfg, rules=rules, services=services, slices=slices)

        n.start_soon(proxy)
        await trio.sleep(5)
        assert scripts == []  # the shared slices informer has not listed yet
        client.listed.set()
        n.start_soon(slices.run)
        await trio.sleep(1)
        assert len(scripts) == 1 and "10.42.0.2:8080" in scripts[0]
        assert sorted(listed) == ["endpointslices", "nodes", "services"]  # one list each
        proxy_scope.cancel()
        await trio.sleep(1)
        assert services._handlers == [] and slices._handlers == []
        n.cancel_scope.cancel()
