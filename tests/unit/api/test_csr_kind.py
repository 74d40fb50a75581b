"""certificates.k8s.io/v1 CertificateSigningRequest through the real API pipeline:
requester stamping, validation, the approval and status subresources, table columns,
and the CSR admission plugins."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest

from fleet.admission import certificates as adm
from fleet.agent.bootstrap import csr_object, make_csr, new_key
from fleet.api import errors
from fleet.api.kinds import certificates as c
from fleet.auth import Attributes, Decision, UserInfo
from fleet.testing.apiserver import open_api

BASE = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def node_csr(name: str = "csr-1", cn: str = "system:node:n1", orgs: tuple[str, ...] = ("system:nodes",),
             signer: str = c.KUBE_APISERVER_CLIENT_KUBELET) -> dict[str, Any]:
    pem = make_csr(new_key(), cn, orgs)
    return csr_object(pem, signer, ["digital signature", "client auth"], name=name)


async def test_create_stamps_requester_and_drops_status(tmp_path: Path) -> None:
    async with open_api(tmp_path, namespace_controller=False) as api:
        body = node_csr()
        body["spec"].update(username="system:node:evil", groups=["system:masters"])
        body["status"] = {"certificate": "Zm9v"}
        code, obj = await api.json("POST", BASE, body)
        assert code == 201, obj
        assert obj["spec"]["username"] == "system:admin"
        assert "system:masters" in obj["spec"]["groups"]
        assert "status" not in obj or not obj["status"].get("certificate")


@pytest.mark.parametrize("mutate, field, msg", [
    (lambda o: o["spec"].update(request=base64.b64encode(b"hello").decode()), "spec.request",
     "PEM block type must be CERTIFICATE REQUEST"),
    (lambda o: o["spec"].pop("signerName"), "spec.signerName", "Required value"),
    (lambda o: o["spec"].update(signerName="kubernetes.io/legacy-unknown"), "spec.signerName", "legacy"),
    (lambda o: o["spec"].update(usages=["client auth", "client auth"]), "spec.usages[1]", "Duplicate"),
    (lambda o: o["spec"].update(usages=["flying"]), "spec.usages[0]", "Unsupported value"),
    (lambda o: o["spec"].update(usages=[]), "spec.usages", "Required value"),
    (lambda o: o["spec"].update(expirationSeconds=60), "spec.expirationSeconds", "600 seconds"),
])
async def test_invalid_requests(tmp_path: Path, mutate: Any, field: str, msg: str) -> None:
    async with open_api(tmp_path, namespace_controller=False) as api:
        body = node_csr()
        mutate(body)
        code, obj = await api.json("POST", BASE, body)
        assert code == 422, obj
        causes = obj["details"]["causes"]
        assert any(x["field"] == field and msg in x["message"] for x in causes), causes


async def test_approval_subresource_and_status(tmp_path: Path) -> None:
    async with open_api(tmp_path, namespace_controller=False) as api:
        code, obj = await api.json("POST", BASE, node_csr())
        assert code == 201
        # The main resource only changes metadata.
        upd = copy.deepcopy(obj)
        upd["spec"]["signerName"] = "example.com/other"
        upd["metadata"]["labels"] = {"a": "b"}
        upd["status"] = {"conditions": [c.condition(c.APPROVED, "Sneaky", "")]}
        code, out = await api.json("PUT", f"{BASE}/csr-1", upd)
        assert code == 200, out
        assert out["spec"]["signerName"] == c.KUBE_APISERVER_CLIENT_KUBELET
        assert out["metadata"]["labels"] == {"a": "b"}
        assert not c.conditions(out)
        # kubectl certificate approve: the object with a condition added, PUT to /approval.
        out["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "KubectlApprove",
                                         "message": "This CSR was approved by kubectl certificate approve."}],
                         "certificate": "c25lYWt5"}
        code, approved = await api.json("PUT", f"{BASE}/csr-1/approval", out)
        assert code == 200, approved
        cond = c.conditions(approved)[0]
        assert cond["type"] == "Approved" and cond["lastUpdateTime"] and cond["lastTransitionTime"]
        assert "certificate" not in approved["status"]  # approval cannot issue
        # Approved and Denied are exclusive.
        both = copy.deepcopy(approved)
        both["status"]["conditions"].append({"type": "Denied", "status": "True"})
        code, err = await api.json("PUT", f"{BASE}/csr-1/approval", both)
        assert code == 422 and "mutually exclusive" in err["message"]
        # The signer's /status: sets the certificate, cannot drop the approval.
        import datetime as dt

        from fleet.auth.pki import ClusterPKI

        pki = ClusterPKI(tmp_path / "pki")
        pki.ensure([])
        cert = pki.sign_csr(
            c.request_pem(approved), signer=c.KUBE_APISERVER_CLIENT_KUBELET,
            usages=["digital signature", "client auth"], ttl=dt.timedelta(hours=1))
        st = copy.deepcopy(approved)
        st["status"] = {"certificate": base64.b64encode(cert).decode(), "conditions": []}
        code, issued = await api.json("PUT", f"{BASE}/csr-1/status", st)
        assert code == 200, issued
        assert c.is_approved(issued) and c.is_issued(issued)
        # An issued certificate never changes.
        again = copy.deepcopy(issued)
        again["status"]["certificate"] = base64.b64encode(cert + cert).decode()
        code, err = await api.json("PUT", f"{BASE}/csr-1/status", again)
        assert code == 422 and "existing certificate" in err["message"]
        # kubectl's columns.
        resp = await api.call("GET", BASE, headers={"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
        import json

        table = json.loads(resp.body)
        assert [col["name"] for col in table["columnDefinitions"]] == [
            "Name", "Age", "SignerName", "Requestor", "RequestedDuration", "Condition"]
        cells = table["rows"][0]["cells"]
        assert cells[0] == "csr-1" and cells[2] == c.KUBE_APISERVER_CLIENT_KUBELET
        assert cells[3] == "system:admin" and cells[4] == "<none>" and cells[5] == "Approved,Issued"


class SignerAuthz:
    """Allows verb on signers named in `allowed` only."""

    def __init__(self, *allowed: tuple[str, str]) -> None:
        self.allowed = set(allowed)
        self.asked: list[Attributes] = []

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        self.asked.append(attrs)
        return Decision((attrs.verb, attrs.name) in self.allowed)


ATTRS = Attributes("update", c.GROUP, "v1", "certificatesigningrequests", "approval", name="csr-1")
USER = UserInfo("alice")


async def test_approval_needs_approve_on_the_signer() -> None:
    csr = node_csr()
    plugin = adm.CertificateApproval(SignerAuthz())
    with pytest.raises(errors.Forbidden, match='user not permitted to approve requests with signerName '
                                               '"kubernetes.io/kube-apiserver-client-kubelet"'):
        await plugin.validate(ATTRS, USER, csr, csr)
    assert [(a.verb, a.resource, a.name) for a in plugin.authorizer.asked] == [  # type: ignore[attr-defined]
        ("approve", "signers", c.KUBE_APISERVER_CLIENT_KUBELET), ("approve", "signers", "kubernetes.io/*")]
    await adm.CertificateApproval(SignerAuthz(("approve", "kubernetes.io/*"))).validate(ATTRS, USER, csr, csr)
    # Other subresources are not its business.
    await plugin.validate(Attributes("update", c.GROUP, "v1", "certificatesigningrequests", "status"), USER,
                          csr, csr)


async def test_signing_needs_sign_when_the_certificate_changes() -> None:
    old = node_csr()
    new = copy.deepcopy(old)
    new["status"] = {"certificate": "eA=="}
    attrs = Attributes("update", c.GROUP, "v1", "certificatesigningrequests", "status", name="csr-1")
    with pytest.raises(errors.Forbidden, match="not permitted to sign"):
        await adm.CertificateSigning(SignerAuthz()).validate(attrs, USER, new, old)
    await adm.CertificateSigning(SignerAuthz()).validate(attrs, USER, old, old)
    await adm.CertificateSigning(SignerAuthz(("sign", c.KUBE_APISERVER_CLIENT_KUBELET))).validate(
        attrs, USER, new, old)


async def test_no_system_masters_from_the_client_signer() -> None:
    attrs = Attributes("create", c.GROUP, "v1", "certificatesigningrequests", name="csr-1")
    bad = node_csr(cn="mallory", orgs=("system:masters",), signer=c.KUBE_APISERVER_CLIENT)
    with pytest.raises(errors.Forbidden, match="with system:masters group is not allowed"):
        await adm.CertificateSubjectRestriction().validate(attrs, USER, bad, None)
    await adm.CertificateSubjectRestriction().validate(attrs, USER, node_csr(cn="bob", orgs=("dev",),
                                                                             signer=c.KUBE_APISERVER_CLIENT), None)
