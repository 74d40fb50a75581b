"""root-ca-cert-publisher: a `kube-root-ca.crt` ConfigMap with the server's CA in every namespace.

As kube-controller-manager's root-ca-certificate-publisher (pkg/controller/certificates/
rootcacertpublisher): every namespace holds a ConfigMap `kube-root-ca.crt` whose
`ca.crt` is the CA bundle that verifies the API server, annotated
`kubernetes.io/description`.  Pods read it through their `kube-api-access-*` projected
volume (fleet/admission/serviceaccount.py) to trust `https://kubernetes.default.svc`.
A namespace appearing, the ConfigMap being deleted or changed by someone else, or the
bundle itself changing (CA rotation) queues the namespace; `plan` decides create,
update or nothing; terminating namespaces are left alone.

Where the bundle comes from is the server's business: `RootCAPublisherConfig.ca_bundle`
is a callable returning the PEM bytes (fleet/server/run.py reads `<data-dir>/tls/ca.crt`,
which holds old and new CA while a rotation overlaps).  It is read again every
`poll_interval` seconds, in a worker thread; a change re-queues every namespace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from fleet.client import ApiException
from fleet.controllers.runtime import (
    Context,
    QueueWorker,
    SharedInformer,
    namespace_terminating,
    split_key,
)

log = logging.getLogger(__name__)

CONFIGMAP_NAME = "kube-root-ca.crt"
CA_KEY = "ca.crt"
DESCRIPTION_ANNOTATION = "kubernetes.io/description"
DESCRIPTION = ("Contains a CA bundle that can be used to verify the kube-apiserver when using "
               "internal endpoints such as the internal service IP or kubernetes.default.svc. "
               "No other usage is guaranteed across distributions of Kubernetes clusters.")


@dataclass
class RootCAPublisherConfig:
    # The server CA bundle (PEM); None or b"": nothing to publish (the controller idles).
    ca_bundle: Callable[[], bytes] | None = None
    # How often the bundle is re-read to notice a rotation.
    poll_interval: float = 60.0


@dataclass(frozen=True)
class Action:
    """What `plan` decided: `verb` is "create", "update" or "" (nothing); `body` the object."""

    verb: str
    body: dict[str, Any] | None = None


def _terminating(namespace: dict[str, Any]) -> bool:
    return bool((namespace.get("metadata") or {}).get("deletionTimestamp")) or \
        (namespace.get("status") or {}).get("phase") == "Terminating"


def plan(namespace: dict[str, Any] | None, configmap: dict[str, Any] | None, ca: str) -> Action:
    """The pure decision for one namespace (kube's `syncNamespace`)."""
    if namespace is None or _terminating(namespace) or not ca:
        return Action("")
    ns = namespace["metadata"]["name"]
    data = {CA_KEY: ca}
    if configmap is None:
        return Action("create", {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": CONFIGMAP_NAME, "namespace": ns,
                                              "annotations": {DESCRIPTION_ANNOTATION: DESCRIPTION}},
                                 "data": data})
    md = configmap.get("metadata") or {}
    annotations = md.get("annotations") if isinstance(md.get("annotations"), dict) else {}
    if configmap.get("data") == data and annotations.get(DESCRIPTION_ANNOTATION):
        return Action("")
    body = {**configmap, "metadata": {**md, "annotations": {**annotations,
                                                            DESCRIPTION_ANNOTATION: DESCRIPTION}},
            "data": data}
    return Action("update", body)


class RootCACertPublisher(QueueWorker):
    """Queue keys are namespaces ("/name")."""

    name = "root-ca-cert-publisher"
    kind = "Namespace"
    workers = 2

    def __init__(self, cfg: RootCAPublisherConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or RootCAPublisherConfig()
        self.ca = ""

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.namespaces: SharedInformer = ctx.informers.informer("v1", "namespaces")
        self.configmaps: SharedInformer = ctx.informers.informer(
            "v1", "configmaps", field_selector=f"metadata.name={CONFIGMAP_NAME}")
        self.namespaces.add_handler(self._on_namespace)
        self.configmaps.add_handler(self._on_configmap)

    def _on_namespace(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype != "DELETED":
            self.enqueue(new)

    def _on_configmap(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None or (obj.get("metadata") or {}).get("name") != CONFIGMAP_NAME:
            return
        self.queue.add("/" + str(obj["metadata"].get("namespace") or ""))

    async def _read_ca(self) -> str:
        if self.cfg.ca_bundle is None:
            return ""
        try:
            raw = await trio.to_thread.run_sync(self.cfg.ca_bundle)
        except OSError as e:
            log.warning("root CA publisher: reading the CA bundle: %s; keeping the last one", e)
            return self.ca
        return raw.decode() if raw else ""

    async def run(self, ctx: Context) -> None:
        self.ca = await self._read_ca()
        if not self.ca:
            log.warning("root CA publisher: no CA bundle configured; %s ConfigMaps are not published",
                        CONFIGMAP_NAME)
        async with trio.open_nursery() as n:
            n.start_soon(self._watch_bundle)
            await super().run(ctx)

    async def _watch_bundle(self) -> None:
        while True:
            await trio.sleep(self.cfg.poll_interval)
            ca = await self._read_ca()
            if ca and ca != self.ca:
                log.info("root CA publisher: the CA bundle changed; updating every namespace")
                self.ca = ca
                for ns in self.namespaces.list():
                    self.enqueue(ns)

    async def reconcile(self, key: str) -> float | None:
        _, ns = split_key(key)
        action = plan(self.namespaces.get(f"/{ns}"), self.configmaps.get(f"{ns}/{CONFIGMAP_NAME}"),
                      self.ca)
        try:
            if action.verb == "create":
                await self.ctx.client.create("v1", "configmaps", action.body, ns)
            elif action.verb == "update":
                await self.ctx.client.replace("v1", "configmaps", CONFIGMAP_NAME, action.body, ns)
        except ApiException as e:
            # 403 NamespaceTerminating / 404 on create: the namespace is going or gone.
            # 404/409 otherwise: our cache was behind; the event on its way re-queues us.
            # Any other 403 (a role missing its rule) is an error, retried and logged.
            if e.code in (404, 409) or (action.verb == "create" and namespace_terminating(e)):
                return None
            raise
        return None
