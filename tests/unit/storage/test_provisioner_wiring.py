"""Which driver instances the server's and a node's provisioner get (fleet/storage/provisioner.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from fleet.client.discovery import APIResource
from fleet.storage import registry
from fleet.storage.driver import Capabilities, DriverEnv
from fleet.storage.provisioner import Place, drivers_for, run_node_provisioner, server_provisioner
from tests.unit.storage.fakes import FakeAPI, FakeDriver

CENTRAL_CAPS = Capabilities()
LOCAL_CAPS = Capabilities(node_local=True, topology_keys=("kubernetes.io/hostname",))


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def only_fakes(monkeypatch: pytest.MonkeyPatch) -> list[DriverEnv]:
    """A registry holding just a central, a node-local and a broken driver; the envs
    each factory was given."""
    monkeypatch.setattr(registry, "_factories", {})
    envs: list[DriverEnv] = []

    def factory(name: str, caps: Capabilities) -> Any:
        def make(env: DriverEnv) -> FakeDriver:
            envs.append(env)
            assert env.data_dir.is_dir(), "the caller creates the driver's directory"
            return FakeDriver(name, caps, env=env)
        return make

    def broken(env: DriverEnv) -> Any:
        raise RuntimeError("plugin bug")

    registry.register("central.fleet.test", factory("central.fleet.test", CENTRAL_CAPS))
    registry.register("local.fleet.test", factory("local.fleet.test", LOCAL_CAPS))
    registry.register("broken.fleet.test", broken)
    return envs


def test_server_gets_the_central_drivers(tmp_path: Path, only_fakes: list[DriverEnv]) -> None:
    prov = server_provisioner(tmp_path)
    assert prov is not None and sorted(prov.drivers) == ["central.fleet.test"]
    assert prov.place == Place()
    env = next(e for e in only_fakes if e.data_dir.name == "central.fleet.test")
    assert env == DriverEnv(data_dir=tmp_path / "storage" / "central.fleet.test")
    # A driver not served here leaves no empty directory behind.
    assert sorted(p.name for p in (tmp_path / "storage").iterdir()) == ["central.fleet.test"]


def test_node_gets_the_node_local_drivers(tmp_path: Path, only_fakes: list[DriverEnv]) -> None:
    labels = {"kubernetes.io/hostname": "n1", "zone": "a"}
    drivers = drivers_for(Place("n1", labels), lambda name: DriverEnv(
        data_dir=tmp_path / "storage" / name, node_name="n1", node_labels=labels))
    assert sorted(drivers) == ["local.fleet.test"]
    env = next(e for e in only_fakes if e.data_dir.name == "local.fleet.test")
    assert (env.node_name, dict(env.node_labels)) == ("n1", labels)


def test_no_drivers_no_server_provisioner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_factories", {})
    assert server_provisioner(tmp_path) is None


async def test_node_provisioner_without_node_local_drivers_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_factories", {})
    registry.register("central.fleet.test", lambda env: FakeDriver("central.fleet.test", CENTRAL_CAPS))
    api = FakeAPI()
    async with trio.open_nursery() as n:
        got = await n.start(lambda task_status: run_node_provisioner(
            api, node_name="n1", node_labels={}, data_dir=tmp_path, task_status=task_status))  # type: ignore[arg-type]
    assert got is None


STORAGE_KINDS = [APIResource("persistentvolumes", "persistentvolume", False, "PersistentVolume", "", "v1"),
                 APIResource("storageclasses", "storageclass", False, "StorageClass", "storage.k8s.io", "v1")]


async def test_node_provisioner_shares_the_agents_drivers_once_the_kinds_are_served(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """The agent hands its own driver instances (one per driver on a node); the loop
    starts once the server serves PersistentVolumes and StorageClasses."""
    local = FakeDriver("local.fleet.test", LOCAL_CAPS)
    api = FakeAPI()
    api.served = STORAGE_KINDS[:1]
    async with trio.open_nursery() as n:
        async def serve_later() -> None:
            await trio.sleep(45)
            api.served = STORAGE_KINDS

        n.start_soon(serve_later)
        prov = await n.start(lambda task_status: run_node_provisioner(
            api, node_name="n1", node_labels={}, data_dir=tmp_path, task_status=task_status,  # type: ignore[arg-type]
            drivers={"local.fleet.test": local, "central.fleet.test": FakeDriver("central.fleet.test")}))
        assert trio.current_time() >= 45
        assert prov is not None and prov.drivers == {"local.fleet.test": local}
        n.cancel_scope.cancel()
