"""The CSR controllers' pure decisions: approve / deny / skip, sign / fail, clean up."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest

from fleet.agent.bootstrap import csr_object, make_csr, new_key
from fleet.api.kinds import certificates as c
from fleet.controllers import csr_plan as p
from fleet.controllers.tokencleaner import cleanup_in

CLIENT = ["digital signature", "client auth"]
SERVING = ["digital signature", "server auth"]
BOOTSTRAP = ("system:bootstrap:abcdef", ["system:bootstrappers", "system:authenticated"])
NODE1 = ("system:node:n1", ["system:nodes", "system:authenticated"])
ALICE = ("alice", ["dev", "system:authenticated"])


def csr(requester: tuple[str, list[str]], cn: str = "system:node:n1", orgs: tuple[str, ...] = ("system:nodes",),
        signer: str = c.KUBE_APISERVER_CLIENT_KUBELET, usages: list[str] | None = None,
        dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), conditions: list[dict[str, Any]] | None = None,
        **spec: Any) -> tuple[dict[str, Any], Any]:
    pem = make_csr(new_key(), cn, orgs, dns, ips)
    obj = csr_object(pem, signer, usages if usages is not None else CLIENT, name="x")
    obj["spec"].update(username=requester[0], groups=requester[1], **spec)
    if conditions:
        obj["status"] = {"conditions": conditions}
    return obj, c.parse_request(pem)


APPROVED = [c.condition(c.APPROVED, "AutoApproved", "")]


@pytest.mark.parametrize("kw, action", [
    # Join: a bootstrap token asks for any node's client certificate.
    ({"requester": BOOTSTRAP}, p.APPROVE),
    ({"requester": BOOTSTRAP, "usages": [*CLIENT, "key encipherment"]}, p.APPROVE),
    # Renewal: the node itself.
    ({"requester": NODE1}, p.APPROVE),
    # A node asking for another node's name: denied.
    ({"requester": NODE1, "cn": "system:node:n2"}, p.DENY),
    # Not a kubelet client request: left alone (the signer fails it).
    ({"requester": BOOTSTRAP, "orgs": ("system:masters",)}, p.SKIP),
    ({"requester": BOOTSTRAP, "cn": "admin"}, p.SKIP),
    ({"requester": BOOTSTRAP, "usages": ["client auth"]}, p.SKIP),
    ({"requester": BOOTSTRAP, "usages": [*CLIENT, "server auth"]}, p.SKIP),
    ({"requester": BOOTSTRAP, "dns": ("n1.example",)}, p.SKIP),
    # Someone else: for a human to decide.
    ({"requester": ALICE}, p.SKIP),
    # Already decided.
    ({"requester": BOOTSTRAP, "conditions": APPROVED}, p.SKIP),
    ({"requester": BOOTSTRAP, "conditions": [c.condition(c.DENIED, "No", "")]}, p.SKIP),
    # Serving certificates: a node for its own name only.
    ({"requester": NODE1, "signer": c.KUBELET_SERVING, "usages": SERVING, "ips": ("10.0.0.1",)}, p.APPROVE),
    ({"requester": NODE1, "signer": c.KUBELET_SERVING, "usages": SERVING, "cn": "system:node:n2",
      "ips": ("10.0.0.1",)}, p.DENY),
    ({"requester": BOOTSTRAP, "signer": c.KUBELET_SERVING, "usages": SERVING, "ips": ("10.0.0.1",)}, p.SKIP),
    ({"requester": NODE1, "signer": c.KUBELET_SERVING, "usages": SERVING}, p.SKIP),  # no SAN
    # A node's storage provisioner certificate: for its own name only, exact subject.
    ({"requester": NODE1, "signer": c.KUBE_APISERVER_CLIENT, "cn": "system:fleet:storage-provisioner:n1",
      "orgs": ("system:fleet:storage-provisioners",)}, p.APPROVE),
    ({"requester": NODE1, "signer": c.KUBE_APISERVER_CLIENT, "cn": "system:fleet:storage-provisioner:n2",
      "orgs": ("system:fleet:storage-provisioners",)}, p.DENY),
    ({"requester": NODE1, "signer": c.KUBE_APISERVER_CLIENT, "cn": "system:fleet:storage-provisioner:n1",
      "orgs": ("system:masters",)}, p.SKIP),
    ({"requester": NODE1, "signer": c.KUBE_APISERVER_CLIENT, "cn": "system:fleet:storage-provisioner:n1",
      "orgs": ("system:fleet:storage-provisioners",), "dns": ("n1.example",)}, p.SKIP),
    ({"requester": ALICE, "signer": c.KUBE_APISERVER_CLIENT, "cn": "system:fleet:storage-provisioner:n1",
      "orgs": ("system:fleet:storage-provisioners",)}, p.SKIP),
    # Other client certificates are never auto-approved.
    ({"requester": NODE1, "signer": c.KUBE_APISERVER_CLIENT}, p.SKIP),
    ({"requester": BOOTSTRAP, "signer": "example.com/x"}, p.SKIP),
])
def test_approval(kw: dict[str, Any], action: str) -> None:
    obj, req = csr(**kw)
    verdict = p.approval(obj, req)
    assert verdict.action == action, verdict
    if action == p.DENY:
        assert verdict.reason == "AutoDenied" and "n2" in verdict.message
    if action == p.APPROVE:
        assert verdict.reason == "AutoApproved"


def test_unparsable_request_is_skipped() -> None:
    obj, _ = csr(BOOTSTRAP)
    assert p.approval(obj, None).action == p.SKIP


@pytest.mark.parametrize("kw, expect", [
    ({}, "sign"),
    ({"conditions": []}, None),  # not approved
    ({"signer": "example.com/x"}, None),  # not ours
    ({"orgs": ("system:masters",)}, "fail"),
    ({"signer": c.KUBE_APISERVER_CLIENT, "cn": "alice", "orgs": ("dev",)}, "sign"),
    ({"signer": c.KUBE_APISERVER_CLIENT, "cn": "alice", "usages": ["server auth"]}, "fail"),
    ({"signer": c.KUBELET_SERVING, "usages": SERVING, "dns": ("n1",)}, "sign"),
    ({"signer": c.KUBELET_SERVING, "usages": SERVING}, "fail"),
])
def test_signing(kw: dict[str, Any], expect: str | None) -> None:
    kw.setdefault("conditions", APPROVED)
    obj, req = csr(NODE1, **kw)
    action = p.signing(obj, req)
    if expect is None:
        assert action is None
    elif expect == "fail":
        assert action is not None and action.failure
    else:
        assert action is not None and not action.failure and action.ttl == p.DEFAULT_SIGNING_DURATION


def test_signing_honours_expiration_seconds_and_never_signs_twice() -> None:
    obj, req = csr(NODE1, conditions=APPROVED, expirationSeconds=3600)
    action = p.signing(obj, req)
    assert action is not None and action.ttl == dt.timedelta(hours=1)
    obj["status"]["certificate"] = base64.b64encode(b"x").decode()
    assert p.signing(obj, req) is None
    failed, req = csr(NODE1, conditions=[*APPROVED, c.condition(c.FAILED, "SignerValidationFailure", "")])
    assert p.signing(failed, req) is None


NOW = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)


def _at(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_cleanup_deadlines() -> None:
    obj, _ = csr(NODE1)
    obj["metadata"]["creationTimestamp"] = _at(NOW - dt.timedelta(hours=23))
    assert p.cleanup_due(obj, NOW) == dt.timedelta(hours=1)  # pending: 24h
    obj["metadata"]["creationTimestamp"] = _at(NOW - dt.timedelta(hours=25))
    assert p.cleanup_due(obj, NOW) <= dt.timedelta(0)
    denied = {"type": "Denied", "status": "True", "lastUpdateTime": _at(NOW - dt.timedelta(minutes=30))}
    obj["status"] = {"conditions": [denied]}
    assert p.cleanup_due(obj, NOW) == dt.timedelta(minutes=30)  # denied: 1h
    approved = {"type": "Approved", "status": "True", "lastUpdateTime": _at(NOW - dt.timedelta(minutes=90))}
    obj["status"] = {"conditions": [approved], "certificate": "eA=="}
    assert p.cleanup_due(obj, NOW) <= dt.timedelta(0)  # issued: 1h after approval
    obj["status"]["conditions"][0]["lastUpdateTime"] = _at(NOW)
    assert p.cleanup_due(obj, NOW, cert_not_after=NOW - dt.timedelta(seconds=1)) <= dt.timedelta(0)


def test_token_cleaner_deadline() -> None:
    assert cleanup_in({}, NOW) is None
    assert cleanup_in({"expiration": "2026-12-03T11:00:00Z"}, NOW) == dt.timedelta(hours=1)
    assert cleanup_in({"expiration": "2026-12-03T09:00:00Z"}, NOW) < dt.timedelta(0)
