"""The agent's peer sync (fleet/agent/podnet.py): every pass hands the driver all
Nodes, and the driver's annotations (its VTEP) are published on our Node only when
the Node does not carry them already — also after the Node was re-created."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleet.agent.podnet import PeerSync


class FakeClient:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                    content_type: str) -> dict[str, Any]:
        self.patches.append((name, body))
        return {}


class FakeDriver:
    def __init__(self, annotations: dict[str, str]) -> None:
        self.annotations = annotations
        self.seen: list[list[str]] = []

    async def sync_peers(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        self.seen.append(sorted(n["metadata"]["name"] for n in nodes))

    def peer_annotations(self) -> Mapping[str, str]:
        return self.annotations


def node(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations or {}}}


VTEP = {"network.fleet.dev/backend-data": '{"VNI":1,"VtepMAC":"0a:00:00:00:00:01"}'}


async def test_publishes_missing_annotations_once() -> None:
    client, driver = FakeClient(), FakeDriver(VTEP)
    sync = PeerSync(client, "n0", driver)  # type: ignore[arg-type]
    sync.informer.items = {"n0": node("n0"), "n1": node("n1")}
    await sync.sync_once()
    assert driver.seen == [["n0", "n1"]]
    assert client.patches == [("n0", {"metadata": {"annotations": VTEP}})]
    # The informer now shows them: nothing more to write.
    sync.informer.items["n0"] = node("n0", {**VTEP, "other": "kept"})
    await sync.sync_once()
    assert len(client.patches) == 1 and sync.passes == 2
    # Our Node deleted and registered again without them: published again.
    sync.informer.items["n0"] = node("n0")
    await sync.sync_once()
    assert len(client.patches) == 2


async def test_nothing_published_without_a_vtep_or_before_registration() -> None:
    client = FakeClient()
    sync = PeerSync(client, "n0", FakeDriver({}))  # type: ignore[arg-type]
    sync.informer.items = {"n0": node("n0")}
    await sync.sync_once()
    sync = PeerSync(client, "n0", FakeDriver(VTEP))  # type: ignore[arg-type]
    sync.informer.items = {"n1": node("n1")}
    await sync.sync_once()
    assert client.patches == []


def test_only_changes_that_matter_to_routes_start_a_pass() -> None:
    sync = PeerSync(FakeClient(), "n0", FakeDriver({}))  # type: ignore[arg-type]
    a = {**node("n1", {"network.fleet.dev/public-ip": "198.18.1.11"}),
         "spec": {"podCIDR": "10.42.2.0/24"}, "status": {"conditions": [{"type": "Ready"}]}}
    heartbeat = {**a, "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": "t2"}]}}
    sync._on_event("MODIFIED", a, heartbeat)
    assert not sync._dirty.is_set()
    for etype, old, new in [
        ("MODIFIED", a, {**a, "spec": {"podCIDR": "10.42.3.0/24"}}),
        ("MODIFIED", a, node("n1", {"network.fleet.dev/public-ip": "198.18.1.12"})),
        ("MODIFIED", a, {**a, "metadata": {**a["metadata"], "deletionTimestamp": "t"}}),
        ("ADDED", None, a),
        ("DELETED", a, None),
    ]:
        sync._dirty = type(sync._dirty)()
        sync._on_event(etype, old, new)
        assert sync._dirty.is_set(), (etype, new)
