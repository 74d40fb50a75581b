"""OCI runtime config (config.json) generation for the oci driver.

A pure function of the container and sandbox specs: `build_config(...) -> dict`, unit
tested without a runtime.  The defaults follow what Docker and containerd's CRI plugin
give a Kubernetes container, so manifests behave as they would there:

- namespaces: pid, ipc, uts, mount always; network = the pod's netns path (joined), or
  the host's for hostNetwork pods (then no uts namespace either: the pod sees the node's
  hostname, as in Kubernetes);
- mounts: /proc, /dev (tmpfs), /dev/pts, /dev/shm (64 MiB), /dev/mqueue, /sys read-only,
  /sys/fs/cgroup read-only, then the pod's resolv.conf/hosts/hostname and the spec's
  mounts (bind, ro, propagation);
- capabilities: Docker's default set, + add − drop ("ALL" allowed on both sides); a
  non-root user gets them only in the bounding set (moby's fix for CVE-2022-24769);
- masked and read-only /proc and /sys paths exactly as moby's defaults;
- devices: the pod's volumeDevices (raw block volumes) as linux.devices, each allowed
  in the device cgroup by its major:minor (read-only ones without "w");
- resources: cpu shares from the request, CFS quota from the limit, memory limit (and
  memory+swap = limit where swap accounting exists, like kubelet without swap), pids
  limit; runc maps these onto cgroup v1 or v2 files itself;
- noNewPrivileges false (Kubernetes' allowPrivilegeEscalation defaults to true).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.runtime.cgroups import CPU_PERIOD_US, cpu_quota, cpu_shares
from fleet.runtime.driver import ContainerSpec, Mount, Sandbox

OCI_VERSION = "1.0.2"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHM_SIZE = 64 * 1024 * 1024

# moby oci/caps/defaults.go
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
)

# Every capability the kernel headers of the runc we target know; "ALL" expands to these.
ALL_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)

# moby oci/defaults.go
MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
)
READONLY_PATHS = (
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
)

_PROPAGATION = {"private": "rprivate", "host-to-container": "rslave",
                "bidirectional": "rshared"}


class SpecError(ValueError):
    """The container spec cannot be expressed as an OCI config (unknown capability...)."""


def normalize_capability(name: str) -> str:
    """Kubernetes writes NET_ADMIN, OCI wants CAP_NET_ADMIN; "ALL" stays."""
    up = name.strip().upper()
    if up == "ALL":
        return up
    full = up if up.startswith("CAP_") else f"CAP_{up}"
    if full not in ALL_CAPABILITIES:
        raise SpecError(f"unknown capability {name!r}")
    return full


def resolve_capabilities(add: list[str], drop: list[str]) -> list[str]:
    """Docker's default set + add − drop; "ALL" in drop empties the base, in add fills it."""
    adds = [normalize_capability(c) for c in add]
    drops = [normalize_capability(c) for c in drop]
    caps = [] if "ALL" in drops else list(DEFAULT_CAPABILITIES)
    if "ALL" in adds:
        caps = list(ALL_CAPABILITIES)
    for c in adds:
        if c != "ALL" and c not in caps:
            caps.append(c)
    # Drop wins over add for named capabilities (as in Docker), except after ALL-drop,
    # where the adds are exactly what the user wants back.
    if "ALL" not in drops:
        caps = [c for c in caps if c not in drops]
    return caps


def _bind(dest: str, source: Path | str, *, read_only: bool,
          propagation: str = "rprivate") -> dict[str, Any]:
    opts = ["rbind", propagation, "ro" if read_only else "rw"]
    return {"destination": dest, "type": "bind", "source": str(source), "options": opts}


def default_mounts() -> list[dict[str, Any]]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620",
                     "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={SHM_SIZE}"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
    ]


def _mounts(container: ContainerSpec, sandbox: Sandbox) -> list[dict[str, Any]]:
    mounts = default_mounts()
    spec = sandbox.spec
    if spec.dns_file is not None:
        mounts.append(_bind("/etc/resolv.conf", spec.dns_file, read_only=False))
    if spec.hosts_file is not None:
        mounts.append(_bind("/etc/hosts", spec.hosts_file, read_only=False))
    user: list[Mount] = list(container.mounts)
    for m in user:
        if not m.container_path.startswith("/"):
            raise SpecError(f"mount path {m.container_path!r} is not absolute")
        if m.propagation not in _PROPAGATION:
            raise SpecError(f"unknown mount propagation {m.propagation!r}")
        mounts.append(_bind(m.container_path, m.host_path, read_only=m.read_only,
                            propagation=_PROPAGATION[m.propagation]))
    return mounts


def _root_propagation(container: ContainerSpec) -> str | None:
    # Bidirectional mounts need a shared root, HostToContainer a slave one (containerd).
    props = {m.propagation for m in container.mounts}
    if "bidirectional" in props:
        return "rshared"
    if "host-to-container" in props:
        return "rslave"
    return None


def _env(container: ContainerSpec, hostname: str) -> list[str]:
    env = dict(container.env)
    env.setdefault("PATH", DEFAULT_PATH)
    if hostname:
        env.setdefault("HOSTNAME", hostname)
    if container.tty:
        env.setdefault("TERM", "xterm")
    return [f"{k}={v}" for k, v in env.items()]


def _devices(container: ContainerSpec) -> list[dict[str, Any]]:
    """linux.devices: the pod's volumeDevices, created in the container's /dev tree."""
    out = []
    for d in container.devices:
        if not d.container_path.startswith("/"):
            raise SpecError(f"devicePath {d.container_path!r} is not absolute")
        if d.kind not in ("b", "c"):
            raise SpecError(f"unknown device type {d.kind!r}")
        out.append({"path": d.container_path, "type": d.kind, "major": d.major,
                    "minor": d.minor, "fileMode": d.file_mode, "uid": 0, "gid": 0})
    return out


def _resources(container: ContainerSpec, *, swap_accounting: bool) -> dict[str, Any]:
    r = container.resources
    res: dict[str, Any] = {
        # Deny all devices, then runc adds its default allow-list (null, zero, tty...);
        # the pod's volumeDevices are allowed by number ("rwm", "rm" when read-only).
        "devices": [{"allow": False, "access": "rwm"}] + [
            {"allow": True, "type": d.kind, "major": d.major, "minor": d.minor,
             "access": "rm" if d.read_only else "rwm"} for d in container.devices],
        "cpu": {"shares": cpu_shares(r.cpu_request_millis)},
    }
    quota = cpu_quota(r.cpu_limit_millis)
    if quota is not None:
        res["cpu"].update({"quota": quota, "period": CPU_PERIOD_US})
    if r.memory_limit_bytes:
        res["memory"] = {"limit": r.memory_limit_bytes}
        if swap_accounting:
            res["memory"]["swap"] = r.memory_limit_bytes
    if r.pids_limit:
        res["pids"] = {"limit": r.pids_limit}
    return res


def build_config(container: ContainerSpec, sandbox: Sandbox, *, rootfs: Path,
                 cgroups_path: str, swap_accounting: bool = False) -> dict[str, Any]:
    """The config.json for `container` in `sandbox`, its root filesystem at `rootfs`."""
    host_network = sandbox.spec.netns_path is None
    hostname = "" if host_network else (sandbox.spec.hostname or sandbox.spec.name)
    caps = resolve_capabilities(container.capabilities_add, container.capabilities_drop)
    root_user = container.user.uid == 0
    namespaces: list[dict[str, str]] = [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}]
    if not host_network:
        namespaces.append({"type": "uts"})
        namespaces.append({"type": "network", "path": str(sandbox.spec.netns_path)})
    if not container.argv:
        raise SpecError(f"container {container.name!r} has no command")
    if not container.working_dir.startswith("/"):
        raise SpecError(f"workingDir {container.working_dir!r} is not absolute")
    process: dict[str, Any] = {
        "terminal": container.tty,
        "user": {"uid": container.user.uid, "gid": container.user.gid},
        "args": container.argv,
        "env": _env(container, hostname),
        "cwd": container.working_dir,
        "capabilities": {
            "bounding": caps,
            "effective": caps if root_user else [],
            "permitted": caps if root_user else [],
            # Never inheritable or ambient (CVE-2022-24769).
            "inheritable": [],
            "ambient": [],
        },
        "noNewPrivileges": False,
    }
    if container.user.additional_gids:
        process["user"]["additionalGids"] = list(container.user.additional_gids)
    linux: dict[str, Any] = {
        "cgroupsPath": "/" + cgroups_path.strip("/"),
        "namespaces": namespaces,
        "resources": _resources(container, swap_accounting=swap_accounting),
        "maskedPaths": list(MASKED_PATHS),
        "readonlyPaths": list(READONLY_PATHS),
    }
    devices = _devices(container)
    if devices:
        linux["devices"] = devices
    prop = _root_propagation(container)
    if prop:
        linux["rootfsPropagation"] = prop
    config: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": str(rootfs), "readonly": container.read_only_root},
        "mounts": _mounts(container, sandbox),
        "linux": linux,
    }
    if hostname:
        config["hostname"] = hostname
    return config
