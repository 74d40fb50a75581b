"""Admission for CertificateSigningRequests: who may approve, sign, and ask for what.

Three of kube-apiserver's plugins (plugin/pkg/admission/certificates), validating:

* **CertificateApproval** — a write to `/approval` needs verb `approve` on resource
  `signers` (group certificates.k8s.io) named after the CSR's signer, or the
  signer's domain wildcard (`kubernetes.io/*`);
* **CertificateSigning** — a `/status` write that changes `status.certificate`
  needs verb `sign` on the same `signers` resource;
* **CertificateSubjectRestriction** — nobody may ask the kube-apiserver-client
  signer for a certificate in `system:masters` (that is cluster-admin for life).

The authorizer is the server's (fleet/server/security.py builds these plugins with
it); with `--authorization-mode AlwaysAllow` everyone may approve and sign, as in
Kubernetes.
"""

from __future__ import annotations

from typing import Any

from fleet.api import errors
from fleet.api.kinds import certificates as csrs
from fleet.auth import SYSTEM_MASTERS, Attributes, Authorizer, UserInfo

RESOURCE = "certificatesigningrequests"


def authorized_for_signer(authorizer: Authorizer, user: UserInfo, verb: str, signer: str) -> bool:
    """IsAuthorizedForSignerName: the exact signer, then `<domain>/*`."""
    for name in (signer, signer.split("/", 1)[0] + "/*"):
        attrs = Attributes(verb, csrs.GROUP, "*", "signers", name=name)
        if authorizer.authorize(user, attrs).allowed:
            return True
    return False


def _forbidden(attrs: Attributes, why: str) -> errors.Forbidden:
    return errors.Forbidden(f'{RESOURCE}.{csrs.GROUP} "{attrs.name}" is forbidden: {why}',
                            name=attrs.name, group=csrs.GROUP, kind=RESOURCE)


def _signer(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("spec") or {}).get("signerName") or "")


class CertificateApproval:
    name = "CertificateApproval"

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if attrs.group != csrs.GROUP or attrs.resource != RESOURCE or attrs.subresource != "approval":
            return
        signer = _signer(obj or old)
        if not authorized_for_signer(self.authorizer, user, "approve", signer):
            raise _forbidden(attrs, f'user not permitted to approve requests with signerName "{signer}"')


class CertificateSigning:
    name = "CertificateSigning"

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if attrs.group != csrs.GROUP or attrs.resource != RESOURCE or attrs.subresource != "status":
            return
        if obj is None or old is None:
            return
        if ((obj.get("status") or {}).get("certificate") or "") == \
                ((old.get("status") or {}).get("certificate") or ""):
            return
        signer = _signer(obj)
        if not authorized_for_signer(self.authorizer, user, "sign", signer):
            raise _forbidden(attrs, f'user not permitted to sign requests with signerName "{signer}"')


class CertificateSubjectRestriction:
    name = "CertificateSubjectRestriction"

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if attrs.group != csrs.GROUP or attrs.resource != RESOURCE or attrs.verb != "create" \
                or attrs.subresource or obj is None:
            return
        if _signer(obj) != csrs.KUBE_APISERVER_CLIENT:
            return
        try:
            req = csrs.parse_request(csrs.request_pem(obj))
        except ValueError:
            return  # validation reports it
        if SYSTEM_MASTERS in csrs.subject_orgs(req):
            raise _forbidden(attrs, f"use of {csrs.KUBE_APISERVER_CLIENT} signer with {SYSTEM_MASTERS} "
                                    "group is not allowed")


def plugins(authorizer: Authorizer) -> list[Any]:
    """The three, in kube-apiserver's order."""
    return [CertificateApproval(authorizer), CertificateSigning(authorizer), CertificateSubjectRestriction()]
