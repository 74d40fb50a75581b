"""kubectl's imperative commands (protobuf request bodies) against a real `fleet server`.

`kubectl create configmap|secret|deployment|namespace|job|cronjob|serviceaccount|service` POST
`application/vnd.kubernetes.protobuf` and never retry in JSON, so each of these fails outright
unless the server decodes protobuf (fleet/api/protobuf.py).  `expose` and `run` are covered too
(kubectl sends those as JSON).  Every result is read back with `kubectl get -o json`, so a command
that "succeeds" but stores the wrong fields fails here.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import FleetServer
from tests.e2e.helpers import container

pytestmark = pytest.mark.e2e

Kubectl = Callable[..., tuple[int, str, str]]
PROTOBUF = "application/vnd.kubernetes.protobuf"


def ok(kubectl: Kubectl, *args: str) -> str:
    rc, out, err = kubectl(*args)
    assert rc == 0, f"kubectl {' '.join(args)} failed ({rc}):\n{out}\n{err}"
    return out


def get(kubectl: Kubectl, namespace: str, what: str) -> dict[str, Any]:
    return json.loads(ok(kubectl, "-n", namespace, "get", what, "-o", "json"))


def test_create_namespace(kubectl: Kubectl) -> None:
    name = f"created-{uuid.uuid4().hex[:8]}"
    assert f"namespace/{name} created" in ok(kubectl, "create", "namespace", name)
    ns = json.loads(ok(kubectl, "get", "namespace", name, "-o", "json"))
    assert ns["kind"] == "Namespace" and ns["metadata"]["name"] == name
    assert ns["metadata"]["uid"] and ns["metadata"]["creationTimestamp"]
    assert ns["status"]["phase"] == "Active"


def test_create_configmap_and_secrets(kubectl: Kubectl, namespace: str) -> None:
    ok(kubectl, "-n", namespace, "create", "configmap", "x",
       "--from-literal=a=b", "--from-literal=empty=")
    cm = get(kubectl, namespace, "configmap/x")
    assert cm["data"] == {"a": "b", "empty": ""}
    assert cm["metadata"]["namespace"] == namespace

    ok(kubectl, "-n", namespace, "create", "secret", "generic", "s", "--from-literal=p=q")
    s = get(kubectl, namespace, "secret/s")
    assert s["data"] == {"p": base64.b64encode(b"q").decode()}
    assert s["type"] == "Opaque"

    ok(kubectl, "-n", namespace, "create", "secret", "docker-registry", "reg",
       "--docker-server=registry.example", "--docker-username=u", "--docker-password=pw")
    reg = get(kubectl, namespace, "secret/reg")
    assert reg["type"] == "kubernetes.io/dockerconfigjson"
    auths = json.loads(base64.b64decode(reg["data"][".dockerconfigjson"]))["auths"]
    assert auths["registry.example"]["username"] == "u"


def test_create_serviceaccount(kubectl: Kubectl, namespace: str) -> None:
    ok(kubectl, "-n", namespace, "create", "serviceaccount", "sa")
    sa = get(kubectl, namespace, "serviceaccount/sa")
    assert sa["kind"] == "ServiceAccount" and sa["metadata"]["name"] == "sa"


def test_create_deployment_and_expose(kubectl: Kubectl, namespace: str) -> None:
    ok(kubectl, "-n", namespace, "create", "deployment", "web", "--image=busybox",
       "--replicas=2", "--port=80")
    d = get(kubectl, namespace, "deployment/web")
    assert d["spec"]["replicas"] == 2
    assert d["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    assert d["metadata"]["labels"] == {"app": "web"}
    assert d["spec"]["template"]["metadata"]["labels"] == {"app": "web"}
    c = container(d, "busybox")
    assert c["image"] == "busybox" and c["ports"][0]["containerPort"] == 80

    # An explicit zero is kept (replicas is a pointer; zero is not "unset").
    ok(kubectl, "-n", namespace, "create", "deployment", "idle", "--image=nginx:1.25",
       "--replicas=0")
    assert get(kubectl, namespace, "deployment/idle")["spec"]["replicas"] == 0

    ok(kubectl, "-n", namespace, "expose", "deployment", "web", "--port=80", "--target-port=8080")
    svc = get(kubectl, namespace, "service/web")
    assert svc["spec"]["selector"] == {"app": "web"}
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 80 and port["targetPort"] == 8080 and port["protocol"] == "TCP"


def test_create_services(kubectl: Kubectl, namespace: str) -> None:
    ok(kubectl, "-n", namespace, "create", "service", "clusterip", "s", "--tcp=80:8080")
    s = get(kubectl, namespace, "service/s")
    assert s["spec"]["type"] == "ClusterIP" and s["spec"]["selector"] == {"app": "s"}
    assert s["spec"]["ports"] == [{"name": "80-8080", "port": 80, "protocol": "TCP",
                                   "targetPort": 8080}]

    ok(kubectl, "-n", namespace, "create", "service", "nodeport", "np", "--tcp=81:8081",
       "--node-port=30081")
    np = get(kubectl, namespace, "service/np")
    assert np["spec"]["type"] == "NodePort"
    assert np["spec"]["ports"][0]["nodePort"] == 30081


def test_create_job_cronjob_and_job_from_cronjob(kubectl: Kubectl, namespace: str) -> None:
    ok(kubectl, "-n", namespace, "create", "job", "j", "--image=busybox", "--", "echo", "hi")
    j = get(kubectl, namespace, "job/j")
    pod = j["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["command"] == ["echo", "hi"]
    assert pod["containers"][0]["image"] == "busybox"

    ok(kubectl, "-n", namespace, "create", "cronjob", "c", "--image=busybox",
       "--schedule=*/5 * * * *", "--", "date")
    cj = get(kubectl, namespace, "cronjob/c")
    assert cj["spec"]["schedule"] == "*/5 * * * *"
    tmpl = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert tmpl["restartPolicy"] == "OnFailure"
    assert tmpl["containers"][0]["command"] == ["date"]

    # kubectl copies the stored template (with defaults) and adds an ownerReference.
    ok(kubectl, "-n", namespace, "create", "job", "now", "--from=cronjob/c")
    now = get(kubectl, namespace, "job/now")
    (ref,) = now["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "CronJob", "c", cj["metadata"]["uid"], True)
    assert now["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    assert now["spec"]["template"]["spec"]["containers"][0]["command"] == ["date"]


def test_run_pod(kubectl: Kubectl, namespace: str) -> None:
    ok(kubectl, "-n", namespace, "run", "p", "--image=nginx:1.25", "--labels=app=p",
       "--env=A=1", "--port=8080")
    p = get(kubectl, namespace, "pod/p")
    assert p["metadata"]["labels"] == {"app": "p"}
    (c,) = p["spec"]["containers"]
    assert c["image"] == "nginx:1.25" and c["env"] == [{"name": "A", "value": "1"}]
    assert c["ports"][0]["containerPort"] == 8080


def test_dry_run_server_stores_nothing(kubectl: Kubectl, namespace: str) -> None:
    out = ok(kubectl, "-n", namespace, "create", "configmap", "dry", "--from-literal=k=v",
             "--dry-run=server", "-o", "json")
    assert json.loads(out)["data"] == {"k": "v"}
    rc, _, err = kubectl("-n", namespace, "get", "configmap", "dry")
    assert rc != 0 and "NotFound" in err


def ld(num: int, data: bytes) -> bytes:
    """A length-delimited protobuf field (short payloads only)."""
    assert len(data) < 128
    return bytes([num << 3 | 2, len(data)]) + data


def test_bad_protobuf_bodies_get_status_errors(fleet_server: FleetServer, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    headers = {"Content-Type": PROTOBUF, "Accept": "application/json"}
    with fleet_server.client() as c:
        r = c.post(path, content=b"k8s\x00\x0a\x05\x0a", headers=headers)
        assert r.status_code == 400, r.text
        assert r.json()["reason"] == "BadRequest"
        # A kind the decoder has no schema for: 415, and kubectl prints the message.
        widget = b"k8s\x00" + ld(1, ld(1, b"example.com/v1") + ld(2, b"Widget"))
        r = c.post(path, content=widget, headers=headers)
        assert r.status_code == 415, r.text
        assert r.json()["reason"] == "UnsupportedMediaType"
