"""The status fields kube-apiserver always serializes (KindInfo.zero_status): what Go's
encoding/json writes for a kind's zero status struct — fields without omitempty, nested
structs — on every stored object, so clients whose models require them can read it."""

from __future__ import annotations

import pytest

from fleet.testing.apiserver import open_api

NS = "/namespaces/default"
TEMPLATE = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
JOB_TEMPLATE = {"metadata": {}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
SEL = {"matchLabels": {"a": "b"}}

CASES = [
    ("/api/v1" + NS + "/services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                                    "spec": {"ports": [{"port": 80}]}}, {"loadBalancer": {}}),
    ("/apis/apps/v1" + NS + "/deployments",
     {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
      "spec": {"selector": SEL, "template": TEMPLATE}}, {}),
    ("/apis/apps/v1" + NS + "/replicasets",
     {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r"},
      "spec": {"selector": SEL, "template": TEMPLATE}}, {"replicas": 0}),
    ("/apis/apps/v1" + NS + "/statefulsets",
     {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "st"},
      "spec": {"selector": SEL, "template": TEMPLATE, "serviceName": "st"}},
     {"replicas": 0, "availableReplicas": 0}),
    ("/apis/apps/v1" + NS + "/daemonsets",
     {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"},
      "spec": {"selector": SEL, "template": TEMPLATE}},
     {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0}),
    ("/api/v1" + NS + "/replicationcontrollers",
     {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc"},
      "spec": {"selector": {"a": "b"}, "template": TEMPLATE}}, {"replicas": 0}),
    ("/apis/batch/v1" + NS + "/jobs",
     {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": JOB_TEMPLATE}}, {}),
    ("/apis/batch/v1" + NS + "/cronjobs",
     {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
      "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": JOB_TEMPLATE}}}}, {}),
    ("/apis/policy/v1" + NS + "/poddisruptionbudgets",
     {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb"},
      "spec": {"selector": SEL, "minAvailable": 1}},
     {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}),
    ("/apis/networking.k8s.io/v1" + NS + "/ingresses",
     {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "i"},
      "spec": {"defaultBackend": {"service": {"name": "s", "port": {"number": 80}}}}}, {"loadBalancer": {}}),
]


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


@pytest.mark.parametrize(("path", "obj", "zero"), CASES, ids=[c[1]["kind"] for c in CASES])
async def test_new_objects_carry_the_zero_status(api, path, obj, zero) -> None:  # type: ignore[no-untyped-def]
    # A client's status on create is dropped (PrepareForCreate), and the zero status stored.
    code, made = await api.json("POST", path, {**obj, "status": {"bogus": 1}})
    assert code == 201, made
    assert made["status"] == zero
    code, got = await api.json("GET", f"{path}/{obj['metadata']['name']}")
    assert got["status"] == zero


async def test_a_status_write_keeps_the_fields(api) -> None:  # type: ignore[no-untyped-def]
    path, obj, _ = CASES[4]  # DaemonSet
    await api.json("POST", path, obj)
    code, got = await api.json("PATCH", f"{path}/ds/status", {"status": {"numberReady": 2}},
                               content_type="application/merge-patch+json")
    assert code == 200 and got["status"]["numberReady"] == 2
    code, cur = await api.json("GET", f"{path}/ds")
    code, got = await api.json("PUT", f"{path}/ds/status", {**cur, "status": {"numberReady": 1}})
    assert code == 200
    assert got["status"] == {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0,
                             "numberReady": 1}


async def test_a_node_gets_the_nested_zero_structs(api) -> None:  # type: ignore[no-untyped-def]
    # A Node keeps the status its creator sends (status_on_create); what it lacks of
    # NodeStatus's nested structs is filled in, field by field.
    code, made = await api.json("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"nodeInfo": {"kubeletVersion": "v1.32.0"}, "capacity": {"cpu": "2"}}})
    assert code == 201, made
    st = made["status"]
    assert st["capacity"] == {"cpu": "2"}
    assert st["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 0}}
    assert st["nodeInfo"]["kubeletVersion"] == "v1.32.0"
    assert st["nodeInfo"]["machineID"] == "" and len(st["nodeInfo"]) == 10
