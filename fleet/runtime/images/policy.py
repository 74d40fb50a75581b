"""`imagePullPolicy`: whether a container start must go to the registry first.

Pure functions so the agent's pod worker and its tests share one definition.
Kubernetes' defaulting: `Always` when the image is `:latest` or has no tag (and is
not pinned by digest), `IfNotPresent` otherwise.
"""

from __future__ import annotations

from fleet.runtime.images.errors import ERR_IMAGE_NEVER_PULL, ImagePullError
from fleet.runtime.images.reference import parse_reference

ALWAYS = "Always"
IF_NOT_PRESENT = "IfNotPresent"
NEVER = "Never"
POLICIES = (ALWAYS, IF_NOT_PRESENT, NEVER)


def default_pull_policy(image: str) -> str:
    """The policy Kubernetes fills in when a container leaves `imagePullPolicy` empty."""
    raw_tail = image.rsplit("/", 1)[-1]
    if "@" in image:
        return IF_NOT_PRESENT
    if ":" not in raw_tail:
        return ALWAYS
    return ALWAYS if parse_reference(image).tag == "latest" else IF_NOT_PRESENT


def should_pull(policy: str | None, present: bool, *, image: str = "") -> bool:
    """True when the image must be pulled before the container can start.

    `Never` with the image absent raises `ImagePullError("ErrImageNeverPull")` —
    the kubelet's message, so users see the same thing they would on Kubernetes.
    An empty policy means the Kubernetes default for `image`.
    """
    if not policy:
        policy = default_pull_policy(image) if image else IF_NOT_PRESENT
    if policy == ALWAYS:
        return True
    if policy == IF_NOT_PRESENT:
        return not present
    if policy == NEVER:
        if present:
            return False
        raise ImagePullError(
            ERR_IMAGE_NEVER_PULL,
            f'Container image "{image}" is not present with pull policy of Never'
            if image
            else "Container image is not present with pull policy of Never",
        )
    raise ValueError(f"unknown imagePullPolicy {policy!r} (want one of {', '.join(POLICIES)})")
