"""Kubernetes Events for pod lifecycle steps, written as the kubelet writes them.

The agent's side of the shared recorder (`fleet.client.events.EventRecorder`:
correlation, aggregation, a per-pod rate limit, ordered background senders,
drops counted): events are about pods (involvedObject = the pod, optionally a
container's `spec.containers{name}` fieldPath) with `source.host` = the node,
so `kubectl describe pod` and `kubectl get events` show what the node did.

The pod worker awaits `record`: while `run` is serving it only queues the
event (a pod start never waits on the API for its Created/Started events);
without it the event is written before the worker goes on.
"""

from __future__ import annotations

from typing import Any

from fleet.client import events as _events
from fleet.client.events import NORMAL, WARNING, container_field_path

DEDUPE_WINDOW = _events.DEDUPE_WINDOW
BURST = _events.BURST
REFILL_SECONDS = _events.REFILL_SECONDS


class EventRecorder(_events.EventRecorder):
    """Writes v1 Events for pods on behalf of `component` on node `node_name`."""

    def __init__(self, client: Any, node_name: str, component: str = "kubelet", **kw: Any) -> None:
        super().__init__(client, component, host=node_name, **kw)
        self.node_name = node_name

    async def record(self, pod: dict[str, Any], type_: str, reason: str,  # type: ignore[override]
                     message: str, field_path: str | None = None) -> None:
        """Queue (while `run` serves) or write one event about `pod`; never raises."""
        if isinstance(pod, dict) and not pod.get("kind"):
            pod = {"apiVersion": "v1", "kind": "Pod", **pod}
        if self.running:
            super().record(pod, type_, reason, message, field_path)
        else:
            await self.write_now(pod, type_, reason, message, field_path)


__all__ = ["NORMAL", "WARNING", "EventRecorder", "container_field_path"]
