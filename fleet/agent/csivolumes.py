"""Claimed volumes on this node: stage, publish, unpublish, unstage, expand, report.

One `NodeVolumes` per agent, shared by every pod worker (the kubelet's volume manager
for CSI volumes).  The pod's `VolumeManager` (fleet.agent.volumes) hands it each
`persistentVolumeClaim` / `ephemeral` volume; the decisions are in
`fleet.agent.csiplan`, the driver calls go through `fleet.storage.driver.Driver`:

    claim bound? (else MountProblem → FailedMount, the worker retries)
      → PV bound to the claim? → CSI driver registered here?
      → attach_required: wait for the VolumeAttachment csi-<sha256> (the server's
        attach/detach controller makes it, the driver's attacher marks it attached;
        its attachmentMetadata is the publish context)
      → node_stage once per volume per node at <data_dir>/plugins/kubernetes.io/csi/
        <driver>/<sha256(handle)>/globalmount (vol_data.json beside it names the volume)
      → node_publish into the pod's volume path (a directory; a file for Block)

What each pod has published is written to `<pod_dir>/csi-volumes.json` *before* the
publish call, so a crash between the two still leaves a record to tear down from.  A
restarted agent reads every record back (`recover`): running pods keep their mounts
(set-up sees the record and the mount and does nothing), records of pods no longer
on the node are unpublished, and staged volumes no pod uses are unstaged — before the
agent's start-time garbage collection would otherwise unmount them blindly.

Staging is reference-counted by the records: a volume is unstaged when the last pod
on the node using it is torn down.  Staged volumes are reported in the Node's
`status.volumesInUse` (`volumes_in_use`), so the attach/detach controller detaches
none before its unstage.  One Trio lock per volume orders a pod's publish against
another pod's unstage.

`run` keeps the CSINode object and the Node's csi.volume.kubernetes.io/nodeid
annotation up to date (real nodes only), grows published volumes whose claim carries
FileSystemResizePending (node_expand; FAILED_PRECONDITION while mounted waits for the
next stage, where the driver grows the volume offline), and sweeps stagings no pod
uses.  `stats` feeds /stats/summary and the kubelet_volume_stats_* metrics.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.agent import csiplan
from fleet.agent.csiplan import MountProblem, PodRecord, Published, Staged, VolumeFacts
from fleet.api.pvmatch import attachment_name, unique_volume_name
from fleet.client import MERGE_PATCH, ApiException
from fleet.storage import registry
from fleet.storage.driver import Code, Driver, DriverEnv, DriverError, VolumeStats
from fleet.storage.mounts import mount_at

log = logging.getLogger(__name__)

ATTACH_TIMEOUT = 15.0
SYNC_PERIOD = 10.0
STATS_MAX_AGE = 10.0

_API_ERRORS = (ApiException, httpx.TransportError, OSError)


def _mounted(path: Path) -> bool:
    """A mount point (by mountinfo: os.path.ismount misses a bind mount within one
    file system); a symlink (a driver's non-root publish) is not one."""
    return not Path(path).is_symlink() and mount_at(Path(path)) is not None


class NodeVolumes:
    """The node's CSI volumes (see the module docstring)."""

    def __init__(self, client: Any, data_dir: Path, node_name: str, *,
                 drivers: Mapping[str, Driver] | None = None,
                 node_labels: Callable[[], Mapping[str, str]] | None = None,
                 events: Any = None, simulated: bool = False,
                 attach_timeout: float = ATTACH_TIMEOUT) -> None:
        self.client = client
        self.data_dir = Path(data_dir)
        self.node_name = node_name
        self.events = events
        self.simulated = simulated
        self.attach_timeout = attach_timeout
        labels = dict(node_labels() if node_labels else {})
        if drivers is None:
            drivers = {}
            for name in registry.names():
                env = DriverEnv(data_dir=self.data_dir / "storage" / name, node_name=node_name,
                                node_labels=labels)
                env.data_dir.mkdir(parents=True, exist_ok=True)
                try:
                    drivers[name] = registry.create(name, env)
                except Exception as e:  # noqa: BLE001 - one broken plugin must not stop the node
                    log.error("storage driver %s failed to start: %s", name, e)
        self.drivers: dict[str, Driver] = dict(drivers)
        self._records: dict[str, PodRecord] = {}
        self._pod_dirs: dict[str, Path] = {}
        self._staged: dict[tuple[str, str], Staged] = {}
        # Staged (node_stage returned) in this run of the agent.
        self._stage_confirmed: set[tuple[str, str]] = set()
        self._locks: dict[tuple[str, str], trio.Lock] = {}
        # Volumes whose node_expand said FAILED_PRECONDITION: retried after next stage.
        self._expand_after_stage: set[tuple[str, str]] = set()
        # Volumes this agent made a VolumeAttachment for: deleted at unstage.
        self._attach_reported: set[tuple[str, str]] = set()
        self._stats: dict[tuple[str, str], tuple[float, VolumeStats]] = {}
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._no_csinode_kind = False

    # -- helpers ---------------------------------------------------------------------
    def _lock(self, key: tuple[str, str]) -> trio.Lock:
        return self._locks.setdefault(key, trio.Lock())

    def driver(self, name: str) -> Driver:
        d = self.drivers.get(name)
        if d is None:
            raise MountProblem(f"kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: "
                               f"driver name {name} not found in the list of registered CSI "
                               "drivers")
        return d

    async def _get(self, api_version: str, plural: str, name: str,
                   namespace: str | None = None) -> tuple[dict[str, Any] | None, str]:
        try:
            return await self.client.get_object(api_version, plural, name, namespace), ""
        except ApiException as e:
            if e.code == 404:
                return None, ""
            return None, str(e)
        except (httpx.TransportError, OSError) as e:
            return None, str(e)

    async def _event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        if self.events is not None:
            await self.events.record(dict(pod), type_, reason, message)

    def _record(self, uid: str, pod_dir: Path) -> PodRecord:
        rec = self._records.get(uid)
        if rec is None:
            rec = csiplan.load_record(pod_dir) or PodRecord(uid=uid)
            self._records[uid] = rec
            self._pod_dirs[uid] = pod_dir
        return rec

    async def _save(self, uid: str) -> None:
        rec, pod_dir = self._records[uid], self._pod_dirs[uid]
        await trio.to_thread.run_sync(csiplan.save_record, pod_dir, rec)

    def _users(self) -> dict[tuple[str, str], set[str]]:
        return csiplan.users(self._records.values())

    # -- set-up ----------------------------------------------------------------------
    async def resolve(self, pod: Mapping[str, Any],
                      vol: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], VolumeFacts]:
        """The bound claim, its PV and the CSI facts; MountProblem when not usable yet."""
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        claim, err = await self._get("v1", "persistentvolumeclaims",
                                     csiplan.claim_name(pod, vol), ns)
        pv_name = csiplan.check_claim(pod, vol, claim, err)
        assert claim is not None
        pv, err = await self._get("v1", "persistentvolumes", pv_name)
        csiplan.check_volume(pod, vol, claim, pv, err)
        assert pv is not None
        return claim, pv, csiplan.volume_facts(vol, pv)

    async def publish(self, pod: Mapping[str, Any], vol: Mapping[str, Any], pod_dir: Path,
                      target_for: Callable[[VolumeFacts], Path]) -> tuple[Path, VolumeFacts]:
        """Make volume `vol` of `pod` appear at `target_for(facts)` (a directory for a
        Filesystem volume, a device file for Block); idempotent (an agent restart
        finds the record and the mount and does nothing).  MountProblem when the claim
        cannot be used yet, DriverFailure when a driver call failed."""
        md = pod.get("metadata") or {}
        uid = str(md.get("uid") or "")
        ns = md.get("namespace") or "default"
        name = str(vol.get("name") or "")
        _claim, _pv, facts = await self.resolve(pod, vol)
        target = Path(target_for(facts))
        drv = self.driver(facts.driver)
        if facts.mode not in drv.capabilities.volume_modes:
            raise MountProblem(f"volume mode {facts.mode} is not supported by CSI driver "
                               f"{facts.driver}")
        self._pods[uid] = pod
        rec = self._record(uid, pod_dir)
        key = (facts.driver, facts.handle)
        staging = csiplan.staging_path(self.data_dir, facts.driver, facts.handle)
        async with self._lock(key):
            have = rec.volumes.get(name)
            if (have is not None and have.done and have.key == key
                    and await trio.to_thread.run_sync(self._still_published, have)):
                self._staged.setdefault(key, Staged(facts.driver, facts.handle, staging))
                return target, facts
            publish_context: Mapping[str, str] = {}
            if drv.capabilities.attach_required:
                publish_context = await self._wait_attached(pod, facts, drv)
            if key not in self._stage_confirmed:
                # Also for a staging an earlier run left (known from its vol_data.json):
                # node_stage is idempotent, and it re-mounts what a `fleet killall` or a
                # reboot took away.
                await self._stage(facts, drv, staging, publish_context)
            rec.volumes[name] = Published(
                volume=name, driver=facts.driver, handle=facts.handle, pv=facts.pv,
                claim=csiplan.claim_name(pod, vol), namespace=ns, mode=facts.mode,
                read_only=facts.read_only, target=str(target), staging=str(staging))
            await self._save(uid)

            # As the kubelet: the parent exists, the driver makes the target itself.
            await trio.to_thread.run_sync(
                lambda: target.parent.mkdir(parents=True, exist_ok=True))
            try:
                await drv.node_publish(facts.handle, staging, target,
                                       read_only=facts.read_only,
                                       volume_mode=facts.mode,  # type: ignore[arg-type]
                                       context=facts.attributes)
            except DriverError as e:
                raise csiplan.driver_failure("SetUp", facts.pv, e.code.value, e.message) from e
            rec.volumes[name].done = True
            await self._save(uid)
        log.info("pod %s/%s: volume %s (%s) published at %s", ns, md.get("name"), name,
                 facts.pv, target)
        return target, facts

    @staticmethod
    def _still_published(p: Published) -> bool:
        """The target still shows the volume: a mount (or, for a driver that publishes
        without mounting, a symlink or a device file) is there."""
        target = Path(p.target)
        if not os.path.lexists(target):
            return False
        return _mounted(target) or target.is_symlink() or not target.is_dir()

    async def _stage(self, facts: VolumeFacts, drv: Driver, staging: Path,
                     publish_context: Mapping[str, str]) -> None:
        def prepare() -> None:
            staging.mkdir(parents=True, exist_ok=True)
            (staging.parent / csiplan.VOL_DATA_NAME).write_text(json.dumps(
                {"driverName": facts.driver, "volumeHandle": facts.handle,
                 "specVolID": facts.pv, "volumeMode": facts.mode}))

        await trio.to_thread.run_sync(prepare)
        key = (facts.driver, facts.handle)
        # Known before the call: a stage that failed half-way is still unstaged (node_
        # unstage is idempotent) when no pod wants the volume any more.
        self._staged[key] = Staged(facts.driver, facts.handle, staging)
        try:
            await drv.node_stage(facts.handle, staging, facts.attributes,
                                 facts.mode, publish_context)  # type: ignore[arg-type]
        except DriverError as e:
            raise csiplan.driver_failure("MountDevice", facts.pv, e.code.value, e.message) from e
        self._stage_confirmed.add(key)
        # An expansion refused while mounted happened offline in this stage: retry it.
        self._expand_after_stage.discard(key)
        log.info("volume %s (%s) staged at %s", facts.pv, facts.handle, staging)

    def volumes_in_use(self) -> list[str]:
        """The staged volumes' unique names, for the Node's `status.volumesInUse`."""
        return [unique_volume_name(d, h) for d, h in self._staged]

    async def _wait_attached(self, pod: Mapping[str, Any], facts: VolumeFacts,
                             drv: Driver) -> Mapping[str, str]:
        """Wait for the VolumeAttachment of (volume, node) to be attached; its
        attachmentMetadata."""
        name = attachment_name(facts.handle, facts.driver, self.node_name)
        # The attach/detach controller creates the attachment once the pod is scheduled
        # here; the driver's attacher marks it attached.
        va, _ = await self._get("storage.k8s.io/v1", "volumeattachments", name)
        deadline = trio.current_time() + self.attach_timeout
        while True:
            status = (va or {}).get("status") or {}
            if status.get("attached"):
                if (facts.driver, facts.handle) not in self._attach_reported:
                    self._attach_reported.add((facts.driver, facts.handle))
                    await self._event(pod, "Normal", "SuccessfulAttachVolume",
                                      f'AttachVolume.Attach succeeded for volume "{facts.pv}" ')
                return {str(k): str(v) for k, v in (status.get("attachmentMetadata") or {}).items()}
            attach_error = (status.get("attachError") or {}).get("message")
            if attach_error:
                raise MountProblem(f'AttachVolume.Attach failed for volume "{facts.pv}" : '
                                   f"{attach_error}")
            if trio.current_time() >= deadline:
                raise MountProblem(f"timed out waiting for external-attacher of {facts.driver} "
                                   f"CSI driver to attach volume {facts.handle}")
            await trio.sleep(0.2)
            va, _ = await self._get("storage.k8s.io/v1", "volumeattachments", name)

    # -- teardown --------------------------------------------------------------------
    async def unpublish_pod(self, uid: str, pod_dir: Path) -> None:
        """Unpublish every claimed volume of pod `uid`, unstaging those no other pod on
        the node uses; the record goes once everything is down.  Raises on a driver
        failure (the worker retries its teardown)."""
        rec = self._records.get(uid)
        if rec is None:
            rec = await trio.to_thread.run_sync(csiplan.load_record, pod_dir)
            if rec is None:
                return
            self._records[uid] = rec
            self._pod_dirs[uid] = pod_dir
        for p in list(rec.volumes.values()):
            async with self._lock(p.key):
                drv = self.driver(p.driver)
                await drv.node_unpublish(p.handle, Path(p.target))
                await trio.to_thread.run_sync(_remove_target, Path(p.target))
                del rec.volumes[p.volume]
                await self._save(uid)
                if not self._users().get(p.key):
                    await self._unstage(Staged(p.driver, p.handle, Path(p.staging)))
        self._records.pop(uid, None)
        self._pod_dirs.pop(uid, None)
        self._pods.pop(uid, None)
        with contextlib.suppress(FileNotFoundError):
            await trio.to_thread.run_sync((Path(pod_dir) / csiplan.RECORD_NAME).unlink)

    async def _unstage(self, s: Staged) -> None:
        drv = self.driver(s.driver)
        await drv.node_unstage(s.handle, s.path)
        key = (s.driver, s.handle)
        self._staged.pop(key, None)
        self._stage_confirmed.discard(key)
        self._stats.pop(key, None)

        def remove() -> None:
            if s.path.exists() and not _mounted(s.path):
                s.path.rmdir() if s.path.is_dir() else s.path.unlink()
            with contextlib.suppress(FileNotFoundError):
                (s.path.parent / csiplan.VOL_DATA_NAME).unlink()
            with contextlib.suppress(OSError):
                s.path.parent.rmdir()

        await trio.to_thread.run_sync(remove)
        log.info("volume %s unstaged from %s", s.handle, s.path)
        self._attach_reported.discard(key)

    # -- restart ---------------------------------------------------------------------
    def _scan(self) -> tuple[dict[str, PodRecord], list[Staged]]:
        records: dict[str, PodRecord] = {}
        pods = self.data_dir / "pods"
        if pods.is_dir():
            for d in pods.iterdir():
                rec = csiplan.load_record(d)
                if rec is not None:
                    records[d.name] = rec
        staged: list[Staged] = []
        root = self.data_dir / csiplan.CSI_PLUGIN_DIR
        if root.is_dir():
            for vol_data in root.glob(f"*/*/{csiplan.VOL_DATA_NAME}"):
                try:
                    doc = json.loads(vol_data.read_text())
                except (OSError, ValueError):
                    continue
                s = Staged(str(doc.get("driverName") or vol_data.parent.parent.name),
                           str(doc.get("volumeHandle") or ""), vol_data.parent / "globalmount")
                staged.append(s)
        return records, staged

    async def recover(self, live_uids: set[str]) -> list[str]:
        """After a restart: adopt the records of live pods, tear down those of pods
        gone meanwhile, unstage what nobody uses; the problems met (logged)."""
        records, staged = await trio.to_thread.run_sync(self._scan)
        problems: list[str] = []
        for s in staged:
            self._staged[(s.driver, s.handle)] = s
        for uid, rec in records.items():
            self._records[uid] = rec
            self._pod_dirs[uid] = self.data_dir / "pods" / uid
        for uid in sorted(set(records) - live_uids):
            try:
                await self.unpublish_pod(uid, self.data_dir / "pods" / uid)
                log.info("volumes of pod %s (gone while the agent was down) torn down", uid)
            except (DriverError, MountProblem, OSError) as e:
                problems.append(f"pod {uid}: {e}")
        problems += await self.sweep()
        for p in problems:
            log.warning("volume recovery: %s", p)
        return problems

    async def sweep(self) -> list[str]:
        """Unstage staged volumes no pod on the node uses."""
        problems = []
        in_use = self._users()
        for s in csiplan.unused_stagings(list(self._staged.values()), in_use):
            async with self._lock((s.driver, s.handle)):
                if self._users().get((s.driver, s.handle)):
                    continue
                try:
                    await self._unstage(s)
                except (DriverError, MountProblem, OSError) as e:
                    problems.append(f"unstaging {s.handle}: {e}")
        return problems

    # -- expansion -------------------------------------------------------------------
    async def expand_once(self) -> None:
        """node_expand every published volume whose claim waits for it."""
        done: set[tuple[str, str]] = set()
        for uid, rec in list(self._records.items()):
            for p in list(rec.volumes.values()):
                if not p.done or p.key in done:
                    continue
                done.add(p.key)
                await self._expand_one(uid, p)

    async def _expand_one(self, uid: str, p: Published) -> None:
        if p.key in self._expand_after_stage:
            return
        claim, _ = await self._get("v1", "persistentvolumeclaims", p.claim, p.namespace)
        if claim is None:
            return
        pv, _ = await self._get("v1", "persistentvolumes", p.pv)
        if pv is None:
            return
        step = csiplan.expansion_step(claim, pv)
        if step is None:
            return
        drv = self.drivers.get(p.driver)
        if drv is None:
            return
        pod = self._pods.get(uid) or {"metadata": {"uid": uid, "name": "", "namespace": p.namespace}}
        async with self._lock(p.key):
            try:
                await drv.node_expand(p.handle, Path(p.target), step.capacity_bytes)
            except DriverError as e:
                if e.code is Code.FAILED_PRECONDITION:
                    self._expand_after_stage.add(p.key)
                    log.info("volume %s: %s; growing at next stage", p.pv, e.message)
                    return
                await self._event(pod, "Warning", "FileSystemResizeFailed",
                                  f'MountVolume.NodeExpandVolume failed for volume "{p.pv}" : '
                                  f"{e.message}")
                return
        status = csiplan.expanded_claim_status(claim, step.capacity)
        try:
            await self.client.patch("v1", "persistentvolumeclaims", p.claim, {"status": status},
                                    MERGE_PATCH, namespace=p.namespace, subresource="status")
        except _API_ERRORS as e:
            log.warning("claim %s/%s: status update after expansion failed: %s", p.namespace,
                        p.claim, e)
            return
        self._stats.pop(p.key, None)
        await self._event(pod, "Normal", "FileSystemResizeSuccessful",
                          f'MountVolume.NodeExpandVolume succeeded for volume "{p.pv}" '
                          f"{self.node_name}")

    # -- CSINode ---------------------------------------------------------------------
    async def sync_csinode(self) -> None:
        """Create or update CSINode <node> and the Node's nodeid annotation."""
        if self.simulated:
            return
        drivers = csiplan.csinode_drivers(self.drivers, self.node_name)
        node, err = await self._get("v1", "nodes", self.node_name)
        if node is None:
            return
        want = csiplan.node_id_annotation(self.drivers, self.node_name,
                                          ((node.get("metadata") or {}).get("annotations") or {})
                                          .get(csiplan.NODE_ID_ANNOTATION))
        if ((node.get("metadata") or {}).get("annotations") or {}).get(
                csiplan.NODE_ID_ANNOTATION) != want:
            await self.client.patch("v1", "nodes", self.node_name,
                                    {"metadata": {"annotations": {csiplan.NODE_ID_ANNOTATION: want}}},
                                    MERGE_PATCH)
        csinode, err = await self._get("storage.k8s.io/v1", "csinodes", self.node_name)
        if err:
            return
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.node_name,
                 "uid": (node.get("metadata") or {}).get("uid", "")}
        if csinode is None:
            try:
                await self.client.create("storage.k8s.io/v1", "csinodes", {
                    "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                    "metadata": {"name": self.node_name, "ownerReferences": [owner]},
                    "spec": {"drivers": drivers}})
            except ApiException as e:
                if e.code != 404:
                    raise
                # A server without the storage.k8s.io kinds: say so once.
                if not self._no_csinode_kind:
                    log.info("the API server has no CSINode kind: not publishing one")
                self._no_csinode_kind = True
        elif (csinode.get("spec") or {}).get("drivers") != drivers:
            csinode["spec"] = {"drivers": drivers}
            await self.client.replace("storage.k8s.io/v1", "csinodes", self.node_name, csinode)

    # -- stats -----------------------------------------------------------------------
    async def stats(self, uid: str | None = None) -> list[tuple[str, Published, VolumeStats]]:
        """(pod uid, what is published, stats) of each published volume (of pod `uid`);
        a volume's stats are measured at most every STATS_MAX_AGE seconds."""
        out = []
        now = trio.current_time()
        for puid, rec in list(self._records.items()):
            if uid is not None and puid != uid:
                continue
            for p in list(rec.volumes.values()):
                if not p.done:
                    continue
                cached = self._stats.get(p.key)
                if cached is None or now - cached[0] > STATS_MAX_AGE:
                    drv = self.drivers.get(p.driver)
                    if drv is None:
                        continue
                    try:
                        st = await drv.node_volume_stats(p.handle, Path(p.target))
                    except (DriverError, OSError) as e:
                        log.debug("volume stats of %s: %s", p.handle, e)
                        continue
                    cached = (now, st)
                    self._stats[p.key] = cached
                out.append((puid, p, cached[1]))
        return out

    async def summary_entries(self, uid: str) -> list[dict[str, Any]]:
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return [csiplan.summary_entry(p.volume, st, p.claim, p.namespace, ts)
                for _, p, st in await self.stats(uid)]

    async def metrics_text(self) -> str:
        return csiplan.metric_samples((p.namespace, p.claim, st) for _, p, st in await self.stats())

    # -- the loop --------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self.sync_csinode()
            except _API_ERRORS as e:
                log.warning("CSINode %s: %s", self.node_name, e)
            try:
                await self.expand_once()
            except _API_ERRORS as e:
                log.warning("volume expansion: %s", e)
            for p in await self.sweep():
                log.warning("volume sweep: %s", p)
            await trio.sleep(SYNC_PERIOD)


def _remove_target(target: Path) -> None:
    """Remove an unpublished target (never through a mount point)."""
    if _mounted(target):
        raise OSError(f"{target} is still mounted after node_unpublish")
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        with contextlib.suppress(OSError):
            target.rmdir()


__all__ = ["ATTACH_TIMEOUT", "NodeVolumes"]
