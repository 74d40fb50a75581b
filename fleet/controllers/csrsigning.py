"""csrsigning: issues certificates for approved CSRs of the built-in signers
(kube-controller-manager's csrsigning controller, the "local" signer).

`csr_plan.signing` decides (pure): sign for min(expirationSeconds, the signing
duration), or mark the request Failed (`SignerValidationFailure`) when it does not
meet its signer's rules.  The signer is an object with `sign_csr(csr_pem, *,
signer, usages, ttl) -> PEM` (the server PKI's ClusterPKI, fleet/auth/pki.py);
the certificate is written through `/status` (the CertificateSigning admission
plugin checks verb `sign`).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from typing import Any

import trio

from fleet.api.kinds import certificates as c
from fleet.client import ApiException
from fleet.controllers import csr_plan
from fleet.controllers.csr_common import API, PLURAL, CSRWorker

log = logging.getLogger(__name__)


class CSRSigningController(CSRWorker):
    name = "csrsigning"

    def __init__(self, signer: Any, *, duration: dt.timedelta = csr_plan.DEFAULT_SIGNING_DURATION) -> None:
        super().__init__()
        self.signer = signer
        self.duration = duration

    async def reconcile(self, key: str) -> float | None:
        name, csr = self.cached(key)
        if csr is None:
            return None
        pem = c.request_pem(csr)
        try:
            req = c.parse_request(pem)
        except ValueError:
            req = None
        action = csr_plan.signing(csr, req, duration=self.duration)
        if action is None:
            return None
        status = dict(csr.get("status") or {})
        if action.failure:
            status["conditions"] = [*c.conditions(csr),
                                    c.condition(c.FAILED, "SignerValidationFailure", action.failure)]
        else:
            signer = str(csr["spec"]["signerName"])
            cert = await trio.to_thread.run_sync(
                lambda: self.signer.sign_csr(pem, signer=signer, usages=action.usages, ttl=action.ttl))
            status["certificate"] = base64.b64encode(cert).decode()
        body = {**csr, "status": status}
        try:
            await self.ctx.client.replace(API, PLURAL, name, body, subresource="status")
        except ApiException as e:
            if e.code in (404, 409):
                return None
            raise
        log.info("certificate signing request %s: %s", name,
                 f"failed: {action.failure}" if action.failure else "certificate issued")
        return None
