"""The storage objects a server creates at start (fleet/server/storagedefaults.py), and
the driver registry's capabilities lookup they are made from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.api import pvmatch as pm
from fleet.api.registry import KindInfo, Registry, default_registry
from fleet.server.storagedefaults import csidriver, default_classes, ensure_default_storage
from fleet.storage import registry as drivers
from fleet.storage.driver import Capabilities, DriverEnv
from fleet.store import open_store


def registry_with_storage_kinds() -> Registry:
    """The built-in registry, plus bare StorageClass/CSIDriver kinds when this checkout
    does not have them yet (their real definitions are another change's)."""
    reg = default_registry()
    for kind, plural in (("StorageClass", "storageclasses"), ("CSIDriver", "csidrivers")):
        if reg.get("storage.k8s.io", "v1", plural) is None:
            reg.register(KindInfo(group="storage.k8s.io", version="v1", kind=kind, plural=plural,
                                  singular=plural[:-1] if not plural.endswith("es") else plural[:-2],
                                  namespaced=False))
    return reg


CAPS = {"hostpath.fleet.dev": Capabilities(node_local=True),
        "local.fleet.dev": Capabilities(node_local=True, capacity_tracking=True, enforces_capacity=True),
        "blk.example": Capabilities(attach_required=True)}


async def stored(store: Any, reg: Registry, plural: str) -> dict[str, dict[str, Any]]:
    info = reg.get("storage.k8s.io", "v1", plural)
    assert info is not None
    return {o["metadata"]["name"]: o for o in (await store.list(info.key(None))).items}


async def test_defaults_created_once_and_never_overwritten(tmp_path: Path) -> None:
    reg = registry_with_storage_kinds()
    async with open_store(tmp_path / "fleet.db") as store:
        created = await ensure_default_storage(store, reg, driver_names=lambda: sorted(CAPS),
                                               capabilities=CAPS.get)
        assert created == ["storageclass/local-path", "storageclass/fleet-local", "csidriver/blk.example",
                           "csidriver/hostpath.fleet.dev", "csidriver/local.fleet.dev"]
        classes = await stored(store, reg, "storageclasses")
        lp = classes["local-path"]
        assert lp["provisioner"] == "hostpath.fleet.dev"
        assert lp["metadata"]["annotations"] == {pm.DEFAULT_CLASS: "true"}
        assert (lp["volumeBindingMode"], lp["reclaimPolicy"], lp["allowVolumeExpansion"]) == (
            "WaitForFirstConsumer", "Delete", True)
        fl = classes["fleet-local"]
        assert fl["provisioner"] == "local.fleet.dev" and "annotations" not in fl["metadata"]
        cds = await stored(store, reg, "csidrivers")
        assert cds["blk.example"]["spec"]["attachRequired"] is True
        # What the server sets, plus the rest of SetDefaults_CSIDriver.
        assert cds["local.fleet.dev"]["spec"] == {"attachRequired": False, "storageCapacity": True,
                                                  "podInfoOnMount": False, "volumeLifecycleModes": ["Persistent"],
                                                  "fsGroupPolicy": "ReadWriteOnceWithFSType",
                                                  "requiresRepublish": False, "seLinuxMount": False}
        assert cds["local.fleet.dev"]["metadata"]["annotations"]["storage.fleet.dev/enforces-capacity"] == "true"
        assert cds["hostpath.fleet.dev"]["metadata"]["annotations"]["storage.fleet.dev/enforces-capacity"] == "false"
        # A second start creates nothing.
        assert await ensure_default_storage(store, reg, driver_names=lambda: sorted(CAPS),
                                            capabilities=CAPS.get) == []


async def test_local_path_is_not_made_default_beside_the_users_default(tmp_path: Path) -> None:
    reg = registry_with_storage_kinds()
    info = reg.get("storage.k8s.io", "v1", "storageclasses")
    assert info is not None
    async with open_store(tmp_path / "fleet.db") as store:
        mine = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "gold", "annotations": {pm.DEFAULT_CLASS: "true"}}, "provisioner": "x"}
        await store.create(info.key(None, "gold"), mine)
        await ensure_default_storage(store, reg, driver_names=lambda: [], capabilities=CAPS.get)
        assert "annotations" not in (await stored(store, reg, "storageclasses"))["local-path"]["metadata"]


async def test_nothing_when_the_kinds_are_not_served(tmp_path: Path) -> None:
    reg = default_registry()
    for plural in ("storageclasses", "csidrivers"):
        if reg.get("storage.k8s.io", "v1", plural) is not None:
            reg.unregister("storage.k8s.io", "v1", plural)
    async with open_store(tmp_path / "fleet.db") as store:
        assert await ensure_default_storage(store, reg, driver_names=lambda: sorted(CAPS),
                                            capabilities=CAPS.get) == []


def test_default_classes_and_csidriver_shapes() -> None:
    assert [c["metadata"]["name"] for c in default_classes()] == ["local-path", "fleet-local"]
    assert "annotations" not in default_classes(another_default=True)[0]["metadata"]
    assert csidriver("d", Capabilities())["spec"]["storageCapacity"] is False


# ---------------------------------------------------------------------------------------
# registry.capabilities


class _ClassDriver:
    capabilities = Capabilities(node_local=True, expansion="online")

    def __init__(self, env: DriverEnv) -> None:
        raise AssertionError("capabilities must be read without an instance")


class _Made:
    def __init__(self, env: DriverEnv) -> None:
        self.capabilities = Capabilities(attach_required=True)
        self.env = env


@pytest.fixture
def scratch_drivers() -> Any:
    names = ["test.pvctl/class", "test.pvctl/instance"]
    yield names
    for n in names:
        drivers.unregister(n)


def test_capabilities_from_the_class_or_an_instance(scratch_drivers: list[str]) -> None:
    made: list[DriverEnv] = []

    def factory(env: DriverEnv) -> Any:
        made.append(env)
        return _Made(env)

    drivers.register("test.pvctl/class", _ClassDriver)  # type: ignore[arg-type]
    drivers.register("test.pvctl/instance", factory)
    assert drivers.capabilities("test.pvctl/class") == _ClassDriver.capabilities
    assert drivers.capabilities("test.pvctl/instance") == Capabilities(attach_required=True)
    assert drivers.capabilities("test.pvctl/instance") == Capabilities(attach_required=True)
    assert len(made) == 1 and made[0].node_name is None and not made[0].data_dir.exists()
    assert drivers.capabilities("test.pvctl/none") is None
    # Registering again forgets what was learnt.
    drivers.register("test.pvctl/instance", lambda env: _ClassDriver)  # type: ignore[arg-type,return-value]
    assert drivers.capabilities("test.pvctl/instance") == _ClassDriver.capabilities
