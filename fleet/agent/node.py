"""The agent's Node: registration, machine facts and conditions, Lease heartbeats, pod CIDR.

Two signals tell the control plane a node is alive, as in Kubernetes since 1.17:

* a `coordination.k8s.io/v1` Lease named after the node in `kube-node-lease`,
  renewed every `heartbeat` seconds — small and cheap, the liveness signal;
* the Node's `status` (capacity, allocatable, conditions, addresses, nodeInfo),
  refreshed every `status_interval` and whenever a condition flips.

Conditions come from the machine (`node_conditions`, pure): MemoryPressure when
less than 100Mi or 5% of memory is available, DiskPressure when less than 10% of
the data dir's filesystem is free, PIDPressure when more than 90% of pid_max is in
use, Ready otherwise with the kubelet's reasons and messages.  A condition keeps
its lastTransitionTime while its status stays the same.

A server that cannot be reached never stops the agent: every loop retries with
back-off (capped) and running pods are untouched.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.agent.config import AgentConfig
from fleet.api import meta
from fleet.client import MERGE_PATCH, ApiException, Client
from fleet.client.errors import explain
from fleet.client.informer import Informer

log = logging.getLogger(__name__)

KUBELET_VERSION = "v1.32.0-fleet"
LEASE_NAMESPACE = "kube-node-lease"
MEMORY_PRESSURE_BYTES = 100 * 1024 * 1024


now_rfc3339 = meta.now_rfc3339


def now_micro() -> str:
    """metav1.MicroTime: RFC 3339 with exactly six fractional digits."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _mapping(value: Any) -> dict[str, Any]:
    """`value` if it is a mapping, else {}: fields of our own Node as the API returns
    it, which a broken writer may have left as a number or a string."""
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class MachineStats:
    """The facts the node conditions are computed from."""

    mem_total: int
    mem_available: int
    disk_total: int
    disk_free: int
    pids: int
    pid_max: int


def read_meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    except OSError:
        pass
    return out


def machine_stats(data_dir: Path) -> MachineStats:
    """Read the machine now (blocking: call from a thread)."""
    mem = read_meminfo()
    st = os.statvfs(data_dir)
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    pids = sum(1 for d in os.listdir("/proc") if d.isdigit())
    return MachineStats(mem_total=mem.get("MemTotal", 0),
                        mem_available=mem.get("MemAvailable", mem.get("MemFree", 0)),
                        disk_total=st.f_blocks * st.f_frsize, disk_free=st.f_bavail * st.f_frsize,
                        pids=pids, pid_max=pid_max)


def _cond(ctype: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": ctype, "status": "True" if status else "False", "reason": reason,
            "message": message}


def node_conditions(m: MachineStats, previous: Sequence[Mapping[str, Any]] | None,
                    now: str, *, runtime_ok: bool = True,
                    runtime_message: str = "") -> list[dict[str, Any]]:
    """The four node conditions for machine `m`, keeping unchanged transition times."""
    mem_pressure = m.mem_total > 0 and (m.mem_available < MEMORY_PRESSURE_BYTES
                                        or m.mem_available < m.mem_total * 0.05)
    disk_pressure = m.disk_total > 0 and m.disk_free < m.disk_total * 0.10
    pid_pressure = m.pid_max > 0 and m.pids > m.pid_max * 0.9
    conds = [
        _cond("MemoryPressure", mem_pressure,
              "KubeletHasInsufficientMemory" if mem_pressure else "KubeletHasSufficientMemory",
              "kubelet has insufficient memory available" if mem_pressure
              else "kubelet has sufficient memory available"),
        _cond("DiskPressure", disk_pressure,
              "KubeletHasDiskPressure" if disk_pressure else "KubeletHasNoDiskPressure",
              "kubelet has disk pressure" if disk_pressure else "kubelet has no disk pressure"),
        _cond("PIDPressure", pid_pressure,
              "KubeletHasInsufficientPID" if pid_pressure else "KubeletHasSufficientPID",
              "kubelet has insufficient PID available" if pid_pressure
              else "kubelet has sufficient PID available"),
        _cond("Ready", runtime_ok, "KubeletReady" if runtime_ok else "KubeletNotReady",
              "kubelet is posting ready status" if runtime_ok
              else (runtime_message or "container runtime is down")),
    ]
    prev = {c.get("type"): c for c in (previous or [])}
    for c in conds:
        p = prev.get(c["type"])
        c["lastHeartbeatTime"] = now
        c["lastTransitionTime"] = (p["lastTransitionTime"]
                                   if p and p.get("status") == c["status"]
                                   and p.get("lastTransitionTime") else now)
    return conds


def node_address(preferred: str = "") -> str:
    """The node's InternalIP: `preferred`, else the first non-loopback IPv4, else 127.0.0.1."""
    if preferred:
        return preferred
    try:
        import pyroute2
        with pyroute2.IPRoute() as ipr:
            for a in ipr.get_addr(family=socket.AF_INET):
                ip = a.get_attr("IFA_ADDRESS")
                if ip and not ip.startswith("127."):
                    return ip
    except Exception:  # no netlink (sandboxed): fall back to the resolver's answer
        try:
            ip = socket.gethostbyname(socket.gethostname())
            if not ip.startswith("127."):
                return ip
        except OSError:
            pass
    return "127.0.0.1"


def os_image() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "Linux"


def runtime_version(driver_name: str) -> str:
    """containerRuntimeVersion: "runc://1.1.5" for the oci driver, "process://fleet" otherwise."""
    if driver_name != "oci":
        return "process://fleet"
    for rt in ("runc", "crun"):
        exe = shutil.which(rt)
        if not exe:
            continue
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                 timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        first = out.splitlines()[0] if out else ""
        ver = first.split()[-1] if first.split() else "unknown"
        return f"{rt}://{ver}"
    return "oci://unknown"


AGENT_API_SCHEME = "fleet.dev/agent-api-scheme"

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
         "s390x": "s390x", "riscv64": "riscv64"}


def node_arch() -> str:
    m = platform.machine()
    return _ARCH.get(m, m)


def build_node_status(cfg: AgentConfig, m: MachineStats, *, address: str, runtime: str,
                      previous: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """The Node's whole status (capacity, allocatable, conditions, addresses, nodeInfo)."""
    capacity = {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{m.mem_total // 1024}Ki",
        "ephemeral-storage": f"{m.disk_total // 1024}Ki",
        "pods": "110",
    }
    uname = os.uname()
    return {
        "capacity": capacity,
        "allocatable": dict(capacity),
        "conditions": node_conditions(m, (previous or {}).get("conditions"), now),
        "addresses": [{"type": "InternalIP", "address": address},
                      {"type": "Hostname", "address": cfg.node_name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": cfg.port}},
        "nodeInfo": {
            "machineID": _read_first("/etc/machine-id"),
            "systemUUID": _read_first("/sys/class/dmi/id/product_uuid"),
            "bootID": _read_first("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": uname.release,
            "osImage": os_image(),
            "containerRuntimeVersion": runtime,
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": node_arch(),
        },
    }


def _read_first(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


RETRYABLE = (ApiException, httpx.TransportError, OSError)


class NodeAgent:
    """Registers the Node, keeps its status and Lease fresh, and finds its pod CIDR."""

    def __init__(self, cfg: AgentConfig, client: Client, *, driver_name: str) -> None:
        self.cfg = cfg
        self.client = client
        self.address = node_address(cfg.address)
        self.runtime = runtime_version(driver_name)
        self.node: dict[str, Any] = {}
        self._status: dict[str, Any] = {}
        # The pod CIDR this node's pods use (from `wait_pod_cidr`): asked for again if
        # the Node is deleted and registered anew, so its pods keep their addresses and
        # peers' routes stay right (node IPAM takes a range a Node already names).
        self.pod_cidr_in_use: str | None = None
        # The node's staged claimed volumes (`status.volumesInUse`, unique volume names):
        # the attach/detach controller detaches none of them (set by the agent's run).
        self.volumes_in_use: Callable[[], list[str]] | None = None

    async def _compute_status(self) -> dict[str, Any]:
        m = await trio.to_thread.run_sync(machine_stats, self.cfg.data_dir)
        status = build_node_status(self.cfg, m, address=self.address, runtime=self.runtime,
                                   previous=self._status, now=now_rfc3339())
        if self.volumes_in_use is not None:
            status["volumesInUse"] = sorted(self.volumes_in_use())
        return status

    async def register(self) -> dict[str, Any]:
        """Create the Node (or take over an existing one) and post its status; retries."""
        backoff = 0.5
        while True:
            try:
                return await self._register_once()
            except RETRYABLE as e:
                log.warning("registering node %s failed (%s); retrying in %.1fs",
                            self.cfg.node_name, explain(e), backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _register_once(self) -> dict[str, Any]:
        name = self.cfg.node_name
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": node_arch(), **self.cfg.labels}
        want_cidr = self.cfg.pod_cidr or self.pod_cidr_in_use
        # How the API server reaches this agent's API (fleet.server.proxy.agent_address):
        # HTTPS unless this agent has no TLS material (a token-only agent).
        annotations = {AGENT_API_SCHEME: "https" if self.cfg.api_tls else "http"}
        try:
            node = await self.client.get_object("v1", "nodes", name)
            patch: dict[str, Any] = {"metadata": {"labels": labels, "annotations": annotations}}
            if want_cidr and not _mapping(node.get("spec")).get("podCIDR"):
                patch["spec"] = {"podCIDR": want_cidr, "podCIDRs": [want_cidr]}
            node = await self.client.patch("v1", "nodes", name, patch, MERGE_PATCH)
        except ApiException as e:
            if e.code != 404:
                raise
            spec: dict[str, Any] = {}
            if want_cidr:
                spec = {"podCIDR": want_cidr, "podCIDRs": [want_cidr]}
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": labels, "annotations": annotations},
                    "spec": spec}
            try:
                node = await self.client.create("v1", "nodes", body)
            except ApiException as e2:
                if e2.code != 409:
                    raise
                return await self._register_once()
        # A stored Node whose status is not a mapping (written by something broken)
        # is healed by the status we post next, not a reason to crash.
        self._status = _mapping(node.get("status"))
        self.node = await self._post_status()
        log.info("node %s registered (InternalIP %s, runtime %s)", name, self.address,
                 self.runtime)
        return self.node

    async def _post_status(self) -> dict[str, Any]:
        status = await self._compute_status()
        node = await self.client.patch("v1", "nodes", self.cfg.node_name, {"status": status},
                                       MERGE_PATCH, subresource="status")
        self._status = status
        self.node = node
        return node

    async def wait_pod_cidr(self) -> str:
        """node.spec.podCIDR, waiting (an informer on this one node) until the server assigns it."""
        name = self.cfg.node_name
        cidr: list[str] = []
        found = trio.Event()

        def on_event(etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            got = _mapping(_mapping(new).get("spec")).get("podCIDR") if new is not None else None
            if got and not found.is_set():
                cidr.append(str(got))
                found.set()

        node = Informer(self.client, "v1", "nodes", on_event, field_selector=f"metadata.name={name}",
                        retry_backoff=0.5, component="agent")
        async with trio.open_nursery() as n:
            await n.start(node.run)  # retries (logged) until the first list succeeds
            if not found.is_set():
                log.info("node %s has no spec.podCIDR yet: waiting for the server to "
                         "assign one before setting up pod networking", name)
            await found.wait()
            n.cancel_scope.cancel()
        self.pod_cidr_in_use = cidr[0]
        return cidr[0]

    async def renew_lease_once(self) -> dict[str, Any]:
        name = self.cfg.node_name
        spec = {"holderIdentity": name, "leaseDurationSeconds": self.cfg.lease_duration,
                "renewTime": now_micro()}
        try:
            return await self.client.patch("coordination.k8s.io/v1", "leases", name,
                                           {"spec": spec}, MERGE_PATCH,
                                           namespace=LEASE_NAMESPACE)
        except ApiException as e:
            if e.code != 404:
                raise
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                             "ownerReferences": self._owner_refs()},
                "spec": {**spec, "acquireTime": spec["renewTime"]}}
        return await self.client.create("coordination.k8s.io/v1", "leases", body,
                                        namespace=LEASE_NAMESPACE)

    def _owner_refs(self) -> list[dict[str, Any]]:
        uid = (self.node.get("metadata") or {}).get("uid")
        if not uid:
            return []
        return [{"apiVersion": "v1", "kind": "Node", "name": self.cfg.node_name, "uid": uid}]

    async def lease_loop(self) -> None:
        """Renew the Lease every `heartbeat` seconds; faster retries while failing."""
        while True:
            try:
                await self.renew_lease_once()
                delay = self.cfg.heartbeat
            except RETRYABLE as e:
                log.warning("renewing the node lease failed: %s", explain(e))
                delay = min(self.cfg.heartbeat, 2.0)
            await trio.sleep(delay)

    async def status_loop(self) -> None:
        """Refresh node status every `status_interval`, at once when a condition flips."""
        last_post = trio.current_time()
        while True:
            await trio.sleep(min(self.cfg.heartbeat, self.cfg.status_interval))
            try:
                status = await self._compute_status()
                flipped = ({c["type"]: c["status"] for c in status["conditions"]}
                           != {c.get("type"): c.get("status")
                               for c in self._status.get("conditions") or [] if isinstance(c, dict)}
                           or status.get("volumesInUse") != self._status.get("volumesInUse"))
                due = trio.current_time() - last_post >= self.cfg.status_interval
                if flipped or due:
                    await self._post_status()
                    last_post = trio.current_time()
            except ApiException as e:
                if e.code == 404:
                    # Someone deleted our Node: register again, as the kubelet does.
                    log.warning("node %s was deleted; registering again", self.cfg.node_name)
                    await self.register()
                else:
                    log.warning("updating node status failed: %s", explain(e))
            except RETRYABLE as e:
                log.warning("updating node status failed: %s", explain(e))
