"""tokencleaner: deletes expired bootstrap token Secrets (kube-controller-manager's
tokencleaner), so an expired join token is gone for good — the authenticator
refuses it anyway (fleet/auth/bootstrap.py), this only tidies up.  A token not yet
expired is looked at again when it expires.
"""

from __future__ import annotations

import datetime as dt
import logging

from fleet.auth import bootstrap
from fleet.client import ApiException
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, split_key

log = logging.getLogger(__name__)


def cleanup_in(data: dict[str, str], now: dt.datetime) -> dt.timedelta | None:
    """Time left before the token's Secret is deleted (<= 0: now; None: never)."""
    exp = bootstrap.expiration(data)
    return None if exp is None else exp - now


class TokenCleaner(QueueWorker):
    name = "tokencleaner"
    kind = "Secret"
    workers = 1

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.secrets: SharedInformer = ctx.informers.informer(
            "v1", "secrets", field_selector=f"type={bootstrap.SECRET_TYPE}")
        self.secrets.add_handler(lambda t, old, new: self.enqueue(new))

    async def reconcile(self, key: str) -> float | None:
        ns, name = split_key(key)
        secret = self.secrets.get(key)
        if ns != bootstrap.NAMESPACE or secret is None or not bootstrap.is_bootstrap_secret(secret):
            return None
        left = cleanup_in(bootstrap.secret_data(secret), dt.datetime.now(dt.UTC))
        if left is None:
            return None
        if left > dt.timedelta(0):
            return left.total_seconds() + 0.5
        try:
            await self.ctx.client.delete("v1", "secrets", name, ns,
                                         body={"preconditions": {"uid": secret["metadata"].get("uid")}})
        except ApiException as e:
            if e.code not in (404, 409):
                raise
        log.info("deleted expired bootstrap token secret %s/%s", ns, name)
        return None
