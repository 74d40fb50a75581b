"""The driver seam: PodRef, PodNetwork and the registry of drivers by name."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from fleet.network import driver as drv
from fleet.network.driver import (
    NetworkConfig,
    NetworkDriver,
    NetworkError,
    PeerRouting,
    PodNetwork,
    PodRef,
    UnknownDriver,
    create_driver,
    get_driver_factory,
    register_driver,
    registered_drivers,
    unregister_driver,
)

CONFIG = NetworkConfig(pod_cidr="10.244.1.0/24", state_dir="/nonexistent-unused")


class FakeDriver:
    """A third-party driver as small as the protocol allows."""

    name = "fake"

    def __init__(self, config: NetworkConfig) -> None:
        self.config = config

    async def setup(self, pod: PodRef, netns_path: str) -> PodNetwork:
        return PodNetwork(ips=("10.244.1.9",))

    async def teardown(self, pod: PodRef, netns_path: str) -> None:
        return None

    async def recover(self, existing: Sequence[PodRef]) -> None:
        return None

    async def uninstall(self) -> None:
        return None


@pytest.fixture
def clean_registry() -> Iterator[None]:
    before = dict(drv._registry)
    yield
    drv._registry.clear()
    drv._registry.update(before)


def test_register_and_create_by_name(clean_registry: None) -> None:
    register_driver("fake", FakeDriver)
    assert "fake" in registered_drivers()
    d = create_driver("fake", CONFIG)
    assert isinstance(d, FakeDriver) and isinstance(d, NetworkDriver)
    assert d.config is CONFIG
    unregister_driver("fake")
    assert "fake" not in registered_drivers()
    unregister_driver("fake")  # no error


def test_a_taken_name_is_not_silently_shadowed(clean_registry: None) -> None:
    register_driver("fake", FakeDriver)
    register_driver("fake", FakeDriver)  # the same factory again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_driver("fake", lambda c: FakeDriver(c))
    register_driver("fake", lambda c: FakeDriver(c), replace=True)
    with pytest.raises(ValueError):
        register_driver("", FakeDriver)


def test_unknown_driver_names_the_known_ones(clean_registry: None) -> None:
    register_driver("fake", FakeDriver)
    with pytest.raises(UnknownDriver, match=r"'nope' \(registered: .*fake"):
        get_driver_factory("nope")


def test_a_factory_returning_a_non_driver_is_refused(clean_registry: None) -> None:
    register_driver("broken", lambda c: object())  # type: ignore[arg-type,return-value]
    with pytest.raises(NetworkError, match="not a driver"):
        create_driver("broken", CONFIG)


def test_bridge_is_found_by_name_without_importing_it_first(clean_registry: None) -> None:
    drv._registry.pop("bridge", None)
    from fleet.network.bridge import BridgeDriver

    d = create_driver("bridge", CONFIG)
    assert isinstance(d, BridgeDriver) and d.name == "bridge"


def test_third_party_drivers_load_from_entry_points(
    clean_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ep = importlib.metadata.EntryPoint(
        name="fake-ep", value=f"{__name__}:FakeDriver", group=drv.ENTRY_POINT_GROUP
    )

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [ep] if group == drv.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(drv.importlib.metadata, "entry_points", entry_points)
    assert "fake-ep" not in registered_drivers()
    assert isinstance(create_driver("fake-ep", CONFIG), FakeDriver)
    assert "fake-ep" in registered_drivers()


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (
            {"metadata": {"uid": "u1", "namespace": "ns", "name": "p"}, "spec": {}},
            PodRef("u1", "ns", "p", host_network=False),
        ),
        (
            {"metadata": {"uid": "u2", "name": "p"}, "spec": {"hostNetwork": True}},
            PodRef("u2", "default", "p", host_network=True),
        ),
        ({"metadata": {"uid": "u3", "namespace": "ns", "name": "p"}}, PodRef("u3", "ns", "p")),
    ],
)
def test_podref_from_pod(pod: dict, expected: PodRef) -> None:
    assert PodRef.from_pod(pod) == expected


def test_podref_needs_a_uid() -> None:
    with pytest.raises(ValueError, match="uid"):
        PodRef.from_pod({"metadata": {"name": "p"}})


def test_podref_is_the_uid_namespace_name_triple() -> None:
    ref = PodRef("u", "ns", "p")
    assert (ref.uid, ref.namespace, ref.name, ref.host_network) == ("u", "ns", "p", False)
    assert str(ref) == "ns/p (u)"
    assert len({ref, PodRef("u", "ns", "p")}) == 1  # hashable, by value


def test_pod_network_primary_ip() -> None:
    assert PodNetwork(ips=("10.0.0.2", "fd00::2")).pod_ip == "10.0.0.2"
    assert PodNetwork(host_network=True).pod_ip is None


class RoutingFakeDriver(FakeDriver):
    """A third-party driver that also routes to other nodes (the optional capability)."""

    name = "fake-routing"

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__(config)
        self.synced: list[list[str]] = []

    async def sync_peers(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        self.synced.append([n["metadata"]["name"] for n in nodes])

    def peer_annotations(self) -> Mapping[str, str]:
        return {"example.com/tunnel": "on"}


def test_peer_routing_is_an_optional_capability(clean_registry: None) -> None:
    register_driver("fake", FakeDriver)
    register_driver("fake-routing", RoutingFakeDriver)
    plain = create_driver("fake", CONFIG)
    routing = create_driver("fake-routing", CONFIG)
    assert isinstance(plain, NetworkDriver) and not isinstance(plain, PeerRouting)
    assert isinstance(routing, NetworkDriver) and isinstance(routing, PeerRouting)
    # The in-tree bridge driver has it too.
    bridge = create_driver("bridge", NetworkConfig(pod_cidr="10.244.1.0/24",
                                                   state_dir="/nonexistent-unused"))
    assert isinstance(bridge, PeerRouting)
