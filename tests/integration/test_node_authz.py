"""Node authorization through the real request pipeline (in process): a node's
identity (`system:node:a` in `system:nodes`), the security assembly with
`--authorization-mode Node` (the Node authorizer after the masters bypass, its graph
fed by store watches) and the built-in admission chain (NodeRestriction).

Node a reads what its pods use and nothing of node b's; it writes its own Node,
Lease, CSINode, its pods' status and nothing of b's; and the requests the agent
itself makes (fleet/agent/node.py registration, status and lease, the CSINode sync,
pod status, final pod deletion, events) all pass as that node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fleet.agent.config import AgentConfig
from fleet.agent.csivolumes import NodeVolumes
from fleet.agent.node import NodeAgent
from fleet.auth import UserInfo
from fleet.client import MERGE_PATCH, ApiException, Client
from fleet.client.events import EventRecorder
from fleet.server.security import SecurityConfig
from fleet.testing.apiserver import InProcessAPI, open_api
from tests.integration.waiting import eventually

NODE_A_TOKEN, NODE_B_TOKEN = "node-a-token", "node-b-token"
TOKENS = {NODE_A_TOKEN: UserInfo("system:node:a", groups=("system:nodes",)),
          NODE_B_TOKEN: UserInfo("system:node:b", groups=("system:nodes",))}
NO_RELATION_A = "no relationship found between node 'a' and this object"


def pod(name: str, node: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], **spec}}


def secret(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"k": "v"}}


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[InProcessAPI]:
    async with open_api(tmp_path, builtin_admission=True, security=SecurityConfig(authorization_mode="Node"),
                        tokens=TOKENS) as api:
        yield api


@pytest.fixture
async def cluster(api: InProcessAPI) -> AsyncIterator[dict[str, Client]]:
    """Nodes a and b, each with a pod using its own Secret, ConfigMap and claim; and
    clients for the admin and both nodes."""
    async with api.client() as admin, api.client(NODE_A_TOKEN) as a, api.client(NODE_B_TOKEN) as b:
        for n in ("a", "b"):
            await admin.create("v1", "nodes", node(n))
            await admin.create("v1", "secrets", secret(f"{n}-secret"), "default")
            await admin.create("v1", "configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                                    "metadata": {"name": f"{n}-config"}, "data": {"x": "y"}},
                               "default")
            await admin.create("v1", "persistentvolumeclaims", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{n}-data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                         "storageClassName": ""}}, "default")
            await admin.create("v1", "pods", pod(
                f"{n}-pod", n, volumes=[{"name": "s", "secret": {"secretName": f"{n}-secret"}},
                                        {"name": "c", "configMap": {"name": f"{n}-config"}},
                                        {"name": "d", "persistentVolumeClaim": {"claimName": f"{n}-data"}}]),
                "default")
        # The graph follows the store: wait until node a's pod is in it.
        await eventually(lambda: a.get_object("v1", "secrets", "a-secret", "default"), "node a's secret readable")
        yield {"admin": admin, "a": a, "b": b}


async def refused(call: Any) -> ApiException:
    with pytest.raises(ApiException) as info:
        await call
    return info.value


async def test_a_node_reads_what_its_pods_use_and_nothing_else(cluster: dict[str, Client]) -> None:
    a = cluster["a"]
    assert (await a.get_object("v1", "secrets", "a-secret", "default"))["data"] == {"k": "dg=="}
    assert (await a.get_object("v1", "configmaps", "a-config", "default"))["data"] == {"x": "y"}
    assert (await a.get_object("v1", "persistentvolumeclaims", "a-data", "default"))["metadata"]["name"] == "a-data"
    # A list of one named object (how a kubelet follows a Secret) is a read of that object.
    listed = await a.list("v1", "secrets", "default", field_selector="metadata.name=a-secret")
    assert [s["metadata"]["name"] for s in listed["items"]] == ["a-secret"]

    e = await refused(a.get_object("v1", "secrets", "b-secret", "default"))
    assert e.code == 403
    assert e.message == ('secrets "b-secret" is forbidden: User "system:node:a" cannot get resource "secrets" in API group "" '
                         f'in the namespace "default": {NO_RELATION_A}')
    for call in (a.get_object("v1", "configmaps", "b-config", "default"),
                 a.get_object("v1", "persistentvolumeclaims", "b-data", "default"),
                 a.list("v1", "secrets", "default", field_selector="metadata.name=b-secret")):
        assert NO_RELATION_A in (await refused(call)).message
    e = await refused(a.list("v1", "secrets", "default"))
    assert e.code == 403 and e.message.endswith(": No Object name found")
    e = await refused(a.create("v1", "secrets", secret("mine"), "default"))
    assert e.code == 403 and e.message.endswith(": can only read resources of this type")
    # Node b, symmetrically.
    assert await cluster["b"].get_object("v1", "secrets", "b-secret", "default")
    assert (await refused(cluster["b"].get_object("v1", "secrets", "a-secret", "default"))).code == 403


async def test_access_ends_with_the_pod(cluster: dict[str, Client]) -> None:
    admin, a = cluster["admin"], cluster["a"]
    await admin.delete("v1", "pods", "a-pod", "default", body={"gracePeriodSeconds": 0})

    async def gone() -> bool:
        try:
            await a.get_object("v1", "secrets", "a-secret", "default")
        except ApiException as e:
            return e.code == 403
        return False

    await eventually(gone, "node a losing its secret with its pod")
    # A new pod bound to a, using b's secret, grants a that secret.
    await admin.create("v1", "pods", pod("a-pod-2", "a", volumes=[{"name": "s", "secret": {"secretName": "b-secret"}}]),
                       "default")
    await eventually(lambda: a.get_object("v1", "secrets", "b-secret", "default"), "node a reading b-secret")


async def test_a_node_writes_only_its_own_node(cluster: dict[str, Client]) -> None:
    a = cluster["a"]
    e = await refused(a.patch("v1", "nodes", "b", {"metadata": {"labels": {"x": "y"}}}, MERGE_PATCH))
    assert e.code == 403
    assert e.message == 'nodes "b" is forbidden: node "a" is not allowed to modify node "b"'
    e = await refused(a.patch("v1", "nodes", "b", {"status": {"phase": "Running"}}, MERGE_PATCH,
                              subresource="status"))
    assert e.message == 'nodes "b" is forbidden: node "a" is not allowed to modify node "b"'
    e = await refused(a.create("v1", "nodes", node("c")))
    assert e.message == 'nodes "c" is forbidden: node "a" is not allowed to modify node "c"'
    # Its own: labels of its domains yes, taints and node-restriction labels no.
    await a.patch("v1", "nodes", "a", {"metadata": {"labels": {"topology.kubernetes.io/zone": "z1"}}}, MERGE_PATCH)
    e = await refused(a.patch("v1", "nodes", "a", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
                              MERGE_PATCH))
    assert e.message == 'nodes "a" is forbidden: node "a" is not allowed to modify taints'
    e = await refused(a.patch("v1", "nodes", "a", {"metadata": {"labels": {"node-restriction.kubernetes.io/x": "1"}}},
                              MERGE_PATCH))
    assert e.message == 'nodes "a" is forbidden: is not allowed to modify labels: node-restriction.kubernetes.io/x'
    assert (await refused(a.delete("v1", "nodes", "a"))).code == 403  # not in the node rules


async def test_a_node_updates_its_own_lease_only(cluster: dict[str, Client]) -> None:
    admin, a = cluster["admin"], cluster["a"]
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "a"},
             "spec": {"holderIdentity": "a", "leaseDurationSeconds": 40}}
    await a.create("coordination.k8s.io/v1", "leases", lease, "kube-node-lease")
    await a.patch("coordination.k8s.io/v1", "leases", "a", {"spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}},
                  MERGE_PATCH, "kube-node-lease")
    await admin.create("coordination.k8s.io/v1", "leases", {**lease, "metadata": {"name": "b"}}, "kube-node-lease")
    e = await refused(a.patch("coordination.k8s.io/v1", "leases", "b", {"spec": {"holderIdentity": "a"}},
                              MERGE_PATCH, "kube-node-lease"))
    assert e.code == 403
    assert e.message.endswith(": can only access node lease with the same name as the requesting node")
    e = await refused(a.create("coordination.k8s.io/v1", "leases", {**lease, "metadata": {"name": "c"}},
                               "kube-node-lease"))
    assert e.message == ('leases.coordination.k8s.io "c" is forbidden: can only access node lease with the same '
                         "name as the requesting node")
    e = await refused(a.create("coordination.k8s.io/v1", "leases", lease, "default"))
    assert e.message.endswith(': can only access leases in the "kube-node-lease" system namespace')


async def test_a_node_touches_only_its_pods(cluster: dict[str, Client]) -> None:
    a = cluster["a"]
    status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    out = await a.patch("v1", "pods", "a-pod", status, MERGE_PATCH, "default", subresource="status")
    assert out["status"]["phase"] == "Running"
    e = await refused(a.patch("v1", "pods", "b-pod", status, MERGE_PATCH, "default", subresource="status"))
    assert e.message == ('pods "b-pod" is forbidden: node "a" can only update pod status for pods with '
                         "spec.nodeName set to itself")
    e = await refused(a.delete("v1", "pods", "b-pod", "default"))
    assert e.message == 'pods "b-pod" is forbidden: node "a" can only delete pods with spec.nodeName set to itself'
    e = await refused(a.create("v1", "pods", {"apiVersion": "policy/v1", "kind": "Eviction",
                                              "metadata": {"name": "b-pod", "namespace": "default"}},
                               "default", name="b-pod", subresource="eviction"))
    assert e.message == 'pods "b-pod" is forbidden: node a can only evict pods with spec.nodeName set to itself'
    e = await refused(a.create("v1", "pods", pod("sneaky", "a"), "default"))
    assert e.message.startswith('pods "sneaky" is forbidden: pod does not have "kubernetes.io/config.mirror"')
    e = await refused(a.patch("v1", "pods", "a-pod", {"metadata": {"labels": {"x": "y"}}}, MERGE_PATCH, "default"))
    assert e.code == 403  # pod updates are not in the node rules
    # The agent finishing a graceful deletion of its own pod (teardown.py).
    pod_a = await a.get_object("v1", "pods", "a-pod", "default")
    await cluster["admin"].delete("v1", "pods", "a-pod", "default")
    await a.delete("v1", "pods", "a-pod", "default", body={
        "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
        "preconditions": {"uid": pod_a["metadata"]["uid"]}})
    assert (await refused(cluster["admin"].get_object("v1", "pods", "a-pod", "default"))).code == 404


async def test_claim_status_and_volumes(cluster: dict[str, Client]) -> None:
    admin, a = cluster["admin"], cluster["a"]
    await admin.create("v1", "persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "vol-a"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "d.example.com", "volumeHandle": "h",
                         "nodeStageSecretRef": {"name": "stage-secret", "namespace": "default"}},
                 "claimRef": {"namespace": "default", "name": "a-data"}}})
    await admin.create("v1", "secrets", secret("stage-secret"), "default")
    await eventually(lambda: a.get_object("v1", "persistentvolumes", "vol-a"), "node a reading its volume")
    assert await a.get_object("v1", "secrets", "stage-secret", "default")
    assert (await refused(cluster["b"].get_object("v1", "persistentvolumes", "vol-a"))).code == 403
    out = await a.patch("v1", "persistentvolumeclaims", "a-data", {"status": {"capacity": {"storage": "1Gi"}}},
                        MERGE_PATCH, "default", subresource="status")
    assert out["status"]["capacity"] == {"storage": "1Gi"}
    e = await refused(a.patch("v1", "persistentvolumeclaims", "a-data", {"status": {"phase": "Lost"}},
                              MERGE_PATCH, "default", subresource="status"))
    assert e.message.startswith('persistentvolumeclaims "a-data" is forbidden: node "a" is not allowed to update '
                                "fields other than status.capacity and status.conditions")


async def test_the_agents_own_requests_pass_as_its_node(cluster: dict[str, Client], tmp_path: Path) -> None:
    """What fleet/agent does as node a: register (get + merge patch of its labels),
    post status, renew its Lease (create, then patch), sync its CSINode and the
    Node's CSI annotation, and record Events."""
    a = cluster["a"]
    cfg = AgentConfig(node_name="a", data_dir=tmp_path / "agent", address="10.0.0.1", driver="process")
    (tmp_path / "agent").mkdir()
    agent = NodeAgent(cfg, a, driver_name="process")
    registered = await agent.register()
    assert registered["metadata"]["labels"]["kubernetes.io/os"] == "linux"
    assert any(c["type"] == "Ready" for c in registered["status"]["conditions"])
    first = await agent.renew_lease_once()
    assert first["metadata"]["ownerReferences"][0]["name"] == "a"
    again = await agent.renew_lease_once()
    assert again["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]

    volumes = NodeVolumes(a, tmp_path / "agent", "a")
    await volumes.sync_csinode()
    csinode = await a.get_object("storage.k8s.io/v1", "csinodes", "a")
    assert csinode["metadata"]["ownerReferences"][0]["uid"] == registered["metadata"]["uid"]
    assert (await refused(a.get_object("storage.k8s.io/v1", "csinodes", "b"))).code == 403

    recorder = EventRecorder(a, "kubelet", host="a")
    pod_a = await a.get_object("v1", "pods", "a-pod", "default")
    await recorder.write_now(pod_a, "Normal", "Pulled", 'Container image "busybox" already present on machine')
    events = await cluster["admin"].list("v1", "events", "default")
    assert any(e["reason"] == "Pulled" for e in events["items"])

