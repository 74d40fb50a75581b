"""The server-side drain runner: one supervised task per draining node that
lists the node's pods, plans with `plan_drain`, evicts through
`ResourceAPI.evict_pod` (so disruption budgets hold), records progress in
the Node and ends the drain Complete, Failed or TimedOut.  At start it
resumes the drains a restart interrupted.  `NodeMaintenance` (drain.py) adds
the REST handlers that start drains and wake it.
"""


from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from fleet.api import errors, meta
from fleet.server.drain_plan import (
    CANCELLED,
    COMPLETE,
    FAILED,
    RUNNING,
    TIMED_OUT,
    DrainOptions,
    DrainPlan,
    _deadline_passed,
    _options_of,
    controller_of,
    finish,
    plan_drain,
    pod_key,
    read_state,
    write_state,
)
from fleet.server.rest import ResourceAPI
from fleet.store import KeyNotFound, RevisionConflict

log = logging.getLogger(__name__)


class DrainRunner:
    """The drain runner of `NodeMaintenance`: its state and the drain loop.

    `run()` must be running (run.py starts it) for drains to make progress.
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
