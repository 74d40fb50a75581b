"""A pod's volumes on the node: materialize, keep up to date, translate into mounts, remove.

The pod worker owns one `VolumeManager` per pod.  `setup(pod)` makes every volume of the
pod exist under `<pod_dir>/volumes/<name>` (hostPath volumes are the host path itself)
and returns their host paths; `mounts_for(container, paths)` turns a container's
`volumeMounts` into runtime `Mount`s; `refresh(pod)` re-renders the volumes whose
content comes from API objects; `teardown()` unmounts and deletes everything.

Volume types:

- emptyDir — a directory (mode 0777, as the kubelet makes it, so non-root containers can
  write).  `medium: Memory` is a tmpfs mount (size from `sizeLimit`, else the node's
  allocatable memory) when we may mount; otherwise a plain directory and a warning.
- hostPath — the host path, after the `type` check (DirectoryOrCreate creates it,
  Directory/File/Socket/CharDevice/BlockDevice must exist as that, FileOrCreate creates
  an empty file in an existing directory).
- persistentVolumeClaim and ephemeral — claimed volumes, staged and published by the
  node's CSI volume manager (`fleet.agent.csivolumes.NodeVolumes`, passed as `csi`):
  a directory under `volumes/<name>`, or for `volumeMode: Block` a device file under
  `volumeDevices/<name>` that `devices_for` hands the container at its devicePath.
  Read-only when the pod's claim reference, the PV (ReadOnlyMany) or the mount says so.
  Until the claim is bound, set-up raises FailedMount with the kubelet's words.
- configMap, secret, downwardAPI, projected — files rendered from API objects.  Secret
  and projected volumes live on a tmpfs when we may mount, so credentials never reach
  the node's disk (as in Kubernetes).

Files from API objects are written the way the kubelet's AtomicWriter writes them, so a
process reading the volume never sees a half-updated set::

    <vol>/..2026_11_29_16_00_00.123456/key     a fresh, fully written copy of the payload
    <vol>/..data -> ..2026_11_29_16_00_00.123456  swapped by rename(2) of a new symlink
    <vol>/key    -> ..data/key                  stable names the container opens

An update writes a new timestamped directory, renames a new `..data` symlink over the old
one (the atomic step), fixes the top-level symlinks and only then removes the old
directory.  An unchanged payload writes nothing.

A referenced ConfigMap/Secret that does not exist and is not `optional` raises
`VolumeError("FailedMount", 'MountVolume.SetUp failed for volume "v" : configmap "x" not
found')` — the kubelet's words — so the worker keeps the pod waiting with an event and
retries.  All blocking file-system work runs in worker threads.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import trio

from fleet.agent import csiplan
from fleet.agent.env import EnvError, Lookup, field_value, resource_value
from fleet.api.expansion import expand_vars
from fleet.api.quantity import QuantityError, int_value
from fleet.runtime.driver import Device, Mount, Propagation
from fleet.storage.mounts import mount_tmpfs as _mount_tmpfs
from fleet.storage.mounts import mounts_under
from fleet.storage.mounts import umount as _umount

log = logging.getLogger(__name__)

FAILED_MOUNT = "FailedMount"

# token_source(pod, audience, expiration_seconds) -> a bound service-account token
# (fleet.agent.satokens.ServiceAccountTokens: cached, refreshed at 80% of its life).
# An exception from it fails the volume's set-up (FailedMount, retried); on refresh
# the old content stays.
TokenSource = Callable[[Mapping[str, Any], str, int], Awaitable[str]]

DATA_DIR_NAME = "..data"
_DATA_TMP_NAME = "..data_tmp"
# Volume types whose content the kubelet mounts read-only whatever volumeMounts say.
_ALWAYS_READ_ONLY = ("configMap", "secret", "downwardAPI", "projected")
_RENDERED = _ALWAYS_READ_ONLY


class VolumeError(Exception):
    """A volume cannot be set up; `reason`/`message` become the worker's event."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _setup_failed(volume: str, detail: str) -> VolumeError:
    return VolumeError(FAILED_MOUNT, f'MountVolume.SetUp failed for volume "{volume}" : {detail}')


# ---------------------------------------------------------------------------------------
# tmpfs via mount(2) (fleet.storage.mounts): no dependency on a mount binary, and errno
# tells us why it failed.


def _may_mount() -> bool:
    return os.geteuid() == 0


# ---------------------------------------------------------------------------------------
# Atomic writer


@dataclass(frozen=True)
class FileContent:
    data: bytes
    mode: int


Payload = dict[str, FileContent]


def _clean_relpath(volume: str, path: str) -> str:
    """An item path: relative, no `..` element, not starting with `..` (reserved)."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or path.startswith(".."):
        raise _setup_failed(volume, f"invalid path {path!r}: must be relative, without '..'")
    return str(p)


def _read_payload(data_dir: Path) -> Payload | None:
    if not data_dir.is_dir():
        return None
    out: Payload = {}
    for dirpath, _dirs, files in os.walk(data_dir):
        for f in files:
            full = Path(dirpath, f)
            st = full.lstat()
            out[str(full.relative_to(data_dir))] = FileContent(full.read_bytes(),
                                                                stat.S_IMODE(st.st_mode))
    return out


def write_atomic(target: Path, payload: Payload) -> bool:
    """Make `target` hold exactly `payload`, kubelet AtomicWriter style; True if changed.

    Blocking: call it in a worker thread."""
    target.mkdir(parents=True, exist_ok=True)
    data_link = target / DATA_DIR_NAME
    old_dir_name = os.readlink(data_link) if data_link.is_symlink() else None
    if old_dir_name is not None and _read_payload(target / old_dir_name) == payload:
        return False

    stamp = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    ts_dir = Path(tempfile.mkdtemp(prefix=stamp, dir=target))
    try:
        ts_dir.chmod(0o755)
        for rel, content in payload.items():
            f = ts_dir / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(content.data)
            # chmod after writing: the umask must not decide a file's mode.
            f.chmod(content.mode)
        tmp_link = target / _DATA_TMP_NAME
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()
        tmp_link.symlink_to(ts_dir.name)
        # The atomic step: readers see either the whole old set or the whole new one.
        os.replace(tmp_link, data_link)
    except BaseException:
        shutil.rmtree(ts_dir, ignore_errors=True)
        raise

    top = {PurePosixPath(rel).parts[0] for rel in payload}
    for name in top:
        link = target / name
        if not link.is_symlink():
            if link.exists():
                # A leftover real file/dir would shadow the key: replace it by the link.
                shutil.rmtree(link) if link.is_dir() else link.unlink()
            link.symlink_to(f"{DATA_DIR_NAME}/{name}")
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.name not in top and entry.is_symlink():
            entry.unlink()
    if old_dir_name is not None and old_dir_name != ts_dir.name:
        shutil.rmtree(target / old_dir_name, ignore_errors=True)
    # Timestamped directories of an interrupted earlier write.
    for entry in target.iterdir():
        if (entry.name.startswith("..") and entry.name not in (DATA_DIR_NAME, ts_dir.name)
                and entry.is_dir() and not entry.is_symlink()):
            shutil.rmtree(entry, ignore_errors=True)
    return True


# ---------------------------------------------------------------------------------------
# Rendering API-object volumes into payloads


def _mode(value: Any, default: int) -> int:
    if value is None:
        return default
    mode = int(value)
    if not 0 <= mode <= 0o777:
        raise ValueError(f"file mode {mode:o} out of range")
    return mode


def _object_files(volume: str, kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """Key → bytes of a ConfigMap (data + binaryData) or Secret (data, decoded)."""
    out: dict[str, bytes] = {}
    try:
        if kind == "ConfigMap":
            out.update({k: str(v).encode() for k, v in (obj.get("data") or {}).items()})
            out.update({k: base64.b64decode(v, validate=True)
                        for k, v in (obj.get("binaryData") or {}).items()})
        else:
            out.update({k: base64.b64decode(v, validate=True)
                        for k, v in (obj.get("data") or {}).items()})
            out.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    except (binascii.Error, ValueError) as e:
        raise _setup_failed(volume, f"{kind.lower()} data is not valid base64: {e}") from None
    return out


class VolumeManager:
    """The volumes of one pod under `pod_dir`; see the module docstring."""

    def __init__(self, pod_dir: Path, lookup: Lookup,
                 node_allocatable: Mapping[str, Any] | None = None, *,
                 token_source: TokenSource | None = None, csi: Any = None) -> None:
        self.pod_dir = Path(pod_dir)
        # fleet.agent.csivolumes.NodeVolumes: claimed volumes; None = not supported here.
        self._csi = csi
        # Raw block volumes: volume name → the published device file.
        self.devices: dict[str, Path] = {}
        self.volumes_dir = self.pod_dir / "volumes"
        self._lookup = lookup
        self._node_allocatable = dict(node_allocatable or {})
        self._token_source = token_source
        self.paths: dict[str, Path] = {}
        self._read_only: set[str] = set()

    # -- setup ---------------------------------------------------------------------------

    async def setup(self, pod: Mapping[str, Any]) -> dict[str, Path]:
        """Materialize every volume of `pod`; idempotent (a restarted agent calls it again)."""
        paths: dict[str, Path] = {}
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            name = vol.get("name", "")
            if not name or "/" in name or name.startswith("."):
                raise VolumeError(FAILED_MOUNT, f"invalid volume name {name!r}")
            paths[name] = await self._setup_one(pod, name, vol)
            if any(t in vol for t in _ALWAYS_READ_ONLY):
                self._read_only.add(name)
        self.paths = paths
        return dict(paths)

    async def _setup_one(self, pod: Mapping[str, Any], name: str, vol: Mapping[str, Any]) -> Path:
        target = self.volumes_dir / name
        if csiplan.is_claim_volume(vol):
            return await self._setup_claimed(pod, name, vol)
        if "hostPath" in vol:
            return await trio.to_thread.run_sync(_check_host_path, name, vol["hostPath"] or {})
        if "emptyDir" in vol:
            spec = vol["emptyDir"] or {}
            if spec.get("medium") == "Memory":
                size = spec.get("sizeLimit") or self._node_allocatable.get("memory")
                await self._tmpfs_dir(name, target, size, mode=0o777)
            else:
                await trio.to_thread.run_sync(_make_dir, target, 0o777)
            return target
        for kind in _RENDERED:
            if kind in vol:
                if kind in ("secret", "projected"):
                    await self._tmpfs_dir(name, target, None, mode=0o755, quiet=True)
                payload = await self._render(pod, name, kind, vol[kind] or {})
                await trio.to_thread.run_sync(write_atomic, target, payload)
                return target
        raise _setup_failed(name, f"unsupported volume type: {sorted(k for k in vol if k != 'name')}")

    async def _setup_claimed(self, pod: Mapping[str, Any], name: str,
                             vol: Mapping[str, Any]) -> Path:
        from fleet.storage.driver import DriverError

        if self._csi is None:
            raise _setup_failed(name, "claimed volumes are not supported on this node")
        try:
            path, facts = await self._csi.publish(
                pod, vol, self.pod_dir,
                lambda f: (self.pod_dir / "volumeDevices" / name if f.mode == "Block"
                           else self.volumes_dir / name))
        except csiplan.MountProblem as e:
            raise VolumeError(FAILED_MOUNT, csiplan.failed_mount_message(name, e.message)) from None
        except csiplan.DriverFailure as e:
            raise VolumeError(FAILED_MOUNT, e.message) from None
        except DriverError as e:  # a driver call outside stage/publish (a plugin's bug)
            raise _setup_failed(name, f"rpc error: code = {e.code.value} desc = {e.message}") from None
        if facts.read_only:
            self._read_only.add(name)
        if facts.mode == "Block":
            self.devices[name] = path
        return path

    async def _tmpfs_dir(self, name: str, target: Path, size: Any, *, mode: int,
                         quiet: bool = False) -> None:
        def work() -> None:
            _make_dir(target, mode)
            if os.path.ismount(target):
                return
            if not _may_mount():
                if not quiet:
                    log.warning("volume %s: medium Memory needs root to mount a tmpfs; "
                                "using a plain directory on disk", name)
                return
            options = f"mode={mode:o}"
            if size is not None:
                try:
                    options += f",size={int_value(size)}"
                except QuantityError:
                    raise _setup_failed(name, f"invalid sizeLimit {size!r}") from None
            try:
                _mount_tmpfs(target, options)
            except OSError as e:
                # Root without CAP_SYS_ADMIN (a container): keep going on disk.
                log.warning("volume %s: %s; using a plain directory on disk", name, e)

        await trio.to_thread.run_sync(work)

    # -- rendering -----------------------------------------------------------------------

    async def _render(self, pod: Mapping[str, Any], volume: str, kind: str,
                      spec: Mapping[str, Any]) -> Payload:
        try:
            return await self._render_kind(pod, volume, kind, spec)
        except (ValueError, TypeError) as e:
            # Bad modes or expirationSeconds in the spec (validation should catch them).
            raise _setup_failed(volume, str(e)) from None

    async def _render_kind(self, pod: Mapping[str, Any], volume: str, kind: str,
                           spec: Mapping[str, Any]) -> Payload:
        default_mode = _mode(spec.get("defaultMode"), 0o644)
        if kind == "configMap":
            return await self._render_object(volume, "ConfigMap", pod, spec.get("name", ""),
                                             spec, default_mode)
        if kind == "secret":
            return await self._render_object(volume, "Secret", pod, spec.get("secretName", ""),
                                             spec, default_mode)
        if kind == "downwardAPI":
            return self._render_downward(pod, volume, spec.get("items") or [], default_mode)
        payload: Payload = {}
        for source in spec.get("sources") or []:
            if "configMap" in source:
                s = source["configMap"] or {}
                payload.update(await self._render_object(volume, "ConfigMap", pod,
                                                         s.get("name", ""), s, default_mode))
            elif "secret" in source:
                s = source["secret"] or {}
                payload.update(await self._render_object(volume, "Secret", pod,
                                                         s.get("name", ""), s, default_mode))
            elif "downwardAPI" in source:
                payload.update(self._render_downward(
                    pod, volume, (source["downwardAPI"] or {}).get("items") or [], default_mode))
            elif "serviceAccountToken" in source:
                s = source["serviceAccountToken"] or {}
                path = _clean_relpath(volume, s.get("path", ""))
                if self._token_source is None:
                    log.warning("volume %s: no service-account token source on this agent; "
                                "not writing %s", volume, path)
                    continue
                try:
                    token = await self._token_source(pod, s.get("audience", ""),
                                                     int(s.get("expirationSeconds") or 3600))
                except Exception as e:  # noqa: BLE001 - fleet.agent.satokens.TokenError and kin
                    # "failed to fetch token: ..." — the kubelet's words after the prefix.
                    raise _setup_failed(volume, str(e)) from e
                payload[path] = FileContent(token.encode(), default_mode)
            else:
                log.warning("volume %s: unsupported projected source %s", volume, sorted(source))
        return payload

    async def _render_object(self, volume: str, kind: str, pod: Mapping[str, Any], name: str,
                             spec: Mapping[str, Any], default_mode: int) -> Payload:
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        optional = bool(spec.get("optional"))
        obj = await self._lookup(kind, namespace, name)  # type: ignore[arg-type]
        if obj is None:
            if optional:
                return {}
            raise _setup_failed(volume, f'{kind.lower()} "{name}" not found')
        files = _object_files(volume, kind, obj)
        items = spec.get("items")
        payload: Payload = {}
        if not items:
            for key, data in files.items():
                payload[_clean_relpath(volume, key)] = FileContent(data, default_mode)
            return payload
        for item in items:
            key = item.get("key", "")
            if key not in files:
                if optional:
                    continue
                what = "config" if kind == "ConfigMap" else "secret"
                raise _setup_failed(volume, f"{kind.lower()} references non-existent {what} key: {key}")
            path = _clean_relpath(volume, item.get("path") or key)
            payload[path] = FileContent(files[key], _mode(item.get("mode"), default_mode))
        return payload

    def _render_downward(self, pod: Mapping[str, Any], volume: str, items: list[Any],
                         default_mode: int) -> Payload:
        payload: Payload = {}
        for item in items:
            path = _clean_relpath(volume, item.get("path", ""))
            try:
                if "fieldRef" in item:
                    value = field_value(pod, (item["fieldRef"] or {}).get("fieldPath", ""),
                                        allow_whole_maps=True)
                elif "resourceFieldRef" in item:
                    ref = item["resourceFieldRef"] or {}
                    value = resource_value(pod, ref.get("containerName", ""),
                                           ref.get("resource", ""), ref.get("divisor"),
                                           self._node_allocatable)
                else:
                    raise EnvError(f"downwardAPI item {path!r} has no fieldRef or resourceFieldRef")
            except EnvError as e:
                raise _setup_failed(volume, e.message) from None
            payload[path] = FileContent(value.encode(), _mode(item.get("mode"), default_mode))
        return payload

    # -- refresh -------------------------------------------------------------------------

    async def refresh(self, pod: Mapping[str, Any]) -> list[str]:
        """Re-render configMap/secret/downwardAPI/projected volumes; names of those changed.

        Every volume is tried; if some failed (an object was deleted meanwhile), their old
        content stays in place — as in Kubernetes — and the first error is raised after
        the others were updated."""
        changed: list[str] = []
        first_error: VolumeError | None = None
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            name = vol.get("name", "")
            kind = next((k for k in _RENDERED if k in vol), None)
            if kind is None or name not in self.paths:
                continue
            try:
                payload = await self._render(pod, name, kind, vol[kind] or {})
            except VolumeError as e:
                first_error = first_error or e
                continue
            if await trio.to_thread.run_sync(write_atomic, self.paths[name], payload):
                changed.append(name)
        if first_error is not None:
            raise first_error
        return changed

    # -- teardown ------------------------------------------------------------------------

    async def teardown(self) -> None:
        """Unmount every tmpfs under the pod dir and remove the pod dir.

        Refuses to delete anything while a mount remains below the pod dir: deleting
        through a mount point would destroy whatever is mounted there."""

        if self._csi is not None:
            # Claimed volumes through their driver first (unpublish, and unstage when
            # no other pod on the node uses them); raises if the driver fails.
            await self._csi.unpublish_pod(self.pod_dir.name, self.pod_dir)

        def work() -> None:
            for mp in mounts_under(self.pod_dir):
                _umount(mp)
            left = mounts_under(self.pod_dir)
            if left:
                raise VolumeError("TeardownFailed", f"still mounted: {', '.join(map(str, left))}")
            if self.pod_dir.exists():
                shutil.rmtree(self.pod_dir)

        await trio.to_thread.run_sync(work)
        self.paths = {}
        self.devices = {}

    # -- mounts --------------------------------------------------------------------------

    def mounts_for(self, container: Mapping[str, Any], volume_paths: Mapping[str, Path] | None = None,
                   *, env: Mapping[str, str] | None = None) -> list[Mount]:
        """The runtime mounts of `container`'s volumeMounts (see module-level `mounts_for`)."""
        paths = self.paths if volume_paths is None else volume_paths
        return mounts_for(container, {k: v for k, v in paths.items() if k not in self.devices},
                          read_only_volumes=self._read_only, env=env)

    def devices_for(self, container: Mapping[str, Any]) -> list[Device]:
        """The runtime devices of `container`'s volumeDevices (see `devices_for`)."""
        return devices_for(container, self.devices, read_only_volumes=self._read_only)


def _make_dir(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    # mkdir's mode is filtered by the umask; the kubelet's emptyDir really is 0777.
    path.chmod(mode)


_HOST_PATH_CHECKS: dict[str, tuple[Callable[[int], bool], str]] = {
    "Directory": (stat.S_ISDIR, "is not a directory"),
    "File": (stat.S_ISREG, "is not a file"),
    "Socket": (stat.S_ISSOCK, "is not a socket file"),
    "CharDevice": (stat.S_ISCHR, "is not a character device"),
    "BlockDevice": (stat.S_ISBLK, "is not a block device"),
}


def _check_host_path(volume: str, spec: Mapping[str, Any]) -> Path:
    path = Path(spec.get("path", ""))
    if not path.is_absolute():
        raise _setup_failed(volume, f"hostPath {str(path)!r} must be an absolute path")
    kind = spec.get("type") or ""
    if kind == "DirectoryOrCreate":
        if not path.exists():
            # The kubelet creates it 0755, owned like the kubelet.
            path.mkdir(mode=0o755, parents=True)
        kind = "Directory"
    elif kind == "FileOrCreate":
        if not path.exists():
            if not path.parent.is_dir():
                raise _setup_failed(volume, f"hostPath type check failed: {path.parent} is not a directory")
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
            os.close(fd)
        kind = "File"
    if kind == "":
        return path
    if kind not in _HOST_PATH_CHECKS:
        raise _setup_failed(volume, f"hostPath type {kind!r} is not supported")
    check, what = _HOST_PATH_CHECKS[kind]
    try:
        ok = check(os.stat(path).st_mode)
    except OSError:
        ok = False
    if not ok:
        raise _setup_failed(volume, f"hostPath type check failed: {path} {what}")
    return path


_PROPAGATION: dict[str | None, Propagation] = {
    None: "private",
    "None": "private",
    "HostToContainer": "host-to-container",
    "Bidirectional": "bidirectional",
}


def mounts_for(container: Mapping[str, Any], volume_paths: Mapping[str, Path], *,
               read_only_volumes: set[str] | frozenset[str] = frozenset(),
               env: Mapping[str, str] | None = None) -> list[Mount]:
    """Translate `container`'s volumeMounts into runtime mounts.

    `subPath` (or `subPathExpr`, expanded from `env`) selects a path inside the volume;
    it is created as a directory when missing, as the kubelet does, and must resolve —
    symlinks followed — to a place inside the volume, so a container cannot point a
    subPath symlink at the host's `/`.  These are a few metadata calls on local disk,
    cheap enough to make here rather than in a thread."""
    mounts: list[Mount] = []
    for vm in container.get("volumeMounts") or []:
        name = vm.get("name", "")
        if name not in volume_paths:
            raise VolumeError(FAILED_MOUNT, f'volume "{name}" not found for volumeMount '
                                            f'{vm.get("mountPath", "")!r}')
        host = Path(volume_paths[name])
        sub = vm.get("subPath") or ""
        if not sub and vm.get("subPathExpr"):
            sub = expand_vars(vm["subPathExpr"], env or {})
        if sub:
            p = PurePosixPath(sub)
            if p.is_absolute() or ".." in p.parts:
                raise VolumeError(FAILED_MOUNT, f"subPath {sub!r} must be a relative path "
                                                "without '..'")
            candidate = host / p
            if not os.path.lexists(candidate):
                if name in read_only_volumes:
                    # Content volumes are rendered from objects: nothing to create into.
                    raise VolumeError(FAILED_MOUNT, f"subPath {sub!r} does not exist in "
                                                    f"volume {name!r}")
                candidate.mkdir(parents=True, exist_ok=True)
                candidate.chmod(0o777)
            resolved = Path(os.path.realpath(candidate))
            base = Path(os.path.realpath(host))
            if resolved != base and base not in resolved.parents:
                raise VolumeError(FAILED_MOUNT, f"subPath {sub!r} resolves outside volume {name!r}")
            host = resolved
        propagation = vm.get("mountPropagation")
        if propagation not in _PROPAGATION:
            raise VolumeError(FAILED_MOUNT, f"invalid mountPropagation {propagation!r}")
        mounts.append(Mount(host_path=host, container_path=vm.get("mountPath", ""),
                            read_only=bool(vm.get("readOnly")) or name in read_only_volumes,
                            propagation=_PROPAGATION[propagation]))
    return mounts


def devices_for(container: Mapping[str, Any], devices: Mapping[str, Path], *,
                read_only_volumes: set[str] | frozenset[str] = frozenset()) -> list[Device]:
    """Translate `container`'s volumeDevices into runtime devices: the published device
    file of each raw block volume, by its major:minor, at `devicePath`."""
    out: list[Device] = []
    for vd in container.get("volumeDevices") or []:
        name = vd.get("name", "")
        if name not in devices:
            raise VolumeError(FAILED_MOUNT, f'volume "{name}" is not a block volume of this pod '
                                            f'(volumeDevice {vd.get("devicePath", "")!r})')
        try:
            st = os.stat(devices[name])
        except OSError as e:
            raise VolumeError(FAILED_MOUNT, f"block volume {name}: {e}") from None
        if stat.S_ISBLK(st.st_mode):
            kind = "b"
        elif stat.S_ISCHR(st.st_mode):
            kind = "c"
        else:
            raise VolumeError(FAILED_MOUNT, f"block volume {name}: {devices[name]} is not a "
                                            "device")
        out.append(Device(host_path=Path(devices[name]), container_path=vd.get("devicePath", ""),
                          major=os.major(st.st_rdev), minor=os.minor(st.st_rdev), kind=kind,
                          read_only=name in read_only_volumes))
    return out
