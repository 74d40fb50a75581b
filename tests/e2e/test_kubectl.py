"""kubectl 1.32, unmodified, against a real `fleet server`.

Each test works in its own namespace on one server shared by the module.  Results
are checked through the API (not only through kubectl's own output), so a command
that "succeeds" without storing the right thing fails here.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import KUBECTL, FleetServer, create_namespace, run_kubectl
from tests.e2e.helpers import (
    api_create,
    api_get,
    assert_absent,
    container,
    dump_all,
    env_of,
    get_obj,
    wait_until,
)

pytestmark = pytest.mark.e2e

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def deployment(name: str = "web", *, env_value: str = "bar", version: str = "v1",
               image: str = "nginx:1.25", replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name, "version": version}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": name,
                            "image": image,
                            "ports": [{"containerPort": 8080}],
                            "env": [{"name": "FOO", "value": env_value},
                                    {"name": "KEEP", "value": "same"}],
                        }
                    ]
                },
            },
        },
    }


def service(name: str = "web") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
        },
    }


def configmap(name: str = "web-config", **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "data": data or {"greeting": "hello"},
    }


def secret(name: str = "web-secret") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": {"password": base64.b64encode(b"s3cret").decode()},
    }


def write_manifest(tmp_path: Path, *docs: dict[str, Any], name: str = "app.yaml") -> Path:
    p = tmp_path / name
    p.write_text(dump_all(*docs))
    return p


def ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0, f"kubectl failed rc={rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def apply_app(kubectl, tmp_path: Path, ns: str) -> Path:  # type: ignore[no-untyped-def]
    path = write_manifest(tmp_path, deployment(), service(), configmap(), secret())
    ok(kubectl("apply", "-n", ns, "-f", str(path)))
    return path


# -- apply -------------------------------------------------------------------------------


def test_apply_creates_all_kinds(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    path = write_manifest(tmp_path, deployment(), service(), configmap(), secret())
    out = ok(kubectl("apply", "-n", namespace, "-f", str(path)))
    assert "deployment.apps/web created" in out
    assert "service/web created" in out
    assert "configmap/web-config created" in out
    assert "secret/web-secret created" in out

    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert dep["metadata"]["namespace"] == namespace
    assert dep["spec"]["replicas"] == 2
    assert env_of(container(dep, "web")) == {"FOO": "bar", "KEEP": "same"}
    applied = json.loads(dep["metadata"]["annotations"][LAST_APPLIED])
    assert applied["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == "bar"
    assert dep["metadata"]["uid"] and dep["metadata"]["resourceVersion"]
    assert dep["metadata"]["creationTimestamp"]

    svc = get_obj(fleet_server, "Service", namespace, "web")
    assert svc["spec"]["selector"] == {"app": "web"}
    assert svc["spec"]["ports"][0]["port"] == 80

    cm = get_obj(fleet_server, "ConfigMap", namespace, "web-config")
    assert cm["data"] == {"greeting": "hello"}

    sec = get_obj(fleet_server, "Secret", namespace, "web-secret")
    assert base64.b64decode(sec["data"]["password"]) == b"s3cret"

    # Applying the same manifest again changes nothing.
    out = ok(kubectl("apply", "-n", namespace, "-f", str(path)))
    assert "deployment.apps/web unchanged" in out
    assert "configmap/web-config unchanged" in out
    # (Compared by generation and spec: the Deployment controller writes status meanwhile.)
    again = get_obj(fleet_server, "Deployment", namespace, "web")
    assert again["metadata"]["generation"] == dep["metadata"]["generation"]
    assert again["spec"] == dep["spec"]


def test_reapply_patches_three_way(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    apply_app(kubectl, tmp_path, namespace)
    before = get_obj(fleet_server, "Deployment", namespace, "web")

    # A change made outside the manifest (by another client) must survive the re-apply.
    with fleet_server.client() as c:
        r = c.patch(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/web",
            content=json.dumps({"metadata": {"annotations": {"owner": "someone-else"}}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text

    path = write_manifest(
        tmp_path, deployment(env_value="baz", version="v2"), service(), configmap(), secret(),
        name="app-v2.yaml",
    )
    out = ok(kubectl("apply", "-n", namespace, "-f", str(path)))
    assert "deployment.apps/web configured" in out
    assert "service/web unchanged" in out

    after = get_obj(fleet_server, "Deployment", namespace, "web")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    assert after["metadata"]["labels"] == {"app": "web", "version": "v2"}
    web = container(after, "web")
    assert env_of(web) == {"FOO": "baz", "KEEP": "same"}
    # Fields the edit did not touch are kept.
    assert web["image"] == "nginx:1.25"
    assert web["ports"][0]["containerPort"] == 8080
    assert after["spec"]["replicas"] == 2
    assert after["metadata"]["annotations"]["owner"] == "someone-else"
    applied = json.loads(after["metadata"]["annotations"][LAST_APPLIED])
    assert applied["metadata"]["labels"]["version"] == "v2"
    assert applied["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == "baz"
    # A spec change bumps the generation.
    assert after["metadata"]["generation"] > before["metadata"]["generation"]


# -- get ---------------------------------------------------------------------------------


def _header(out: str) -> list[str]:
    return out.splitlines()[0].split()


def test_get_wide_all_yaml_labels_selector(
    fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path
) -> None:
    apply_app(kubectl, tmp_path, namespace)
    other = deployment("other")
    api_create(fleet_server, "Deployment", namespace, other)

    out = ok(kubectl("get", "deploy,svc,cm", "-n", namespace, "-o", "wide"))
    blocks = [b for b in out.split("\n\n") if b.strip()]
    by_first_row = {b.splitlines()[1].split()[0]: b for b in blocks}
    dep_block = by_first_row.get("deployment.apps/other") or by_first_row["deployment.apps/web"]
    for col in ("NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"):
        assert col in _header(dep_block), dep_block
    web_row = next(line for line in dep_block.splitlines() if line.startswith("deployment.apps/web "))
    assert "nginx:1.25" in web_row and "app=web" in web_row
    svc_block = by_first_row["service/web"]
    for col in ("TYPE", "CLUSTER-IP", "PORT(S)", "SELECTOR"):
        assert col in _header(svc_block), svc_block
    assert "80/TCP" in svc_block and "ClusterIP" in svc_block
    cm_block = next(b for b in blocks if "configmap/web-config" in b)
    assert "DATA" in _header(cm_block)

    out = ok(kubectl("get", "all", "-A"))
    assert "NAMESPACE" in _header(out)
    ns_lines = [line for line in out.splitlines() if line.startswith(namespace + " ")]
    names = {line.split()[1] for line in ns_lines}
    assert {"deployment.apps/web", "deployment.apps/other", "service/web"} <= names, out

    y = yaml.safe_load(ok(kubectl("get", "deploy", "web", "-n", namespace, "-o", "yaml")))
    assert y["kind"] == "Deployment" and y["apiVersion"] == "apps/v1"
    assert y["metadata"]["name"] == "web" and y["spec"]["replicas"] == 2

    j = json.loads(ok(kubectl("get", "deploy", "-n", namespace, "-o", "json")))
    assert sorted(i["metadata"]["name"] for i in j["items"]) == ["other", "web"]

    out = ok(kubectl("get", "deploy", "-n", namespace, "--show-labels"))
    assert "LABELS" in _header(out)
    web_line = next(line for line in out.splitlines() if line.startswith("web "))
    assert "app=web" in web_line and "version=v1" in web_line

    out = ok(kubectl("get", "deploy", "-n", namespace, "-l", "app=web"))
    rows = [line.split()[0] for line in out.splitlines()[1:]]
    assert rows == ["web"], out
    out = ok(kubectl("get", "deploy", "-n", namespace, "-l", "app!=web", "-o", "name"))
    assert out.split() == ["deployment.apps/other"], out

    out = ok(kubectl("get", "deploy", "-n", namespace, "--field-selector", "metadata.name=other",
                     "-o", "name"))
    assert out.split() == ["deployment.apps/other"], out


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "watched"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"]}]},
    }


def test_get_pods_watch_sees_new_pods(fleet_server: FleetServer, namespace: str, tmp_path: Path) -> None:
    assert KUBECTL
    api_create(fleet_server, "Pod", namespace, pod("first"))
    out_path = tmp_path / "watch.out"
    err_path = tmp_path / "watch.err"
    argv = [KUBECTL, "--kubeconfig", str(fleet_server.kubeconfig),
            "--cache-dir", str(fleet_server.data_dir.parent / "kubectl-cache"),
            "get", "pods", "-n", namespace, "-w"]
    with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
        proc = subprocess.Popen(argv, stdout=out_f, stderr=err_f, stdin=subprocess.DEVNULL)
        try:
            # The initial list shows the existing pod; after that, new pods can only come
            # from the watch.
            wait_until(lambda: "first" in out_path.read_text(), timeout=20,
                       what=f"initial list in kubectl -w output (stderr: {err_path.read_text()})")
            assert proc.poll() is None, err_path.read_text()
            api_create(fleet_server, "Pod", namespace, pod("second"))
            wait_until(lambda: "second" in out_path.read_text(), timeout=20,
                       what=f"the new pod in kubectl -w output (stderr: {err_path.read_text()})")
            with fleet_server.client() as c:
                r = c.patch(
                    f"/api/v1/namespaces/{namespace}/pods/second",
                    content=json.dumps({"metadata": {"labels": {"touched": "yes"}}}),
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                assert r.status_code == 200, r.text
            # A modification is printed as another row for the same pod.
            wait_until(lambda: out_path.read_text().count("second") >= 2, timeout=20,
                       what="the modified pod in kubectl -w output")
            assert proc.poll() is None, f"kubectl -w exited early: {err_path.read_text()}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    lines = out_path.read_text().splitlines()
    assert lines[0].split()[:3] == ["NAME", "READY", "STATUS"], lines


# -- label / annotate / patch / edit / scale ----------------------------------------------


def test_label_annotate_and_patches(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    apply_app(kubectl, tmp_path, namespace)

    out = ok(kubectl("label", "deploy", "web", "-n", namespace, "team=blue"))
    assert "deployment.apps/web labeled" in out
    out = ok(kubectl("annotate", "deploy", "web", "-n", namespace, "note=hello world"))
    assert "deployment.apps/web annotated" in out
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert dep["metadata"]["labels"]["team"] == "blue"
    assert dep["metadata"]["labels"]["app"] == "web"
    assert dep["metadata"]["annotations"]["note"] == "hello world"

    # Removing a label.
    ok(kubectl("label", "deploy", "web", "-n", namespace, "team-"))
    assert "team" not in get_obj(fleet_server, "Deployment", namespace, "web")["metadata"]["labels"]

    # Relabel without --overwrite is refused.
    rc, _, err = kubectl("label", "deploy", "web", "-n", namespace, "app=other")
    assert rc != 0 and "already has a value" in err, err

    out = ok(kubectl("patch", "deploy", "web", "-n", namespace, "--type", "merge",
                     "-p", '{"spec":{"replicas":3},"metadata":{"labels":{"version":null}}}'))
    assert "deployment.apps/web patched" in out
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert dep["spec"]["replicas"] == 3
    assert "version" not in dep["metadata"]["labels"]

    ok(kubectl("patch", "deploy", "web", "-n", namespace, "--type", "json", "-p", json.dumps([
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "nginx:1.26"},
        {"op": "add", "path": "/metadata/labels/jp", "value": "yes"},
    ])))
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert container(dep, "web")["image"] == "nginx:1.26"
    assert dep["metadata"]["labels"]["jp"] == "yes"

    # A failed JSON-patch `test` op changes nothing.
    generation, spec = dep["metadata"]["generation"], dep["spec"]
    rc, _, err = kubectl("patch", "deploy", "web", "-n", namespace, "--type", "json", "-p", json.dumps([
        {"op": "test", "path": "/spec/replicas", "value": 99},
        {"op": "replace", "path": "/spec/replicas", "value": 7},
    ]))
    assert rc != 0, err
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert dep["spec"] == spec and dep["metadata"]["generation"] == generation

    # Strategic merge: containers merge by name, env by name.
    ok(kubectl("patch", "deploy", "web", "-n", namespace, "--type", "strategic", "-p", json.dumps(
        {"spec": {"template": {"spec": {"containers": [
            {"name": "sidecar", "image": "busybox:1.36"},
            {"name": "web", "env": [{"name": "EXTRA", "value": "1"}]},
        ]}}}}
    )))
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    names = sorted(c["name"] for c in dep["spec"]["template"]["spec"]["containers"])
    assert names == ["sidecar", "web"]
    web = container(dep, "web")
    assert web["image"] == "nginx:1.26"
    assert env_of(web) == {"FOO": "bar", "KEEP": "same", "EXTRA": "1"}
    assert container(dep, "sidecar")["image"] == "busybox:1.36"

    # Strategic merge `$patch: delete` removes one keyed element.
    ok(kubectl("patch", "deploy", "web", "-n", namespace, "-p", json.dumps(
        {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}}}
    )))
    dep = get_obj(fleet_server, "Deployment", namespace, "web")
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["web"]
    assert "$patch" not in json.dumps(dep)


def test_edit_with_editor_script(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    api_create(fleet_server, "ConfigMap", namespace, configmap("edited", greeting="hello"))
    editor = tmp_path / "editor.py"
    editor.write_text(
        f"#!{sys.executable}\n"
        "import sys, yaml\n"
        "path = sys.argv[-1]\n"
        "obj = yaml.safe_load(open(path))\n"
        "obj['data']['greeting'] = 'edited-by-script'\n"
        "obj['metadata'].setdefault('labels', {})['edited'] = 'yes'\n"
        "open(path, 'w').write(yaml.safe_dump(obj))\n"
    )
    editor.chmod(editor.stat().st_mode | stat.S_IXUSR)
    out = ok(kubectl("edit", "cm", "edited", "-n", namespace,
                     env={"KUBE_EDITOR": str(editor), "EDITOR": str(editor)}))
    assert "configmap/edited edited" in out
    cm = get_obj(fleet_server, "ConfigMap", namespace, "edited")
    assert cm["data"] == {"greeting": "edited-by-script"}
    assert cm["metadata"]["labels"] == {"app": "web", "edited": "yes"}


def test_scale_uses_scale_subresource(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    apply_app(kubectl, tmp_path, namespace)
    rc, out, err = kubectl("scale", "deploy/web", "-n", namespace, "--replicas=5", "-v=6")
    assert rc == 0, err
    assert "deployment.apps/web scaled" in out
    assert f"/apis/apps/v1/namespaces/{namespace}/deployments/web/scale" in err, err
    assert get_obj(fleet_server, "Deployment", namespace, "web")["spec"]["replicas"] == 5

    code, scale = api_get(fleet_server, f"/apis/apps/v1/namespaces/{namespace}/deployments/web/scale")
    assert code == 200, scale
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"]["replicas"] == 5
    assert scale["metadata"]["name"] == "web"

    # --current-replicas is a precondition.
    rc, _, err = kubectl("scale", "deploy/web", "-n", namespace, "--current-replicas=2", "--replicas=1")
    assert rc != 0, err
    assert get_obj(fleet_server, "Deployment", namespace, "web")["spec"]["replicas"] == 5


# -- delete / namespaces --------------------------------------------------------------------


def test_delete_f_removes_everything(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    path = apply_app(kubectl, tmp_path, namespace)
    out = ok(kubectl("delete", "-n", namespace, "-f", str(path), "--timeout=60s"))
    for line in ('deployment.apps "web" deleted', 'service "web" deleted',
                 'configmap "web-config" deleted', 'secret "web-secret" deleted'):
        assert line in out, out
    assert_absent(fleet_server, "Deployment", namespace, "web")
    assert_absent(fleet_server, "Service", namespace, "web")
    assert_absent(fleet_server, "ConfigMap", namespace, "web-config")
    assert_absent(fleet_server, "Secret", namespace, "web-secret")

    rc, _, err = kubectl("delete", "cm", "web-config", "-n", namespace)
    assert rc != 0 and "NotFound" in err and "not found" in err, err


def test_namespace_apply_then_delete(fleet_server: FleetServer, kubectl, tmp_path: Path) -> None:
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    path = write_manifest(tmp_path, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    out = ok(kubectl("apply", "-f", str(path)))
    assert f"namespace/{ns} created" in out
    code, body = api_get(fleet_server, f"/api/v1/namespaces/{ns}")
    assert code == 200 and body["status"]["phase"] == "Active", body

    out = ok(kubectl("get", "ns"))
    assert any(line.split()[0] == ns for line in out.splitlines()[1:]), out

    start = time.monotonic()
    out = ok(kubectl("delete", "ns", ns, "--timeout=60s", timeout=90))
    assert f'namespace "{ns}" deleted' in out
    # kubectl waited for it to be gone.
    code, body = api_get(fleet_server, f"/api/v1/namespaces/{ns}")
    assert code == 404, (code, body, time.monotonic() - start)


def test_namespace_delete_removes_contents(fleet_server: FleetServer, kubectl) -> None:
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    create_namespace(fleet_server, ns)
    api_create(fleet_server, "ConfigMap", ns, configmap("inside"))
    ok(kubectl("delete", "ns", ns, "--timeout=60s", timeout=90))
    code, _ = api_get(fleet_server, f"/api/v1/namespaces/{ns}")
    assert code == 404
    code, body = api_get(fleet_server, f"/api/v1/namespaces/{ns}/configmaps")
    assert code == 200 and body["items"] == [], body
    # Nothing can be created in a namespace that does not exist.
    with fleet_server.client() as c:
        r = c.post(f"/api/v1/namespaces/{ns}/configmaps", json=configmap("late"))
    assert r.status_code == 404, r.text


# -- discovery / explain / version -------------------------------------------------------------


def test_api_resources(kubectl) -> None:  # type: ignore[no-untyped-def]
    out = ok(kubectl("api-resources"))
    header = _header(out)
    assert header[:5] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"], header
    rows: dict[str, list[str]] = {}
    for line in out.splitlines()[1:]:
        # First row per name: metrics.k8s.io serves `nodes` and `pods` too (listed later).
        rows.setdefault(line.split()[0], line.split())
    assert rows["pods"] == ["pods", "po", "v1", "true", "Pod"]
    assert rows["deployments"] == ["deployments", "deploy", "apps/v1", "true", "Deployment"]
    assert rows["services"] == ["services", "svc", "v1", "true", "Service"]
    assert rows["configmaps"] == ["configmaps", "cm", "v1", "true", "ConfigMap"]
    assert rows["namespaces"] == ["namespaces", "ns", "v1", "false", "Namespace"]
    assert rows["secrets"] == ["secrets", "v1", "true", "Secret"]

    out = ok(kubectl("api-versions"))
    assert {"v1", "apps/v1"} <= set(out.split())


def test_explain_pods(kubectl) -> None:  # type: ignore[no-untyped-def]
    out = ok(kubectl("explain", "pods"))
    assert "KIND:" in out and "Pod" in out
    assert "VERSION:" in out and "v1" in out
    assert "FIELDS:" in out and "spec" in out
    out = ok(kubectl("explain", "deployment.spec.replicas"))
    assert "replicas" in out and "integer" in out


def test_version(kubectl) -> None:  # type: ignore[no-untyped-def]
    out = ok(kubectl("version"))
    assert "Client Version: v1.32" in out
    assert "Server Version: v1." in out, out
    j = json.loads(ok(kubectl("version", "-o", "json")))
    assert j["serverVersion"]["major"] == "1" and j["serverVersion"]["gitVersion"].startswith("v1.")


def test_short_names_and_create_imperative(fleet_server: FleetServer, kubectl, namespace: str) -> None:
    """`create configmap` posts protobuf (see K8S-API.md); `get cm` resolves the short name."""
    ok(kubectl("create", "configmap", "imp", "-n", namespace, "--from-literal=k=v"))
    assert get_obj(fleet_server, "ConfigMap", namespace, "imp")["data"] == {"k": "v"}
    out = ok(kubectl("get", "cm", "imp", "-n", namespace, "-o", "jsonpath={.data.k}"))
    assert out == "v"


# -- bad input --------------------------------------------------------------------------------


def test_apply_invalid_objects_rejected(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    bad_selector = deployment("mismatch")
    bad_selector["spec"]["selector"] = {"matchLabels": {"app": "something-else"}}
    path = write_manifest(tmp_path, bad_selector, name="bad-selector.yaml")
    rc, out, err = kubectl("apply", "-n", namespace, "-f", str(path))
    assert rc != 0, out
    assert "is invalid" in err, err
    # kubectl rewrites an Invalid Status as 'The <details.kind> "<name>" is invalid: <causes>'.
    assert 'The Deployment "mismatch" is invalid' in err, err
    assert "spec.template.metadata.labels" in err, err
    assert "selector" in err, err
    assert_absent(fleet_server, "Deployment", namespace, "mismatch")

    path = write_manifest(tmp_path, configmap("BadName"), name="bad-name.yaml")
    rc, out, err = kubectl("apply", "-n", namespace, "-f", str(path))
    assert rc != 0, out
    assert "is invalid" in err and "BadName" in err, err
    code, body = api_get(fleet_server, f"/api/v1/namespaces/{namespace}/configmaps")
    # Only what root-ca-cert-publisher puts in every namespace.
    assert code == 200 and [i["metadata"]["name"] for i in body["items"]] in ([], ["kube-root-ca.crt"]), body


def test_apply_unknown_field_strict(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    dep = deployment("strict")
    dep["spec"]["replicaz"] = 3
    path = write_manifest(tmp_path, dep, name="unknown.yaml")
    rc, out, err = kubectl("apply", "-n", namespace, "-f", str(path))
    assert rc != 0, out
    assert "unknown field" in err and "replicaz" in err, err
    assert_absent(fleet_server, "Deployment", namespace, "strict")

    # An unknown field in a re-apply (the PATCH path) is refused too and changes nothing.
    good = write_manifest(tmp_path, deployment("strict"), name="good.yaml")
    ok(kubectl("apply", "-n", namespace, "-f", str(good)))
    before = get_obj(fleet_server, "Deployment", namespace, "strict")
    dep = deployment("strict")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    path = write_manifest(tmp_path, dep, name="unknown2.yaml")
    rc, out, err = kubectl("apply", "-n", namespace, "-f", str(path))
    assert rc != 0, out
    assert "unknown field" in err and "imagePullPolicyy" in err, err
    after = get_obj(fleet_server, "Deployment", namespace, "strict")
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def test_unauthenticated_kubectl_is_refused(fleet_server: FleetServer, tmp_path: Path) -> None:
    assert KUBECTL
    cfg = yaml.safe_load(fleet_server.kubeconfig.read_text())
    for u in cfg["users"]:
        u["user"] = {"token": "not-the-token"}
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text(yaml.safe_dump(cfg))
    os.chmod(bad, 0o600)
    p = subprocess.run(
        [KUBECTL, "--kubeconfig", str(bad), "--cache-dir", str(tmp_path / "cache"),
         "get", "ns"],
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode != 0
    assert "Unauthorized" in p.stderr or "must be logged in" in p.stderr, p.stderr


def test_kubectl_runner_roundtrip(fleet_server: FleetServer) -> None:
    """The conftest runner reports kubectl's exit code and stderr faithfully."""
    rc, out, err = run_kubectl(fleet_server, "get", "deploy", "does-not-exist", "-n", "default")
    assert rc == 1 and out == ""
    assert 'deployments.apps "does-not-exist" not found' in err, err


def test_server_dry_run_stores_nothing(fleet_server: FleetServer, kubectl, namespace: str, tmp_path: Path) -> None:
    path = write_manifest(tmp_path, configmap("dry"), name="dry.yaml")
    out = ok(kubectl("apply", "-n", namespace, "-f", str(path), "--dry-run=server"))
    assert "configmap/dry created (server dry run)" in out
    assert_absent(fleet_server, "ConfigMap", namespace, "dry")

    ok(kubectl("apply", "-n", namespace, "-f", str(path)))
    rv = get_obj(fleet_server, "ConfigMap", namespace, "dry")["metadata"]["resourceVersion"]
    out = ok(kubectl("delete", "cm", "dry", "-n", namespace, "--dry-run=server"))
    assert "(server dry run)" in out
    assert get_obj(fleet_server, "ConfigMap", namespace, "dry")["metadata"]["resourceVersion"] == rv


def test_system_namespaces_cannot_be_deleted(fleet_server: FleetServer, kubectl) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = kubectl("delete", "ns", "default", "--wait=false")
    assert rc != 0
    assert "forbidden" in err.lower(), err
    code, body = api_get(fleet_server, "/api/v1/namespaces/default")
    assert code == 200 and "deletionTimestamp" not in body["metadata"], body
