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

The module's parts: `drain_plan.py` (options, which pods go, the progress
document; pure), `drain_runner.py` (the runner loop), this module (the
REST handlers of the two subresources).
"""

from __future__ import annotations

from typing import Any

from fleet.api import errors
from fleet.api.validation import type_invalid
from fleet.server.drain_plan import (
    CANCELLED,
    FAILED,
    RUNNING,
    drain_document,
    finish,
    new_state,
    parse_options,
    read_state,
    write_state,
)
from fleet.server.drain_runner import DrainRunner
from fleet.server.http import Req, Resp
from fleet.server.request_params import decode_body
from fleet.server.routes import Route


class NodeMaintenance(DrainRunner):
    """The REST handlers of nodes/drain and nodes/schedulable, and the drain runner.

    `run()` must be running (run.py starts it) for drains to make progress; the
    handlers only record the request in the Node and wake the runner.
    """


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


def _body(req: Req) -> Any:
    return decode_body(req) if req.body.strip() else {}
