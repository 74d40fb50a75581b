"""Node maintenance: Fleet's `nodes/{name}/drain` and `nodes/{name}/schedulable`
subresources, and the server-side drain that runs behind them.

kubectl's `cordon`, `uncordon` and `drain` work against Fleet as they do
against Kubernetes (a PATCH of `spec.unschedulable`, then one eviction per
pod, all driven by the client).  A client-side drain dies with the client,
though, and its progress is visible only on that client's terminal.  Fleet's
drain runs in the server instead:

    POST /api/v1/nodes/{name}/drain        start: cordon, then evict (202 + progress)
    GET  /api/v1/nodes/{name}/drain        progress
    POST /api/v1/nodes/{name}/schedulable  {"schedulable": false|true}: cordon / uncordon

**State lives in the Node.**  The drain's options and progress are one JSON
document in the node's `fleet.dev/drain-status` annotation, so every client
(kubectl included: `kubectl get node -o yaml`) sees it, and a server restart
resumes a drain that was Running: at start the runner looks for such nodes.

**Which pods go** is decided exactly as kubectl drain decides
(k8s.io/kubectl/pkg/drain/filters.go), by the pure `plan_drain`: mirror pods
(annotation `kubernetes.io/config.mirror`) are skipped; DaemonSet-managed pods
are skipped with `ignoreDaemonSets`, and refuse the drain without it (their
controller would put them straight back); pods with emptyDir volumes need
`deleteEmptyDirData`; pods no controller manages need `force`.  Any refusal
fails the drain before anything is evicted, with kubectl's message.

**Evictions** go through `ResourceAPI.evict_pod`, the code behind the
`pods/eviction` subresource, so disruption budgets are honoured: a 429 puts
the pod on `blockedByBudget` and it is retried every `retry_interval`
seconds, as kubectl does, until it goes or `timeoutSeconds` passes.  The
drain is Complete when every pod it had to remove is gone from the node.

Phases: Running → Complete | Failed | TimedOut.  Making the node schedulable
again (this API, or `kubectl uncordon`) while a drain runs cancels it (Failed,
with the reason in `errors`).  One runner task per draining node, supervised:
an unexpected error is logged and the drain resumes from the annotation.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from fleet.api import errors, meta
from fleet.api.validation import as_int, type_invalid
from fleet.server.http import Req, Resp
from fleet.server.request_params import decode_body
from fleet.server.rest import ResourceAPI
from fleet.server.routes import Route
from fleet.store import KeyNotFound, RevisionConflict

log = logging.getLogger(__name__)

DRAIN_ANNOTATION = "fleet.dev/drain-status"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

RUNNING, COMPLETE, FAILED, TIMED_OUT = "Running", "Complete", "Failed", "TimedOut"

# kubectl's filter messages (k8s.io/kubectl/pkg/drain/filters.go), kept verbatim:
# kfleet drain takes the same flags, and people search for these strings.
DAEMONSET_FATAL = "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)"
DAEMONSET_WARNING = "ignoring DaemonSet-managed Pods"
LOCAL_STORAGE_FATAL = "Pods with local storage (use --delete-emptydir-data to override)"
LOCAL_STORAGE_WARNING = "deleting Pods with local storage"
# kubectl 1.32 prints this one as "cannot delete cannot delete Pods that ..." (its
# constant repeats the prefix its error list adds); Fleet says it once.
UNMANAGED_FATAL = "Pods that declare no controller (use --force to override)"
UNMANAGED_WARNING = "deleting Pods that declare no controller"
CANCELLED = "drain cancelled: the node was made schedulable again"

DRAIN_KIND = {"group": "fleet.dev", "version": "v1", "kind": "NodeDrain"}


@dataclass(frozen=True)
class DrainOptions:
    """The body of `POST nodes/{name}/drain` (kubectl drain's flags, camelCased)."""

    ignoreDaemonSets: bool = False  # noqa: N815 - the JSON field names are the API
    deleteEmptyDirData: bool = False  # noqa: N815
    force: bool = False
    gracePeriodSeconds: int = -1  # noqa: N815 - negative: each pod's own terminationGracePeriodSeconds
    timeoutSeconds: int = 0  # noqa: N815 - 0: no limit (kubectl's default too)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_options(body: Any) -> DrainOptions:
    """DrainOptions from a request body (absent fields take kubectl's defaults); 422 on bad values."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise errors.BadRequest("the body must be a JSON object of drain options")
    causes = []
    values: dict[str, Any] = {}
    for name in ("ignoreDaemonSets", "deleteEmptyDirData", "force"):
        val = body.get(name)
        if val is None:
            continue
        if not isinstance(val, bool):
            causes.append(type_invalid(name, val, "boolean"))
        values[name] = val
    for name in ("gracePeriodSeconds", "timeoutSeconds"):
        val = body.get(name)
        if val is None:
            continue
        if as_int(val) is None:
            causes.append(type_invalid(name, val, "integer"))
        elif name == "timeoutSeconds" and val < 0:
            causes.append(errors.cause(name, f"Invalid value: {val}: must be greater than or equal to 0"))
        values[name] = val
    known = set(DrainOptions.__dataclass_fields__) | {"kind", "apiVersion"}
    for name in body:
        if name not in known:
            causes.append(errors.cause(name, f'unknown field "{name}"', "FieldValueNotSupported"))
    if causes:
        raise errors.Invalid.for_object("NodeDrain", "fleet.dev", "", causes)
    return DrainOptions(**values)


# ----------------------------------------------------------------------------- planning


def pod_key(pod: dict[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def controller_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    """metav1.GetControllerOf: the owner reference with controller=true."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _has_local_storage(pod: dict[str, Any]) -> bool:
    return any(isinstance(v, dict) and v.get("emptyDir") is not None
               for v in (pod.get("spec") or {}).get("volumes") or [])


@dataclass
class DrainPlan:
    """What a drain does with the pods on a node, and why (kubectl's filter outcomes)."""

    evict: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # DaemonSet-managed and mirror pods
    warnings: dict[str, list[str]] = field(default_factory=dict)  # message -> pods
    errors: dict[str, list[str]] = field(default_factory=dict)  # message -> pods

    def error_messages(self) -> list[str]:
        return [f"cannot delete {msg}: {', '.join(pods)}" for msg, pods in self.errors.items()]

    def warning_messages(self) -> list[str]:
        return [f"{msg}: {', '.join(pods)}" for msg, pods in self.warnings.items()]


def plan_drain(pods: list[dict[str, Any]], opts: DrainOptions, daemonsets: set[str]) -> DrainPlan:
    """kubectl drain's filters, in kubectl's order, over the pods bound to the node.

    `daemonsets` holds "namespace/name" of the DaemonSets that exist; a pod whose
    controlling DaemonSet is gone is an orphan, deleted only with `force`.  A
    pod stops at the first filter that skips or refuses it.  (kubectl keeps
    only the last filter's warning; Fleet keeps them all.)
    """
    plan = DrainPlan()
    for pod in sorted(pods, key=pod_key):
        key = pod_key(pod)
        md = pod.get("metadata") or {}
        ctrl = controller_of(pod)
        finished = _finished(pod)
        warnings: list[str] = []
        verdict, reason = _filter(pod, md, ctrl, finished, opts, daemonsets, warnings)
        if verdict == "evict":
            plan.evict.append(pod)
        elif verdict == "skip":
            plan.skipped.append(key)
        else:
            plan.errors.setdefault(reason, []).append(key)
        for w in warnings:
            plan.warnings.setdefault(w, []).append(key)
    return plan


def _filter(pod: dict[str, Any], md: dict[str, Any], ctrl: dict[str, Any] | None, finished: bool,
            opts: DrainOptions, daemonsets: set[str], warnings: list[str]) -> tuple[str, str]:
    """One pod through kubectl's filter chain: ("evict" | "skip" | "error", reason)."""
    # daemonSetFilter: the DaemonSet controller ignores cordons and would put the pod back.
    if ctrl is not None and ctrl.get("kind") == "DaemonSet" and not finished:
        name = str(ctrl.get("name", ""))
        if f"{md.get('namespace', '')}/{name}" not in daemonsets:
            if not opts.force:
                return "error", f'daemonsets.apps "{name}" not found'
            warnings.append(f'daemonsets.apps "{name}" not found')
        elif not opts.ignoreDaemonSets:
            return "error", DAEMONSET_FATAL
        else:
            warnings.append(DAEMONSET_WARNING)
            return "skip", ""
    # mirrorPodFilter: static pods belong to their node's agent, not to the API.
    if MIRROR_ANNOTATION in (md.get("annotations") or {}):
        return "skip", ""
    # localStorageFilter: emptyDir data dies with the pod.
    if _has_local_storage(pod) and not finished:
        if not opts.deleteEmptyDirData:
            return "error", LOCAL_STORAGE_FATAL
        warnings.append(LOCAL_STORAGE_WARNING)
    # unreplicatedFilter: nothing would recreate an unmanaged pod elsewhere.
    if not finished and ctrl is None:
        if not opts.force:
            return "error", UNMANAGED_FATAL
        warnings.append(UNMANAGED_WARNING)
    return "evict", ""


# ----------------------------------------------------------------------------- state


def read_state(node: dict[str, Any]) -> dict[str, Any] | None:
    """The drain document in the node's annotation (None: never drained, or unreadable)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(DRAIN_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def write_state(node: dict[str, Any], state: dict[str, Any]) -> None:
    md = node.setdefault("metadata", {})
    annotations = md.get("annotations")
    if not isinstance(annotations, dict):
        annotations = md["annotations"] = {}
    annotations[DRAIN_ANNOTATION] = json.dumps(state, separators=(",", ":"), sort_keys=True)


def new_state(opts: DrainOptions) -> dict[str, Any]:
    # `id` tells one drain from the next (two may start within the same second).
    return {"id": uuid.uuid4().hex[:12], "phase": RUNNING, "options": opts.to_json(),
            "startTime": meta.now_rfc3339(),
            "completionTime": None, "evicted": [], "remaining": [], "blockedByBudget": [],
            "skipped": [], "warnings": [], "errors": []}


def finish(state: dict[str, Any], phase: str, *problems: str) -> dict[str, Any]:
    state = dict(state, phase=phase, completionTime=meta.now_rfc3339())
    state["errors"] = list(state.get("errors") or []) + list(problems)
    if phase != COMPLETE:
        return state
    state["remaining"] = []
    state["blockedByBudget"] = []
    return state


def drain_document(name: str, state: dict[str, Any]) -> dict[str, Any]:
    """The answer of GET/POST nodes/{name}/drain: the stored state with a type header."""
    return {"kind": DRAIN_KIND["kind"], "apiVersion": f"{DRAIN_KIND['group']}/{DRAIN_KIND['version']}",
            "metadata": {"name": name}, **state}


def _options_of(state: dict[str, Any]) -> DrainOptions:
    try:
        return parse_options(state.get("options") or {})
    except errors.APIError:
        return DrainOptions()


def _deadline_passed(state: dict[str, Any], opts: DrainOptions) -> bool:
    if opts.timeoutSeconds <= 0:
        return False
    try:
        started = meta.parse_rfc3339(state["startTime"])
    except (KeyError, TypeError, ValueError):
        return False
    return (meta.utcnow() - started).total_seconds() >= opts.timeoutSeconds


# ----------------------------------------------------------------------------- the service


class NodeMaintenance:
    """The REST handlers of nodes/drain and nodes/schedulable, and the drain runner.

    `run()` must be running (run.py starts it) for drains to make progress; the
    handlers only record the request in the Node and wake the runner.
    """

    def __init__(self, resources: ResourceAPI, *, poll_interval: float = 1.0,
                 retry_interval: float = 5.0) -> None:
        self.resources = resources
        self.store = resources.store
        self.poll_interval = poll_interval
        self.retry_interval = retry_interval
        self._wake_send, self._wake_recv = trio.open_memory_channel[str](math.inf)
        self._running: set[str] = set()
        # Nodes woken while their task was running: that task may have been on its
        # way out, so it looks once more before it ends.
        self._again: set[str] = set()

    # -- REST ------------------------------------------------------------------------

    async def handle(self, route: Route, req: Req, verb: str) -> Resp:
        assert route.name is not None
        if req.query.get("dryRun"):
            raise errors.BadRequest(f"dryRun is not supported on nodes/{route.subresource}")
        if route.subresource == "schedulable":
            return await self.set_schedulable(route.name, _body(req))
        if verb == "get":
            return await self.drain_status(route.name)
        return await self.start_drain(route.name, _body(req))

    async def start_drain(self, name: str, body: Any) -> Resp:
        """Cordon the node and record a Running drain in one write; the runner does the rest."""
        opts = parse_options(body)
        state = new_state(opts)

        def change(node: dict[str, Any]) -> dict[str, Any]:
            current = read_state(node)
            if current is not None and current.get("phase") == RUNNING:
                raise errors.Conflict(f'Operation cannot be fulfilled on nodes/drain "{name}": a drain of '
                                      "this node is already running", name=name, kind="nodes")
            node.setdefault("spec", {})["unschedulable"] = True
            write_state(node, state)
            return node

        await self._update_node(name, change)
        self._wake_send.send_nowait(name)
        return Resp.json(202, drain_document(name, state))

    async def drain_status(self, name: str) -> Resp:
        node = await self._get_node(name)
        state = read_state(node)
        if state is None:
            raise errors.NotFound(f'no drain has been started on node "{name}"', name=name, kind="nodes")
        return Resp.json(200, drain_document(name, state))

    async def set_schedulable(self, name: str, body: Any) -> Resp:
        """Cordon (false) or uncordon (true), as kubectl cordon/uncordon do; uncordoning
        cancels a drain that is still running."""
        if not isinstance(body, dict):
            raise errors.BadRequest('the body must be {"schedulable": true|false}')
        want = body.get("schedulable")
        if want is None:
            raise errors.Invalid.for_object("Node", "", name, [errors.cause(
                "schedulable", "Required value", "FieldValueRequired")])
        if not isinstance(want, bool):
            raise errors.Invalid.for_object("Node", "", name, [type_invalid("schedulable", want, "boolean")])

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            spec = node.setdefault("spec", {})
            changed = False
            if want and spec.get("unschedulable") is not None:
                # What kubectl uncordon leaves: the field is omitted, not false.
                spec.pop("unschedulable")
                changed = True
            elif not want and spec.get("unschedulable") is not True:
                spec["unschedulable"] = True
                changed = True
            state = read_state(node)
            if want and state is not None and state.get("phase") == RUNNING:
                write_state(node, finish(state, FAILED, CANCELLED))
                changed = True
            return node if changed else None

        node = await self._update_node(name, change)
        return Resp.json(200, node)

    # -- the runner ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run drains: the ones found Running at start (a restart resumes them), then
        each one a POST starts."""
        async with trio.open_nursery() as nursery:
            res = await self.store.list(meta.store_key("", "nodes", None))
            for node in res.items:
                state = read_state(node)
                if state is not None and state.get("phase") == RUNNING:
                    self._start(nursery, node["metadata"]["name"])
            task_status.started()
            async for name in self._wake_recv:
                self._start(nursery, name)

    def _start(self, nursery: trio.Nursery, name: str) -> None:
        if name in self._running:
            self._again.add(name)
            return
        self._running.add(name)
        nursery.start_soon(self._supervise, name)

    async def _supervise(self, name: str) -> None:
        """Drain `name`; an unexpected failure is logged and the drain resumed after a
        back-off (its state is in the Node, so nothing is lost)."""
        backoff = 1.0
        try:
            while True:
                self._again.discard(name)
                try:
                    await self.drain(name)
                except Exception:
                    log.exception("drain of node %s failed; resuming in %.0fs", name, backoff)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                # No await between this check and leaving `_running`: a wake-up
                # either lands before it (and is seen) or finds the task gone.
                if name not in self._again:
                    return
        finally:
            self._running.discard(name)

    async def drain(self, name: str) -> None:
        """One drain, start (or resume) to end; returns when the phase is final."""
        last_try: dict[str, float] = {}  # pod uid -> trio time of the last refused eviction
        done: set[str] = set()  # uids of pods this drain has evicted
        started: Any = None
        while True:
            try:
                node = await self._get_node(name)
            except errors.NotFound:
                return  # the node is gone, and its drain state with it
            state = read_state(node)
            if state is None or state.get("phase") != RUNNING:
                return
            if state.get("id") != started:
                # A new drain (this task outlived the one it was started for).
                started, last_try, done = state.get("id"), {}, set()
            opts = _options_of(state)
            if (node.get("spec") or {}).get("unschedulable") is not True:
                await self._save(name, finish(state, FAILED, CANCELLED))
                return
            plan = await self._plan(name, opts)
            if plan.errors:
                # kubectl refuses before evicting anything; so does Fleet.
                await self._save(name, finish(state, FAILED, *plan.error_messages()))
                return
            new = dict(state, skipped=plan.skipped, warnings=plan.warning_messages())
            evicted = list(state.get("evicted") or [])
            blocked: list[str] = []
            problems: list[str] = []
            now = trio.current_time()
            for pod in plan.evict:
                key, md = pod_key(pod), pod["metadata"]
                uid = md.get("uid", "")
                if uid in done:
                    continue  # evicted: only waiting for it to go is left
                if uid in last_try and now - last_try[uid] < self.retry_interval:
                    blocked.append(key)
                    continue
                # A pod already terminating is evicted too: a no-op, unless this drain's
                # gracePeriodSeconds is 0, which removes it at once (as with kubectl).
                problem = await self._evict(pod, opts)
                if problem is None:
                    done.add(uid)
                    if key not in evicted:
                        evicted.append(key)
                elif problem == "blocked":
                    last_try[uid] = now
                    blocked.append(key)
                elif problem != "gone":
                    problems.append(problem)
            remaining = [pod_key(p) for p in plan.evict]
            new.update(evicted=evicted, blockedByBudget=sorted(set(blocked)), remaining=remaining)
            if problems:
                await self._save(name, finish(new, FAILED, *problems))
                return
            if not remaining:
                await self._save(name, finish(new, COMPLETE))
                return
            if _deadline_passed(state, opts):
                await self._save(name, finish(new, TIMED_OUT, f"drain did not complete within "
                                              f"{opts.timeoutSeconds}s; remaining: {', '.join(remaining)}"))
                return
            if new != state:
                await self._save(name, new)
            await trio.sleep(self.poll_interval)

    async def _plan(self, name: str, opts: DrainOptions) -> DrainPlan:
        pods = [p for p in (await self.store.list(meta.store_key("", "pods", None))).items
                if (p.get("spec") or {}).get("nodeName") == name]
        daemonsets: set[str] = set()
        for pod in pods:
            ctrl = controller_of(pod)
            if ctrl is None or ctrl.get("kind") != "DaemonSet":
                continue
            ns = pod["metadata"].get("namespace", "")
            try:
                await self.store.get(meta.store_key("apps", "daemonsets", ns, str(ctrl.get("name", ""))))
            except KeyNotFound:
                continue
            daemonsets.add(f"{ns}/{ctrl.get('name', '')}")
        return plan_drain(pods, opts, daemonsets)

    async def _evict(self, pod: dict[str, Any], opts: DrainOptions) -> str | None:
        """Evict one pod: None when done, "blocked" on a budget (429), "gone", or an error."""
        delete_opts: dict[str, Any] = {}
        if opts.gracePeriodSeconds >= 0:
            delete_opts["gracePeriodSeconds"] = opts.gracePeriodSeconds
        md = pod["metadata"]
        try:
            await self.resources.evict_pod(md.get("namespace", ""), md["name"], delete_opts)
        except errors.TooManyRequests:
            return "blocked"
        except errors.NotFound:
            return "gone"
        except errors.APIError as e:
            return f'error when evicting pods/"{md["name"]}" -n "{md.get("namespace", "")}": {e.message}'
        return None

    # -- node access -----------------------------------------------------------------

    async def _get_node(self, name: str) -> dict[str, Any]:
        try:
            return await self.store.get(meta.store_key("", "nodes", None, name))
        except KeyNotFound:
            raise errors.NotFound(f'nodes "{name}" not found', name=name, kind="nodes") from None

    async def _save(self, name: str, state: dict[str, Any]) -> None:
        """Write the drain state, unless the drain was cancelled or replaced meanwhile."""
        drain_id = state.get("id")

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            current = read_state(node)
            if current is None or current.get("phase") != RUNNING or current.get("id") != drain_id:
                return None
            write_state(node, state)
            return node

        try:
            await self._update_node(name, change)
        except errors.NotFound:
            pass

    async def _update_node(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any] | None],
                           ) -> dict[str, Any]:
        """Read-modify-write of a Node with the revision as precondition, retried on
        conflicts (agents write node status all the time).  `change` returns None
        for "nothing to write"; the result is the stored (or unchanged) node."""
        key = meta.store_key("", "nodes", None, name)
        for _attempt in range(16):
            node = await self._get_node(name)
            new = change(copy.deepcopy(node))
            if new is None:
                return node
            try:
                return await self.store.update(key, new, expected_revision=int(node["metadata"]["resourceVersion"]))
            except RevisionConflict:
                continue
            except KeyNotFound:
                raise errors.NotFound(f'nodes "{name}" not found', name=name, kind="nodes") from None
        raise errors.Conflict(f'Operation cannot be fulfilled on nodes "{name}": too many concurrent writers; '
                              "try again", name=name, kind="nodes")


def _body(req: Req) -> Any:
    return decode_body(req) if req.body.strip() else {}
