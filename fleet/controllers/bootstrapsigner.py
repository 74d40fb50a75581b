"""bootstrapsigner: keeps `kube-public/cluster-info` signed for every signing
bootstrap token (kube-controller-manager's bootstrapsigner).

For each valid token with usage-bootstrap-signing, cluster-info's data holds
`jws-kubeconfig-<id>`: a detached HS256 JWS of its kubeconfig keyed by the token
secret; signatures of tokens deleted or expired are removed.  A node joining with
only the token (fleet/agent/bootstrap.py) checks the signature before it trusts the
CA in that kubeconfig.  `bootstrap.signed_data` decides (pure); this loop writes.
"""

from __future__ import annotations

import datetime as dt
import logging

from fleet.auth import bootstrap
from fleet.client import ApiException
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer

log = logging.getLogger(__name__)

KEY = f"{bootstrap.CLUSTER_INFO_NAMESPACE}/{bootstrap.CLUSTER_INFO_NAME}"


class BootstrapSigner(QueueWorker):
    name = "bootstrapsigner"
    kind = "ConfigMap"
    workers = 1

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.configmaps: SharedInformer = ctx.informers.informer(
            "v1", "configmaps", field_selector=f"metadata.name={bootstrap.CLUSTER_INFO_NAME}")
        self.secrets: SharedInformer = ctx.informers.informer(
            "v1", "secrets", field_selector=f"type={bootstrap.SECRET_TYPE}")
        self.configmaps.add_handler(lambda t, old, new: self.queue.add(KEY))
        self.secrets.add_handler(lambda t, old, new: self.queue.add(KEY))

    async def reconcile(self, key: str) -> float | None:
        cm = self.configmaps.get(KEY)
        if cm is None:
            return None
        tokens = self.secrets.list(bootstrap.NAMESPACE)
        now = dt.datetime.now(dt.UTC)
        want = bootstrap.signed_data(cm, tokens, now)
        # A token's signature goes when it expires: look again then.
        expiries = [e for s in tokens if (e := bootstrap.expiration(bootstrap.secret_data(s))) and e > now]
        again = (min(expiries) - now).total_seconds() + 0.5 if expiries else None
        if want is None:
            return again
        body = {**cm, "data": want}
        try:
            await self.ctx.client.replace("v1", "configmaps", bootstrap.CLUSTER_INFO_NAME, body,
                                          bootstrap.CLUSTER_INFO_NAMESPACE)
        except ApiException as e:
            if e.code in (404, 409):
                return None
            raise
        log.info("signed %s for %d bootstrap token(s)", KEY,
                 sum(1 for k in want if k.startswith(bootstrap.JWS_PREFIX)))
        return again
