"""ImageLocality: prefer nodes that already hold the pod's images.

A node that has the images starts the pod sooner and saves registry
bandwidth.  kube-scheduler's formula: each container image present on the
node contributes its size scaled by how widely it has spread
(`size * nodes_having_it / all_nodes`) — an image already on every node
gives no node an edge, which keeps pods of a popular image from piling onto
the few nodes that pulled it first (the "node heating" problem).  The sum
is clamped to [23 MB, 1000 MB x containers] and mapped linearly to 0..100,
so small images (under the 23 MB threshold) do not matter at all.

Images are compared in their normalized form (`nginx` ==
`docker.io/library/nginx:latest`), see `snapshot.normalize_image_name`.
The point is skipped when none of the pod's images is on any node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.scheduler.framework import MAX_NODE_SCORE, Code, CycleState, Status
from fleet.scheduler.plugins._cycle import cycle_snapshot
from fleet.scheduler.podinfo import normalize_image_name
from fleet.scheduler.snapshot import NodeInfo

MB = 1024 * 1024
MIN_THRESHOLD = 23 * MB
MAX_CONTAINER_THRESHOLD = 1000 * MB


def calculate_priority(sum_scores: int, num_containers: int) -> int:
    """Clamp the summed image score to the thresholds and map it to 0..100."""
    max_threshold = MAX_CONTAINER_THRESHOLD * num_containers
    sum_scores = min(max(sum_scores, MIN_THRESHOLD), max_threshold)
    return MAX_NODE_SCORE * (sum_scores - MIN_THRESHOLD) // (max_threshold - MIN_THRESHOLD)


def pod_images(pod: dict[str, Any]) -> list[str]:
    """Normalized images of the init and app containers, one entry per container."""
    spec = pod.get("spec") or {}
    out = []
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        image = c.get("image") if isinstance(c, dict) else None
        if isinstance(image, str) and image:
            out.append(normalize_image_name(image))
    return out


class ImageLocality:
    name = "ImageLocality"
    _key = "ImageLocality/spread"

    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        snap = cycle_snapshot(state, nodes)
        images = pod_images(pod)
        spec = pod.get("spec") or {}
        containers = len(spec.get("initContainers") or []) + len(spec.get("containers") or [])
        if snap is None or not images or not containers or not len(snap):
            return Status(Code.SKIP)
        total = len(snap)
        spread = [(image, snap.image_nodes(image) / total) for image in images]
        spread = [(image, f) for image, f in spread if f > 0]
        if not spread:
            return Status(Code.SKIP)
        state.write(self._key, (spread, containers))
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        spread, containers = state.read(self._key)
        images = node.images
        total = 0
        for image, factor in spread:
            size = images.get(image)
            if size:
                total += int(size * factor)
        return calculate_priority(total, containers)
