"""ReplicationController, PodTemplate and APIService with kubectl against a real `fleet server`.

The module shares one server and two simulated nodes (pods go Running and Ready a
moment after they are bound), and each test works in its own namespace:

- an RC applied with `kubectl apply -f` gets its pods (selector and labels defaulted
  from the template), `kubectl get rc -o wide` prints kubectl's columns, `kubectl scale
  rc` moves the count both ways, and deleting the RC takes its pods (garbage collector);
- `kubectl get podtemplates` prints NAME CONTAINERS IMAGES POD LABELS;
- `kubectl get apiservices` lists the Local APIServices, Available, and an APIService
  registering an aggregated server is stored and shown `False (ServiceNotProxied)`;
- `kubectl apply --prune -l app=x -f dir/` with kubectl's default allowlist (which names
  /v1/ReplicationController) prunes what left the directory.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer
from tests.e2e.helpers import dump_all, wait_until
from tests.e2e.simnodes import SimNodes

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

TIMEOUT = 90.0  # generous: the machine is shared


def ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0, f"kubectl failed rc={rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def ready_node(srv: FleetServer, name: str) -> bool:
    with srv.client() as c:
        r = c.get(f"/api/v1/nodes/{name}")
    if r.status_code != 200:
        return False
    conds = r.json().get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


@pytest.fixture(scope="module")
def nodes(fleet_server: FleetServer) -> Iterator[list[str]]:
    sim = SimNodes(fleet_server, count=2, prefix=f"rc{uuid.uuid4().hex[:4]}").start()
    try:
        wait_until(lambda: all(ready_node(fleet_server, n) for n in sim.names), timeout=60,
                   what="simulated nodes Ready")
        yield sim.names
    finally:
        sim.stop()


def rc_manifest(name: str, replicas: int) -> dict[str, Any]:
    # No selector and no labels: both are defaulted from the template's labels.
    return {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": name},
            "spec": {"replicas": replicas, "template": {
                "metadata": {"labels": {"app": name, "tier": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27"},
                                        {"name": "log", "image": "busybox:1.36"}]}}}}


def pods_of(kubectl: Any, ns: str, selector: str) -> list[dict[str, Any]]:
    out = ok(kubectl("-n", ns, "get", "pods", "-l", selector, "-o", "json"))
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def rc_status(kubectl: Any, ns: str, name: str) -> dict[str, Any]:
    return json.loads(ok(kubectl("-n", ns, "get", "rc", name, "-o", "json"))).get("status") or {}


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


def test_replication_controller_apply_scale_wide_and_delete(kubectl, namespace, nodes):
    ns = namespace
    # A pod already carrying the selector's labels, owned by nobody: the RC adopts it and
    # creates one pod, not two.
    orphan = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "orphan", "labels": {"app": "web", "tier": "web"}},
              "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}
    ok(kubectl("-n", ns, "apply", "-f", "-", input=dump_all(orphan)))
    ok(kubectl("-n", ns, "apply", "-f", "-", input=dump_all(rc_manifest("web", 2))))
    stored = json.loads(ok(kubectl("-n", ns, "get", "rc", "web", "-o", "json")))
    assert stored["spec"]["selector"] == {"app": "web", "tier": "web"}
    assert stored["metadata"]["labels"] == {"app": "web", "tier": "web"}

    def settled(n: int) -> bool:
        st = rc_status(kubectl, ns, "web")
        return (len(pods_of(kubectl, ns, "app=web")) == n and st.get("replicas", 0) == n
                and st.get("readyReplicas", 0) == n and st.get("availableReplicas", 0) == n
                and st.get("observedGeneration") == json.loads(ok(kubectl(
                    "-n", ns, "get", "rc", "web", "-o", "json")))["metadata"]["generation"])

    wait_until(lambda: settled(2), timeout=TIMEOUT, what="2 ready pods of rc/web")
    pods = pods_of(kubectl, ns, "app=web")
    for p in pods:
        (ref,) = p["metadata"]["ownerReferences"]
        assert (ref["apiVersion"], ref["kind"], ref["name"], ref["controller"]) == \
            ("v1", "ReplicationController", "web", True)
    assert sorted(p["metadata"]["name"].startswith("web-") for p in pods) == [False, True]
    assert "orphan" in [p["metadata"]["name"] for p in pods]
    assert rc_status(kubectl, ns, "web")["fullyLabeledReplicas"] == 2
    described = ok(kubectl("-n", ns, "describe", "rc", "web"))
    assert "Replicas:     2 current / 2 desired" in described, described
    assert "Pods Status:  2 Running / 0 Waiting / 0 Succeeded / 0 Failed" in described, described
    assert "SuccessfulCreate" in described  # the controller's event, on the RC
    assert "rc/web" in ok(kubectl("-n", ns, "get", "all", "-o", "name")).replace(
        "replicationcontroller/", "rc/")

    rows = table(ok(kubectl("-n", ns, "get", "rc", "-o", "wide")))
    assert rows[0] == ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    name, desired, current, ready, _age, containers, images, selector = rows[1]
    assert (name, desired, current, ready) == ("web", "2", "2", "2")
    assert (containers, images, selector) == ("web,log", "nginx:1.27,busybox:1.36", "app=web,tier=web")

    ok(kubectl("-n", ns, "scale", "rc", "web", "--replicas=3"))
    wait_until(lambda: settled(3), timeout=TIMEOUT, what="rc/web scaled up to 3")
    ok(kubectl("-n", ns, "scale", "rc/web", "--replicas=1"))
    wait_until(lambda: settled(1), timeout=TIMEOUT, what="rc/web scaled down to 1")
    scale = json.loads(ok(kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/replicationcontrollers/web/scale")))
    assert (scale["kind"], scale["spec"]["replicas"], scale["status"]["selector"]) == \
        ("Scale", 1, "app=web,tier=web")

    ok(kubectl("-n", ns, "delete", "rc", "web", "--wait=true", timeout=120))
    wait_until(lambda: not pods_of(kubectl, ns, "app=web"), timeout=TIMEOUT,
               what="rc/web's pods garbage-collected")


def test_replication_controller_invalid_is_refused_with_kubes_message(kubectl, namespace):
    bad = rc_manifest("bad", 1)
    bad["spec"]["selector"] = {"app": "other"}
    rc, _, err = kubectl("-n", namespace, "apply", "-f", "-", input=dump_all(bad))
    assert rc != 0
    assert "spec.template.metadata.labels: Invalid value" in err
    assert "`selector` does not match template `labels`" in err
    # The kinds are in the OpenAPI documents: strict field validation and `kubectl explain`.
    typo = rc_manifest("typo", 1)
    typo["spec"]["replica"] = 2
    rc, _, err = kubectl("-n", namespace, "apply", "-f", "-", input=dump_all(typo))
    assert rc != 0 and 'unknown field "spec.replica"' in err, err
    out = ok(kubectl("explain", "rc.spec.selector"))
    assert "KIND:       ReplicationController" in out and "map[string]string" in out
    assert "FIELD: caBundle" in ok(kubectl("explain", "apiservices.spec.caBundle"))
    assert "KIND:       PodTemplate" in ok(kubectl("explain", "podtemplates.template"))


def test_podtemplates_table(kubectl, namespace):
    tpl = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tpl"},
           "template": {"metadata": {"labels": {"app": "t", "a": "b"}},
                        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}}
    ok(kubectl("-n", namespace, "apply", "-f", "-", input=dump_all(tpl)))
    out = ok(kubectl("-n", namespace, "get", "podtemplates"))
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "CONTAINERS", "IMAGES", "POD", "LABELS"]
    assert row.split() == ["tpl", "c", "busybox:1.36", "a=b,app=t"]
    stored = json.loads(ok(kubectl("-n", namespace, "get", "podtemplate", "tpl", "-o", "json")))
    assert stored["template"]["spec"]["restartPolicy"] == "Always"  # defaulted as a pod spec


def test_apiservices_local_and_registered(kubectl, fleet_server):
    rows = {r[0]: r for r in table(ok(kubectl("get", "apiservices")))[1:]}
    for name in ("v1.", "v1.apps", "v2.autoscaling", "v1.rbac.authorization.k8s.io", "v1beta1.metrics.k8s.io"):
        assert rows[name][1:3] == ["Local", "True"], rows.get(name)
    local = json.loads(ok(kubectl("get", "apiservice", "v1beta1.metrics.k8s.io", "-o", "json")))
    assert local["spec"]["groupPriorityMinimum"] == 100
    (cond,) = local["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Available", "True", "Local")
    # Discovery lists metrics.k8s.io where a cluster with metrics-server does: last.
    groups = json.loads(ok(kubectl("get", "--raw", "/apis")))["groups"]
    assert groups[0]["name"] == "apiregistration.k8s.io" and groups[-1]["name"] == "metrics.k8s.io"

    ext = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
           "metadata": {"name": f"v1alpha1.i16-{uuid.uuid4().hex[:6]}.example.com"},
           "spec": {"service": {"namespace": "default", "name": "my-aggregated"},
                    "insecureSkipTLSVerify": True, "groupPriorityMinimum": 1000, "versionPriority": 15}}
    ext["spec"].update(group=ext["metadata"]["name"].split(".", 1)[1], version="v1alpha1")
    try:
        ok(kubectl("apply", "-f", "-", input=dump_all(ext)))
        row = table(ok(kubectl("get", "apiservice", ext["metadata"]["name"])))[1]
        assert row[1:4] == ["default/my-aggregated", "False", "(ServiceNotProxied)"]
        bad = json.loads(json.dumps(ext))
        bad["metadata"]["name"] = "v1.wrong.example.com"
        rc, _, err = kubectl("apply", "-f", "-", input=dump_all(bad))
        assert rc != 0 and 'must be `spec.version+"."+spec.group`' in err
    finally:
        kubectl("delete", "apiservice", ext["metadata"]["name"], "--ignore-not-found")


def test_apply_prune_with_the_default_allowlist(kubectl, namespace, tmp_path: Path):
    def cm(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"app": "x"}},
                "data": {"k": name}}

    d = tmp_path / "manifests"
    d.mkdir()
    (d / "a.yaml").write_text(dump_all(cm("a")))
    (d / "b.yaml").write_text(dump_all(cm("b")))
    ok(kubectl("-n", namespace, "apply", "--prune", "-l", "app=x", "-f", str(d)))
    (d / "b.yaml").unlink()
    out = ok(kubectl("-n", namespace, "apply", "--prune", "-l", "app=x", "-f", str(d)))
    assert "configmap/b pruned" in out, out
    names = [i["metadata"]["name"] for i in json.loads(ok(kubectl(
        "-n", namespace, "get", "cm", "-l", "app=x", "-o", "json")))["items"]]
    assert names == ["a"]
