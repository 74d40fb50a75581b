"""The errors the image layer raises, shaped for the kubelet-style reasons the agent reports.

The agent turns an `ImagePullError` straight into a container's waiting state:
`reason` becomes `ErrImagePull` / `ErrImageNeverPull` / `InvalidImageName` (and the
agent's back-off turns repeats into `ImagePullBackOff`), and `message` — which
carries the registry's own words, such as `manifest unknown` or
`unauthorized: authentication required` — becomes the state's message.
"""

from __future__ import annotations

ERR_IMAGE_PULL = "ErrImagePull"
ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"
INVALID_IMAGE_NAME = "InvalidImageName"


class ImageError(Exception):
    """Base of every error the image store and registry client raise."""


class ImagePullError(ImageError):
    """Getting an image failed; `reason` is a Kubernetes waiting reason, `message` says why."""

    def __init__(self, reason: str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        # The registry's HTTP status when the failure came from it (401, 404, ...).
        self.status = status

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"ImagePullError({self.reason!r}, {self.message!r})"


class DigestMismatchError(ImageError):
    """Content did not hash to the digest it was fetched or imported by."""


class LayerError(ImageError):
    """A layer archive is malformed or unsafe (path traversal, link escaping the layer)."""


class ImageNotFoundError(ImageError, KeyError):
    """The store has no image under this reference."""

    def __str__(self) -> str:
        return f"image not present: {self.args[0]}"


class ImageImportError(ImageError):
    """An image archive (OCI layout or docker save tarball) could not be imported."""
