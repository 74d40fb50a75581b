"""CustomResourceDefinitions with the real kubectl 1.32 against `fleet server`.

A CRD applied with kubectl is Established and its kind served by the generic REST, watch,
discovery, tables, patches, OpenAPI (explain) and garbage collection: printer columns,
the status and scale subresources, schema and CEL validation in kube's words, pruning,
server-side apply with the schema's list types, two versions with None conversion,
short names and categories, namespace deletion, and the CRD's own deletion (its
objects first).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer
from tests.e2e.helpers import dump_all

pytestmark = pytest.mark.e2e


def crd(group: str, *, plural: str = "crontabs", kind: str = "CronTab", scope: str = "Namespaced",
        versions: list[dict[str, Any]] | None = None, short: tuple[str, ...] = ("ct",),
        categories: tuple[str, ...] = ()) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.minReplicas <= self.replicas",
                                              "message": "replicas must be at least minReplicas",
                                              "fieldPath": ".replicas"}],
                "properties": {
                    "cronSpec": {"type": "string", "pattern": r"^(\d+|\*)(/\d+)?(\s+(\d+|\*)(/\d+)?){4}$"},
                    "image": {"type": "string"},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                    "minReplicas": {"type": "integer", "default": 0},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["name"],
                              "items": {"type": "object", "required": ["name"],
                                        "properties": {"name": {"type": "string"},
                                                       "port": {"type": "integer"}}}},
                },
            },
            "status": {"type": "object", "properties": {"replicas": {"type": "integer"},
                                                        "phase": {"type": "string"}}},
        },
    }
    versions = versions or [{
        "name": "v1", "served": True, "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                 "statusReplicasPath": ".status.replicas"}},
        "additionalPrinterColumns": [
            {"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"},
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }]
    names: dict[str, Any] = {"plural": plural, "singular": kind.lower(), "kind": kind,
                             "shortNames": list(short)}
    if categories:
        names["categories"] = list(categories)
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": scope, "names": names, "versions": versions}}


def unique_group() -> str:
    return f"g{uuid.uuid4().hex[:8]}.example.com"


def write(tmp_path: Path, *objs: dict[str, Any]) -> str:
    p = tmp_path / f"m-{uuid.uuid4().hex[:6]}.yaml"
    p.write_text(dump_all(*objs))
    return str(p)


def apply_crd(kubectl: Any, tmp_path: Path, obj: dict[str, Any]) -> None:
    rc, out, err = kubectl("apply", "-f", write(tmp_path, obj))
    assert rc == 0, err
    rc, out, err = kubectl("wait", "--for=condition=Established", "--timeout=30s",
                           f"crd/{obj['metadata']['name']}")
    assert rc == 0, err


def cron(group: str, name: str, version: str = "v1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{group}/{version}", "kind": "CronTab", "metadata": {"name": name},
            "spec": {"cronSpec": "* * * * */5", "image": "img", **spec}}


def test_crd_printer_columns_explain_status(kubectl, namespace: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    apply_crd(kubectl, tmp_path, crd(g))
    rc, out, err = kubectl("get", "crd", f"crontabs.{g}", "-o", "json")
    assert rc == 0, err
    st = json.loads(out)["status"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["NamesAccepted"]["reason"] == "NoConflicts"
    assert conds["Established"]["reason"] == "InitialNamesAccepted"
    assert st["acceptedNames"]["kind"] == "CronTab" and st["storedVersions"] == ["v1"]
    rc, out, err = kubectl("apply", "-n", namespace, "-f", write(tmp_path, cron(g, "c1", replicas=3)))
    assert rc == 0, err
    rc, out, err = kubectl("get", f"crontabs.{g}", "-n", namespace)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "SPEC", "REPLICAS", "AGE"], out
    assert lines[1].split()[:6] == ["c1", "*", "*", "*", "*", "*/5"][:6] or "c1" in lines[1]
    assert " 3 " in lines[1]
    rc, out, err = kubectl("get", f"crontabs.{g}", "-n", namespace, "-o", "wide")
    assert rc == 0, err
    assert out.splitlines()[0].split() == ["NAME", "SPEC", "REPLICAS", "PHASE", "AGE"], out
    # Defaults from the schema.
    rc, out, err = kubectl("get", f"crontabs.{g}", "c1", "-n", namespace, "-o", "json")
    obj = json.loads(out)
    assert obj["spec"]["minReplicas"] == 0 and obj["metadata"]["generation"] == 1
    # The status subresource: a main write keeps status; /status changes only status.
    rc, out, err = kubectl("patch", f"crontabs.{g}", "c1", "-n", namespace, "--subresource=status",
                           "--type=merge", "-p", '{"status":{"phase":"Running","replicas":3}}')
    assert rc == 0, err
    rc, out, err = kubectl("get", f"crontabs.{g}", "c1", "-n", namespace, "-o", "json")
    obj = json.loads(out)
    assert obj["status"] == {"phase": "Running", "replicas": 3}
    assert obj["metadata"]["generation"] == 1  # a status write is not a spec change
    rc, out, err = kubectl("patch", f"crontabs.{g}", "c1", "-n", namespace, "--type=merge",
                           "-p", '{"status":{"phase":"Lost"},"spec":{"image":"img2"}}')
    assert rc == 0, err
    obj = json.loads(kubectl("get", f"crontabs.{g}", "c1", "-n", namespace, "-o", "json")[1])
    assert obj["status"]["phase"] == "Running" and obj["spec"]["image"] == "img2"
    assert obj["metadata"]["generation"] == 2
    rc, out, err = kubectl("get", f"crontabs.{g}", "-n", namespace, "-o", "wide")
    assert "Running" in out
    rc, out, err = kubectl("patch", f"crontabs.{g}", "c1", "-n", namespace, "--subresource=status",
                           "--type=merge", "-p", '{"status":{"replicas":"many"}}')
    assert rc == 1
    assert 'status.replicas: Invalid value: "string": status.replicas in body must be of type integer' in err
    # explain reads the published schema.
    rc, out, err = kubectl("explain", f"crontabs.{g}.spec")
    assert rc == 0, err
    assert "cronSpec" in out and "replicas" in out and "<integer>" in out
    rc, out, err = kubectl("explain", f"crontabs.{g}")
    assert rc == 0, err
    assert f"GROUP:      {g}" in out and "KIND:       CronTab" in out


def test_crd_invalid_objects(kubectl, namespace: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    apply_crd(kubectl, tmp_path, crd(g))
    bad = cron(g, "bad", replicas=20)
    bad["spec"]["cronSpec"] = "nope"
    rc, out, err = kubectl("create", "-n", namespace, "-f", write(tmp_path, bad))
    assert rc == 1
    assert 'The CronTab "bad" is invalid' in err
    assert 'spec.cronSpec: Invalid value: "nope": spec.cronSpec in body should match' in err
    assert "spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10" in err
    # A CEL rule: its message at its fieldPath.
    rc, out, err = kubectl("create", "-n", namespace, "-f",
                           write(tmp_path, cron(g, "cel", replicas=2, minReplicas=5)))
    assert rc == 1
    assert "spec.replicas: Invalid value: \"object\": replicas must be at least minReplicas" in err
    # Unknown fields: pruned with a warning, refused under --validate=strict.
    rc, out, err = kubectl("create", "--validate=warn", "-n", namespace, "-f", write(tmp_path, cron(g, "extra", bogus=1)))
    assert rc == 0, err
    assert 'unknown field "spec.bogus"' in err
    obj = json.loads(kubectl("get", f"crontabs.{g}", "extra", "-n", namespace, "-o", "json")[1])
    assert "bogus" not in obj["spec"]
    rc, out, err = kubectl("create", "--validate=strict", "-n", namespace, "-f",
                           write(tmp_path, cron(g, "strict", bogus=1)))
    assert rc == 1
    assert 'strict decoding error: unknown field "spec.bogus"' in err
    # Strategic merge patch is refused for custom resources.
    rc, out, err = kubectl("patch", f"crontabs.{g}", "extra", "-n", namespace, "--type=strategic",
                           "-p", '{"spec":{"image":"x"}}')
    assert rc == 1 and "UnsupportedMediaType" in err or "415" in err or "not supported" in err


def test_non_structural_crd_lists_violations(kubectl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    obj = crd(g)
    s = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    s["properties"]["spec"]["properties"]["loose"] = {}
    s["properties"]["spec"]["properties"]["image"] = {"type": "string", "x-kubernetes-int-or-string": True}
    obj["spec"]["versions"][0]["additionalPrinterColumns"][0]["type"] = "color"
    rc, out, err = kubectl("create", "-f", write(tmp_path, obj))
    assert rc == 1
    assert f'The CustomResourceDefinition "crontabs.{g}" is invalid' in err
    assert ("spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[loose].type: "
            "Required value: must not be empty for specified object fields") in err
    assert 'spec.versions[0].additionalPrinterColumns[0].type: Unsupported value: "color"' in err
    # A wrong name is refused with kube's words.
    obj = crd(g)
    obj["metadata"]["name"] = "wrong.example.com"
    rc, out, err = kubectl("create", "-f", write(tmp_path, obj))
    assert rc == 1 and 'metadata.name: Invalid value: "wrong.example.com": must be spec.names.plural+"."+spec.group' in err


def test_crd_cel_cost_refused(kubectl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    obj = crd(g)
    spec = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["tags"] = {"type": "array", "items": {"type": "string"}}
    spec["x-kubernetes-validations"] = [{"rule": "self.tags.all(x, self.tags.exists_one(y, x == y))"}]
    rc, out, err = kubectl("create", "-f", write(tmp_path, obj))
    assert rc == 1
    assert "estimated rule cost exceeds budget" in err


def test_crd_server_side_apply_and_scale(kubectl, namespace: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    apply_crd(kubectl, tmp_path, crd(g))
    a = cron(g, "s1", ports=[{"name": "http", "port": 80}])
    rc, out, err = kubectl("apply", "--server-side", "--field-manager", "a", "-n", namespace, "-f", write(tmp_path, a))
    assert rc == 0, err
    b = {"apiVersion": f"{g}/v1", "kind": "CronTab", "metadata": {"name": "s1"},
         "spec": {"ports": [{"name": "https", "port": 443}]}}
    rc, out, err = kubectl("apply", "--server-side", "--field-manager", "b", "-n", namespace, "-f", write(tmp_path, b))
    assert rc == 0, err
    obj = json.loads(kubectl("get", f"crontabs.{g}", "s1", "-n", namespace, "-o", "json")[1])
    # A map list keyed by name: both managers' items are kept.
    assert sorted(p["name"] for p in obj["spec"]["ports"]) == ["http", "https"]
    rc, out, err = kubectl("scale", f"crontabs.{g}/s1", "-n", namespace, "--replicas=4")
    assert rc == 0, err
    assert "scaled" in out
    obj = json.loads(kubectl("get", f"crontabs.{g}", "s1", "-n", namespace, "-o", "json")[1])
    assert obj["spec"]["replicas"] == 4


def test_crd_watch_short_name_category(fleet_server: FleetServer, kubectl, namespace: str,  # type: ignore[no-untyped-def]
                                       tmp_path: Path) -> None:
    g = unique_group()
    short = "ct" + uuid.uuid4().hex[:4]
    cat = "cat" + uuid.uuid4().hex[:4]
    apply_crd(kubectl, tmp_path, crd(g, short=(short,), categories=(cat,)))
    rc, out, err = kubectl("create", "-n", namespace, "-f", write(tmp_path, cron(g, "w1")))
    assert rc == 0, err
    rc, out, err = kubectl("get", short, "-n", namespace)
    assert rc == 0 and "w1" in out, err
    rc, out, err = kubectl("get", cat, "-n", namespace)
    assert rc == 0 and "w1" in out.split(), (out, err)
    rc, out, err = kubectl("api-resources", "--api-group", g)
    assert rc == 0 and short in out and "CronTab" in out, err
    proc = subprocess.Popen([KUBECTL, "--kubeconfig", str(fleet_server.kubeconfig), "get", short, "-n", namespace,
                             "-w", "--request-timeout=8s", "-o", "name"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        rc, out, err = kubectl("create", "-n", namespace, "-f", write(tmp_path, cron(g, "w2")))
        assert rc == 0, err
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"crontab.{g}/w1" in out and f"crontab.{g}/w2" in out


def test_crd_two_versions_none_conversion(kubectl, namespace: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    schema = {"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
    versions = [{"name": "v1beta1", "served": True, "storage": False, "schema": {"openAPIV3Schema": schema}},
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}]
    apply_crd(kubectl, tmp_path, crd(g, versions=versions))
    rc, out, err = kubectl("create", "-n", namespace, "-f", write(tmp_path, cron(g, "old", version="v1beta1")))
    assert rc == 0, err
    for v in ("v1", "v1beta1"):
        rc, out, err = kubectl("get", f"crontabs.{v}.{g}", "old", "-n", namespace, "-o", "json")
        assert rc == 0, err
        assert json.loads(out)["apiVersion"] == f"{g}/{v}"
    rc, out, err = kubectl("get", f"crontabs.v1beta1.{g}", "-n", namespace, "-o", "json")
    assert rc == 0, err
    assert [i["apiVersion"] for i in json.loads(out)["items"]] == [f"{g}/v1beta1"]
    st = json.loads(kubectl("get", "crd", f"crontabs.{g}", "-o", "json")[1])["status"]
    assert st["storedVersions"] == ["v1"]


def test_crd_deletion_removes_objects_first(kubectl, namespace: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    apply_crd(kubectl, tmp_path, crd(g))
    for n in ("d1", "d2"):
        rc, out, err = kubectl("create", "-n", namespace, "-f", write(tmp_path, cron(g, n)))
        assert rc == 0, err
    rc, out, err = kubectl("delete", "crd", f"crontabs.{g}", "--timeout=60s")
    assert rc == 0, err
    rc, out, err = kubectl("get", "crd", f"crontabs.{g}")
    assert rc == 1 and "NotFound" in err
    rc, out, err = kubectl("api-resources", "--api-group", g)
    assert "CronTab" not in out


def test_crd_namespace_deletion_and_gc(kubectl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    g = unique_group()
    apply_crd(kubectl, tmp_path, crd(g))
    ns = "crd-ns-" + uuid.uuid4().hex[:6]
    rc, out, err = kubectl("create", "namespace", ns)
    assert rc == 0, err
    rc, out, err = kubectl("create", "-n", ns, "-f", write(tmp_path, cron(g, "owner")))
    assert rc == 0, err
    owner = json.loads(kubectl("get", f"crontabs.{g}", "owner", "-n", ns, "-o", "json")[1])
    child = cron(g, "child")
    child["metadata"]["ownerReferences"] = [{"apiVersion": f"{g}/v1", "kind": "CronTab", "name": "owner",
                                             "uid": owner["metadata"]["uid"]}]
    rc, out, err = kubectl("create", "-n", ns, "-f", write(tmp_path, child))
    assert rc == 0, err
    rc, out, err = kubectl("delete", f"crontabs.{g}", "owner", "-n", ns, "--wait=false")
    assert rc == 0, err
    # The garbage collector finds new kinds by rediscovery (every 30 s).
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        rc, out, err = kubectl("get", f"crontabs.{g}", "child", "-n", ns)
        if rc == 1 and "NotFound" in err:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the dependent CronTab was not garbage collected")
    rc, out, err = kubectl("create", "-n", ns, "-f", write(tmp_path, cron(g, "left")))
    assert rc == 0, err
    rc, out, err = kubectl("delete", "namespace", ns, "--timeout=90s")
    assert rc == 0, err
    rc, out, err = kubectl("get", f"crontabs.{g}", "-A", "-o", "name")
    assert rc == 0 and out.strip() == "", out
