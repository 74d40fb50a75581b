"""csrcleaner: removes CertificateSigningRequests once they have served their purpose
(kube-controller-manager's csrcleaner): pending ones after 24 hours, issued,
denied and failed ones an hour after the decision, and any whose certificate has
expired.  `csr_plan.cleanup_due` decides; each CSR is looked at again when its
deadline comes.
"""

from __future__ import annotations

import datetime as dt
import logging

from cryptography import x509

from fleet.api.kinds import certificates as c
from fleet.client import ApiException
from fleet.controllers import csr_plan
from fleet.controllers.csr_common import API, PLURAL, CSRWorker

log = logging.getLogger(__name__)


def cert_not_after(pem: bytes) -> dt.datetime | None:
    try:
        return x509.load_pem_x509_certificates(pem)[0].not_valid_after_utc if pem else None
    except (ValueError, IndexError):
        return None


class CSRCleanerController(CSRWorker):
    name = "csrcleaner"

    async def reconcile(self, key: str) -> float | None:
        name, csr = self.cached(key)
        if csr is None:
            return None
        due = csr_plan.cleanup_due(csr, dt.datetime.now(dt.UTC), cert_not_after(c.certificate_pem(csr)))
        if due > dt.timedelta(0):
            return due.total_seconds() + 1
        try:
            await self.ctx.client.delete(API, PLURAL, name)
        except ApiException as e:
            if e.code != 404:
                raise
        log.info("deleted certificate signing request %s (past its cleanup deadline)", name)
        return None
