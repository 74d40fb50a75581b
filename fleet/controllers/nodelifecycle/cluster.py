"""The node lifecycle controller's writes: `ClusterAPI` (what it needs from the cluster)
and `ApiCluster` (that, over the real API client).

Kept apart from the controller so its loops run against a fake `ClusterAPI` under
trio's MockClock; `_EventSink` lets the shared event recorder write through the same
interface.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from fleet.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiException, Client


class ClusterAPI(Protocol):
    """The writes the controller makes (ApiException 404/409 on failure)."""

    async def get_node(self, name: str) -> dict[str, Any] | None: ...

    async def patch_node(self, name: str, patch: dict[str, Any], *, status: bool = False) -> dict[str, Any]: ...

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...

    async def delete_pod(self, namespace: str, name: str, uid: str | None, *,
                         grace_period: int | None = None) -> None: ...

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None: ...


class ApiCluster:
    """`ClusterAPI` over the real API client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.client.get_object("v1", "nodes", name)
        except ApiException as e:
            if e.code == 404:
                return None
            raise

    async def patch_node(self, name: str, patch: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        return await self.client.patch("v1", "nodes", name, patch, MERGE_PATCH,
                                       subresource="status" if status else None)

    async def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.client.patch("v1", "pods", name, patch, STRATEGIC_MERGE_PATCH, namespace,
                                       subresource="status")

    async def delete_pod(self, namespace: str, name: str, uid: str | None, *,
                         grace_period: int | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        await self.client.delete("v1", "pods", name, namespace, body=body)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        await self.client.create("v1", "events", event, namespace)

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self.client.patch("v1", "events", name, patch, MERGE_PATCH, namespace)


RETRYABLE = (ApiException, httpx.HTTPError, OSError)


class _EventSink:
    """What the shared event recorder writes through: the controller's `ClusterAPI`.

    Repeats are bumped with `patch_event` where the API offers it; without it a
    repeat is written as a new event (the recorder's answer to a 404)."""

    def __init__(self, api: ClusterAPI) -> None:
        self.api = api

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str) -> None:
        await self.api.create_event(namespace, body)

    async def patch(self, api_version: str, plural: str, name: str, body: dict[str, Any], ctype: str,
                    namespace: str | None = None) -> None:
        patch_event = getattr(self.api, "patch_event", None)
        if patch_event is None:
            raise ApiException({"reason": "NotFound", "message": "no event patches here"}, 404)
        await patch_event(namespace or "default", name, body)
