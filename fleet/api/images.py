"""Image references: parse and normalize the names users write in pod specs (no I/O).

This module owns the single rule for turning `busybox` into
`docker.io/library/busybox:latest`, so the agent's image store, the registry
client, its `imagePullPolicy` decision and the scheduler's ImageLocality all
agree on what "the same image" means (fleet/runtime/images/reference.py maps a
refusal to the kubelet's InvalidImageName pull error).
The grammar follows the distribution project's `reference` package (what Docker,
containerd and the kubelet use): the first path component is a registry host only
if it contains a `.` or a `:`, is `localhost`, or has an upper-case letter;
otherwise the image lives on Docker Hub, and one-component Hub names sit under
`library/`.  A reference with neither tag nor digest means `:latest`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
# The host that actually serves Docker Hub's distribution API.
DOCKER_HUB_REGISTRY = "registry-1.docker.io"
_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io"}

# One path component: lower-case alphanumerics joined by `.`, `_`, `__` or runs of `-`.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_DOMAIN_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?$"
)
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST_RE = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}$")
_SHA256_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Reference:
    """A normalized image reference: `domain/path[:tag][@digest]`."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        """`domain/path`, the name without tag or digest."""
        return f"{self.domain}/{self.path}"

    @property
    def registry_host(self) -> str:
        """The host:port to talk the distribution API to (Docker Hub has its own)."""
        return DOCKER_HUB_REGISTRY if self.domain == DOCKER_HUB else self.domain

    @property
    def target(self) -> str:
        """What to ask the registry's manifests endpoint for: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.domain, self.path, None, digest)

    def __str__(self) -> str:
        s = self.repository
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s


class InvalidReference(ValueError):
    """`ref` is not an image reference; the message says why."""


def parse_reference(ref: str) -> Reference:
    """Parse and normalize `ref`; raises InvalidReference when malformed."""
    original = ref
    if not ref or ref != ref.strip() or any(c.isspace() for c in ref):
        raise _invalid(original, "empty or contains whitespace")
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise _invalid(original, f"bad digest {digest!r}")
        if digest.startswith("sha256:") and not _SHA256_RE.match(digest):
            raise _invalid(original, "sha256 digests are 64 lower-case hex digits")
    tag = None
    # A tag is after the last ':' that follows the last '/', so `host:5000/x` is no tag.
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        ref, tag = ref[:colon], ref[colon + 1 :]
        if not _TAG_RE.match(tag):
            raise _invalid(original, f"bad tag {tag!r}")
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        domain, path = first, rest
        if not _DOMAIN_RE.match(domain):
            raise _invalid(original, f"bad registry host {domain!r}")
        domain = domain.lower()
    else:
        domain, path = DOCKER_HUB, ref
    if domain in _HUB_ALIASES:
        domain = DOCKER_HUB
    if domain == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _PATH_RE.match(path) or len(f"{domain}/{path}") > 255:
        raise _invalid(original, f"bad repository name {path!r}")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(domain, path, tag, digest)


def normalize(ref: str) -> str:
    """The canonical string form of `ref` (`busybox` → `docker.io/library/busybox:latest`)."""
    return str(parse_reference(ref))


def is_digest(s: str) -> bool:
    """True for a bare `sha256:<64 hex>` (an image or manifest id rather than a name)."""
    return bool(_SHA256_RE.match(s))


def _invalid(ref: str, why: str) -> InvalidReference:
    return InvalidReference(f'invalid image reference "{ref}": {why}')
