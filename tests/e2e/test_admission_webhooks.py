"""Dynamic admission webhooks against a real `fleet server`, configured with kubectl.

The webhooks' decisions are written here (`review_answer`), served by
fleet/testing/webhook.py's `WebhookServer` (threading `http.server` + ssl on
127.0.0.1) with a certificate from a test CA (`loopback_tls`); the configurations
carry that CA as their `caBundle`.  Every configuration selects only the namespace
of the test that created it (namespaceSelector on `kubernetes.io/metadata.name`),
so the tests share one server without seeing each other's webhooks.

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
  with `--audit-log-path`);
* a webhook whose matchCondition (CEL) is false for a request is not called.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.testing.oidc import loopback_tls
from fleet.testing.webhook import API, WebhookServer, configmap_hook, json_patch, review_response
from tests.conftest import KUBECTL, FleetServer, ServerFactory, create_namespace, run_kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

# The Service the service-reference test puts in front of the webhook (named in the certificate).
SVC, SVC_NS = "hooks", "webhook-svc-e2e"


# --------------------------------------------------------------------------- the webhook server

def make_tls(tmp: Path, name: str = "webhook") -> tuple[bytes, Path, Path]:
    """(CA PEM, certificate file, key file) for 127.0.0.1 and the Service's DNS name."""
    ca, cert, key = loopback_tls(tmp, name, dns_names=(f"{SVC}.{SVC_NS}.svc",))
    return ca.read_bytes(), cert, key


def review_answer(path: str, review: dict[str, Any]) -> dict[str, Any] | bytes:
    """What the test's webhooks decide, by URL path."""
    req = review["request"]
    obj = req.get("object") or {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if path == "/mutate":
        ops: list[dict[str, Any]] = []
        if not labels:
            ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
        ops.append({"op": "add", "path": "/metadata/labels/injected-by", "value": "webhook"})
        return review_response(review, **json_patch(ops), warnings=["label injected by the test webhook"])
    if path == "/validate":
        if labels.get("deny") == "yes":
            return review_response(review, allowed=False, auditAnnotations={"checked": "true"},
                                   status={"code": 403, "reason": "Forbidden",
                                           "message": "configmaps labelled deny=yes are not allowed"})
        return review_response(review, auditAnnotations={"checked": "true"})
    if path == "/slow":
        time.sleep(3)
    if path == "/garbage":
        return b"<html>not an AdmissionReview</html>"
    return review_response(review)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path, Path]:
    return make_tls(tmp_path_factory.mktemp("webhook-tls"))


@pytest.fixture(scope="module")
def webhook(tls: tuple[bytes, Path, Path]) -> Iterator[WebhookServer]:
    with WebhookServer(tls[1], tls[2], review_answer) as srv:
        yield srv


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
                                          tls: tuple[bytes, Path, Path], ns: str,
                                          configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/mutate"
    install(fleet_server, configs, "MutatingWebhookConfiguration",
            configmap_hook("inject.webhooks.fleet.test", ns, url, tls[0]))
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
                                                     tls: tuple[bytes, Path, Path], ns: str,
                                                     configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            configmap_hook("deny.webhooks.fleet.test", ns, url, tls[0]))
    err = eventually_refused(fleet_server, ns, "deny=yes")
    assert ('admission webhook "deny.webhooks.fleet.test" denied the request: '
            "configmaps labelled deny=yes are not allowed") in err
    rc, out, err = create_configmap(fleet_server, ns, "allowed", "deny=no")
    assert rc == 0, err


def test_webhook_with_a_false_match_condition_is_not_called(fleet_server: FleetServer, webhook: WebhookServer,
                                                            tls: tuple[bytes, Path, Path], ns: str,
                                                            configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            configmap_hook("cond.webhooks.fleet.test", ns, url, tls[0], matchConditions=[
                {"name": "checked-only", "expression": "object.metadata.name.startsWith('checked-')"}]))
    deadline = time.monotonic() + 10
    while True:  # the configuration cache is watch-fed: wait until the webhook is live
        rc, out, err = create_configmap(fleet_server, ns, f"checked-{uuid.uuid4().hex[:6]}", "deny=yes")
        if rc != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert 'admission webhook "cond.webhooks.fleet.test" denied the request' in err
    # Its condition is false for this name: not called, so not refused.
    rc, out, err = create_configmap(fleet_server, ns, "unchecked", "deny=yes")
    assert rc == 0, err
    assert not [r for r in webhook.reviews if r["request"].get("name") == "unchecked"]


def test_dead_webhook_fails_closed_naming_it(fleet_server: FleetServer, tls: tuple[bytes, Path, Path],
                                            ns: str, configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{free_port()}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            configmap_hook("dead.webhooks.fleet.test", ns, url, tls[0], timeoutSeconds=2))
    err = eventually_refused(fleet_server, ns)
    assert (f'Internal error occurred: failed calling webhook "dead.webhooks.fleet.test": Post "{url}": '
            f"dial tcp 127.0.0.1:{url.split(':')[2].split('/')[0]}: connect: connection refused") in err
    # Still refused, every time (not a transient of the cache).
    rc, out, err = create_configmap(fleet_server, ns, "after")
    assert rc != 0 and 'failed calling webhook "dead.webhooks.fleet.test"' in err


def test_dead_webhook_with_ignore_admits_with_a_warning(fleet_server: FleetServer,
                                                       tls: tuple[bytes, Path, Path], ns: str,
                                                       configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{free_port()}/mutate"
    install(fleet_server, configs, "MutatingWebhookConfiguration",
            configmap_hook("optional.webhooks.fleet.test", ns, url, tls[0], failurePolicy="Ignore", timeoutSeconds=2))
    deadline = time.monotonic() + 10
    while True:
        rc, out, err = create_configmap(fleet_server, ns, f"cm-{uuid.uuid4().hex[:6]}")
        assert rc == 0, err
        if 'failed calling webhook "optional.webhooks.fleet.test"' in err or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert 'Warning: failed calling webhook "optional.webhooks.fleet.test"' in err


def test_slow_webhook_times_out_and_fails_closed(fleet_server: FleetServer, webhook: WebhookServer,
                                                 tls: tuple[bytes, Path, Path], ns: str,
                                                 configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/slow"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            configmap_hook("slow.webhooks.fleet.test", ns, url, tls[0], timeoutSeconds=1))
    err = eventually_refused(fleet_server, ns)
    assert ('Internal error occurred: failed calling webhook "slow.webhooks.fleet.test": '
            "context deadline exceeded") in err


def test_wrong_ca_bundle_fails_closed(fleet_server: FleetServer, webhook: WebhookServer, ns: str,
                                      tmp_path: Path, configs: list[tuple[str, str]]) -> None:
    other_ca, _, _ = make_tls(tmp_path, "other")
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            configmap_hook("untrusted.webhooks.fleet.test", ns, url, other_ca))
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
                                                        tls: tuple[bytes, Path, Path], ns: str,
                                                        configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(fleet_server, configs, "ValidatingWebhookConfiguration",
            configmap_hook("dry.webhooks.fleet.test", ns, url, tls[0], sideEffects="NoneOnDryRun"))
    eventually_refused(fleet_server, ns, "deny=yes")
    rc, out, err = create_configmap(fleet_server, ns, "dry", "deny=yes", dry_run=True)
    assert rc != 0 and 'admission webhook "dry.webhooks.fleet.test" denied the request' in err
    rc, out, err = create_configmap(fleet_server, ns, "dry", dry_run=True)
    assert rc == 0, err
    assert any(r["request"].get("name") == "dry" and r["request"]["dryRun"] is True for r in webhook.reviews)
    rc, out, err = run_kubectl(fleet_server, "get", "configmap", "dry", "-n", ns)
    assert rc != 0 and "not found" in err


def test_webhook_through_a_service_reference(fleet_server: FleetServer, webhook: WebhookServer,
                                             tls: tuple[bytes, Path, Path],
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
        h = configmap_hook("svc.webhooks.fleet.test", SVC_NS, "", tls[0])
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
                                            tls: tuple[bytes, Path, Path], ns: str,
                                            configs: list[tuple[str, str]]) -> None:
    url = f"https://127.0.0.1:{webhook.port}/garbage"
    install(fleet_server, configs, "MutatingWebhookConfiguration",
            configmap_hook("garbage.webhooks.fleet.test", ns, url, tls[0]))
    err = eventually_refused(fleet_server, ns)
    assert ('Internal error occurred: failed calling webhook "garbage.webhooks.fleet.test": '
            "received invalid webhook response") in err


def test_audit_annotations_in_the_audit_log(fleet_server_factory: ServerFactory, webhook: WebhookServer,
                                            tls: tuple[bytes, Path, Path], tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    srv = fleet_server_factory.start(extra_args=["--audit-log-path", str(log)])
    ns = f"wh-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, ns)
    url = f"https://127.0.0.1:{webhook.port}/validate"
    install(srv, [], "ValidatingWebhookConfiguration", configmap_hook("audit.webhooks.fleet.test", ns, url, tls[0]))
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
