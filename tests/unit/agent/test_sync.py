"""The agent's pod sync (and its podCIDR wait) on the one client informer: what a re-list and a slow recovery
must not leak.

A fake client serves the node's pods (list, and watch streams the test scripts); a
fake driver reports the containers the shims kept alive; PodWorker is replaced by a
recorder.  Runs under trio's MockClock.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from fleet.agent import sync as sync_mod
from fleet.agent.worker import LABEL_POD_UID
from fleet.client import ApiException
from fleet.runtime.driver import ContainerHandle

EXPIRED = ApiException({"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}, 410)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def pod(name: str, rv: int, uid: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "d", "uid": uid or f"uid-{name}", "resourceVersion": str(rv)},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x"}]}}


def handle(pod_uid: str) -> ContainerHandle:
    return ContainerHandle(id=f"c-{pod_uid}", name="main", sandbox_id=pod_uid, pid=1, shim_pid=2,
                           started_at=datetime.now(UTC), bundle=Path("/nonexistent"),
                           log_path=Path("/nonexistent"), labels={LABEL_POD_UID: pod_uid})


class FakeClient:
    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.streams: list[tuple[list[dict[str, Any]], BaseException | None]] = []
        self.more = trio.Event()

    async def list_all(self, *args: Any, **kw: Any) -> dict[str, Any]:
        assert kw.get("field_selector") == "spec.nodeName=n1"
        return {"metadata": {"resourceVersion": "100"}, "items": list(self.pods.values())}

    async def watch(self, *args: Any, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        while not self.streams:
            self.more = trio.Event()
            await self.more.wait()
        events, end = self.streams.pop(0)
        for e in events:
            yield e
        if end is not None:
            raise end
        await trio.sleep(math.inf)

    def script(self, events: list[dict[str, Any]], end: BaseException | None = None) -> None:
        self.streams.append((events, end))
        self.more.set()


class FakeDriver:
    def __init__(self, handles: list[ContainerHandle], recovery_takes: float = 0.0) -> None:
        self.handles = handles
        self.recovery_takes = recovery_takes
        self.removed: list[str] = []

    async def recover(self) -> list[ContainerHandle]:
        await trio.sleep(self.recovery_takes)
        return list(self.handles)

    async def remove(self, h: ContainerHandle) -> None:
        self.removed.append(h.id)


class Workers:
    """Stands in for PodWorker: records which pods got a worker, with what, and which went."""

    def __init__(self) -> None:
        self.started: list[tuple[str, list[str]]] = []
        self.gone: list[str] = []

    def factory(self, pod: dict[str, Any], env: Any, adopted: list[ContainerHandle]) -> Any:
        rec = self

        class W:
            def __init__(self) -> None:
                self.pod, self.uid = pod, pod["metadata"]["uid"]
                self.namespace, self.name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                rec.started.append((self.uid, [h.id for h in adopted]))

            def update(self, p: dict[str, Any]) -> None:
                pass

            def gone(self) -> None:
                rec.gone.append(self.uid)

            async def run(self) -> None:
                await trio.sleep(math.inf)

        return W()


def make_sync(monkeypatch: pytest.MonkeyPatch, client: FakeClient, driver: FakeDriver) -> tuple[Any, Workers]:
    workers = Workers()
    monkeypatch.setattr(sync_mod, "PodWorker", workers.factory)
    env = type("Env", (), {"client": client, "driver": driver, "network": None, "events": None})()
    return sync_mod.PodSync("n1", env), workers


async def test_pods_deleted_while_the_watch_was_lost_are_torn_down(
        monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient(pod("a", 1), pod("b", 2), pod("c", 3))
    ps, workers = make_sync(monkeypatch, client, FakeDriver([]))
    async with trio.open_nursery() as n:
        await n.start(ps.run)
        assert sorted(u for u, _ in workers.started) == ["uid-a", "uid-b", "uid-c"]
        # The agent is cut off; meanwhile a is deleted and c deleted and re-created.
        del client.pods["a"]
        client.pods["c"] = pod("c", 9, uid="uid-c2")
        client.script([], EXPIRED)
        client.script([])
        await trio.sleep(5)
        n.cancel_scope.cancel()
    assert sorted(workers.gone) == ["uid-a", "uid-c"]
    assert [u for u, _ in workers.started][-1] == "uid-c2"


async def test_containers_of_a_pod_deleted_during_recovery_are_removed(
        monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock) -> None:
    """Recovery keeps the containers of the pods listed; a pod deleted while recovery
    ran has no worker to take them, so they are removed rather than left running."""
    client = FakeClient(pod("a", 1), pod("b", 2))
    driver = FakeDriver([handle("uid-a"), handle("uid-b"), handle("uid-stale")], recovery_takes=3.0)
    ps, workers = make_sync(monkeypatch, client, driver)
    client.script([])

    async def delete_b_during_recovery() -> None:
        await trio.sleep(1)
        del client.pods["b"]
        # The watch that follows the first list brings the deletion.
        client.streams.clear()
        client.script([{"type": "DELETED", "object": pod("b", 5)}])

    async with trio.open_nursery() as n:
        # The first watch after the list blocks until the deletion is scripted.
        client.streams.clear()
        n.start_soon(delete_b_during_recovery)
        await n.start(ps.run)
        await trio.sleep(1)
        n.cancel_scope.cancel()
    assert workers.started == [("uid-a", ["c-uid-a"])]  # a adopted its container; b got no worker
    assert sorted(driver.removed) == ["c-uid-b", "c-uid-stale"]


async def test_the_node_waits_for_its_pod_cidr_through_an_informer(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    """wait_pod_cidr follows only its own Node and returns once node IPAM assigned a range,
    across a lost watch (the re-list finds it)."""
    from fleet.agent.config import AgentConfig
    from fleet.agent.node import NodeAgent

    node = {"kind": "Node", "metadata": {"name": "n1", "uid": "u", "resourceVersion": "1"}, "spec": {}}
    client = FakeClient()
    client.pods = {"n1": node}
    seen_selectors: list[Any] = []

    async def list_all(*args: Any, **kw: Any) -> dict[str, Any]:
        seen_selectors.append(kw.get("field_selector"))
        return {"metadata": {"resourceVersion": "100"}, "items": list(client.pods.values())}

    client.list_all = list_all  # type: ignore[method-assign]
    agent = NodeAgent(AgentConfig(node_name="n1", data_dir=tmp_path, address="127.0.0.1"), client,  # type: ignore[arg-type]
                      driver_name="process")
    got: list[str] = []

    async def wait() -> None:
        got.append(await agent.wait_pod_cidr())

    async with trio.open_nursery() as n:
        n.start_soon(wait)
        await trio.sleep(5)
        assert got == []
        # The watch is lost; meanwhile IPAM assigned the range: the re-list brings it.
        client.pods = {"n1": {**node, "metadata": {**node["metadata"], "resourceVersion": "2"},
                              "spec": {"podCIDR": "10.42.7.0/24"}}}
        client.script([], EXPIRED)
        await trio.sleep(5)
    assert got == ["10.42.7.0/24"]
    assert seen_selectors == ["metadata.name=n1", "metadata.name=n1"]
