"""Dynamic admission webhooks against a real `fleet server`, configured with kubectl.

The webhooks are written here: a small HTTPS server (threading `http.server` + ssl)
on 127.0.0.1, with a certificate from a CA this module makes with `cryptography`;
the configurations carry that CA as their `caBundle`.  Every configuration selects
only the namespace of the test that created it (namespaceSelector on
`kubernetes.io/metadata.name`), so the tests share one server without seeing each
other's webhooks.

* a mutating webhook injects a label into ConfigMaps (JSONPatch), and its warning is
  printed by kubectl;
* a validating webhook refuses a labelled ConfigMap; kubectl prints kube-apiserver's
  `admission webhook "..." denied the request: ...`;
* a dead webhook (nothing listening) with failurePolicy Fail refuses, naming the webhook;
  with Ignore the write is admitted with a warning;
* a slow webhook past its timeoutSeconds fails closed, and so does one answering garbage;
* a dry run through a webhook with sideEffects None is called and nothing is stored;
* a webhook reached through a Service reference (its endpoints; TLS checked for
  `<service>.<namespace>.svc`);
* a webhook's auditAnnotations land in the request's audit event (a server of its own
  with `--audit-log-path`).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer, ServerFactory, create_namespace, run_kubectl
from tests.e2e.webhookserver import WebhookServer, make_tls

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

API = "admissionregistration.k8s.io/v1"
# The Service the service-reference test puts in front of the webhook (named in the certificate).
SVC, SVC_NS = "hooks", "webhook-svc-e2e"


# --------------------------------------------------------------------------- the webhook server

def review_answer(path: str, review: dict[str, Any]) -> dict[str, Any]:
    """What the test's webhooks decide, by URL path."""
    req = review["request"]
    obj = req.get("object") or {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    resp: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    if path == "/mutate":
        ops: list[dict[str, Any]] = []
        if not labels:
            ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
        ops.append({"op": "add", "path": "/metadata/labels/injected-by", "value": "webhook"})
        resp.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(ops).encode()).decode(),
                    warnings=["label injected by the test webhook"])
    elif path == "/validate":
        resp["auditAnnotations"] = {"checked": "true"}
        if labels.get("deny") == "yes":
            resp.update(allowed=False, status={"code": 403, "reason": "Forbidden",
                                               "message": "configmaps labelled deny=yes are not allowed"})
    elif path == "/slow":
        time.sleep(3)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}


def answer(path: str, review: dict[str, Any]) -> bytes:
    if path == "/garbage":
        return b"<html>not an AdmissionReview</html>"
    return json.dumps(review_answer(path, review)).encode()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, ssl.SSLContext]:
    return make_tls(tmp_path_factory.mktemp("webhook-tls"), [f"{SVC}.{SVC_NS}.svc"])


@pytest.fixture(scope="module")
def webhook(tls: tuple[bytes, ssl.SSLContext]) -> Iterator[WebhookServer]:
    srv = WebhookServer(tls[1], answer)
    try:
        yield srv
    finally:
        srv.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- helpers

@pytest.fixture
def ns(fleet_server: FleetServer) -> Iterator[str]:
    name = f"wh-{uuid.uuid4().hex[:6]}"
    create_namespace(fleet_server, name)
    yield name
    with fleet_server.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def configs(fleet_server: FleetServer) -> Iterator[list[tuple[str, str]]]:
    """(plural, name) of the configurations a test created; deleted afterwards."""
    made: list[tuple[str, str]] = []
    yield made
    with fleet_server.client() as c:
        for plural, name in made:
            c.delete(f"/apis/{API}/{plural}/{name}")


def hook(name: str, ns: str, url: str, ca: bytes, **kw: Any) -> dict[str, Any]:
    return {"name": name, "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], **kw}


def install(srv: FleetServer, made: list[tuple[str, str]], kind: str, *hooks: dict[str, Any]) -> str:
    name = f"wh-{uuid.uuid4().hex[:6]}"
    doc = {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "webhooks": list(hooks)}
    rc, out, err = run_kubectl(srv, "apply", "-f", "-", input=json.dumps(doc))
    assert rc == 0, err
    made.append((kind.lower() + "s", name))
    # The configuration cache is watch-fed: wait until the server acts on it.
    return name


def create_configmap(srv: FleetServer, ns: str, name: str, *labels: str,
                     dry_run: bool = False) -> tuple[int, str, str]:
    doc = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": ns,
                        "labels": dict(lbl.split("=", 1) for lbl in labels)}, "data": {"k": "v"}}
    args = ["create", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return run_kubectl(srv, *args, input=json.dumps(doc))


def eventually_refused(srv: FleetServer, ns: str, *labels: str) -> str:
    """Create ConfigMaps until one is refused (the cache catches up within milliseconds)."""
    deadline = time.monotonic() + 10
    while True:
        rc, out, err = create_configmap(srv, ns, f"probe-{uuid.uuid4().hex[:6]}", *labels)
        if rc != 0 or time.monotonic() > deadline:
            assert rc != 0, "the webhook never refused"
            return err
        time.sleep(0.2)


def labels_of(srv: FleetServer, ns: str, name: str) -> dict[str, str]:
    rc, out, err = run_kubectl(srv, "get", "configmap", name, "-n", ns, "-o", "json")
    assert rc == 0, err
    return json.loads(out)["metadata"].get("labels") or {}


# --------------------------------------------------------------------------- tests

def test_mutating_webhook_injects_a_label(fleet_server: FleetServer, webhook: WebhookServer,
                                          tls: tuple[bytes, ssl.SSLContext], ns: str,
                                          configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/mutate"
    install(fleet_server, configs, "MutatingWebhookConfiguration",
            hook("inject.webhooks.fleet.test", ns, url, tls[0]))
    deadline = time.monotonic() + 10
    while True:
        name = f"cm-{uuid.uuid4().hex[:6]}"
        rc, out, err = create_configmap(fleet_server, ns, name, "app=demo")
        assert rc == 0, err
        if labels_of(fleet_server, ns, name).get("injected-by") == "webhook" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert labels_of(fleet_server, ns, name) == {"app": "demo", "injected-by": "webhook"}
    # kubectl prints the webhook's warning.
    assert "Warning: label injected by the test webhook" in err
    # The review carried the request as kube-apiserver sends it.
    review = [r for r in webhook.reviews if r["path"] == "/mutate"
              and r["request"].get("name") == name][-1]["request"]
    assert review["operation"] == "CREATE" and review["namespace"] == ns
    assert review["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert review["resource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    assert review["userInfo"]["username"] and review["dryRun"] is False
    # `kubectl get` prints the configuration with its WEBHOOKS column.
    rc, out, err = run_kubectl(fleet_server, "get", "mutatingwebhookconfigurations", configs[0][1])
    assert rc == 0, err
    assert out.split("\n")[0].split() == ["NAME", "WEBHOOKS", "AGE"]
    assert out.split("\n")[1].split()[:2] == [configs[0][1], "1"]


def test_validating_webhook_rejects_with_its_message(fleet_server: FleetServer, webhook: WebhookServer,
                                                     tls: tuple[bytes, ssl.SSLContext], ns: str,
                                                     configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            hook("deny.webhooks.fleet.test", ns, url, tls[0]))
    err = eventually_refused(fleet_server, ns, "deny=yes")
    assert ('admission webhook "deny.webhooks.fleet.test" denied the request: '
            "configmaps labelled deny=yes are not allowed") in err
    rc, out, err = create_configmap(fleet_server, ns, "allowed", "deny=no")
    assert rc == 0, err


def test_dead_webhook_fails_closed_naming_it(fleet_server: FleetServer, tls: tuple[bytes, ssl.SSLContext],
                                            ns: str, configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{free_port()}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            hook("dead.webhooks.fleet.test", ns, url, tls[0], timeoutSeconds=2))
    err = eventually_refused(fleet_server, ns)
    assert (f'Internal error occurred: failed calling webhook "dead.webhooks.fleet.test": Post "{url}": '
            f"dial tcp 127.0.0.1:{url.split(':')[2].split('/')[0]}: connect: connection refused") in err
    # Still refused, every time (not a transient of the cache).
    rc, out, err = create_configmap(fleet_server, ns, "after")
    assert rc != 0 and 'failed calling webhook "dead.webhooks.fleet.test"' in err


def test_dead_webhook_with_ignore_admits_with_a_warning(fleet_server: FleetServer,
                                                       tls: tuple[bytes, ssl.SSLContext], ns: str,
                                                       configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{free_port()}/mutate"
    install(fleet_server, configs, "MutatingWebhookConfiguration",
            hook("optional.webhooks.fleet.test", ns, url, tls[0], failurePolicy="Ignore", timeoutSeconds=2))
    deadline = time.monotonic() + 10
    while True:
        rc, out, err = create_configmap(fleet_server, ns, f"cm-{uuid.uuid4().hex[:6]}")
        assert rc == 0, err
        if 'failed calling webhook "optional.webhooks.fleet.test"' in err or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert 'Warning: failed calling webhook "optional.webhooks.fleet.test"' in err


def test_slow_webhook_times_out_and_fails_closed(fleet_server: FleetServer, webhook: WebhookServer,
                                                 tls: tuple[bytes, ssl.SSLContext], ns: str,
                                                 configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/slow"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            hook("slow.webhooks.fleet.test", ns, url, tls[0], timeoutSeconds=1))
    err = eventually_refused(fleet_server, ns)
    assert ('Internal error occurred: failed calling webhook "slow.webhooks.fleet.test": '
            "context deadline exceeded") in err


def test_wrong_ca_bundle_fails_closed(fleet_server: FleetServer, webhook: WebhookServer, ns: str,
                                      tmp_path: Path, configs: list[tuple[str, str]]) -> None:
    other_ca, _ = make_tls(tmp_path)
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            hook("untrusted.webhooks.fleet.test", ns, url, other_ca))
    err = eventually_refused(fleet_server, ns)
    assert 'failed calling webhook "untrusted.webhooks.fleet.test"' in err
    assert "tls: failed to verify certificate" in err


def test_invalid_configuration_refused_with_kube_messages(fleet_server: FleetServer) -> None:
    doc = {"apiVersion": API, "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "bad"},
           "webhooks": [{"name": "bad.webhooks.fleet.test", "clientConfig": {"url": "http://127.0.0.1/x"},
                         "rules": [], "timeoutSeconds": 60}]}
    rc, out, err = run_kubectl(fleet_server, "create", "-f", "-", input=json.dumps(doc))
    assert rc != 0
    assert "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun" in err
    assert "webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1" in err
    assert "'https' is the only allowed URL scheme" in err
    assert "the timeout value must be between 1 and 30 seconds" in err


def test_server_dry_run_calls_side_effect_free_webhooks(fleet_server: FleetServer, webhook: WebhookServer,
                                                        tls: tuple[bytes, ssl.SSLContext], ns: str,
                                                        configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            hook("dry.webhooks.fleet.test", ns, url, tls[0], sideEffects="NoneOnDryRun"))
    eventually_refused(fleet_server, ns, "deny=yes")
    rc, out, err = create_configmap(fleet_server, ns, "dry", "deny=yes", dry_run=True)
    assert rc != 0 and 'admission webhook "dry.webhooks.fleet.test" denied the request' in err
    rc, out, err = create_configmap(fleet_server, ns, "dry", dry_run=True)
    assert rc == 0, err
    assert any(r["request"].get("name") == "dry" and r["request"]["dryRun"] is True for r in webhook.reviews)
    rc, out, err = run_kubectl(fleet_server, "get", "configmap", "dry", "-n", ns)
    assert rc != 0 and "not found" in err


def test_webhook_through_a_service_reference(fleet_server: FleetServer, webhook: WebhookServer,
                                             tls: tuple[bytes, ssl.SSLContext],
                                             configs: list[tuple[str, str]]) -> None:
    create_namespace(fleet_server, SVC_NS)
    try:
        # A selector-less Service whose Endpoints point at the test's webhook on loopback.
        docs = [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": SVC, "namespace": SVC_NS},
                 "spec": {"ports": [{"name": "https", "port": 443, "targetPort": webhook.port}]}},
                {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": SVC, "namespace": SVC_NS},
                 "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
                              "ports": [{"name": "https", "port": webhook.port}]}]}]
        for doc in docs:
            rc, out, err = run_kubectl(fleet_server, "apply", "-f", "-", input=json.dumps(doc))
            assert rc == 0, err
        h = hook("svc.webhooks.fleet.test", SVC_NS, "", tls[0])
        h["clientConfig"] = {"service": {"namespace": SVC_NS, "name": SVC, "path": "/validate"},
                             "caBundle": h["clientConfig"]["caBundle"]}
        install(fleet_server, configs, "ValidatingWebhookConfiguration", h)
        err = eventually_refused(fleet_server, SVC_NS, "deny=yes")
        assert ('admission webhook "svc.webhooks.fleet.test" denied the request: '
                "configmaps labelled deny=yes are not allowed") in err
    finally:
        with fleet_server.client() as c:
            c.delete(f"/api/v1/namespaces/{SVC_NS}")


def test_garbage_answer_fails_closed_clearly(fleet_server: FleetServer, webhook: WebhookServer,
                                            tls: tuple[bytes, ssl.SSLContext], ns: str,
                                            configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/garbage"
    install(fleet_server, configs, "MutatingWebhookConfiguration",
            hook("garbage.webhooks.fleet.test", ns, url, tls[0]))
    err = eventually_refused(fleet_server, ns)
    assert ('Internal error occurred: failed calling webhook "garbage.webhooks.fleet.test": '
            "received invalid webhook response") in err


def test_audit_annotations_in_the_audit_log(fleet_server_factory: ServerFactory, webhook: WebhookServer,
                                            tls: tuple[bytes, ssl.SSLContext], tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    srv = fleet_server_factory.start(extra_args=["--audit-log-path", str(log)])
    ns = f"wh-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(srv, [], "ValidatingWebhookConfiguration", hook("audit.webhooks.fleet.test", ns, url, tls[0]))
    eventually_refused(srv, ns, "deny=yes")
    rc, out, err = create_configmap(srv, ns, "audited")
    assert rc == 0, err
    assert srv.stop() == 0  # flushes the audit writer
    events = [json.loads(line) for line in log.read_text().splitlines()]
    done = [e for e in events if e.get("stage") == "ResponseComplete" and e.get("verb") == "create"
            and (e.get("objectRef") or {}).get("resource") == "configmaps"
            and (e.get("objectRef") or {}).get("namespace") == ns]
    assert done and all(e.get("annotations", {}).get("audit.webhooks.fleet.test/checked") == "true"
                        for e in done[-2:]), done[-2:]
