"""ServiceAccount controller: every active namespace has a `default` ServiceAccount.

As kube-controller-manager's serviceaccounts-controller: a namespace appearing (or
its `default` ServiceAccount being deleted) is reconciled by creating the account;
terminating namespaces are left alone (the namespace controller is emptying them).
"""

from __future__ import annotations

from typing import Any

from fleet.client import ApiException
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, split_key

DEFAULT = "default"


def needs_default(namespace: dict[str, Any] | None, accounts: list[dict[str, Any]]) -> bool:
    """The pure decision: an active namespace without a `default` account needs one."""
    if namespace is None:
        return False
    if (namespace.get("metadata") or {}).get("deletionTimestamp") or \
            (namespace.get("status") or {}).get("phase") == "Terminating":
        return False
    return not any((a.get("metadata") or {}).get("name") == DEFAULT for a in accounts)


class ServiceAccountController(QueueWorker):
    name = "serviceaccount"
    workers = 2

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.namespaces: SharedInformer = ctx.informers.informer("v1", "namespaces")
        self.accounts: SharedInformer = ctx.informers.informer("v1", "serviceaccounts")
        self.namespaces.add_handler(lambda t, old, new: self.enqueue(new))
        self.accounts.add_handler(self._on_account)

    def _on_account(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED" and old is not None and old["metadata"].get("name") == DEFAULT:
            self.queue.add("/" + old["metadata"]["namespace"])

    async def reconcile(self, key: str) -> float | None:
        _, ns = split_key(key)
        namespace = self.namespaces.get(f"/{ns}")
        if not needs_default(namespace, self.accounts.list(ns)):
            return None
        try:
            await self.ctx.client.create("v1", "serviceaccounts", {
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": DEFAULT, "namespace": ns}}, ns)
        except ApiException as e:
            if e.code == 409:
                return None  # already there (our cache was behind)
            if e.code in (403, 404):
                return None  # the namespace is going or gone
            raise
        return None
