"""A tiny but real container image built from Debian's busybox-static, for tests and demos.

Tests need an image they can pull, import and run without reaching the internet,
so this module builds one from `/bin/busybox` (package busybox-static): one layer
with the binary, symlinks for the common applets, `/tmp`, and an `/etc/passwd`
with root and nobody.  The result is byte-for-byte reproducible (fixed mtimes,
sorted entries, gzip without timestamps), so its digests are stable across runs.

It can be written as an OCI image-layout archive or a `docker save` tarball, or
pushed to a registry with the distribution API's monolithic blob upload; extra
layers (including deletions, i.e. whiteouts) and multi-platform indexes are there
so tests can exercise layering and platform selection against a real registry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fleet.runtime.images.auth import Credentials, RegistryAuth, registry_error_message
from fleet.runtime.images.manifest import (
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER_GZIP,
    OCI_MANIFEST,
    Platform,
)

BUSYBOX = Path("/bin/busybox")
APPLETS = (
    "sh", "ash", "echo", "cat", "sleep", "ls", "env", "id", "wget", "httpd", "nc", "true",
    "false", "test", "[", "printf", "mkdir", "rm", "cp", "mv", "ps", "kill", "grep", "sed",
    "head", "tail", "date", "hostname", "touch", "pwd", "uname", "wc", "dd", "yes", "seq",
    "ln", "chmod", "stat", "tee", "sync", "whoami", "mount", "df", "du", "top", "xargs",
    "timeout", "nslookup", "ping", "ip", "vi", "find", "sort", "uniq", "tr", "cut", "awk",
    "tar",  # kubectl cp runs `tar` in the container
)
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = b"root:x:0:\nnogroup:x:65534:\n"
# Every entry gets this mtime so the layer (and so every digest) is reproducible.
EPOCH = 0


def busybox_problem(path: Path = BUSYBOX) -> str | None:
    """Why `path` can't be used as the image's busybox (None when it can).

    The image has no shared libraries, so the binary must be statically linked:
    an ELF without a PT_INTERP program header.  The `busybox` package (dynamic)
    installs the same path, hence the check.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"{path} is not readable ({e.strerror}); install the busybox-static package"
    if data[:4] != b"\x7fELF":
        return f"{path} is not an ELF binary"
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    if is64:
        phoff, = struct.unpack_from(endian + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(endian + "HH", data, 0x36)
    else:
        phoff, = struct.unpack_from(endian + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(endian + "HH", data, 0x2A)
    for i in range(phnum):
        p_type, = struct.unpack_from(endian + "I", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP: needs a dynamic loader the image doesn't have
            return f"{path} is dynamically linked; install busybox-static instead of busybox"
    return None


@dataclass
class Layer:
    """One built layer: the plain tar (for docker save) and its gzip (for registries/OCI)."""

    tar: bytes
    gz: bytes

    @property
    def diff_id(self) -> str:
        return "sha256:" + hashlib.sha256(self.tar).hexdigest()

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.gz).hexdigest()

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": OCI_LAYER_GZIP, "digest": self.digest, "size": len(self.gz)}


@dataclass
class OciImage:
    """A complete single-platform image: layers, config and manifest, all in memory."""

    layers: list[Layer]
    config: dict[str, Any]
    platform: Platform
    config_bytes: bytes = field(init=False)
    manifest_bytes: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.config["rootfs"] = {"type": "layers", "diff_ids": [la.diff_id for la in self.layers]}
        self.config_bytes = json.dumps(self.config, sort_keys=True).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": OCI_CONFIG,
                "digest": self.config_digest,
                "size": len(self.config_bytes),
            },
            "layers": [la.descriptor() for la in self.layers],
        }
        self.manifest_bytes = json.dumps(manifest, sort_keys=True).encode()

    @property
    def config_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.config_bytes).hexdigest()

    @property
    def manifest_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest_bytes).hexdigest()

    def blobs(self) -> dict[str, bytes]:
        """digest → content for every blob the manifest refers to."""
        out = {self.config_digest: self.config_bytes}
        for la in self.layers:
            out[la.digest] = la.gz
        return out

    def manifest_descriptor(self, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "mediaType": OCI_MANIFEST,
            "digest": self.manifest_digest,
            "size": len(self.manifest_bytes),
            "platform": {"os": self.platform.os, "architecture": self.platform.architecture},
        }
        if self.platform.variant:
            d["platform"]["variant"] = self.platform.variant
        if annotations:
            d["annotations"] = annotations
        return d


# -- building ------------------------------------------------------------------
def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.size = size
    ti.linkname = link
    ti.mtime = EPOCH
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    return ti


def build_layer(entries: dict[str, bytes | str | None], *, dirs: dict[str, int] | None = None) -> Layer:
    """A layer from `path → content`: bytes is a file, str (starting `->`) a symlink, None a deletion.

    Parent directories are added (mode 0755 unless `dirs` says otherwise); a None
    value writes the OCI whiteout `.wh.<name>`, and a path ending in `/.wh..wh..opq`
    marks its directory opaque.
    """
    dirs = dict(dirs or {})
    for path in entries:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.setdefault("/".join(parts[:i]), 0o755)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for d in sorted(dirs):
            tf.addfile(_info(d + "/", tarfile.DIRTYPE, dirs[d]))
        for path in sorted(entries):
            value = entries[path]
            path = path.strip("/")
            if value is None:
                parent, _, base = path.rpartition("/")
                wh = f"{parent}/.wh.{base}" if parent else f".wh.{base}"
                tf.addfile(_info(wh, tarfile.REGTYPE, 0o644))
            elif isinstance(value, str):
                tf.addfile(_info(path, tarfile.SYMTYPE, 0o777, link=value.removeprefix("->")))
            else:
                mode = 0o755 if path.startswith("bin/") else 0o644
                tf.addfile(_info(path, tarfile.REGTYPE, mode, len(value)), io.BytesIO(value))
    tar = buf.getvalue()
    return Layer(tar=tar, gz=gzip.compress(tar, compresslevel=6, mtime=0))


def build_busybox_image(
    *,
    busybox: Path = BUSYBOX,
    cmd: list[str] | None = None,
    entrypoint: list[str] | None = None,
    env: list[str] | None = None,
    workdir: str = "/",
    user: str = "",
    exposed_ports: list[str] | None = None,
    extra_layers: list[dict[str, bytes | str | None]] | None = None,
    platform: Platform | None = None,
) -> OciImage:
    """The busybox image (plus any `extra_layers` on top, see `build_layer`)."""
    problem = busybox_problem(busybox)
    if problem:
        raise FileNotFoundError(problem)
    base: dict[str, bytes | str | None] = {"bin/busybox": busybox.read_bytes()}
    for applet in APPLETS:
        base[f"bin/{applet}"] = "->busybox"
    base["etc/passwd"] = PASSWD
    base["etc/group"] = GROUP
    layers = [
        build_layer(
            base,
            dirs={"tmp": 0o1777, "root": 0o700, "etc": 0o755, "dev": 0o755, "proc": 0o555,
                  "sys": 0o555, "var": 0o755, "home": 0o755},
        )
    ]
    layers += [build_layer(extra) for extra in extra_layers or []]
    plat = platform or Platform.host()
    run_config: dict[str, Any] = {
        "Env": list(env) if env is not None else [PATH_ENV],
        "Cmd": list(cmd) if cmd is not None else ["sh"],
        "WorkingDir": workdir,
    }
    if entrypoint is not None:
        run_config["Entrypoint"] = list(entrypoint)
    if user:
        run_config["User"] = user
    if exposed_ports:
        run_config["ExposedPorts"] = {p: {} for p in exposed_ports}
    config: dict[str, Any] = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": plat.architecture,
        "os": plat.os,
        "config": run_config,
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "fleet.testing.oci_image"}]
        * len(layers),
    }
    if plat.variant:
        config["variant"] = plat.variant
    return OciImage(layers=layers, config=config, platform=plat)


def build_index(images: list[OciImage]) -> bytes:
    """An OCI image index over `images` (one per platform)."""
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [img.manifest_descriptor() for img in images],
        },
        sort_keys=True,
    ).encode()


# -- archives ------------------------------------------------------------------
def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    tf.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))


def write_oci_archive(image: OciImage, path: Path, ref: str | None) -> Path:
    """Write `image` as an OCI image layout in a tar; `ref` names it in index.json."""
    annotations = None
    if ref is not None:
        annotations = {
            "org.opencontainers.image.ref.name": ref,
            "io.containerd.image.name": ref,
        }
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [image.manifest_descriptor(annotations)],
    }
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        _add_bytes(tf, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add_bytes(tf, "index.json", json.dumps(index).encode())
        blobs = image.blobs()
        blobs[image.manifest_digest] = image.manifest_bytes
        tf.addfile(_info("blobs/", tarfile.DIRTYPE, 0o755))
        tf.addfile(_info("blobs/sha256/", tarfile.DIRTYPE, 0o755))
        for digest in sorted(blobs):
            _add_bytes(tf, "blobs/sha256/" + digest.removeprefix("sha256:"), blobs[digest])
    return path


def write_docker_archive(image: OciImage, path: Path, repo_tags: list[str]) -> Path:
    """Write `image` the way `docker save` does (manifest.json, config, plain layer tars)."""
    config_name = image.config_digest.removeprefix("sha256:") + ".json"
    layer_names = [la.diff_id.removeprefix("sha256:") + "/layer.tar" for la in image.layers]
    manifest = [{"Config": config_name, "RepoTags": list(repo_tags), "Layers": layer_names}]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        _add_bytes(tf, "manifest.json", json.dumps(manifest).encode())
        _add_bytes(tf, config_name, image.config_bytes)
        for la, name in zip(image.layers, layer_names, strict=True):
            tf.addfile(_info(name.split("/")[0] + "/", tarfile.DIRTYPE, 0o755))
            _add_bytes(tf, name, la.tar)
    return path


# -- pushing -------------------------------------------------------------------
class PushError(Exception):
    """The registry refused part of a push; the message carries its words."""


def _credentials(auth: Credentials | tuple[str, str] | None) -> Credentials | None:
    if auth is None or isinstance(auth, Credentials):
        return auth
    return Credentials(*auth)


async def push(
    image: OciImage,
    registry_url: str,
    repo: str,
    tag: str,
    auth: Credentials | tuple[str, str] | None = None,
) -> str:
    """Upload `image`'s blobs and manifest to `registry_url` as `repo:tag`; returns the manifest digest."""
    async with _Pusher(registry_url, repo, auth) as p:
        await p.push_image(image, tag)
    return image.manifest_digest


async def push_index(
    images: list[OciImage],
    registry_url: str,
    repo: str,
    tag: str,
    auth: Credentials | tuple[str, str] | None = None,
) -> str:
    """Push each image by digest, then an index over them as `repo:tag`; returns its digest."""
    index = build_index(images)
    async with _Pusher(registry_url, repo, auth) as p:
        for img in images:
            await p.push_image(img, img.manifest_digest)
        await p.put_manifest(tag, index, OCI_INDEX)
    return "sha256:" + hashlib.sha256(index).hexdigest()


class _Pusher:
    def __init__(
        self, registry_url: str, repo: str, auth: Credentials | tuple[str, str] | None
    ) -> None:
        self.repo = repo
        self.client = httpx.AsyncClient(base_url=registry_url.rstrip("/"), timeout=60.0)
        self.auth = RegistryAuth(_credentials(auth))
        self.scope = f"repository:{repo}:pull,push"

    async def __aenter__(self) -> _Pusher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def _send(self, method: str, url: str, **kw: Any) -> httpx.Response:
        req = self.client.build_request(method, url, **kw)
        return await self.auth.send(self.client, req, scope=self.scope)

    async def push_image(self, image: OciImage, reference: str) -> None:
        for digest, data in image.blobs().items():
            await self.put_blob(digest, data)
        await self.put_manifest(reference, image.manifest_bytes, OCI_MANIFEST)

    async def put_blob(self, digest: str, data: bytes) -> None:
        head = await self._send("HEAD", f"/v2/{self.repo}/blobs/{digest}")
        if head.status_code == 200:
            return
        start = await self._send("POST", f"/v2/{self.repo}/blobs/uploads/")
        if start.status_code != 202 or "location" not in start.headers:
            raise PushError(f"starting upload of {digest}: {registry_error_message(start)}")
        location = start.headers["location"]
        url = location + ("&" if "?" in location else "?") + f"digest={digest}"
        done = await self._send(
            "PUT", url, content=data, headers={"Content-Type": "application/octet-stream"}
        )
        if done.status_code != 201:
            raise PushError(f"uploading {digest}: {registry_error_message(done)}")

    async def put_manifest(self, reference: str, body: bytes, media_type: str) -> None:
        resp = await self._send(
            "PUT", f"/v2/{self.repo}/manifests/{reference}", content=body,
            headers={"Content-Type": media_type},
        )
        if resp.status_code != 201:
            raise PushError(f"putting manifest {reference}: {registry_error_message(resp)}")
