"""The provisioner against a real `fleet server` running in this process.

Two fake drivers are registered in the test (outside `fleet/storage`, as a
third-party plugin would be): a central one, served by the server's own
provisioner (a controller of its controller manager), and a node-local one with
capacity tracking, served by a node instance (`run_node_provisioner`) started here
for a node "node-x" — what a real agent runs.  The claims carry the
`volume.kubernetes.io/storage-provisioner` annotation the PV controller sets.

Shown: a claim gets its PV (pre-bound, provisioned-by, csi source, node affinity)
and the external-provisioner's Events; the PV controller binds it; growing the
claim grows the volume and the claim's capacity; deleting the claim deletes the
volume and its PV; a claim larger than the node gives its selected node back with a
ProvisioningFailed event naming why; CSIStorageCapacity objects are published in
kube-system.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.client import MERGE_PATCH, ApiException, Client, ClientConfig
from fleet.network.cluster_dns import ClusterDNSConfig
from fleet.network.ingress import IngressConfig
from fleet.server import run as server_run
from fleet.storage import registry
from fleet.storage.driver import Capabilities, DriverEnv
from fleet.storage.provisioner import run_node_provisioner
from tests.conftest import free_port
from tests.integration.waiting import eventually
from tests.unit.storage.fakes import FakeDriver

CENTRAL = "central.fleet.test"
LOCAL = "local.fleet.test"
STORAGE = "storage.k8s.io/v1"
NS = "default"




class Drivers:
    def __init__(self) -> None:
        self.made: dict[tuple[str, str | None], FakeDriver] = {}

    def factory(self, name: str, caps: Capabilities, **kw: Any) -> Callable[[DriverEnv], FakeDriver]:
        def make(env: DriverEnv) -> FakeDriver:
            d = self.made[(name, env.node_name)] = FakeDriver(name, caps, env=env, **kw)
            return d
        return make


@pytest.fixture
def drivers(monkeypatch: pytest.MonkeyPatch) -> Drivers:
    # The in-tree drivers register when first imported: import them into the real
    # table now, or the server started below would register them into the copy only,
    # and later tests in this process would find no hostpath.fleet.dev.
    registry.load_plugins()
    monkeypatch.setattr(registry, "_factories", dict(registry._factories))
    d = Drivers()
    registry.register(CENTRAL, d.factory(CENTRAL, Capabilities(expansion="online"), node_expansion=False))
    registry.register(LOCAL, d.factory(LOCAL, Capabilities(
        node_local=True, topology_keys=("kubernetes.io/hostname",), capacity_tracking=True),
        free_bytes=8 * 2**30))
    return d


@pytest.fixture
async def client(tmp_path: Path, drivers: Drivers) -> AsyncIterator[Client]:
    cfg = server_run.ServerConfig(data_dir=tmp_path / "server", port=free_port(), metrics_port=free_port(),
                                  agent=False, scheduler=False, sync="NORMAL",
                                  dns=ClusterDNSConfig(bind=""), ingress=IngressConfig(enabled=False))
    async with trio.open_nursery() as n:
        info = await n.start(server_run.run, cfg)
        async with Client(ClientConfig(server=info.url, token=info.token, ca_data=info.ca_pem)) as c:
            yield c
        n.cancel_scope.cancel()


def storage_class(name: str, provisioner: str, mode: str) -> dict[str, Any]:
    return {"apiVersion": STORAGE, "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "volumeBindingMode": mode, "reclaimPolicy": "Delete",
            "allowVolumeExpansion": True}


def claim(name: str, provisioner: str, cls: str, size: str, node: str | None = None) -> dict[str, Any]:
    ann = {"volume.kubernetes.io/storage-provisioner": provisioner}
    if node:
        ann["volume.kubernetes.io/selected-node"] = node
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS, "annotations": ann},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": cls,
                     "resources": {"requests": {"storage": size}}}}


async def events_of(client: Client, name: str) -> list[tuple[str, str, str]]:
    items = (await client.list("v1", "events", NS)).get("items") or []
    return [(e["reason"], e["message"], (e.get("source") or {}).get("component", "")) for e in items
            if (e.get("involvedObject") or {}).get("name") == name]


async def get(client: Client, plural: str, name: str, ns: str | None = None,
              api_version: str = "v1") -> dict[str, Any] | None:
    try:
        return await client.get_object(api_version, plural, name, ns)
    except ApiException as e:
        if e.code == 404:
            return None
        raise


async def test_central_driver_claim_lifecycle(client: Client, drivers: Drivers) -> None:
    await client.create(STORAGE, "storageclasses", storage_class("fake-central", CENTRAL, "Immediate"))
    made = await client.create("v1", "persistentvolumeclaims", claim("data", CENTRAL, "fake-central", "1Gi"), NS)
    pv_name = f"pvc-{made['metadata']['uid']}"
    pv = await eventually(lambda: get(client, "persistentvolumes", pv_name), "the PV")
    assert pv["spec"]["claimRef"]["uid"] == made["metadata"]["uid"]
    assert pv["spec"]["csi"]["driver"] == CENTRAL
    assert pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == CENTRAL
    assert "external-provisioner.volume.kubernetes.io/finalizer" in pv["metadata"]["finalizers"]
    evs = await eventually(lambda: events_of(client, "data"), "events")
    assert ("Provisioning", 'External provisioner is provisioning volume for claim "default/data"',
            f"{CENTRAL}_fleet-server") in evs
    await eventually(lambda: _has(events_of(client, "data"), "ProvisioningSucceeded"), "ProvisioningSucceeded")
    # The PV controller binds the pre-bound pair.
    await eventually(lambda: _phase(client, "data", "Bound"), "the claim Bound")
    # Expansion: the driver needs no node step, so the claim's capacity follows at once.
    await client.patch("v1", "persistentvolumeclaims", "data",
                       {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}, MERGE_PATCH, NS)
    await eventually(lambda: _capacity(client, "data", "2Gi"), "capacity 2Gi")
    pv = await get(client, "persistentvolumes", pv_name)
    assert pv is not None and pv["spec"]["capacity"]["storage"] == "2Gi"
    # Delete reclaim: the volume and its PV go with the claim.
    central = drivers.made[(CENTRAL, None)]
    assert list(central.volumes) == [pv_name]
    await client.delete("v1", "persistentvolumeclaims", "data", NS)
    await eventually(lambda: _gone(client, "persistentvolumes", pv_name), "the PV deleted")
    assert central.volumes == {}


async def test_node_local_driver(client: Client, drivers: Drivers, tmp_path: Path) -> None:
    await client.create(STORAGE, "storageclasses", storage_class("fake-local", LOCAL, "WaitForFirstConsumer"))
    async with trio.open_nursery() as n:
        prov = await n.start(lambda task_status: run_node_provisioner(
            client, node_name="node-x", node_labels={"kubernetes.io/hostname": "node-x"},
            data_dir=tmp_path / "agent", task_status=task_status))
        assert prov is not None and LOCAL in prov.drivers and CENTRAL not in prov.drivers
        # Capacity of the node for the class, in kube-system.
        caps = await eventually(lambda: _capacities(client), "a CSIStorageCapacity")
        assert caps == {("node-x", "fake-local"): "8Gi"}
        made = await client.create("v1", "persistentvolumeclaims",
                                   claim("local", LOCAL, "fake-local", "1Gi", node="node-x"), NS)
        pv = await eventually(lambda: get(client, "persistentvolumes", f"pvc-{made['metadata']['uid']}"), "PV")
        assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-x"]}]
        await eventually(lambda: _eq(_capacities(client), {("node-x", "fake-local"): "7Gi"}), "capacity down")
        # More than the node has: Pending, an event naming why, the node given back.
        await client.create("v1", "persistentvolumeclaims",
                            claim("huge", LOCAL, "fake-local", "100Gi", node="node-x"), NS)
        await eventually(lambda: _unselected(client, "huge"), "selected-node removed")
        evs = await events_of(client, "huge")
        assert any(r == "ProvisioningFailed" and "ResourceExhausted" in m and "not enough space" in m
                   for r, m, _ in evs), evs
        huge = await get(client, "persistentvolumeclaims", "huge", NS)
        assert huge is not None and huge["status"]["phase"] == "Pending"
        n.cancel_scope.cancel()


async def _has(evs: Awaitable[list[tuple[str, str, str]]], reason: str) -> bool:
    return any(r == reason for r, _, _ in await evs)


async def _phase(client: Client, name: str, phase: str) -> bool:
    c = await get(client, "persistentvolumeclaims", name, NS)
    return c is not None and (c.get("status") or {}).get("phase") == phase


async def _capacity(client: Client, name: str, size: str) -> bool:
    c = await get(client, "persistentvolumeclaims", name, NS)
    return c is not None and ((c.get("status") or {}).get("capacity") or {}).get("storage") == size


async def _gone(client: Client, plural: str, name: str) -> bool:
    return await get(client, plural, name) is None


async def _unselected(client: Client, name: str) -> bool:
    c = await get(client, "persistentvolumeclaims", name, NS)
    return c is not None and "volume.kubernetes.io/selected-node" not in (c["metadata"].get("annotations") or {})


async def _capacities(client: Client) -> dict[tuple[str, str], str]:
    items = (await client.list(STORAGE, "csistoragecapacities", "kube-system")).get("items") or []
    return {(o["nodeTopology"]["matchLabels"]["kubernetes.io/hostname"], o["storageClassName"]): o.get("capacity")
            for o in items if (o["metadata"].get("labels") or {}).get("csi.storage.k8s.io/drivername") == LOCAL}


async def _eq(got: Awaitable[Any], want: Any) -> bool:
    return await got == want
