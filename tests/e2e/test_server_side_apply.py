"""Server-side apply with stock clients: kubectl 1.32 and the official Python client, against `fleet server`.

Two field managers applying one field, the conflict kubectl prints, `--force-conflicts`,
managedFields as `kubectl get --show-managed-fields` shows them, the client-side →
server-side apply upgrade, and `DynamicClient.server_side_apply`.  Results are checked
through the API too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.conftest import FleetServer
from tests.e2e.helpers import dump_all, get_obj

pytestmark = pytest.mark.e2e

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def deployment(name: str = "web", *, replicas: int = 1, image: str = "nginx:1.25") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": name, "image": image}]}}},
    }


def manifest(tmp_path: Path, obj: dict[str, Any], name: str = "m.yaml") -> str:
    p = tmp_path / name
    p.write_text(dump_all(obj))
    return str(p)


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e for e in obj["metadata"].get("managedFields") or []}


def test_two_managers_conflict_then_force(fleet_server: FleetServer, kubectl, namespace: str,  # type: ignore[no-untyped-def]
                                          tmp_path: Path) -> None:
    rc, out, err = kubectl("apply", "--server-side", "--field-manager", "a", "-n", namespace,
                           "-f", manifest(tmp_path, deployment(replicas=2), "a.yaml"))
    assert rc == 0, err
    assert "deployment.apps/web serverside-applied" in out
    rc, out, err = kubectl("apply", "--server-side", "--field-manager", "b", "-n", namespace,
                           "-f", manifest(tmp_path, deployment(replicas=3), "b.yaml"))
    assert rc == 1
    assert 'Apply failed with 1 conflict: conflict with "a": .spec.replicas' in err
    assert "--force-conflicts" in err  # kubectl's own advice follows kube's message
    assert get_obj(fleet_server, "Deployment", namespace, "web")["spec"]["replicas"] == 2
    rc, out, err = kubectl("apply", "--server-side", "--field-manager", "b", "--force-conflicts", "-n", namespace,
                           "-f", manifest(tmp_path, deployment(replicas=3), "b.yaml"))
    assert rc == 0, err
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert dep["spec"]["replicas"] == 3
    m = managers(dep)
    assert "f:replicas" in m[("b", "Apply")]["fieldsV1"]["f:spec"]
    assert "f:replicas" not in m[("a", "Apply")]["fieldsV1"]["f:spec"]
    assert "f:template" in m[("a", "Apply")]["fieldsV1"]["f:spec"]
    # kubectl shows both managers' entries.
    rc, out, err = kubectl("get", "deployment", "web", "-n", namespace, "-o", "yaml", "--show-managed-fields")
    assert rc == 0, err
    shown = {(e["manager"], e["operation"]) for e in yaml.safe_load(out)["metadata"]["managedFields"]}
    assert {("a", "Apply"), ("b", "Apply")} <= shown
    rc, out, err = kubectl("get", "deployment", "web", "-n", namespace, "-o", "yaml")
    assert rc == 0 and "managedFields" not in out  # hidden unless asked for, as with kube-apiserver


def test_server_side_dry_run_and_diff(fleet_server: FleetServer, kubectl, namespace: str,  # type: ignore[no-untyped-def]
                                      tmp_path: Path) -> None:
    path = manifest(tmp_path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                               "data": {"a": "1"}})
    rc, out, err = kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", path)
    assert rc == 0, err
    rc, out, err = kubectl("get", "configmap", "cfg", "-n", namespace)
    assert rc == 1 and "NotFound" in err
    rc, out, err = kubectl("apply", "--server-side", "-n", namespace, "-f", path)
    assert rc == 0, err
    m = managers(get_obj(fleet_server, "ConfigMap", namespace, "cfg"))
    assert m[("kubectl", "Apply")]["fieldsV1"] == {"f:data": {"f:a": {}}}
    changed = manifest(tmp_path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                                  "data": {"a": "2"}}, "changed.yaml")
    rc, out, err = kubectl("diff", "--server-side", "-n", namespace, "-f", changed)
    assert rc == 1, err  # kubectl diff: 1 means "differences found"
    assert '-  a: "1"' in out and '+  a: "2"' in out


def test_client_side_apply_then_server_side(fleet_server: FleetServer, kubectl, namespace: str,  # type: ignore[no-untyped-def]
                                            tmp_path: Path) -> None:
    rc, out, err = kubectl("apply", "-n", namespace, "-f", manifest(tmp_path, deployment(replicas=2), "1.yaml"))
    assert rc == 0, err
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert ("kubectl-client-side-apply", "Update") in managers(dep)
    assert LAST_APPLIED in dep["metadata"]["annotations"]
    # The upgrade: kubectl may take over what its last client-side apply set, without --force-conflicts.
    rc, out, err = kubectl("apply", "--server-side", "-n", namespace,
                           "-f", manifest(tmp_path, deployment(replicas=4, image="nginx:1.27"), "2.yaml"))
    assert rc == 0, err
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert dep["spec"]["replicas"] == 4
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
    m = managers(dep)
    assert "f:replicas" in m[("kubectl", "Apply")]["fieldsV1"]["f:spec"]
    # kubectl then migrates the client-side entry into its Apply entry (a JSON patch of managedFields).
    assert ("kubectl-client-side-apply", "Update") not in m
    assert json.loads(dep["metadata"]["annotations"][LAST_APPLIED])["spec"]["replicas"] == 4
    # And back: client-side apply still works on the object.
    rc, out, err = kubectl("apply", "-n", namespace, "-f", manifest(tmp_path, deployment(replicas=5), "3.yaml"))
    assert rc == 0, err
    assert get_obj(fleet_server, "Deployment", namespace, "web")["spec"]["replicas"] == 5


@pytest.fixture(scope="module")
def dynamic(fleet_server: FleetServer) -> Iterator[DynamicClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(fleet_server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        yield DynamicClient(api)


def test_python_client_server_side_apply(dynamic: DynamicClient, namespace: str) -> None:
    cms = dynamic.resources.get(api_version="v1", kind="ConfigMap")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "py", "namespace": namespace},
            "data": {"k": "v1"}}
    created = cms.server_side_apply(body=body, field_manager="py-a")
    assert created.data.k == "v1"
    assert [(e.manager, e.operation) for e in created.metadata.managedFields] == [("py-a", "Apply")]
    other = {**body, "data": {"k": "v2"}}
    with pytest.raises(ApiException) as e:
        cms.server_side_apply(body=other, field_manager="py-b")
    assert e.value.status == 409
    status = json.loads(e.value.body)
    assert status["details"]["causes"] == [{"reason": "FieldManagerConflict", "message": 'conflict with "py-a"',
                                            "field": ".data.k"}]
    forced = cms.server_side_apply(body=other, field_manager="py-b", force_conflicts=True)
    assert forced.data.k == "v2"
    assert {(e.manager, e.operation) for e in forced.metadata.managedFields} == {("py-b", "Apply")}
    # The typed API's updates are tracked too: the client's default manager is its User-Agent prefix.
    v1 = client.CoreV1Api(dynamic.client)
    v1.patch_namespaced_config_map("py", namespace, {"data": {"other": "x"}})
    got = v1.read_namespaced_config_map("py", namespace)
    assert ("OpenAPI-Generator", "Update") in {(e.manager, e.operation) for e in got.metadata.managed_fields}


def test_python_client_create_from_yaml_applies(dynamic: DynamicClient, namespace: str, tmp_path: Path) -> None:
    from kubernetes import utils

    path = tmp_path / "cm.yaml"
    path.write_text(dump_all({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "from-yaml"},
                              "data": {"k": "1"}}))
    for value in ("1", "2"):  # created, then applied again over itself
        path.write_text(path.read_text().replace("k: '1'", f"k: '{value}'").replace('k: "1"', f'k: "{value}"'))
        utils.create_from_yaml(dynamic.client, str(path), namespace=namespace, apply=True)
    got = client.CoreV1Api(dynamic.client).read_namespaced_config_map("from-yaml", namespace)
    assert got.data == {"k": "2"}
    assert [(e.manager, e.operation) for e in got.metadata.managed_fields] == [("python-client", "Apply")]
