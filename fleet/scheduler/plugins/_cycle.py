"""How a plugin reaches the whole cluster from inside a cycle.

Most plugins judge one node at a time and need nothing else.  A few
(InterPodAffinity, PodTopologySpread, VolumeBinding, ImageLocality) need the
cluster-wide aggregates of the `Snapshot`.  kube-scheduler gives plugins a
handle to the cycle's snapshot; here the Framework attaches it to the
CycleState as `state.snapshot`.  Every NodeInfo built by a Snapshot also
points back to it, which covers the score points (they receive nodes) and a
Framework that has not attached the snapshot: a plugin then defers its
pre-filter work to its first `filter` call (see `DEFERRED`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fleet.scheduler.framework import CycleState
from fleet.scheduler.snapshot import NodeInfo, Snapshot

# Written by a pre_filter that could not see the snapshot; the plugin's
# filter then does the work on the first node it is given.
DEFERRED: Any = object()


def cycle_snapshot(state: CycleState, nodes: Sequence[NodeInfo] = ()) -> Snapshot | None:
    """The snapshot this cycle runs over: the CycleState's, else the one the nodes belong to."""
    snap = getattr(state, "snapshot", None)
    if snap is None and nodes:
        snap = nodes[0].snapshot
    return snap


def resolve_deferred(state: CycleState, key: str, node: NodeInfo,
                     build: Callable[[Any, Snapshot], Any], plugin: str) -> Any:
    """The plugin's pre-filter state under `key`, built now from the node's snapshot if
    its pre_filter wrote `(DEFERRED, arg)`: `build(arg, snapshot)` runs once per cycle."""
    s = state.read(key)
    if isinstance(s, tuple) and s[0] is DEFERRED:
        snap = node.snapshot
        assert snap is not None, f"{plugin} needs nodes from a Snapshot"
        s = build(s[1], snap)
        state.write(key, s)
    return s
