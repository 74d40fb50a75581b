"""Manifests, indexes and platforms: the pure part of reading an image's description.

Registries and archives hand us JSON in two dialects — OCI (`application/vnd.oci.*`)
and Docker schema 2 (`application/vnd.docker.distribution.*`) — which mean the
same thing.  This module knows their media types, picks the node's platform out of
a multi-platform index (the way containerd's default matcher does: os and
architecture must match, a variant must match when the node has one, attestation
manifests are never images), and checks a single-platform manifest has what we need
(a config and its layers).  No I/O here, so all of it is tested table-driven.
"""

from __future__ import annotations

import json
import platform as _platform
from dataclasses import dataclass
from typing import Any

from fleet.runtime.images.errors import ERR_IMAGE_PULL, ImagePullError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"

INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
CONFIG_TYPES = frozenset({OCI_CONFIG, DOCKER_CONFIG})
LAYER_TYPES = frozenset(
    {
        OCI_LAYER_TAR, OCI_LAYER_GZIP, OCI_LAYER_ZSTD, DOCKER_LAYER_GZIP, DOCKER_LAYER_TAR,
        # Foreign (Windows) layers are refused at platform selection long before here.
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    }
)

# What we tell a registry we understand, most preferred first.
MANIFEST_ACCEPT = ", ".join([OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST])

# uname -m → GOARCH-style architecture (and variant) as registries label images.
_MACHINE_ARCH: dict[str, tuple[str, str]] = {
    "x86_64": ("amd64", ""),
    "amd64": ("amd64", ""),
    "aarch64": ("arm64", "v8"),
    "arm64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "i386": ("386", ""),
    "i686": ("386", ""),
    "ppc64le": ("ppc64le", ""),
    "s390x": ("s390x", ""),
    "riscv64": ("riscv64", ""),
}


@dataclass(frozen=True)
class Platform:
    """An image platform: `linux/amd64`, `linux/arm64/v8`, ..."""

    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def host(cls) -> Platform:
        """This machine's platform, named the way registries name it."""
        machine = _platform.machine().lower()
        arch, variant = _MACHINE_ARCH.get(machine, (machine, ""))
        return cls("linux", arch, variant)

    @classmethod
    def parse(cls, value: str | tuple[str, ...] | Platform) -> Platform:
        """From `"linux/arm64/v8"`, `("linux", "amd64")` or a Platform."""
        if isinstance(value, Platform):
            return value
        parts = value.split("/") if isinstance(value, str) else list(value)
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"platform must be os/arch[/variant], not {value!r}")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else "")

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: what a blob is, how big, and its digest."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: dict[str, str] | None = None

    @classmethod
    def from_json(cls, d: Any) -> Descriptor:
        if not isinstance(d, dict):
            raise _bad("descriptor is not an object")
        digest, size = d.get("digest"), d.get("size")
        if not isinstance(digest, str) or ":" not in digest:
            raise _bad(f"descriptor has no valid digest: {d!r}")
        if not isinstance(size, int) or size < 0:
            raise _bad(f"descriptor {digest} has no valid size")
        plat = None
        p = d.get("platform")
        if isinstance(p, dict) and p.get("os") and p.get("architecture"):
            plat = Platform(str(p["os"]), str(p["architecture"]), str(p.get("variant") or ""))
        ann = d.get("annotations") if isinstance(d.get("annotations"), dict) else None
        return cls(str(d.get("mediaType") or ""), digest, size, plat, ann)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.platform:
            out["platform"] = {"os": self.platform.os, "architecture": self.platform.architecture}
            if self.platform.variant:
                out["platform"]["variant"] = self.platform.variant
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class ImageManifest:
    """A single-platform manifest: one config blob and its layers, bottom layer first."""

    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


def media_type_of(body: bytes | dict[str, Any], content_type: str = "") -> str:
    """The media type of a manifest document: its own `mediaType`, else the HTTP header, else shape."""
    doc = json.loads(body) if isinstance(body, bytes | bytearray) else body
    if isinstance(doc, dict) and isinstance(doc.get("mediaType"), str) and doc["mediaType"]:
        return doc["mediaType"]
    ct = content_type.split(";")[0].strip()
    if ct in INDEX_TYPES or ct in MANIFEST_TYPES:
        return ct
    # OCI allows leaving mediaType out; tell an index from a manifest by its fields.
    if isinstance(doc, dict) and "manifests" in doc:
        return OCI_INDEX
    if isinstance(doc, dict) and "config" in doc and "layers" in doc:
        return OCI_MANIFEST
    if isinstance(doc, dict) and doc.get("schemaVersion") == 1:
        return "application/vnd.docker.distribution.manifest.v1+json"
    return ct or "unknown"


def parse_manifest(doc: dict[str, Any], media_type: str) -> ImageManifest:
    """Check and read a single-platform manifest."""
    if media_type not in MANIFEST_TYPES:
        raise _bad(f"unsupported manifest media type {media_type!r}")
    config = Descriptor.from_json(doc.get("config"))
    if config.media_type and config.media_type not in CONFIG_TYPES:
        raise _bad(f"not a container image: config media type {config.media_type!r}")
    layers_json = doc.get("layers")
    if not isinstance(layers_json, list):
        raise _bad("manifest has no layers list")
    layers = tuple(Descriptor.from_json(x) for x in layers_json)
    for layer in layers:
        if layer.media_type and layer.media_type not in LAYER_TYPES:
            raise _bad(f"unsupported layer media type {layer.media_type!r}")
    return ImageManifest(media_type, config, layers)


def index_entries(doc: dict[str, Any]) -> list[Descriptor]:
    """The manifests an index lists."""
    entries = doc.get("manifests")
    if not isinstance(entries, list):
        raise _bad("image index has no manifests list")
    return [Descriptor.from_json(x) for x in entries]


def _is_attestation(d: Descriptor) -> bool:
    ann = d.annotations or {}
    return ann.get("vnd.docker.reference.type") == "attestation-manifest" or (
        d.platform is not None and d.platform.os == "unknown"
    )


def platform_matches(want: Platform, have: Platform) -> bool:
    """containerd's rule: os and arch equal; variants must agree when both name one.

    arm64 images are usually labelled without a variant, and an arm64 node is v8,
    so an absent variant on either side matches.
    """
    if want.os != have.os or want.architecture != have.architecture:
        return False
    return not want.variant or not have.variant or want.variant == have.variant


def select_platform(entries: list[Descriptor], want: Platform) -> Descriptor:
    """The index entry for `want`: an exact variant match first, then a compatible one."""
    candidates = [
        d for d in entries
        if d.platform is not None and not _is_attestation(d) and platform_matches(want, d.platform)
    ]
    exact = [d for d in candidates if d.platform is not None and d.platform.variant == want.variant]
    if exact:
        return exact[0]
    if candidates:
        return candidates[0]
    offered = ", ".join(str(d.platform) for d in entries if d.platform and not _is_attestation(d))
    raise ImagePullError(
        ERR_IMAGE_PULL,
        f"no matching manifest for {want} in the manifest list entries"
        + (f" (offered: {offered})" if offered else ""),
    )


def _bad(msg: str) -> ImagePullError:
    return ImagePullError(ERR_IMAGE_PULL, msg)
