"""What this node's agent created on the machine: list it, and remove it.

One inventory serves three callers, so "what is ours" is decided in one place:

* the pod worker, after tearing a pod down, asks `pod_leftovers` whether the pod's
  containers, netns, veth and mounts are really gone before it finalizes the pod
  object (and `remove_pod` force-removes what the runtime driver left);
* the agent's start-time garbage collection (`collect_garbage`) removes what no pod
  bound to the node owns any more (containers and their shims, runc state, pod netns,
  veths, mounts under the data dir, cgroups), after a crash or a pod deleted while
  the agent was down;
* `fleet killall` (`killall`) stops everything the agent of one data dir started,
  node-level things too (bridge, nftables table), like k3s' `k3s-killall.sh`.

Every resource is identified through the agent's data dir, never by a machine-wide
pattern, so two agents on one machine (tests run several) never touch each other's:

* containers: the bundles under `<data_dir>/runtime/containers/` (their shim and
  container pids with `/proc` start times, their cgroup from `shim.json`), and the ids
  runc keeps under the agent's own `--root <data_dir>/runtime/runc`;
* pods: the uids with state under `<data_dir>/pods/`, `<data_dir>/runtime/sandboxes/`
  or a container bundle.  The worker creates `pods/<uid>/` before the pod's netns,
  so a pod netns always has an owner on disk;
* pod netns: `<netns dir>/<uid>` for those uids (the netns dir may be shared by
  agents; pod uids are unique);
* veths: the bridge driver's `host_veth_name(uid)` for those uids, and veths enslaved
  to the agent's own bridge;
* mounts: mount points under the data dir, and the pod netns pins above;
* cgroups: the pod cgroups recorded in sandboxes and the container cgroups recorded
  in bundles;
* node level (killall only): the agent's bridge, its nftables table and the service
  proxy's table (`proxy_table_for`), named in the
  agent record `<data_dir>/agent.json` that the agent writes at start (with its pid
  and `/proc` start time: the "pid file" killall checks), and the pod network's VXLAN
  device and routes to other nodes (`fleet.network.overlay`, route protocol 70).

The network things live in the agent's network namespace, which need not be the
caller's (tests run agents in namespaces of their own; an operator may run `fleet
killall` from another one): the record keeps the namespace's inode, and listing and
removal happen inside it — found through the running agent's `/proc/<pid>/ns/net` or
a pin under `/run/netns`.  When it no longer exists its links went with it, and
nothing of the caller's namespace (a bridge of the same name) is ever touched.

Listing functions are blocking and free of side effects; removal functions are
blocking, idempotent, and raise `CleanupError` (an OSError) when something stays.
Callers on Trio run them in a worker thread.  Failures are counted in
`fleet_agent_cleanup_failures_total{phase,resource}` (the process-wide registry
of `fleet._core.supervise`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from fleet._core.supervise import REGISTRY
from fleet.agent.volumes import _umount, mounts_under
from fleet.network import nft
from fleet.network.bridge import (
    DEFAULT_BRIDGE,
    DEFAULT_NFT_TABLE,
    LinkInfo,
    delete_link_sync,
    host_veth_name,
    list_links_sync,
)
from fleet.network.driver import NetworkError
from fleet.network.netns import (
    DEFAULT_NETNS_DIR,
    IP_NETNS_DIR,
    delete_netns_sync,
    enter_netns,
    is_netns,
)
from fleet.runtime import cgroups as _cgroups
from fleet.runtime import shim
from fleet.runtime.procfs import all_stats, proc_start_time, read_stat

log = logging.getLogger(__name__)

RECORD_FILE = "agent.json"

CLEANUP_FAILURES = Counter(
    "fleet_agent_cleanup_failures",
    "Node resources (containers, netns, veths, mounts, cgroups) the agent failed to remove.",
    ["phase", "resource"], registry=REGISTRY)


class CleanupError(OSError):
    """Something the agent created could not be removed (it is still there)."""


def failed(phase: str, resource: str) -> None:
    """Count one failed removal (`phase`: teardown, gc or killall)."""
    CLEANUP_FAILURES.labels(phase, resource).inc()


def failures(phase: str, resource: str) -> float:
    """The counter's value (for tests)."""
    return REGISTRY.get_sample_value("fleet_agent_cleanup_failures_total",
                                     {"phase": phase, "resource": resource}) or 0.0


def nft_table_for(bridge: str | None) -> str:
    """The nftables table of the agent whose bridge is `bridge`.

    The default bridge keeps the historical `table ip fleet`; any other bridge gets a
    table of its own, so two agents on one machine never replace (or killall never
    deletes) each other's masquerade rules."""
    if not bridge or bridge == DEFAULT_BRIDGE:
        return DEFAULT_NFT_TABLE
    return "fleet_" + "".join(ch if ch.isalnum() else "_" for ch in bridge)


def proxy_table_for(bridge: str | None) -> str:
    """The service proxy's nftables table (`fleet.network.service_proxy`) of the agent
    whose bridge is `bridge`: `fleet-proxy` for the default bridge, else one of its own,
    tied to the bridge the way `nft_table_for` is."""
    from fleet.network.proxy_rules import DEFAULT_TABLE

    if not bridge or bridge == DEFAULT_BRIDGE:
        return DEFAULT_TABLE
    return DEFAULT_TABLE + "_" + "".join(ch if ch.isalnum() else "_" for ch in bridge)


# ---------------------------------------------------------------------------------------
# The agent record (pid file)


@dataclass
class AgentRecord:
    """What the agent of a data dir writes about itself at start."""

    pid: int
    pid_start: int
    node_name: str = ""
    netns_dir: str = DEFAULT_NETNS_DIR
    bridge: str | None = None  # None: no pod network (or not the bridge driver)
    nft_table: str | None = None
    proxy_table: str | None = None  # the service proxy's table, when it runs
    cgroup_root: str = str(_cgroups.DEFAULT_ROOT)
    # The inode of the agent's network namespace (0: unknown, the caller's is assumed).
    netns_inode: int = 0

    def running(self) -> bool:
        """True while the process that wrote this record is alive (same start time)."""
        return self.pid > 0 and proc_start_time(self.pid) == self.pid_start


def write_record(data_dir: Path, record: AgentRecord) -> None:
    """Write `<data_dir>/agent.json` atomically."""
    shim.write_json_atomic(Path(data_dir) / RECORD_FILE, asdict(record))


def read_record(data_dir: Path) -> AgentRecord | None:
    """The agent record of `data_dir`, or None if there is none (or it is unreadable)."""
    try:
        d = json.loads((Path(data_dir) / RECORD_FILE).read_text())
        return AgentRecord(**{k: d[k] for k in AgentRecord.__dataclass_fields__ if k in d})
    except (OSError, ValueError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            log.warning("agent record in %s unreadable: %s", data_dir, e)
        return None


def current_record(data_dir: Path, *, node_name: str, netns_dir: str | None,
                   bridge: str | None, proxy_table: str | None = None) -> AgentRecord:
    """The record for this process."""
    pid = os.getpid()
    return AgentRecord(pid=pid, pid_start=proc_start_time(pid) or 0, node_name=node_name,
                       netns_dir=netns_dir or DEFAULT_NETNS_DIR, bridge=bridge,
                       nft_table=nft_table_for(bridge) if bridge else None,
                       proxy_table=proxy_table,
                       netns_inode=_netns_inode("/proc/thread-self/ns/net") or 0)


def _netns_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class _Gone:
    """The agent's network namespace no longer exists."""


GONE = _Gone()


def agent_netns(record: AgentRecord | None) -> str | None | _Gone:
    """Where the agent's network things are: None (the caller's namespace), a path to
    enter, or GONE (see the module docstring)."""
    if record is None or not record.netns_inode:
        return None
    if _netns_inode("/proc/thread-self/ns/net") == record.netns_inode:
        return None
    candidates = [f"/proc/{record.pid}/ns/net"] if record.running() else []
    with contextlib.suppress(OSError):
        candidates += [os.path.join(IP_NETNS_DIR, n) for n in sorted(os.listdir(IP_NETNS_DIR))]
    for path in candidates:
        if _netns_inode(path) == record.netns_inode:
            return path
    return GONE


# ---------------------------------------------------------------------------------------
# Listing


@dataclass(frozen=True)
class Container:
    """One container bundle of the agent's runtime state."""

    id: str
    bundle: Path
    pod_uid: str
    shim: tuple[int, int]  # (pid, /proc start time); (0, 0) if unknown
    process: tuple[int, int]
    cgroup: str | None

    def live_pids(self) -> list[int]:
        return [pid for pid, start in (self.shim, self.process)
                if pid > 0 and proc_start_time(pid) == start]


@dataclass
class Inventory:
    """Everything of one agent found on the machine."""

    containers: list[Container] = field(default_factory=list)
    runc_only: list[str] = field(default_factory=list)  # runc state without a bundle
    pod_uids: set[str] = field(default_factory=set)
    netns: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    bridge: str | None = None  # present on the machine
    nft_table: str | None = None  # present on the machine
    proxy_table: str | None = None  # present on the machine
    vxlan: str | None = None  # the pod network's VXLAN device, present
    routes: list[str] = field(default_factory=list)  # our routes to other nodes' pods
    # Where the network things above are (`agent_netns`).
    net_where: str | None | _Gone = None

    def describe(self, *, node_level: bool = True) -> list[str]:
        """One line per resource (pod state directories are not listed: they are files)."""
        out = [f"container {c.id} (pod {c.pod_uid}, live pids {c.live_pids()})"
               for c in self.containers]
        out += [f"runc container {i}" for i in self.runc_only]
        out += [f"netns {p}" for p in self.netns]
        out += [f"veth {v}" for v in self.veths]
        out += [f"mount {m}" for m in self.mounts]
        out += [f"cgroup {c}" for c in self.cgroups]
        if node_level:
            out += [f"bridge {self.bridge}"] if self.bridge else []
            out += [f"nft table ip {self.nft_table}"] if self.nft_table else []
            out += [f"nft table ip {self.proxy_table}"] if self.proxy_table else []
            out += [f"vxlan {self.vxlan}"] if self.vxlan else []
            out += [f"route {r}" for r in self.routes]
        return out


def _runtime_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "runtime"


def list_containers(data_dir: Path) -> list[Container]:
    """The container bundles under the agent's runtime state."""
    root = _runtime_dir(data_dir) / "containers"
    try:
        dirs = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    out = []
    for d in dirs:
        try:
            meta = json.loads((d / shim.META_FILE).read_text())
        except (OSError, ValueError):
            meta = {}
        # The sandbox id is the pod uid (ShimDriver.create_sandbox).
        uid = str(meta.get("sandbox_id") or "")
        cgroup = None
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            # No shim.json yet: the container never started, so it has no cgroup.
            cgroup = shim.ShimConfig.load(d).cgroup if (d / shim.CONFIG_FILE).exists() else None
        out.append(Container(id=d.name, bundle=d, pod_uid=uid,
                             shim=shim.read_pid_file(d / shim.SHIM_PID_FILE),
                             process=shim.read_pid_file(d / shim.CONTAINER_PID_FILE),
                             cgroup=cgroup))
    return out


def _find_runtime() -> str | None:
    from fleet.runtime.oci import find_runtime

    return find_runtime()


def list_runc(data_dir: Path) -> list[str]:
    """Container ids runc keeps under the agent's own `--root`."""
    root = _runtime_dir(data_dir) / "runc"
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


def _sandboxes(data_dir: Path) -> dict[str, str | None]:
    """Pod uid -> the pod cgroup recorded for its sandbox."""
    root = _runtime_dir(data_dir) / "sandboxes"
    out: dict[str, str | None] = {}
    try:
        dirs = sorted(root.iterdir())
    except FileNotFoundError:
        return out
    for d in dirs:
        try:
            out[d.name] = json.loads((d / "sandbox.json").read_text()).get("cgroup_parent")
        except (OSError, ValueError, AttributeError):
            out[d.name] = None
    return out


def list_pod_uids(data_dir: Path, containers: Iterable[Container] = ()) -> set[str]:
    """Uids of the pods that have anything on this node under the data dir."""
    uids = set(_sandboxes(data_dir))
    with contextlib.suppress(FileNotFoundError):
        uids |= {p.name for p in (Path(data_dir) / "pods").iterdir()}
    uids |= {c.pod_uid for c in containers if c.pod_uid}
    return uids


def list_netns(netns_dir: str, uids: Iterable[str]) -> list[str]:
    """The pinned netns (or a leftover pin file) of those pods."""
    out = []
    for uid in sorted(uids):
        path = os.path.join(netns_dir, uid)
        if os.path.lexists(path):
            out.append(path)
    return out


def list_veths(bridge: str | None, uids: Iterable[str],
               links: list[LinkInfo] | None = None) -> list[str]:
    """Veths of those pods, and any veth on the agent's bridge."""
    links = list_links_sync() if links is None else links
    wanted = {host_veth_name(u) for u in uids}
    out = []
    for link in links:
        if link.name in wanted or (bridge and link.kind == "veth" and link.master == bridge):
            out.append(link.name)
    return sorted(set(out))


def list_mounts(data_dir: Path, netns: Iterable[str] = ()) -> list[str]:
    """Mount points below the data dir (deepest first), then the given netns pins.

    The data dir itself is left out: it may well be a file system of its own."""
    top = os.path.realpath(data_dir)
    out = [str(p) for p in mounts_under(Path(data_dir)) if str(p) != top]
    for path in netns:
        if is_netns(path):
            out.append(path)
    return out


def list_cgroups(data_dir: Path, containers: Iterable[Container], root: Path) -> list[str]:
    """Container cgroups and pod cgroups recorded by the agent that still exist."""
    cg = _cgroups.Cgroups(root)
    if not cg.version:
        return []
    rels = [c.cgroup for c in containers if c.cgroup]
    rels += [p for p in _sandboxes(data_dir).values() if p]
    return [r for r in dict.fromkeys(rels) if cg.exists(r)]


def _nft_tables() -> list[str]:
    """The machine's `ip` nftables tables ([] where nft is not installed)."""
    if not nft.nft_available():
        return []
    try:
        return nft.list_tables_sync("ip")
    except nft.NftError as e:
        # Listing is best effort (the table is then not reported); say why.
        log.warning("cannot list nftables tables: %s", e)
        return []


_FIND = object()


def take(data_dir: Path, record: AgentRecord | None = None, *,
         uids: Iterable[str] | None = None, node_level: bool = True,
         net_where: Any = _FIND) -> Inventory:
    """Everything the agent of `data_dir` has on the machine (of the pods `uids` only,
    if given; node-level things only with `node_level`).  Its network things are
    looked for in `net_where` (default: `agent_netns(record)`)."""
    data_dir = Path(data_dir)
    record = record or read_record(data_dir)
    netns_dir = record.netns_dir if record else DEFAULT_NETNS_DIR
    bridge = record.bridge if record else None
    containers = list_containers(data_dir)
    owned = list_pod_uids(data_dir, containers)
    only = set(uids) if uids is not None else None
    if only is not None:
        containers = [c for c in containers if c.pod_uid in only]
        owned = only
    where = agent_netns(record) if net_where is _FIND else net_where
    inv = Inventory(containers=containers, pod_uids=owned, net_where=where)
    links: list[LinkInfo] = []
    if where is not GONE:
        with enter_netns(where):  # type: ignore[arg-type]
            links = list_links_sync()
    if only is None:
        known = {c.id for c in containers}
        inv.runc_only = [i for i in list_runc(data_dir) if i not in known]
    inv.netns = list_netns(netns_dir, owned)
    inv.veths = list_veths(bridge if only is None else None, owned, links)
    mounts = list_mounts(data_dir, inv.netns)
    if only is not None:
        roots = [str(data_dir / "pods" / u) for u in only] + [str(c.bundle) for c in containers]
        mounts = [m for m in mounts if m in inv.netns
                  or any(m == r or m.startswith(r + "/") for r in roots)]
    inv.mounts = mounts
    root = Path(record.cgroup_root) if record else _cgroups.DEFAULT_ROOT
    inv.cgroups = list_cgroups(data_dir, containers, root)
    if only is not None:
        sandboxes = _sandboxes(data_dir)
        mine = {c.cgroup for c in containers} | {sandboxes.get(u) for u in only}
        inv.cgroups = [c for c in inv.cgroups if c in mine]
    if node_level and bridge and where is not GONE:
        if any(link.name == bridge for link in links):
            inv.bridge = bridge
        with enter_netns(where):  # type: ignore[arg-type]
            if record and record.nft_table and record.nft_table in _nft_tables():
                inv.nft_table = record.nft_table
            inv.vxlan, inv.routes = _overlay_state(links)
    if node_level and record and record.proxy_table and where is not GONE:
        with enter_netns(where):  # type: ignore[arg-type]
            if record.proxy_table in _nft_tables():
                inv.proxy_table = record.proxy_table
    return inv


def _overlay_state(links: list[LinkInfo]) -> tuple[str | None, list[str]]:
    """The pod network's VXLAN device (if present) and our routes, in this namespace."""
    from fleet.network import netlink, overlay, peers

    vxlan = peers.VXLAN_DEVICE if any(link.name == peers.VXLAN_DEVICE and link.kind == "vxlan"
                                      for link in links) else None
    try:
        with netlink.iproute(None) as ipr:
            routes = sorted(overlay.current_sync(ipr, peers.VXLAN_DEVICE).routes)
    except OSError as e:
        log.warning("cannot list the pod network's routes: %s", e)
        routes = []
    return vxlan, routes


def pod_leftovers(data_dir: Path, uid: str, *, netns_dir: str | None,
                  with_veth: bool) -> list[str]:
    """What of pod `uid` is still on the machine (empty: it is really gone)."""
    data_dir = Path(data_dir)
    out = [f"container {c.id}" for c in list_containers(data_dir) if c.pod_uid == uid]
    if (_runtime_dir(data_dir) / "sandboxes" / uid).exists():
        out.append(f"sandbox state {uid}")
    netns = list_netns(netns_dir or DEFAULT_NETNS_DIR, [uid])
    out += [f"netns {p}" for p in netns]
    if with_veth:
        out += [f"veth {v}" for v in list_veths(None, [uid])]
    pod_dir = data_dir / "pods" / uid
    out += [f"mount {m}" for m in mounts_under(pod_dir)]
    if pod_dir.exists():
        out.append(f"pod directory {pod_dir}")
    return out


# ---------------------------------------------------------------------------------------
# Removal


def _kill(pid: int, start: int, timeout: float = 5.0) -> bool:
    """SIGKILL `pid` if it is still the process that started at `start`; True once gone."""
    if pid <= 0 or proc_start_time(pid) != start:
        return True
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return True
    try:
        if proc_start_time(pid) != start:
            return True
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Gone, or a zombie waiting for a parent that is not us: either way it runs no more.
        if proc_start_time(pid) != start or _zombie(pid):
            return True
        time.sleep(0.02)
    return False


def _zombie(pid: int) -> bool:
    st = read_stat(pid)
    return st is None or st.gone


def unmount(path: str) -> None:
    """Unmount `path` (lazily if busy); not mounted is fine."""
    try:
        _umount(Path(path))
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOENT):
            raise CleanupError(e.errno, f"umount {path}: {e.strerror}") from e


def remove_cgroup(rel: str, root: Path = _cgroups.DEFAULT_ROOT) -> None:
    cg = _cgroups.Cgroups(root)
    if cg.version and cg.exists(rel) and not cg.remove(rel, timeout=5.0):
        raise CleanupError(f"cgroup {rel} still busy after 5s")


def remove_runc(data_dir: Path, cid: str) -> None:
    """`runc --root <agent's> delete --force ID` (a missing container is fine)."""
    runtime = _find_runtime()
    root = _runtime_dir(data_dir) / "runc"
    if runtime is not None:
        subprocess.run([runtime, "--root", str(root), "delete", "--force", cid],
                       capture_output=True, check=False)
    if (root / cid).exists():
        # runc could not (or is not installed): its state dir is all there is left.
        shutil.rmtree(root / cid)


def remove_container(data_dir: Path, c: Container, root: Path = _cgroups.DEFAULT_ROOT) -> None:
    """Kill the container's processes and shim, delete it from runc, unmount its root,
    remove its cgroup and bundle."""
    for pid, start in (c.process, c.shim):
        if not _kill(pid, start):
            raise CleanupError(f"container {c.id}: pid {pid} survived SIGKILL")
    remove_runc(data_dir, c.id)
    for m in mounts_under(c.bundle):
        unmount(str(m))
    if c.cgroup:
        remove_cgroup(c.cgroup, root)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(c.bundle)


def remove_veth(name: str) -> None:
    """Delete a link (a veth, or the agent's bridge); its absence is not an error."""
    try:
        delete_link_sync(name)
    except NetworkError as e:
        raise CleanupError(str(e)) from e


def remove_netns(path: str) -> None:
    delete_netns_sync(path)
    if os.path.lexists(path):
        raise CleanupError(f"netns {path} is still there")


def _in_netns(where: str | None, fn: Any, *args: Any) -> None:
    with enter_netns(where):
        fn(*args)


def remove_overlay() -> None:
    """Delete the pod network's VXLAN device and our routes (this namespace)."""
    from fleet.network import netlink, overlay, peers

    try:
        with netlink.iproute(None) as ipr:
            overlay.remove_sync(ipr, peers.VXLAN_DEVICE)
    except NetworkError as e:
        raise CleanupError(str(e)) from e


def remove_nft_table(table: str) -> None:
    try:
        nft.delete_table_sync("ip", table)
    except nft.NftError as e:
        raise CleanupError(f"nft delete table ip {table}: {e}") from e


@dataclass
class Report:
    """What a clean-up removed, and what it could not."""

    removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _attempt(report: Report, phase: str, resource: str, what: str, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        failed(phase, resource)
        log.warning("%s: could not remove %s: %s", phase, what, e)
        report.errors.append(f"{what}: {e}")
    else:
        report.removed.append(what)


def remove(data_dir: Path, inv: Inventory, *, phase: str,
           root: Path = _cgroups.DEFAULT_ROOT) -> Report:
    """Remove everything in `inv` (what `take` found), in dependency order: processes
    first (they pin netns, mounts and cgroups), then network, mounts, cgroups, state."""
    data_dir = Path(data_dir)
    r = Report()
    for c in inv.containers:
        _attempt(r, phase, "container", f"container {c.id}", remove_container, data_dir, c, root)
    for cid in inv.runc_only:
        _attempt(r, phase, "container", f"runc container {cid}", remove_runc, data_dir, cid)
    net = inv.net_where if inv.net_where is not GONE else None
    if inv.net_where is GONE:
        # The namespace died, and its links and tables with it.
        inv.veths, inv.bridge, inv.nft_table, inv.vxlan, inv.routes = [], None, None, None, []
    for v in inv.veths:
        _attempt(r, phase, "veth", f"veth {v}", _in_netns, net, remove_veth, v)
    for p in inv.netns:
        _attempt(r, phase, "netns", f"netns {p}", remove_netns, p)
    for m in inv.mounts:
        if m not in inv.netns:
            _attempt(r, phase, "mount", f"mount {m}", unmount, m)
    for cg in inv.cgroups:
        _attempt(r, phase, "cgroup", f"cgroup {cg}", remove_cgroup, cg, root)
    if inv.bridge:
        _attempt(r, phase, "bridge", f"bridge {inv.bridge}", _in_netns, net, remove_veth,
                 inv.bridge)
    if inv.nft_table:
        _attempt(r, phase, "nft", f"nft table ip {inv.nft_table}", _in_netns, net,
                 remove_nft_table, inv.nft_table)
    if inv.proxy_table:
        _attempt(r, phase, "nft", f"nft table ip {inv.proxy_table}", _in_netns, net,
                 remove_nft_table, inv.proxy_table)
    if inv.vxlan or inv.routes:
        what = ", ".join(([f"vxlan {inv.vxlan}"] if inv.vxlan else [])
                         + [f"route {x}" for x in inv.routes])
        _attempt(r, phase, "overlay", what, _in_netns, net, remove_overlay)
    for uid in sorted(inv.pod_uids):
        for d in (data_dir / "pods" / uid, _runtime_dir(data_dir) / "sandboxes" / uid):
            if d.exists():
                _attempt(r, phase, "state", f"state {d}", _rmtree_unmounted, d)
    return r


def _rmtree_unmounted(d: Path) -> None:
    """rmtree, refused while anything is mounted below (a claimed volume's data)."""
    left = mounts_under(d)
    if left:
        raise CleanupError(errno.EBUSY, f"still mounted: {', '.join(map(str, left))}")
    shutil.rmtree(d)


def remove_pod(data_dir: Path, uid: str, *, netns_dir: str | None, with_veth: bool,
               phase: str = "teardown") -> Report:
    """Force-remove whatever of pod `uid` is still on the machine (the worker's
    fallback when the runtime driver's own removal left something)."""
    record = AgentRecord(pid=0, pid_start=0, netns_dir=netns_dir or DEFAULT_NETNS_DIR)
    inv = take(data_dir, record, uids=[uid], node_level=False)
    if not with_veth:
        inv.veths = []
    root = read_record(data_dir)
    return remove(data_dir, inv, phase=phase,
                  root=Path(root.cgroup_root) if root else _cgroups.DEFAULT_ROOT)


def collect_garbage(data_dir: Path, live: Iterable[str], record: AgentRecord | None = None) -> Report:
    """Start-time GC: remove every pod-level resource of the agent that no pod in `live`
    (the uids bound to this node in the API) owns.  Node-level setup stays."""
    data_dir = Path(data_dir)
    record = record or read_record(data_dir)
    keep = set(live)
    everything = take(data_dir, record, node_level=False)
    dead = everything.pod_uids - keep
    inv = take(data_dir, record, uids=dead, node_level=False)
    # Containers with no pod at all (a bundle whose meta.json never got written) and
    # runc state without a bundle belong to nobody: they go too.
    inv.containers += [c for c in everything.containers if not c.pod_uid]
    inv.runc_only = everything.runc_only
    if record and record.bridge:
        # Veths on our bridge that no live pod accounts for.
        keep_veths = {host_veth_name(u) for u in keep}
        inv.veths = sorted(set(inv.veths) | {v for v in everything.veths if v not in keep_veths})
    root = Path(record.cgroup_root) if record else _cgroups.DEFAULT_ROOT
    report = remove(data_dir, inv, phase="gc", root=root)
    for what in report.removed:
        log.info("garbage collection: removed %s (no pod on this node owns it)", what)
    return report


def _descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every process below `pid` (the shim launcher; shims are not:
    they detach with setsid and a double fork, and are found through their bundles)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for st in all_stats():
        children.setdefault(st.ppid, []).append((st.pid, st.start_time))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


def stop_agent(record: AgentRecord, *, timeout: float = 10.0) -> bool:
    """SIGTERM the recorded agent process, SIGKILL it after `timeout`, then its helper
    processes (the shim launcher) that did not follow it; True if it ran."""
    if not record.running():
        return False
    helpers = _descendants(record.pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and record.running() and not _zombie(record.pid):
        time.sleep(0.05)
    if not _kill(record.pid, record.pid_start):
        raise CleanupError(f"agent pid {record.pid} survived SIGKILL")
    # The launcher exits once the agent's end of its pipe closes; give it a moment.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(
            proc_start_time(p) == s and not _zombie(p) for p, s in helpers):
        time.sleep(0.05)
    for pid, start in helpers:
        if not _kill(pid, start):
            raise CleanupError(f"agent helper pid {pid} survived SIGKILL")
    return True


def killall(data_dir: Path, *, stop: bool = True) -> Report:
    """Stop everything the agent of `data_dir` started (see the module docstring).

    With `stop`, a running agent process of that data dir is stopped first (SIGTERM,
    then SIGKILL after 10 s), as k3s-killall.sh stops k3s; without it a running agent
    is an error (its pod workers would re-create what is removed).  Idempotent."""
    data_dir = Path(data_dir)
    record = read_record(data_dir)
    report = Report()
    if record is not None and record.running() and not stop:
        raise CleanupError(f"the agent of {data_dir} is running (pid {record.pid})")
    # Hold the agent's namespace before the agent goes: one that is not pinned anywhere
    # (only the agent and its shims were in it) must still be found afterwards.
    where = agent_netns(record)
    held = None
    if isinstance(where, str) and where.startswith("/proc/"):
        with contextlib.suppress(OSError):
            held = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
            where = f"/proc/self/fd/{held}"
    try:
        if record is not None and record.running():
            stop_agent(record)
            report.removed.append(f"agent process {record.pid}")
        inv = take(data_dir, record, node_level=True, net_where=where)
        root = Path(record.cgroup_root) if record else _cgroups.DEFAULT_ROOT
        r = remove(data_dir, inv, phase="killall", root=root)
    finally:
        if held is not None:
            os.close(held)
    report.removed += r.removed
    report.errors += r.errors
    return report


__all__ = [
    "AgentRecord", "CleanupError", "Container", "Inventory", "Report", "collect_garbage",
    "current_record", "failures", "killall", "list_containers",
    "list_mounts", "list_netns", "list_pod_uids", "list_veths", "nft_table_for",
    "proxy_table_for",
    "pod_leftovers", "read_record", "remove", "remove_pod", "stop_agent", "take",
    "write_record",
]
