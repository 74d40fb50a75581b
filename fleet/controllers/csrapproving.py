"""csrapproving: auto-approves the CertificateSigningRequests nodes make to join and
to renew (kube-controller-manager's csrapproving controller).

The decision is `csr_plan.approval` (pure); this loop reads CSRs from an informer,
parses the request and writes the verdict through `/approval`, the subresource
`kubectl certificate approve|deny` writes, as the controller's own user (the
CertificateApproval admission plugin checks it may approve for the signer).
"""

from __future__ import annotations

import logging

from fleet.api.kinds import certificates as c
from fleet.client import ApiException
from fleet.controllers import csr_plan
from fleet.controllers.csr_common import API, PLURAL, CSRWorker

log = logging.getLogger(__name__)


class CSRApprovingController(CSRWorker):
    name = "csrapproving"

    async def reconcile(self, key: str) -> float | None:
        name, csr = self.cached(key)
        if csr is None:
            return None
        try:
            req = c.parse_request(c.request_pem(csr))
        except ValueError:
            req = None
        verdict = csr_plan.approval(csr, req)
        if verdict.action == csr_plan.SKIP:
            return None
        ctype = c.APPROVED if verdict.action == csr_plan.APPROVE else c.DENIED
        body = dict(csr)
        body["status"] = dict(csr.get("status") or {})
        body["status"]["conditions"] = [*c.conditions(csr), c.condition(ctype, verdict.reason, verdict.message)]
        try:
            await self.ctx.client.replace(API, PLURAL, name, body, subresource="approval")
        except ApiException as e:
            if e.code in (404, 409):
                return None  # gone, or changed: the informer brings the new version
            raise
        log.info("%s certificate signing request %s: %s", ctype.lower(), name, verdict.message)
        return None
