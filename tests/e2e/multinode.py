"""Multi-node test hosts: "machines" in network namespaces on a test LAN, one real
`fleet agent` in each, and one `fleet server --no-agent` on the host.

Topology (every piece created here and removed at the end, even on failure):

    root netns (pytest, fleet server)         lan netns  fn-<tag>-lan (an L2 switch,
                                                          and a router between segments)
    fn-<tag>h 198.18.A.254/24 ── veth ──────── fnh  ┐
                                                     ├─ fnbr0 bridge (segment 0: 198.18.A.0/24)
    machine fn-<tag>-m0: eth0 198.18.A.10 ── veth ─ fnm0 ┤
    machine fn-<tag>-m1: eth0 198.18.A.11 ── veth ─ fnm1 ┘
    machine fn-<tag>-m2: eth0 198.18.B.12 ── veth ─ fnm2 ── fnbr1 bridge (segment 1:
                                                              198.18.B.0/24, 198.18.B.1
                                                              routes to 198.18.A.0/24)

* Segment 0 holds the host's veth, so the server listens on `198.18.A.254` and every
  machine reaches it; machines on another segment (`segments=[0, 0, 1]`) are one
  routed hop away (a default route via the lan netns), so they do *not* share an L2
  segment with the others — what the VXLAN backend is for.  198.18.0.0/15 is the
  benchmarking range (RFC 2544); the /24s are picked free at set-up.
* Each machine runs `fleet agent` started with `nsenter --net=/run/netns/<ns>` (not
  `ip netns exec`, which also unshares the mount namespace and would hide the pod
  netns bind mounts): its own `--data-dir`, `--node-name`, `--address`, `--port`
  (9301: each namespace has its own), pod bridge `fn-<tag>b` (`cluster.bridge`),
  oci driver (runc), `--cluster-cidr 10.42.0.0/16` (the server's too).  The busybox
  test image (`IMAGE`, pull policy Never) is imported into every node's image store
  before its agent starts.  Extra flags: `agent_args=[...]`, `server_args=[...]`.
* Teardown: every pod is deleted through the API and each agent must remove all of
  it (the leak check of `tests/e2e/leaks.py`; the inventory finds each agent's links
  in the agent's own namespace); then processes are stopped by pid, `fleet killall`
  runs for each data dir, and the namespaces (with the links, bridges and nft tables
  in them) are deleted.  A leak fails the test after it has been removed.
* Each cluster records what it made in `/run/fn-multinode/<tag>.json`; a cluster
  starting later reaps the records of test runs that were killed (`reap_stale`: their
  agents via `fleet killall`, server, namespaces, routes, host link).
* Set-up takes about 2.5-4 s (`cluster.setup_seconds`): agents start while the
  server finishes starting.

API (see `MultiNodeCluster`):

    with multinode_cluster(tmp_path, nodes=2) as cluster:   # or the fixtures in
        cluster.server_url, cluster.server, cluster.kubeconfig #   tests/e2e/conftest.py
        cluster.host_address, cluster.router_address(seg), cluster.lan, cluster.metrics_url
        n = cluster.nodes[0]; n.name, n.ns, n.ns_path, n.address, n.data_dir, n.port
        cluster.exec_in(n.ns, ["ip", "route"])              # CompletedProcess (text)
        cluster.spawn_in(cluster.lan, [...])                 # Popen, killed at teardown
        cluster.kubectl("get", "nodes")                      # (rc, stdout, stderr)
        cluster.client()                                     # httpx client of the API
        ns = cluster.create_namespace()
        cluster.create_pod(ns, cluster.pod("web", n, ["httpd", "-f", "-p", "8080"]))
        cluster.wait_pod_ready(ns, "web")["status"]["podIP"]
        run_in_netns(n.ns_path, fn, *args)                    # Python code in a namespace
        cluster.restart_node(i); cluster.stop_node(i)
        MultiNodeCluster(..., idle=[1]); cluster.start_node(1, ["--server", url, "--token", t])
        cluster.delete_node(i)                               # a node leaving
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from fleet.agent import inventory
from fleet.network.netns import enter_netns
from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.runtime.oci import find_runtime
from fleet.runtime.procfs import proc_start_time
from fleet.testing.oci_image import build_busybox_image, busybox_problem, write_oci_archive
from tests.conftest import KUBECTL, FleetServer, ServerFactory, _server_env, run_kubectl
from tests.e2e import leaks

T = TypeVar("T")

IMAGE = "localhost/fleet-test/busybox:1"
CLUSTER_CIDR = "10.42.0.0/16"
AGENT_PORT = 9301  # every machine has its own namespace: the same port on each
_LOCK = "/run/fn-multinode.lock"
# One record per live cluster: what it made, so a later run can remove what a killed
# test run (SIGKILL, a CI timeout) left — agents run in sessions of their own and
# outlive it.  Only records whose owner process is gone are reaped.
_RECORDS = Path("/run/fn-multinode")
_BENCH_NET = ipaddress.IPv4Network("198.18.0.0/15")


def problem() -> str | None:
    """Why this machine cannot run the fixture (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, runc)"
    missing = [t for t in ("ip", "nsenter", "nft") if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} installed"
    if find_runtime() is None:
        return "needs runc or crun"
    if KUBECTL is None:
        return "needs kubectl"
    return busybox_problem()


def sh(*argv: str, check: bool = True, timeout: float = 30.0) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def run_in_netns(ns_path: str, fn: Callable[..., T], *args: Any) -> T:
    """Call `fn(*args)` on a fresh thread switched into the namespace at `ns_path`
    (netlink sockets and child processes it creates live there)."""
    def call() -> T:
        with enter_netns(ns_path):
            return fn(*args)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(call).result()


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = []
    for r in json.loads(sh("ip", "-j", "-4", "route", "show", "table", "all")):
        dst = r.get("dst")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                out.append(ipaddress.IPv4Network(dst if "/" in dst else dst + "/32", strict=False))
    for link in json.loads(sh("ip", "-j", "-4", "addr")):
        for a in link.get("addr_info", []):
            out.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return out


def _free_subnets(n: int) -> list[ipaddress.IPv4Network]:
    used = _used_networks()
    candidates = list(_BENCH_NET.subnets(new_prefix=24))
    random.shuffle(candidates)
    free = [c for c in candidates if not any(c.overlaps(u) for u in used)]
    assert len(free) >= n, "no free /24 left in 198.18.0.0/15"
    return free[:n]


@dataclass
class Node:
    """One machine: its namespace, address and agent process."""

    index: int
    name: str  # the Node name
    ns: str  # the netns name (`ip netns` / /run/netns/<ns>)
    address: str  # eth0's address: the node's InternalIP
    segment: int
    data_dir: Path
    log_path: Path
    port: int = AGENT_PORT
    bridge: str = "fn0"
    argv_extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    # How the agent authenticates instead of `--kubeconfig <admin>` (a joining node:
    # `--server URL --token <join token>`); see `MultiNodeCluster.start_node`.
    credentials: list[str] | None = None

    @property
    def ns_path(self) -> str:
        return f"/run/netns/{self.ns}"

    def argv(self, kubeconfig: Path) -> list[str]:
        auth = self.credentials if self.credentials is not None else ["--kubeconfig", str(kubeconfig)]
        return ["nsenter", f"--net={self.ns_path}", sys.executable, "-m", "fleet.cli.main", "agent",
                *auth, "--data-dir", str(self.data_dir),
                "--node-name", self.name, "--port", str(self.port), "--address", self.address,
                "--driver", "oci", "--network", "bridge", "--bridge-name", self.bridge,
                "--cluster-cidr", CLUSTER_CIDR, "--lease-interval", "2",
                *self.argv_extra]

    def start(self, kubeconfig: Path) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with open(self.log_path, "ab") as log:
            # nsenter execs the agent (no --fork): the pid is the agent's.
            self.proc = subprocess.Popen(self.argv(kubeconfig), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=_server_env(),
                                         start_new_session=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the agent (pods keep running under their shims), SIGKILL after `timeout`."""
        if not self.running:
            return
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)

    def output(self, tail: int = 8000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""


class MultiNodeCluster:
    """The machines, the server, and how tests reach them (see the module docstring)."""

    def __init__(self, base: Path, *, nodes: int = 2, segments: Sequence[int] | None = None,
                 agent_args: Sequence[str] = (), server_args: Sequence[str] = (),
                 idle: Sequence[int] = ()) -> None:
        self.base = base
        self.tag = uuid.uuid4().hex[:6]
        self.lan = f"fn-{self.tag}-lan"
        self.host_link = f"fn-{self.tag}h"
        self.bridge = f"fn-{self.tag}b"  # every agent's pod bridge, in its own namespace
        self.segments = list(segments) if segments is not None else [0] * nodes
        assert len(self.segments) == nodes and min(self.segments) == 0
        self.subnets: list[ipaddress.IPv4Network] = []
        self.nodes: list[Node] = []
        self.agent_args = list(agent_args)
        self.server_args = list(server_args)
        # Machines built (network, image) but whose agent the test starts itself
        # (`start_node`): a node joining with a bootstrap token.
        self.idle = set(idle)
        self.factory = ServerFactory(base)
        self.server: FleetServer | None = None
        self.image = IMAGE
        self._netns: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self.setup_seconds = 0.0

    # -- addresses -------------------------------------------------------------------
    @property
    def host_address(self) -> str:
        """The host's address on segment 0 (the server listens there)."""
        return str(self.subnets[0].network_address + 254)

    def router_address(self, segment: int) -> str:
        """The lan namespace's address on `segment` (machines' default gateway)."""
        return str(self.subnets[segment].network_address + 1)

    @property
    def server_url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def kubeconfig(self) -> Path:
        assert self.server is not None
        return self.server.kubeconfig

    @property
    def metrics_url(self) -> str:
        """The server's /metrics (it listens on `host_address`, not loopback)."""
        assert self.server is not None
        return f"http://{self.host_address}:{self.server.metrics_port}/metrics"

    # -- set-up ------------------------------------------------------------------------
    def start(self) -> MultiNodeCluster:
        t0 = time.monotonic()
        self._build_network()
        self.server = self.factory.new(extra_args=[
            "--address", self.host_address, "--cluster-cidr", CLUSTER_CIDR, *self.server_args])
        self.server.spawn()
        self._record()
        # While the server starts: the image into every node's store.
        archive = write_oci_archive(build_busybox_image(), self.base / "busybox.tar", IMAGE)
        for node in self.nodes:
            import_archive_sync(ImageStore(node.data_dir / "images"), archive, IMAGE)
        # The server writes its kubeconfig once it listens: the agents (a second of
        # Python start-up each) start then, while it finishes becoming ready.
        deadline = time.monotonic() + 30
        while not self.kubeconfig.exists() and self.server.proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        for node in self.nodes:
            if node.index not in self.idle:
                node.start(self.kubeconfig)
        self.server.wait_ready()
        for node in self.nodes:
            if node.index not in self.idle:
                self.wait_node_ready(node)
        self.setup_seconds = time.monotonic() - t0
        return self

    def _build_network(self) -> None:
        with open(_LOCK, "w") as lock:
            # Serialise the choice of subnets with other fixtures starting right now.
            fcntl.flock(lock, fcntl.LOCK_EX)
            reap_stale()
            self.subnets = _free_subnets(max(self.segments) + 1)
            self._record()
            self._add_netns(self.lan)
            lan = ["ip", "-n", self.lan]
            sh(*lan, "link", "set", "lo", "up")
            for seg in range(len(self.subnets)):
                br = f"fnbr{seg}"
                sh(*lan, "link", "add", br, "type", "bridge")
                sh(*lan, "addr", "add", f"{self.router_address(seg)}/24", "dev", br)
                sh(*lan, "link", "set", br, "up")
            sh("ip", "netns", "exec", self.lan, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            # The host's leg: a veth whose far end is a port of segment 0's bridge.
            sh("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", "fnh",
               "netns", self.lan)
            sh(*lan, "link", "set", "fnh", "master", "fnbr0", "up")
            sh("ip", "addr", "add", f"{self.host_address}/24", "dev", self.host_link)
            sh("ip", "link", "set", self.host_link, "up")
            for seg in range(1, len(self.subnets)):
                sh("ip", "route", "add", str(self.subnets[seg]), "via", self.router_address(0))
        for i, seg in enumerate(self.segments):
            ns = f"fn-{self.tag}-m{i}"
            self._add_netns(ns)
            address = str(self.subnets[seg].network_address + 10 + i)
            sh(*lan, "link", "add", f"fnm{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh(*lan, "link", "set", f"fnm{i}", "master", f"fnbr{seg}", "up")
            m = ["ip", "-n", ns]
            sh(*m, "link", "set", "lo", "up")
            sh(*m, "addr", "add", f"{address}/24", "dev", "eth0")
            sh(*m, "link", "set", "eth0", "up")
            sh(*m, "route", "add", "default", "via", self.router_address(seg))
            root = self.base / f"node{i}"
            root.mkdir(parents=True, exist_ok=True)
            self.nodes.append(Node(index=i, name=f"fn-{self.tag}-n{i}", ns=ns, address=address,
                                   segment=seg, data_dir=root / "agent", log_path=root / "agent.log",
                                   bridge=self.bridge, argv_extra=list(self.agent_args)))
            self._record()

    def _add_netns(self, name: str) -> None:
        self._netns.append(name)
        self._record()
        sh("ip", "netns", "add", name)

    def _record(self) -> None:
        """Write (again) this cluster's record for `reap_stale`."""
        _RECORDS.mkdir(exist_ok=True)
        pid = os.getpid()
        srv = self.server.proc.pid if self.server and self.server.proc else 0
        (_RECORDS / f"{self.tag}.json").write_text(json.dumps({
            "owner": [pid, proc_start_time(pid)],
            "server": [srv, proc_start_time(srv) if srv else None],
            "netns": self._netns, "host_link": self.host_link,
            "routes": [str(n) for n in self.subnets[1:]],
            "data_dirs": [str(n.data_dir) for n in self.nodes]}))

    # -- talking to it -----------------------------------------------------------------
    def client(self, timeout: float = 10.0) -> httpx.Client:
        assert self.server is not None
        return self.server.client(timeout=timeout)

    def kubectl(self, *args: str, input: str | None = None,
                timeout: float = 60.0) -> tuple[int, str, str]:
        assert self.server is not None
        return run_kubectl(self.server, *args, input=input, timeout=timeout)

    def node(self, ns_or_name: str) -> Node:
        for n in self.nodes:
            if ns_or_name in (n.ns, n.name):
                return n
        raise KeyError(ns_or_name)

    def exec_in(self, ns: str, argv: Sequence[str], *, check: bool = False,
                timeout: float = 30.0, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the network namespace `ns` (a node's ns or name, or the lan's)."""
        path = f"/run/netns/{ns}" if ns == self.lan else self.node(ns).ns_path
        p = subprocess.run(["nsenter", f"--net={path}", *argv], capture_output=True, text=True,
                           timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} in {ns} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def spawn_in(self, ns: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start `argv` in namespace `ns` (a node's, or `cluster.lan`); killed by pid at
        teardown if still running."""
        path = f"/run/netns/{ns}" if ns == self.lan else self.node(ns).ns_path
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(["nsenter", f"--net={path}", *argv], **kw)
        self._procs.append(proc)
        return proc

    def get(self, path: str) -> tuple[int, Any]:
        with self.client() as c:
            r = c.get(path)
        return r.status_code, r.json()

    def post(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create `obj` at `path` (a collection); asserts 201."""
        with self.client() as c:
            r = c.post(path, json=obj)
        assert r.status_code == 201, r.text
        return r.json()

    def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the object at `path`; asserts 200."""
        with self.client() as c:
            r = c.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text
        return r.json()

    def node_object(self, node: Node) -> dict[str, Any] | None:
        code, body = self.get(f"/api/v1/nodes/{node.name}")
        return body if code == 200 else None

    def wait_node_ready(self, node: Node, timeout: float = 60.0, since: int = 0) -> dict[str, Any]:
        """Until the Node is Ready with a pod CIDR and the agent (its log past byte
        `since`) syncs pods."""
        deadline = time.monotonic() + timeout
        while True:
            if not node.running:
                raise AssertionError(f"agent of {node.name} exited\n{node.output()}")
            obj = self.node_object(node)
            if obj is not None:
                conds = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
                if (conds.get("Ready") == "True" and obj.get("spec", {}).get("podCIDR")
                        and "running (driver" in node.output(tail=200_000_000)[since:]):
                    return obj
            if time.monotonic() > deadline:
                raise AssertionError(f"node {node.name} not ready after {timeout}s: {obj}\n"
                                     f"{node.output()}")
            time.sleep(0.2)

    def pod(self, name: str, node: Node, command: Sequence[str], *,
            grace: int = 2, **spec: Any) -> dict[str, Any]:
        """A Pod manifest bound to `node` running `command` in the busybox image."""
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": grace,
                         "containers": [{"name": "main", "image": IMAGE,
                                         "imagePullPolicy": "Never", "command": list(command)}],
                         **spec}}

    def create_pod(self, namespace: str, manifest: dict[str, Any]) -> None:
        with self.client() as c:
            r = c.post(f"/api/v1/namespaces/{namespace}/pods", json=manifest)
        assert r.status_code == 201, r.text

    def create_namespace(self, name: str | None = None) -> str:
        name = name or f"fn-{uuid.uuid4().hex[:6]}"
        with self.client() as c:
            r = c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": name}})
        assert r.status_code == 201, r.text
        return name

    def wait_pod_ready(self, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The pod once Ready with a pod IP."""
        deadline = time.monotonic() + timeout
        while True:
            code, p = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            st = p.get("status") or {} if code == 200 else {}
            conds = {c["type"]: c["status"] for c in st.get("conditions", [])}
            if conds.get("Ready") == "True" and st.get("podIP"):
                return p
            if time.monotonic() > deadline:
                node = self.node(p.get("spec", {}).get("nodeName", "")) if code == 200 else None
                raise AssertionError(f"pod {namespace}/{name} not ready after {timeout}s: "
                                     f"{json.dumps(st)}\n{node.output() if node else ''}")
            time.sleep(0.2)

    def start_node(self, i: int, credentials: list[str] | None = None) -> Node:
        """Start node i's agent (an idle machine's, or one stopped), authenticating with
        `credentials` (agent flags) instead of the admin kubeconfig when given."""
        node = self.nodes[i]
        node.credentials = credentials
        node.start(self.kubeconfig)
        return node

    def stop_node(self, i: int) -> None:
        """Stop node i's agent (its pods keep running until teardown)."""
        self.nodes[i].stop()

    def restart_node(self, i: int) -> None:
        """Stop node i's agent and start it again (its pods keep running meanwhile)."""
        node = self.nodes[i]
        node.stop()
        node.start(self.kubeconfig)
        self.wait_node_ready(node, since=node.log_path.stat().st_size)

    def delete_node(self, i: int) -> None:
        """A node leaves: stop its agent and delete its Node object."""
        node = self.nodes[i]
        node.stop()
        with self.client() as c:
            r = c.delete(f"/api/v1/nodes/{node.name}")
        assert r.status_code in (200, 202, 404), r.text

    # -- teardown ----------------------------------------------------------------------
    def _host_link_exists(self) -> bool:
        return subprocess.run(["ip", "link", "show", self.host_link],
                              capture_output=True).returncode == 0

    def close(self) -> None:
        """Delete pods, stop everything by pid, remove the namespaces; fail on a leak."""
        problems: list[str] = []
        leaked: dict[str, list[str]] = {}
        try:
            if self.server is not None and self.server.proc and self.server.proc.poll() is None:
                with contextlib.suppress(Exception):
                    with self.client() as c:
                        r = c.get("/api/v1/pods")
                        for p in r.json().get("items", []) if r.status_code == 200 else []:
                            m = p["metadata"]
                            c.delete(f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}")
                for node in self.nodes:
                    if node.running:
                        left = leaks.wait_clean(node.data_dir)
                        if left:
                            leaked[node.name] = left
        finally:
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
            for node in self.nodes:
                try:
                    node.stop()
                except Exception as e:
                    problems.append(f"stopping {node.name}: {e!r}")
            for node in self.nodes:
                if not node.data_dir.exists():
                    continue
                try:
                    report = inventory.killall(node.data_dir)
                    problems += [f"{node.name}: killall could not remove {e}" for e in report.errors]
                except Exception as e:
                    problems.append(f"killall {node.name}: {e!r}")
            problems += self.factory.stop_all()
            for ns in reversed(self._netns):
                p = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
                if p.returncode != 0:
                    problems.append(f"ip netns del {ns}: {p.stderr}")
            for seg in range(1, len(self.subnets)):
                subprocess.run(["ip", "route", "del", str(self.subnets[seg])], capture_output=True)
            # The host's veth goes with its peer in the lan namespace, once the kernel's
            # asynchronous namespace clean-up has run.
            deadline = time.monotonic() + 10
            while self._host_link_exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._host_link_exists():
                problems.append(f"link {self.host_link} is still there")
                subprocess.run(["ip", "link", "del", self.host_link], capture_output=True)
        if not problems:
            (_RECORDS / f"{self.tag}.json").unlink(missing_ok=True)
        outputs = "\n".join(f"----- {n.name} -----\n{n.output()}" for n in self.nodes if n.name in leaked)
        assert not leaked, f"agents left {leaked} after their pods were deleted\n{outputs}"
        assert not problems, problems


def reap_stale() -> list[str]:
    """Remove what clusters of dead test runs left (see `_RECORDS`); what was reaped."""
    reaped = []
    for path in sorted(_RECORDS.glob("*.json")) if _RECORDS.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
            pid, start = rec["owner"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if proc_start_time(pid) == start:
            continue  # its test run is alive: it cleans up itself
        for d in rec.get("data_dirs", []):
            with contextlib.suppress(Exception):
                inventory.killall(Path(d))  # the agent by its record, its pods, its links
        spid, sstart = rec.get("server") or [0, None]
        if spid and sstart and proc_start_time(spid) == sstart:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spid, signal.SIGKILL)
        for ns in reversed(rec.get("netns", [])):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for net in rec.get("routes", []):
            subprocess.run(["ip", "route", "del", net], capture_output=True)
        if rec.get("host_link"):
            subprocess.run(["ip", "link", "del", rec["host_link"]], capture_output=True)
        path.unlink(missing_ok=True)
        reaped.append(path.stem)
    return reaped


@contextlib.contextmanager
def multinode_cluster(base: Path, **kw: Any) -> Iterator[MultiNodeCluster]:
    """A started `MultiNodeCluster` under `base`, torn down (and leak-checked) on exit."""
    cluster = MultiNodeCluster(base, **kw)
    try:
        yield cluster.start()
    finally:
        cluster.close()
