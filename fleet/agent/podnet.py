"""The agent's side of the pod network across nodes: Nodes in, routes out.

An informer on every Node feeds the network driver's `PeerRouting.sync_peers` (the
bridge driver: host-gw routes or VXLAN, `fleet.network.overlay`) whenever a Node is
added, deleted, or changed in what routes depend on (pod CIDR, published address and
VTEP, deletion — `peers.peer_view`; not heartbeats), and every `resync` seconds anyway,
so a route someone deleted comes back.  Bursts of events coalesce into one pass.  A pass that fails is retried with back-off; running pods are never touched.

After each pass the annotations the driver wants on this node (its VTEP MAC) are
compared with the Node as the informer last saw it and patched when they differ —
also after the Node was deleted and registered again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
import trio

from fleet.client import MERGE_PATCH, ApiException, Client
from fleet.client.errors import explain
from fleet.client.informer import Informer
from fleet.network.driver import NetworkError, PeerRouting
from fleet.network.peers import peer_view

log = logging.getLogger(__name__)

RESYNC_SECONDS = 30.0


class PeerSync:
    """Keeps the driver's routes to the other nodes in line with the Node objects."""

    def __init__(self, client: Client, node_name: str, driver: PeerRouting, *,
                 resync: float = RESYNC_SECONDS) -> None:
        self.client = client
        self.node_name = node_name
        self.driver = driver
        self.resync = resync
        self.passes = 0
        self._dirty = trio.Event()
        self.informer = Informer(client, "v1", "nodes", self._on_event, retry_backoff=1.0,
                                 component="agent")

    def _on_event(self, etype: str, old: Any, new: Any) -> None:
        # Node heartbeats change status every few seconds on every node: only what
        # the routes (or our annotations) depend on starts a pass.
        if etype != "MODIFIED" or peer_view(old) != peer_view(new):
            self._dirty.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            await n.start(self.informer.run)
            await self.informer.wait_synced()
            await self._pass_with_retries()
            task_status.started()
            while True:
                with trio.move_on_after(self.resync):
                    await self._dirty.wait()
                # Let a burst of events land before the next pass.
                await trio.sleep(0.05)
                await self._pass_with_retries()

    async def _pass_with_retries(self) -> None:
        backoff = 0.5
        while True:
            self._dirty = trio.Event()
            try:
                await self.sync_once()
                return
            except (NetworkError, ApiException, httpx.TransportError, OSError) as e:
                log.warning("pod network: syncing routes to other nodes failed: %s; "
                            "retrying in %.1fs", explain(e) if not isinstance(e, NetworkError) else e,
                            backoff)
            with trio.move_on_after(backoff):
                await self._dirty.wait()
            backoff = min(backoff * 2, 30.0)

    async def sync_once(self) -> None:
        """One pass: routes from the cached Nodes, then this Node's annotations."""
        nodes = self.informer.list()
        await self.driver.sync_peers(nodes)
        self.passes += 1
        await self._publish(self.driver.peer_annotations())

    async def _publish(self, want: Mapping[str, str]) -> None:
        if not want:
            return
        me = next((n for n in self.informer.list()
                   if (n.get("metadata") or {}).get("name") == self.node_name), None)
        if me is None:
            return  # not registered (again) yet: the ADDED event brings us back here
        have = (me.get("metadata") or {}).get("annotations") or {}
        if all(have.get(k) == v for k, v in want.items()):
            return
        await self.client.patch("v1", "nodes", self.node_name,
                                {"metadata": {"annotations": dict(want)}}, MERGE_PATCH)
        log.info("pod network: published %s on node %s", ", ".join(sorted(want)), self.node_name)


__all__ = ["PeerSync", "RESYNC_SECONDS"]
