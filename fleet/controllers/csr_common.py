"""What the three CertificateSigningRequest controllers (csrapproving, csrsigning,
csrcleaner) share: one informer on CSRs, every change queued, a key read back as the
cached object.  Their decisions are `csr_plan`'s."""

from __future__ import annotations

from typing import Any

from fleet.api.kinds import certificates as c
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, split_key

API = f"{c.GROUP}/v1"
PLURAL = "certificatesigningrequests"


class CSRWorker(QueueWorker):
    kind = "CertificateSigningRequest"
    workers = 1

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.csrs: SharedInformer = ctx.informers.informer(API, PLURAL)
        self.csrs.add_handler(lambda t, old, new: self.enqueue(new))

    def cached(self, key: str) -> tuple[str, dict[str, Any] | None]:
        """(name, the CSR as the informer has it, or None once it is gone)."""
        _, name = split_key(key)
        return name, self.csrs.get(f"/{name}")
