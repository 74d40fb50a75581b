"""One pod's life on this node: the pod worker.

`sync` keeps one `PodWorker` per pod uid and feeds it the latest pod object; the
worker drives the runtime `Driver` through this lifecycle and reports status::

      new / adopted
          │
          ▼
      [sandbox]  netns + network setup (unless hostNetwork / no pod network),
          │      pod cgroup parent, /etc/hosts, volumes      (retried with back-off)
          ▼
      [init containers]  one at a time, in order; each: image → start → wait;
          │   exit 0 → next.  Non-zero → Never: pod Failed ─────────────────┐
          │                  else CrashLoopBackOff → restart it              │
          ▼                                                                 │
      [app containers]  all at once, one loop each:                         │
          │   image (ErrImagePull → ImagePullBackOff, back-off) → start     │
          │   → postStart (fails → kill) → Running + probes → wait          │
          │   → restart per restartPolicy (CrashLoopBackOff: 10s doubling   │
          │     to 300s, reset after 10 min of running); a liveness or       │
          │     startup failure kills it (preStop, TERM, grace, KILL) and    │
          │     restarts it unless Never; every loop done → Succeeded/Failed │
          ▼                                                                 │
      [finished] ◄──────────────────────────────────────────────────────────┘
          │  (containers kept for logs until the pod is deleted)
          │  deletionTimestamp set, or the object disappears (at any stage above)
          ▼
      [terminating]  per running container: preStop (within the grace period),
          │          SIGTERM, wait the rest of the grace period, SIGKILL
          ▼
      [torn down]  containers removed, sandbox, network, netns, volumes
          │
          ▼  the pod object still exists → DELETE gracePeriodSeconds=0,
             preconditions.uid, so the API finally removes it

Containers run under the runtime's shims, so they outlive the agent; a restarted
agent hands the worker the handles `driver.recover()` found for its pod (labels
carry pod uid, container name, attempt) and the worker waits on them again
instead of starting new ones — nothing restarts.

Probes (`fleet.agent.probes.ProbeRunner`, a fresh one per container instance) and
lifecycle handlers (`fleet.agent.hooks.run_lifecycle_hook`) run exec actions through
`Driver.exec`; the runner's ready/started flags are the container's `ready`/`started`,
which status.py turns into the ContainersReady and Ready conditions.

The worker is spread over modules by job: `containerspec.py` (Kubernetes' rules for
command, env, resources, user, restarts, grace), `images.py` (the `ImageProvider` the
worker pulls through), `sandbox.py` (the `[sandbox]` step, a mixin) and `teardown.py`
(`[terminating]`, `[torn down]` and the final delete, a mixin); this module keeps the
lifecycle, the containers' loops, probes, hooks and status.

Status is written through `pods/{name}/status` by one reporter task, only when it
differs from the last report in more than timestamps; changes made while a write is in
flight go out together in the next one (`status_min_interval` adds a pause, off by
default).  All waiting and back-off use Trio's clock.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.agent import inventory
from fleet.agent.containerspec import (
    DEFAULT_GRACE,
    container_resources,
    container_user,
    grace_period,
    image_env,
    machine_allocatable,
    plain_env,
    resolve_argv,
    restart_wanted,
)
from fleet.agent.hooks import HookResult, run_lifecycle_hook
from fleet.agent.images import ImageInfo, ImageProvider
from fleet.agent.probes import ExecInContainer, ProbeFailure, ProbeRunner
from fleet.agent.sandbox import PodSandbox
from fleet.agent.service_env import service_link_env
from fleet.agent.status import ContainerView, build_pod_status, status_changed
from fleet.agent.teardown import PodTeardown
from fleet.api import meta
from fleet.client import MERGE_PATCH, ApiException
from fleet.runtime.driver import (
    ContainerHandle,
    ContainerSpec,
    ContainerStatus,
    Driver,
    ExitStatus,
    RuntimeDriverError,
    Sandbox,
)

log = logging.getLogger(__name__)

LABEL_POD_UID = "fleet.io/pod-uid"
LABEL_POD_NAME = "fleet.io/pod-name"
LABEL_POD_NAMESPACE = "fleet.io/pod-namespace"
LABEL_CONTAINER = "fleet.io/container"
LABEL_ATTEMPT = "fleet.io/attempt"
LABEL_INIT = "fleet.io/init"

BACKOFF_INITIAL = 10.0
BACKOFF_MAX = 300.0
# A container that ran this long without failing starts its next back-off from scratch.
BACKOFF_RESET_AFTER = 600.0
# Kubernetes gives a container at least this long after preStop before SIGKILL.
MIN_GRACE_AFTER_PRESTOP = 2.0
PROBE_KEYS = ("startupProbe", "livenessProbe", "readinessProbe")


rfc3339 = meta.format_time


# ---------------------------------------------------------------------------------------
# What a worker needs from the agent


@dataclass
class WorkerEnv:
    client: Any  # fleet.client.Client (or a test double with the same methods)
    driver: Driver
    images: ImageProvider
    data_dir: Path
    host_ip: str
    network: Any = None  # fleet.network.NetworkDriver, None = pods use the host network
    netns_dir: str | None = None
    status_min_interval: float = 0.0
    # The node's allocatable resources (the Node object's status.allocatable, kept fresh
    # by the agent's status loop): resourceFieldRef defaults for containers without
    # limits, and the size of memory-backed emptyDirs.  None: measured from the machine.
    node_allocatable: Callable[[], Mapping[str, Any] | None] | None = None
    # Optional integrations with sibling modules, looked up once by the agent.
    volumes: Any = None
    env: Any = None
    # fleet.agent.events.EventRecorder: the kubelet's Events for pods; None = none.
    events: Any = None
    # fleet.agent.dnsconfig.NodeDNS: cluster DNS address(es), domain, node resolv.conf;
    # None: the defaults (10.43.0.10, cluster.local, /etc/resolv.conf).
    dns: Any = None
    # Every Service (an informer's list): service-link variables; None: none.
    services: Callable[[], Iterable[Mapping[str, Any]]] | None = None
    # (pod, netns) after network set-up, before containers (fleet.agent.netpolicy).
    netns_ready: Callable[[Mapping[str, Any], str], Awaitable[None]] | None = None
    # fleet.agent.csivolumes.NodeVolumes: persistentVolumeClaim / ephemeral volumes
    # (staged and published through the storage drivers); None: not supported.
    csi: Any = None
    # fleet.agent.satokens.ServiceAccountTokens: bound tokens for projected
    # serviceAccountToken sources (TokenRequest as this node); None: not written.
    tokens: Any = None


# ---------------------------------------------------------------------------------------
# The worker


@dataclass
class ContainerRun:
    """One container of the pod across its restarts."""

    spec: dict[str, Any]
    init: bool
    view: ContainerView
    handle: ContainerHandle | None = None
    previous: ContainerHandle | None = None
    backoff: float = BACKOFF_INITIAL
    image_backoff: float = BACKOFF_INITIAL
    next_attempt: int = 0
    adopted: bool = False
    stopping: bool = False
    old_handles: list[ContainerHandle] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec["name"]


class PodWorker(PodSandbox, PodTeardown):
    """Runs one pod (see the module docstring); `update` and `gone` come from sync."""

    def __init__(self, pod: dict[str, Any], env: WorkerEnv,
                 adopted: Sequence[ContainerHandle] = ()) -> None:
        self.pod = pod
        self.env = env
        md = pod["metadata"]
        self.uid: str = md["uid"]
        self.namespace: str = md.get("namespace") or "default"
        self.name: str = md["name"]
        spec = pod.get("spec") or {}
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.init = [ContainerRun(dict(c), True, ContainerView(c["name"], c.get("image", "")))
                     for c in spec.get("initContainers") or []]
        self.apps = [ContainerRun(dict(c), False, ContainerView(c["name"], c.get("image", "")))
                     for c in spec.get("containers") or []]
        for c in self.init:
            c.view.state = {"waiting": {"reason": "PodInitializing"}}
        self.sandbox: Sandbox | None = None
        self.netns_path: str | None = None
        self.pod_ips: list[str] = []
        self.start_time = rfc3339()
        self.finished = trio.Event()
        self.done = trio.Event()
        self._terminating = trio.Event()
        self._gone = False
        self._grace = grace_period(pod)
        self._life: trio.CancelScope | None = None
        self._dirty = trio.Event()
        self._reported: dict[str, Any] | None = None
        self._phase_override: str | None = None
        self._message = ""
        self._stray: list[ContainerHandle] = []
        self._vm: Any = None
        self._machine_allocatable: dict[str, str] | None = None
        self._volume_paths: dict[str, Path] = {}
        self._adopt(adopted)

    # -- inputs from sync ----------------------------------------------------------
    @property
    def host_network(self) -> bool:
        return bool((self.pod.get("spec") or {}).get("hostNetwork")) or self.env.network is None

    def update(self, pod: dict[str, Any]) -> None:
        """A newer version of the pod object."""
        self.pod = pod
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            self.terminate(grace_period(pod))
        elif self._drifted(pod.get("status") or {}):
            # Someone else rewrote what this node reports (the node lifecycle
            # controller marks pods NotReady while the node is unreachable): the
            # node's own view wins again, as the kubelet's status manager does.
            self._reported = None
            self._changed()

    def _drifted(self, api: Mapping[str, Any]) -> bool:
        """True when the API's phase or our conditions differ from what we last wrote."""
        mine = self._reported
        if not mine:
            return False
        if mine.get("phase") != api.get("phase"):
            return True
        theirs = {c.get("type"): c.get("status") for c in api.get("conditions") or []
                  if isinstance(c, dict)}
        return any(theirs.get(c.get("type")) != c.get("status")
                   for c in mine.get("conditions") or [] if isinstance(c, dict))

    def gone(self) -> None:
        """The pod object was removed from the API: stop everything, delete nothing."""
        self._gone = True
        self.terminate(self._grace)

    def terminate(self, grace: float) -> None:
        if self._terminating.is_set():
            # A later delete may only shorten the grace period.
            self._grace = min(self._grace, grace)
            return
        self._grace = grace
        self._terminating.set()
        if self._life is not None:
            self._life.cancel()

    @property
    def terminating(self) -> bool:
        return self._terminating.is_set()

    def containers(self) -> list[ContainerRun]:
        return [*self.init, *self.apps]

    def find(self, container: str | None, *, previous: bool = False) -> ContainerHandle | None:
        """The handle of `container` (first app container if None) for logs/exec."""
        for c in (self.apps + self.init if container is None else self.containers()):
            if container is None or c.name == container:
                return c.previous if previous else (c.handle or c.previous)
        return None

    # -- adoption --------------------------------------------------------------------
    def _adopt(self, handles: Sequence[ContainerHandle]) -> None:
        by_name = {c.name: c for c in self.containers()}
        for h in sorted(handles, key=lambda h: int(h.labels.get(LABEL_ATTEMPT, h.attempt))):
            c = by_name.get(h.labels.get(LABEL_CONTAINER, h.name))
            if c is None:
                # A container no longer in the spec: removed at teardown.
                self._stray.append(h)
                continue
            if c.handle is not None:
                c.old_handles.append(c.handle)
            c.handle = h
            c.adopted = True
            c.next_attempt = h.attempt + 1
            c.view.restart_count = h.attempt
            c.view.container_id = f"fleet://{h.id}"
        for c in self.containers():
            if c.old_handles:
                c.previous = c.old_handles.pop()

    # -- status ------------------------------------------------------------------------
    def _changed(self) -> None:
        self._dirty.set()

    async def _event(self, type_: str, reason: str, message: str,
                     c: ContainerRun | None = None) -> None:
        """One Kubernetes Event about this pod (or container `c`); never raises."""
        if self.env.events is None:
            return
        path = None
        if c is not None:
            path = f"spec.{'initContainers' if c.init else 'containers'}{{{c.name}}}"
        await self.env.events.record(self.pod, type_, reason, message, path)

    def compute_status(self) -> dict[str, Any]:
        return build_pod_status(
            self.pod, [c.view for c in self.init], [c.view for c in self.apps],
            pod_ips=self.pod_ips, host_ip=self.env.host_ip, start_time=self.start_time,
            now=rfc3339(), phase_override=self._phase_override, message=self._message)

    async def report_now(self) -> None:
        """Write the status if it changed; raises on API errors."""
        status = self.compute_status()
        if not status_changed(self._reported, status):
            return
        await self.env.client.patch("v1", "pods", self.name, {"status": status}, MERGE_PATCH,
                                    namespace=self.namespace, subresource="status")
        self._reported = status

    async def _report_loop(self) -> None:
        backoff = 0.5
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            if self._gone:
                return
            try:
                await self.report_now()
                backoff = 0.5
            except ApiException as e:
                if e.code == 404:
                    return  # the object is gone; sync will tell us
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, e)
                self._dirty.set()
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            except (httpx.TransportError, OSError) as e:
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, e)
                self._dirty.set()
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            # Changes made while a write was in flight are coalesced into the next
            # one anyway; an extra pause (off by default) trades latency for fewer
            # writes.  It used to be 50 ms and was the largest avoidable step of a pod
            # start: the Running report waited out the pause after ContainerCreating.
            if self.env.status_min_interval > 0:
                await trio.sleep(self.env.status_min_interval)

    # -- the whole life ------------------------------------------------------------------
    async def run(self) -> None:
        try:
            async with trio.open_nursery() as n:
                n.start_soon(self._report_loop)
                self._changed()
                with trio.CancelScope() as self._life:
                    if self._terminating.is_set():
                        self._life.cancel()
                    await self._lifecycle()
                self.finished.set()
                self._changed()
                await self._terminating.wait()
                await self._stop_all()
                if not self._gone:
                    with contextlib.suppress(ApiException, httpx.TransportError, OSError):
                        with trio.move_on_after(10):
                            await self.report_now()
                await self._teardown()
                if not self._gone:
                    await self._delete_object()
                n.cancel_scope.cancel()
        finally:
            if self.env.events is not None:
                self.env.events.forget(self.uid)
            self.done.set()

    async def _lifecycle(self) -> None:
        await self._setup_with_retry()
        if any(c.adopted for c in self.apps):
            # App containers exist already: initialisation finished before the restart.
            for c in self.init:
                if c.handle is None:
                    c.view.state = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        for c in self.init:
            t = c.view.state.get("terminated")
            if t and t.get("exitCode") == 0 and c.handle is None:
                continue
            code = await self._container_loop(c)
            if code != 0:
                # restartPolicy Never: the pod has failed; app containers never start.
                for a in self.apps:
                    a.view.state = {"waiting": {"reason": "PodInitializing"}}
                self._changed()
                return
        async with trio.open_nursery() as n:
            if self._vm is not None:
                n.start_soon(self._refresh_volumes)
            async with trio.open_nursery() as apps:
                for c in self.apps:
                    apps.start_soon(self._container_loop, c)
            n.cancel_scope.cancel()

    # -- one container -----------------------------------------------------------------
    async def _pull_secrets(self) -> list[dict[str, Any]]:
        out = []
        for ref in (self.pod.get("spec") or {}).get("imagePullSecrets") or []:
            try:
                sec = await self.env.client.get_object("v1", "secrets", ref["name"],
                                                       self.namespace)
            except ApiException as e:
                log.warning("pod %s/%s: pull secret %s: %s", self.namespace, self.name,
                            ref.get("name"), e)
                continue
            data = sec.get("data") or {}
            for key in (".dockerconfigjson", ".dockercfg"):
                if key in data:
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(base64.b64decode(data[key])))
        return out

    async def _ensure_image(self, c: ContainerRun) -> ImageInfo:
        from fleet.runtime.images import ImagePullError

        image = c.spec.get("image", "")
        policy = c.spec.get("imagePullPolicy")
        while True:
            try:
                secrets = await self._pull_secrets()
                will_pull = getattr(self.env.images, "will_pull", None)
                pulling = bool(will_pull(image, policy)) if callable(will_pull) else False
                if pulling:
                    await self._event("Normal", "Pulling", f'Pulling image "{image}"', c)
                t0 = trio.current_time()
                info = await self.env.images.ensure(image, policy, secrets)
                c.image_backoff = BACKOFF_INITIAL
                c.view.image_id = info.image_id
                if pulling:
                    took = trio.current_time() - t0
                    await self._event("Normal", "Pulled",
                                      f'Successfully pulled image "{image}" in {took:.3f}s', c)
                else:
                    await self._event("Normal", "Pulled", f'Container image "{image}" '
                                      "already present on machine", c)
                return info
            except ImagePullError as e:
                reason = e.reason or "ErrImagePull"
                c.view.state = {"waiting": {"reason": reason, "message": e.message}}
                self._changed()
                await self._event("Warning", "Failed", e.message, c)
                await self._event("Warning", "Failed", f"Error: {reason}", c)
                log.info("pod %s/%s: image %s: %s: %s", self.namespace, self.name, image,
                         reason, e.message)
                if reason not in ("ErrImagePull",):
                    # InvalidImageName / ErrImageNeverPull: nothing changes by retrying
                    # soon, but the image may be imported later: retry slowly.
                    await trio.sleep(c.image_backoff)
                else:
                    # The kubelet shows ErrImagePull once, then ImagePullBackOff while
                    # it waits to try again.
                    await trio.sleep(min(1.0, c.image_backoff))
                    c.view.state = {"waiting": {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{image}": {e.message}'}}
                    self._changed()
                    await self._event("Normal", "BackOff", f'Back-off pulling image "{image}"',
                                      c)
                    await self._event("Warning", "Failed", "Error: ImagePullBackOff", c)
                    await trio.sleep(c.image_backoff)
                c.image_backoff = min(c.image_backoff * 2, BACKOFF_MAX)

    async def _build_spec(self, c: ContainerRun, info: ImageInfo) -> ContainerSpec:
        spec = c.spec
        pod_spec = self.pod.get("spec") or {}
        base = image_env(info.config)
        if self.env.services is not None:
            # Service links sit above the image's Env and below the container's own.
            base.update(service_link_env(self.env.services(), self.namespace,
                                         pod_spec.get("enableServiceLinks", True) is not False))
        if self.env.env is not None:
            # fleet.agent.env: envFrom and valueFrom too; image Env is the lowest layer.
            env = await self.env.env.resolve_env(
                self.pod, spec, self._lookup, node_allocatable=await self._allocatable(),
                pod_ips=self.pod_ips,
                host_ips=[self.env.host_ip], base_env=base)
        else:
            env = plain_env(spec, base)
        env.setdefault("HOSTNAME", pod_spec.get("hostname") or self.name)
        command, args = resolve_argv(spec, info.config, env)
        sc = spec.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        attempt = c.next_attempt
        return ContainerSpec(
            name=c.name, layers=list(reversed(info.layers)), command=command, args=args,
            env=env, working_dir=spec.get("workingDir") or info.config.get("WorkingDir") or "/",
            user=container_user(spec, pod_spec, info.config),
            capabilities_add=list(caps.get("add") or []),
            capabilities_drop=list(caps.get("drop") or []),
            read_only_root=bool(sc.get("readOnlyRootFilesystem")),
            mounts=self._mounts(spec, env), devices=self._devices(spec),
            resources=container_resources(spec),
            tty=bool(spec.get("tty")), stdin=bool(spec.get("stdin")),
            stdin_once=bool(spec.get("stdinOnce")), attempt=attempt,
            labels={LABEL_POD_UID: self.uid, LABEL_POD_NAME: self.name,
                    LABEL_POD_NAMESPACE: self.namespace, LABEL_CONTAINER: c.name,
                    LABEL_ATTEMPT: str(attempt), LABEL_INIT: "true" if c.init else "false"})

    async def _allocatable(self) -> Mapping[str, Any]:
        """The node's allocatable resources: the Node object's, else the machine's."""
        if self.env.node_allocatable is not None:
            alloc = self.env.node_allocatable()
            if alloc:
                return alloc
        if self._machine_allocatable is None:
            self._machine_allocatable = await trio.to_thread.run_sync(
                machine_allocatable, self.env.data_dir)
        return self._machine_allocatable

    async def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        plural = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
        try:
            return await self.env.client.get_object("v1", plural, name, namespace)
        except ApiException as e:
            if e.code == 404:
                return None
            raise

    async def _start(self, c: ContainerRun) -> ExitStatus | None:
        """Start a new attempt of `c`; an ExitStatus when it could not start.

        The container stays `waiting: ContainerCreating` here: it is reported running
        only once its postStart handler has finished, as the kubelet does."""
        assert self.sandbox is not None
        config_backoff = 1.0
        while True:
            info = await self._ensure_image(c)
            try:
                cspec = await self._build_spec(c, info)
                break
            except (ApiException, httpx.TransportError) as e:
                reason, message = "CreateContainerConfigError", str(e)
            except Exception as e:  # fleet.agent.env.EnvError: a missing ConfigMap/Secret
                reason = getattr(e, "reason", "CreateContainerConfigError")
                message = getattr(e, "message", str(e))
            # The referenced object may appear later: wait in that state and retry.
            c.view.state = {"waiting": {"reason": reason, "message": message}}
            self._changed()
            await self._event("Warning", "Failed", f"Error: {message}", c)
            await trio.sleep(config_backoff)
            config_backoff = min(config_backoff * 2, 30.0)
        c.view.state = {"waiting": {"reason": "ContainerCreating"}}
        try:
            handle = await self.env.driver.start(self.sandbox, cspec)
        except RuntimeDriverError as e:
            c.next_attempt += 1
            await self._event("Warning", "Failed", f"Error: {e}", c)
            return _start_error(str(e))
        await self._event("Normal", "Created", f"Created container {c.name}", c)
        await self._event("Normal", "Started", f"Started container {c.name}", c)
        # Keep the previous attempt (for `logs --previous`); older ones go.
        if c.previous is not None:
            c.old_handles.append(c.previous)
        c.previous = c.handle
        c.handle = handle
        c.view.restart_count = cspec.attempt
        c.next_attempt = cspec.attempt + 1
        c.view.container_id = f"fleet://{handle.id}"
        self._changed()
        await self._remove_old(c)
        return None

    async def _remove_old(self, c: ContainerRun) -> None:
        while c.old_handles:
            h = c.old_handles.pop()
            try:
                await self.env.driver.remove(h)
            except (RuntimeDriverError, OSError) as e:
                # Not retried here: the pod's teardown removes every container of its
                # sandbox and checks that none is left.
                inventory.failed("teardown", "container")
                log.warning("pod %s/%s: removing old container %s: %s", self.namespace,
                            self.name, h.id, e)

    def _mark_running(self, c: ContainerRun) -> None:
        assert c.handle is not None
        c.view.state = {"running": {"startedAt": rfc3339(c.handle.started_at)}}
        self._changed()

    async def _container_loop(self, c: ContainerRun) -> int:
        """Run `c` until it is done for good; returns its last exit code."""
        while True:
            exit_: ExitStatus | None = None
            # When the container began, on Trio's clock: probes' initialDelaySeconds
            # count from it.
            began = trio.current_time()
            if c.handle is not None and c.adopted:
                c.adopted = False
                st = await self.env.driver.inspect(c.handle)
                if st.status == ContainerStatus.EXITED and st.exit is not None:
                    exit_ = st.exit
                else:
                    # Started before the agent restarted: the kubelet, too, measures
                    # the initial delay from the container's own start time.
                    age = (datetime.now(UTC) - c.handle.started_at).total_seconds()
                    began -= max(age, 0.0)
                    self._mark_running(c)
            else:
                exit_ = await self._start(c)
                began = trio.current_time()
                if exit_ is None:
                    exit_ = await self._post_start(c)
                if exit_ is None:
                    self._mark_running(c)
            failure: ProbeFailure | None = None
            started = trio.current_time()
            if exit_ is None:
                exit_, failure = await self._watch_running(c, began)
            ran = trio.current_time() - started
            self._record_exit(c, exit_)
            if failure is not None:
                # The kubelet restarts a container that failed its liveness (or
                # startup) probe whatever the exit code, unless the policy is Never.
                restart = self.restart_policy != "Never"
            else:
                restart = restart_wanted(self.restart_policy, exit_.exit_code, init=c.init)
            if not restart:
                return exit_.exit_code
            if ran >= BACKOFF_RESET_AFTER:
                c.backoff = BACKOFF_INITIAL
            delay = c.backoff
            c.backoff = min(c.backoff * 2, BACKOFF_MAX)
            c.view.state = {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {int(delay)}s restarting failed container={c.name} "
                           f"pod={self.name}_{self.namespace}({self.uid})"}}
            self._changed()
            await self._event("Warning", "BackOff", "Back-off restarting failed container "
                              f"{c.name} in pod {self.name}_{self.namespace}({self.uid})", c)
            await trio.sleep(delay)

    # -- probes ------------------------------------------------------------------------
    def _pod_ip(self) -> str | None:
        return self.pod_ips[0] if self.pod_ips else None

    def _exec_in(self, handle: ContainerHandle) -> ExecInContainer:
        """`exec_in_container` for probes and hooks: `Driver.exec` in this container,
        output discarded (drained, so a chatty command cannot block on a full pipe)."""
        async def discard(_: bytes) -> None:
            return None

        async def exec_in_container(argv: Sequence[str], timeout: float) -> int:
            with trio.move_on_after(timeout) as scope:
                code = await self.env.driver.exec(handle, list(argv), stdout=discard,
                                                  stderr=discard)
            if scope.cancelled_caught:
                # Cancelling the exec stops it (the driver reaps its process); to the
                # probe this is a failure, not an exit code.
                raise TimeoutError(f"timed out after {timeout:g}s")
            return code

        return exec_in_container

    async def _watch_running(self, c: ContainerRun,
                             began: float) -> tuple[ExitStatus, ProbeFailure | None]:
        """Wait for the container to exit, running its probes meanwhile; the exit, and
        the probe failure that made us kill it, if one did."""
        assert c.handle is not None
        handle = c.handle
        failure: ProbeFailure | None = None
        runner: ProbeRunner | None = None
        if not c.init and any(c.spec.get(k) for k in PROBE_KEYS):

            def on_change() -> None:
                assert runner is not None
                if (c.view.ready, c.view.started) != (runner.ready, runner.started):
                    c.view.ready, c.view.started = runner.ready, runner.started
                    self._changed()

            def on_liveness_failure(f: ProbeFailure) -> None:
                nonlocal failure
                if failure is not None:
                    return
                failure = f
                log.info("pod %s/%s: container %s: %s; restarting it", self.namespace,
                         self.name, c.name, f.message)
                grace = (float(f.grace_period_seconds) if f.grace_period_seconds is not None
                         else self._container_grace(c))
                # In the outer nursery: the kill must finish even though the probes
                # are cancelled as soon as the container exits.
                killers.start_soon(self._event, "Normal", "Killing",
                                   f"Container {c.name} failed {f.probe} probe, will be "
                                   "restarted", c)
                killers.start_soon(self._kill_quietly, c, handle, grace)

            def on_unhealthy(kind: str, message: str) -> None:
                log.debug("pod %s/%s: container %s: %s", self.namespace, self.name, c.name,
                          message)
                killers.start_soon(self._event, "Warning", "Unhealthy", message, c)

            runner = ProbeRunner(c.spec, pod_ip=self._pod_ip(),
                                 exec_in_container=self._exec_in(handle),
                                 on_liveness_failure=on_liveness_failure,
                                 on_unhealthy=on_unhealthy, on_change=on_change,
                                 started_at=began)
        # Without probes a container is started and ready as soon as it runs.
        c.view.started = runner.started if runner is not None else True
        c.view.ready = runner.ready if runner is not None else True
        self._changed()
        async with trio.open_nursery() as killers:
            async with trio.open_nursery() as probing:
                if runner is not None:
                    probing.start_soon(runner.run)
                exit_ = await self.env.driver.wait(handle)
                probing.cancel_scope.cancel()
        if failure is not None:
            # The kubelet's Killing event, kept where `kubectl describe` shows it.
            kind = failure.probe
            exit_ = _with_message(exit_, f"{failure.message}; container {c.name} failed "
                                         f"{kind} probe, will be restarted")
        return exit_, failure

    def _container_grace(self, c: ContainerRun) -> float:
        g = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        return float(DEFAULT_GRACE if g is None else g)

    def _record_exit(self, c: ContainerRun, exit_: ExitStatus) -> None:
        term: dict[str, Any] = {"exitCode": exit_.exit_code, "reason": exit_.reason,
                                "finishedAt": rfc3339(exit_.finished_at),
                                "containerID": c.view.container_id or None}
        running = c.view.state.get("running")
        term["startedAt"] = (running or {}).get("startedAt") or (
            rfc3339(c.handle.started_at) if c.handle else None)
        if exit_.signal:
            term["signal"] = exit_.signal
        msg = exit_.message or self._termination_message(c)
        if msg:
            term["message"] = msg
        term = {k: v for k, v in term.items() if v is not None}
        c.view.last_state = {"terminated": term}
        c.view.state = {"terminated": dict(term)}
        c.view.ready = False
        c.view.started = False
        self._changed()

    def _termination_message(self, c: ContainerRun) -> str:
        """/dev/termination-log, when the container wrote one (read from its bundle)."""
        if c.handle is None:
            return ""
        p = c.handle.bundle / "rootfs" / "dev" / "termination-log"
        try:
            return p.read_text(errors="replace")[:4096] if p.is_file() else ""
        except OSError:
            return ""

    # -- hooks -------------------------------------------------------------------------
    async def _post_start(self, c: ContainerRun) -> ExitStatus | None:
        """Run postStart; None when the container may go on, else how it ended (it
        exited meanwhile, or the handler failed and we killed it)."""
        hook = (c.spec.get("lifecycle") or {}).get("postStart")
        if not hook or c.handle is None:
            return None
        handle = c.handle
        exited: ExitStatus | None = None
        result: HookResult | None = None
        async with trio.open_nursery() as n:

            async def watch_exit() -> None:
                # A handler that hangs must not hide a container that already died.
                nonlocal exited
                exited = await self.env.driver.wait(handle)
                n.cancel_scope.cancel()

            n.start_soon(watch_exit)
            result = await run_lifecycle_hook(
                "postStart", hook, pod=self.pod, container=c.spec, pod_ip=self._pod_ip(),
                exec_in_container=self._exec_in(handle))
            n.cancel_scope.cancel()
        if result is not None and result.ok:
            return None
        if result is None:
            assert exited is not None
            return exited
        log.info("pod %s/%s: %s", self.namespace, self.name, result.message)
        await self._event("Warning", "FailedPostStartHook", result.message, c)
        try:
            st = await self._kill(c, handle, self._container_grace(c))
        except RuntimeDriverError as e:
            log.warning("pod %s/%s: killing %s: %s", self.namespace, self.name, c.name, e)
            st = exited or _start_error(str(e))
        return ExitStatus(exit_code=st.exit_code, signal=st.signal, oom_killed=st.oom_killed,
                          finished_at=st.finished_at, reason=result.reason,
                          message=result.message)

    async def _kill(self, c: ContainerRun, handle: ContainerHandle, grace: float) -> ExitStatus:
        """Stop one container as the kubelet does: preStop (until `grace` runs out),
        SIGTERM, the rest of the grace period, SIGKILL."""
        deadline = trio.current_time() + grace
        hook = (c.spec.get("lifecycle") or {}).get("preStop")
        remaining = grace
        if hook and grace > 0:
            result = await run_lifecycle_hook(
                "preStop", hook, pod=self.pod, container=c.spec, pod_ip=self._pod_ip(),
                exec_in_container=self._exec_in(handle), deadline=deadline)
            if not result.ok:
                log.info("pod %s/%s: %s", self.namespace, self.name, result.message)
                await self._event("Warning", "FailedPreStopHook", result.message, c)
            # A preStop that used up the grace period still leaves the process a
            # moment to handle SIGTERM (the kubelet's minimum of 2 s).
            remaining = max(deadline - trio.current_time(), MIN_GRACE_AFTER_PRESTOP)
        return await self.env.driver.stop(handle, max(remaining, 0.0))

    async def _kill_quietly(self, c: ContainerRun, handle: ContainerHandle,
                            grace: float) -> None:
        try:
            await self._kill(c, handle, grace)
        except RuntimeDriverError as e:
            log.warning("pod %s/%s: stopping %s: %s", self.namespace, self.name, c.name, e)

def _with_message(exit_: ExitStatus, message: str) -> ExitStatus:
    """`exit_` with `message` (the runtime's own message, if any, kept after it)."""
    full = f"{message}: {exit_.message}" if exit_.message else message
    return dataclasses.replace(exit_, message=full)


def _start_error(message: str) -> ExitStatus:
    return ExitStatus(exit_code=128, signal=None, oom_killed=False,
                      finished_at=datetime.now(UTC), reason="StartError", message=message)


__all__ = ["LABEL_POD_UID", "ContainerRun", "PodWorker", "WorkerEnv"]
