"""Pod sync: the pods bound to this node, one `PodWorker` each, and restart recovery.

The agent follows only its own pods (`fieldSelector=spec.nodeName=<node>`) through the
one client informer (fleet.client.informer), which re-lists after a 410 or a lost
connection and reports every difference: a pod deleted while the agent could not
watch comes out of the re-list as DELETED, and one deleted and re-created under the
same name as DELETED + ADDED.  Every change goes to the pod's worker, keyed by uid: a
new uid starts a worker, a deletionTimestamp starts graceful termination, a DELETED
tears the worker's pod down.

Recovery, before the first worker starts: `driver.recover()` finds every container
the shims kept alive (or recorded as exited) while the agent was down; they are
handed to their pods' workers by the labels the worker put on them (pod uid,
container name, attempt), so running containers are adopted, not restarted.
Containers and sandboxes of pods no longer bound here are removed, and the network
driver releases addresses of pods that are gone.

`PodSync` also answers the agent API's "which container is this?" questions
(`find`), from the workers' handles.

A pod the agent cannot make sense of (no object envelope, a spec its worker
trips over) is skipped: one log line with its key, a count in
`fleet_object_errors_total{component="agent"}` and, when the pod has a name to
hang it on, a Warning `FailedSync` Event — and the agent carries on with every
other pod.  A worker that crashes later is reported the same way.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import trio

from fleet._core.supervise import object_failed
from fleet.agent.worker import LABEL_POD_UID, PodWorker, WorkerEnv
from fleet.api.meta import malformed
from fleet.client.informer import Informer, object_key
from fleet.runtime.driver import ContainerHandle, RuntimeDriverError

log = logging.getLogger(__name__)


def pod_uid(pod: Any) -> str:
    """The pod's uid, or "" — never an exception, whatever the object holds."""
    md = pod.get("metadata") if isinstance(pod, Mapping) else None
    uid = md.get("uid") if isinstance(md, Mapping) else None
    return uid if isinstance(uid, str) else ""


class PodSync:
    def __init__(self, node_name: str, env: WorkerEnv) -> None:
        self.node_name = node_name
        self.env = env
        self.workers: dict[str, PodWorker] = {}
        self._adoptable: dict[str, list[ContainerHandle]] = {}
        self._nursery: trio.Nursery | None = None
        self.informer: Informer | None = None
        self._recovered = False

    # -- for the agent API -----------------------------------------------------------
    def find_handle(self, namespace: str, pod: str, container: str | None = None, *,
                    previous: bool = False) -> ContainerHandle | None:
        w = self.worker_for(namespace, pod)
        return w.find(container, previous=previous) if w is not None else None

    # fleet.agent.api's ContainerLocator protocol.
    def find(self, namespace: str, pod: str, container: str | None) -> Any:
        from fleet.agent.api import LocateError

        w = self.worker_for(namespace, pod)
        if w is None:
            return None
        names = [c.name for c in w.apps]
        if container is None:
            if len(names) != 1:
                raise LocateError.container_required(pod, names)
            container = names[0]
        run = next((c for c in w.containers() if c.name == container), None)
        if run is None:
            raise LocateError.invalid_container(container, pod)
        return self._located(w, run)

    def _located(self, w: PodWorker, run: Any) -> Any:
        from fleet.agent.api import LocatedContainer

        running = run.handle is not None and "running" in run.view.state
        stdin_path = None
        if run.spec.get("stdin") and run.handle is not None:
            stdin = getattr(self.env.driver, "stdin_path", None)
            stdin_path = stdin(run.handle) if stdin is not None else None
        return LocatedContainer(
            driver=self.env.driver, handle=run.handle if running else None,
            log_path=run.handle.log_path if run.handle else None,
            previous_log_path=run.previous.log_path if run.previous else None,
            stdin_path=stdin_path, tty=bool(run.spec.get("tty")), name=run.name)

    def pod_sandbox(self, namespace: str, pod: str) -> Any:
        from fleet.agent.portforward import PodSandboxRef

        w = self.worker_for(namespace, pod)
        if w is None or w.sandbox is None:
            return None
        # A driver whose containers share the node's network (process) has no pod netns.
        joins = getattr(self.env.driver, "joins_pod_netns", True)
        return PodSandboxRef(w.sandbox.id, w.netns_path if joins else None)

    def all(self) -> list[Any]:
        return [(w.namespace, w.name, w.uid, [(c.name, self._located(w, c))
                                              for c in w.containers()])
                for w in list(self.workers.values())]

    async def volume_entries(self, uid: str) -> list[dict[str, Any]]:
        """/stats/summary `volume` entries of pod `uid` (its claimed volumes)."""
        csi = getattr(self.env, "csi", None)
        return await csi.summary_entries(uid) if csi is not None else []

    async def volume_metrics(self) -> str:
        """kubelet_volume_stats_* samples in Prometheus text format ("" without volumes)."""
        csi = getattr(self.env, "csi", None)
        return await csi.metrics_text() if csi is not None else ""

    def worker_for(self, namespace: str, pod: str) -> PodWorker | None:
        for w in self.workers.values():
            if w.namespace == namespace and w.name == pod:
                return w
        return None

    # -- recovery ------------------------------------------------------------------------
    async def recover(self, live_pods: list[dict[str, Any]]) -> None:
        """Adopt surviving containers; remove what belongs to pods no longer here."""
        try:
            handles = await self.env.driver.recover()
        except (RuntimeDriverError, OSError) as e:
            log.warning("runtime recovery failed: %s", e)
            handles = []
        live = {pod_uid(p) for p in live_pods} - {""}
        by_pod: dict[str, list[ContainerHandle]] = defaultdict(list)
        for h in handles:
            uid = h.labels.get(LABEL_POD_UID) or h.sandbox_id
            if uid in live:
                by_pod[uid].append(h)
            else:
                log.info("removing container %s (%s) of pod %s, no longer on this node",
                         h.id, h.name, uid)
                try:
                    await self.env.driver.remove(h)
                except (RuntimeDriverError, OSError) as e:
                    log.warning("removing container %s: %s", h.id, e)
        self._adoptable = dict(by_pod)
        sandboxes = getattr(self.env.driver, "sandboxes", None)
        if sandboxes is not None:
            for sb in await sandboxes():
                if sb.id not in live:
                    try:
                        await self.env.driver.remove_sandbox(sb)
                    except (RuntimeDriverError, OSError) as e:
                        log.warning("removing sandbox %s: %s", sb.id, e)
        if self.env.network is not None:
            from fleet.network import PodRef
            try:
                await self.env.network.recover(
                    [PodRef.from_pod(p) for p in live_pods if pod_uid(p) in live and malformed(p) is None])
            except Exception as e:
                log.warning("network recovery failed: %s", e)
        n = sum(len(v) for v in by_pod.values())
        if n:
            log.info("re-adopting %d container(s) of %d pod(s)", n, len(by_pod))

    # -- the watch -------------------------------------------------------------------------
    def _on_event(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """Informer handler: every change of a pod bound here goes to its worker.

        Until recovery is done events only fill the informer's cache; `run` then
        hands the whole cache over at once (`_relisted`)."""
        if not self._recovered:
            return
        if etype == "DELETED":
            if old is not None:
                self._handle(old, deleted=True)
        elif new is not None:
            self._handle(new)

    def _malformed(self, pod: Any, why: str) -> None:
        """Informer report of a pod without the common envelope: log, count, Event."""
        self._skipped(pod, ValueError(why))

    def _handle(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        try:
            self._handle_one(pod, deleted)
        except Exception as e:  # noqa: BLE001 - one pod must never stop the agent's sync
            self._skipped(pod, e)

    def _skipped(self, pod: Any, exc: BaseException, action: str = "skipping it") -> None:
        """Report a pod the agent could not handle: log + count, and an Event on it if
        it has the identity one needs (an Event names its object)."""
        object_failed("agent", "Pod", object_key(pod), exc, action=action, logger=log)
        md = pod.get("metadata") if isinstance(pod, Mapping) else None
        if (self.env.events is not None and self._nursery is not None and isinstance(md, Mapping)
                and all(isinstance(md.get(f), str) and md.get(f) for f in ("name", "namespace", "uid"))):
            self._nursery.start_soon(self.env.events.record, dict(pod), "Warning", "FailedSync",
                                     f"node {self.node_name} cannot run this pod ({action}): {exc!r}")

    def _handle_one(self, pod: Mapping[str, Any], deleted: bool) -> None:
        assert self._nursery is not None
        uid = pod_uid(pod)
        if not uid:
            return
        w = self.workers.get(uid)
        if deleted:
            if w is not None:
                w.gone()
            return
        why = malformed(pod)
        if why is not None:
            raise ValueError(why)
        if (pod.get("spec") or {}).get("nodeName") != self.node_name:
            return
        if w is None:
            w = PodWorker(dict(pod), self.env, self._adoptable.pop(uid, []))
            self.workers[uid] = w
            self._nursery.start_soon(self._run_worker, w)
        w.update(dict(pod))

    async def _run_worker(self, w: PodWorker) -> None:
        try:
            await w.run()
        except Exception as e:  # noqa: BLE001 - a broken pod must never take the agent down
            self._skipped(w.pod, e, action="its pod worker crashed")
        finally:
            if self.workers.get(w.uid) is w:
                del self.workers[w.uid]

    def _relisted(self, pods: list[dict[str, Any]]) -> None:
        """Hand a whole list of this node's pods over: workers of pods not in it go."""
        seen = {pod_uid(p) for p in pods}
        for uid, w in list(self.workers.items()):
            if uid not in seen:
                w.gone()
        for p in pods:
            self._handle(p)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            self._nursery = n
            self.informer = Informer(self.env.client, "v1", "pods",
                                     field_selector=f"spec.nodeName={self.node_name}",
                                     retry_backoff=0.5, component="agent",
                                     on_malformed=self._malformed)
            self.informer.add_handler(self._on_event)
            await n.start(self.informer.run)  # retries until the first list succeeds
            await self.recover(self.informer.list())
            self._recovered = True
            # The cache as it is now, recovery having taken a while: pods deleted
            # meanwhile are simply not in it ...
            self._relisted(self.informer.list())
            # ... and the containers recovery kept for them have no worker to take them.
            unclaimed, self._adoptable = self._adoptable, {}
            for uid, handles in unclaimed.items():
                n.start_soon(self._remove_unclaimed, uid, handles)
            task_status.started()

    async def _remove_unclaimed(self, uid: str, handles: list[ContainerHandle]) -> None:
        for h in handles:
            log.info("removing container %s (%s) of pod %s, deleted while the agent recovered",
                     h.id, h.name, uid)
            try:
                await self.env.driver.remove(h)
            except (RuntimeDriverError, OSError) as e:
                object_failed("agent", "Pod", uid, e, action=f"removing its container {h.id} failed",
                              logger=log)
