"""Image references for the runtime: `fleet.api.images`, with refusals as pull errors.

The grammar and normalization live in `fleet.api.images` (shared with the
scheduler's ImageLocality); here a malformed reference becomes the kubelet's
`InvalidImageName` ImagePullError that the pod worker reports.
"""

from __future__ import annotations

from fleet.api import images as _images
from fleet.api.images import DOCKER_HUB, DOCKER_HUB_REGISTRY, Reference, is_digest
from fleet.runtime.images.errors import ImagePullError


def parse_reference(ref: str) -> Reference:
    """Parse and normalize `ref`; raises ImagePullError(InvalidImageName) when malformed."""
    try:
        return _images.parse_reference(ref)
    except _images.InvalidReference as e:
        raise ImagePullError("InvalidImageName", str(e)) from None


def normalize(ref: str) -> str:
    """The canonical string form of `ref` (`busybox` → `docker.io/library/busybox:latest`)."""
    return str(parse_reference(ref))


__all__ = ["DOCKER_HUB", "DOCKER_HUB_REGISTRY", "Reference", "is_digest", "normalize", "parse_reference"]
