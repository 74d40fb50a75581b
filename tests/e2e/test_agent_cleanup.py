"""Nothing an agent creates outlives its pods, its own crash, or `fleet killall`.

A real server and real agents (runc, the bridge network on a bridge and cluster CIDR
of the test's own), checked against the machine itself — `ip`, `nft`, /proc/mounts,
/proc — rather than against the agent's own bookkeeping:

* the agent is SIGKILLed, one pod is deleted gracefully and one force-deleted while it
  is down; the restarted agent removes both pods' containers, netns and veths within
  seconds (the force-deleted pod through its start-time garbage collection: there is no
  pod object left to tell it), with no fixture clean-up;
* `fleet killall --data-dir DIR` stops the running agent of DIR and everything it
  started — agent, shim launcher, shims, containers, pod netns, veths, bridge, nft table,
  mounts — and a second run succeeds and finds nothing; a second agent on the same
  machine keeps its running container.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.agent import inventory
from fleet.network.bridge import host_veth_name
from fleet.network.netns import DEFAULT_NETNS_DIR
from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.runtime.procfs import proc_start_time
from fleet.testing.oci_image import build_busybox_image, write_oci_archive
from tests.conftest import FleetServer, _server_env, create_namespace
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import finish, leftovers
from tests.e2e.test_agent import IMAGE, Agent, create, get, pod, pod_status
from tests.e2e.test_agent import pytestmark as _agent_marks

pytestmark = [
    *_agent_marks,
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables (nft)"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (ip)"),
]


class NetAgent(Agent):
    """A `fleet agent` with the bridge network on a bridge of its own (or none)."""

    def __init__(self, srv: FleetServer, base: Path, name: str, bridge: str | None,
                 cluster_cidr: str = "10.42.0.0/16") -> None:
        super().__init__(srv, base, name)
        self.cluster_cidr = cluster_cidr
        self.data_dir = base / f"agent-{name}"
        self.log_path = base / f"agent-{name}.log"
        self.bridge = bridge

    def start(self) -> None:
        net = ["--network", "bridge", "--bridge-name", self.bridge,
               "--cluster-cidr", self.cluster_cidr] if self.bridge else ["--network", "none"]
        argv = [sys.executable, "-m", "fleet.cli.main", "agent", "--kubeconfig",
                str(self.srv.kubeconfig), "--data-dir", str(self.data_dir),
                "--node-name", self.node, "--port", str(self.port), "--driver", "oci",
                *net, "--address", "127.0.0.1"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=_server_env(),
                                         start_new_session=True)


@pytest.fixture
def env(fleet_server_factory: Any,
        request: pytest.FixtureRequest) -> Iterator[tuple[FleetServer, NetAgent, str]]:
    # A cluster CIDR of this test's own: pod routes never clash with other tests' bridges.
    cidr = f"10.{random.randrange(200, 250)}.0.0/16"
    srv = fleet_server_factory.start(extra_args=["--cluster-cidr", cidr])
    base = srv.data_dir.parent
    tag = uuid.uuid4().hex[:6]
    agent = NetAgent(srv, base, f"clean-{tag}", bridge=f"flc{tag}", cluster_cidr=cidr)
    archive = write_oci_archive(build_busybox_image(), base / "busybox.tar", IMAGE)
    import_archive_sync(ImageStore(agent.data_dir / "images"), archive, IMAGE)
    ns = f"clean-{tag}"
    create_namespace(srv, ns)
    agent.start()
    try:
        yield srv, agent, ns
    finally:
        if getattr(request.node.getparent(pytest.Module), "_fleet_failed", False):
            sys.stderr.write(f"\n----- agent output -----\n{agent.output()}\n")
        agent.stop()
        # Bridge and nft table are node-level: killall removes them.  The tests below
        # check the pods' resources themselves, so no leak check here.
        finish(agent.data_dir, [], agent.output())
        shutil.rmtree(agent.data_dir, ignore_errors=True)


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def _nft_table_exists(table: str) -> bool:
    return subprocess.run(["nft", "list", "table", "ip", table],
                          capture_output=True).returncode == 0


def _mounts_under(path: Path | str) -> list[str]:
    root = os.path.realpath(path)
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    return [m for m in points if m == root or m.startswith(root.rstrip("/") + "/")]


def _alive(pid: int, start: int) -> bool:
    """Still running (a zombie waiting to be reaped by init runs no more)."""
    if pid <= 0 or proc_start_time(pid) != start:
        return False
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")


def _uid(srv: FleetServer, ns: str, name: str) -> str:
    code, body = get(srv, f"/api/v1/namespaces/{ns}/pods/{name}")
    assert code == 200, body
    return str(body["metadata"]["uid"])


def _processes(agent: Agent) -> list[tuple[int, int]]:
    """(pid, start time) of every container process and shim of the agent."""
    out = []
    for d in (agent.data_dir / "runtime" / "containers").iterdir():
        for f in ("shim.pid", "container.pid"):
            try:
                pid, start = (int(x) for x in (d / f).read_text().split())
            except (OSError, ValueError):
                continue
            out.append((pid, start))
    return out


def _children(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of the direct children of `pid` (the shim launcher)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2:].split()
        if int(fields[1]) == pid:
            out.append((int(entry), int(fields[19])))
    return out


def _running(srv: FleetServer, ns: str, name: str) -> bool:
    return pod_status(srv, ns, name).get("phase") == "Running"


def _pod_resources(uid: str) -> dict[str, bool]:
    netns = os.path.join(DEFAULT_NETNS_DIR, uid)
    return {"netns": os.path.lexists(netns) or netns in _mounts_under(netns),
            "veth": _link_exists(host_veth_name(uid))}


def test_agent_restart_removes_pods_deleted_while_it_was_down(
        env: tuple[FleetServer, NetAgent, str]) -> None:
    srv, agent, ns = env
    create(srv, ns, pod("graceful", agent.node, ["sh", "-c", "sleep 3600"]))
    create(srv, ns, pod("forced", agent.node, ["sh", "-c", "sleep 3600"]))
    for name in ("graceful", "forced"):
        wait_until(lambda name=name: _running(srv, ns, name), timeout=60, what=f"{name} Running")
    uids = {name: _uid(srv, ns, name) for name in ("graceful", "forced")}
    for uid in uids.values():
        assert _pod_resources(uid) == {"netns": True, "veth": True}
    procs = _processes(agent)
    assert len(procs) >= 4 and all(_alive(*p) for p in procs), procs

    agent.kill()  # SIGKILL, by pid
    with srv.client() as c:
        # Graceful: the object waits, Terminating, for the node to finish it.
        assert c.delete(f"/api/v1/namespaces/{ns}/pods/graceful").status_code in (200, 202)
        # Forced: the object is gone at once; only the agent's GC can find what it left.
        assert c.delete(f"/api/v1/namespaces/{ns}/pods/forced",
                        params={"gracePeriodSeconds": "0"}).status_code in (200, 202)
    assert get(srv, f"/api/v1/namespaces/{ns}/pods/forced")[0] == 404
    # The containers outlive the agent (their shims keep them).
    assert all(_alive(*p) for p in procs)

    agent.start()
    for name, uid in uids.items():
        wait_until(lambda uid=uid: _pod_resources(uid) == {"netns": False, "veth": False},
                   timeout=15, what=f"the netns and veth of {name} removed")
    wait_until(lambda: not any(_alive(*p) for p in procs), timeout=15,
               what="every container and shim of both pods gone")
    wait_until(lambda: not list((agent.data_dir / "runtime" / "containers").iterdir()),
               timeout=15, what="the container bundles removed")
    wait_until(lambda: get(srv, f"/api/v1/namespaces/{ns}/pods/graceful")[0] == 404,
               timeout=15, what="the graceful pod finalized")
    assert leftovers(agent.data_dir) == []
    assert "garbage collection: removed" in agent.output()


def test_killall_stops_everything_of_its_agent_only(
        env: tuple[FleetServer, NetAgent, str]) -> None:
    srv, agent, ns = env
    # A second agent on the same machine (no pod network) runs a pod too: killall of
    # the first must not touch it.
    other = NetAgent(srv, agent.data_dir.parent, f"other-{uuid.uuid4().hex[:6]}", bridge=None)
    import_archive_sync(ImageStore(other.data_dir / "images"),
                        agent.data_dir.parent / "busybox.tar", IMAGE)
    other.start()
    try:
        create(srv, ns, pod("mine", agent.node, ["sh", "-c", "sleep 3600"]))
        create(srv, ns, pod("theirs", other.node, ["sh", "-c", "sleep 3600"]))
        for name in ("mine", "theirs"):
            wait_until(lambda name=name: _running(srv, ns, name), timeout=60,
                       what=f"{name} Running")
        uid = _uid(srv, ns, "mine")
        assert agent.proc is not None
        agent_pid = agent.proc.pid
        record = inventory.read_record(agent.data_dir)
        assert record is not None and record.pid == agent_pid and record.running()
        table = record.nft_table
        assert table and table != "fleet" and _nft_table_exists(table)
        proxy_table = record.proxy_table
        assert proxy_table and proxy_table != "fleet-proxy"
        wait_until(lambda: _nft_table_exists(proxy_table), timeout=30,
                   what="the service proxy's table")
        assert agent.bridge and _link_exists(agent.bridge)
        assert _pod_resources(uid) == {"netns": True, "veth": True}
        assert _mounts_under(agent.data_dir), "the container's root should be mounted"
        procs = _processes(agent) + _children(agent_pid)
        assert all(_alive(*p) for p in procs) and len(procs) >= 3, procs
        theirs = _processes(other)
        assert theirs and all(_alive(*p) for p in theirs)

        argv = [sys.executable, "-m", "fleet.cli.main", "killall", "--data-dir",
                str(agent.data_dir)]
        res = subprocess.run(argv, capture_output=True, text=True, env=_server_env(), timeout=60)
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert f"agent process {agent_pid}" in res.stdout
        agent.proc.wait(timeout=5)

        assert not any(_alive(*p) for p in procs), "a process of the agent survived killall"
        assert _pod_resources(uid) == {"netns": False, "veth": False}
        assert not _link_exists(agent.bridge)
        assert not _nft_table_exists(table)
        assert not _nft_table_exists(proxy_table)
        assert _mounts_under(agent.data_dir) == []
        assert not any(e.name == uid for e in Path(DEFAULT_NETNS_DIR).iterdir())
        assert inventory.take(agent.data_dir).describe() == []

        again = subprocess.run(argv, capture_output=True, text=True, env=_server_env(),
                               timeout=60)
        assert again.returncode == 0 and again.stdout == "", (again.stdout, again.stderr)
        # The other agent's container runs on, untouched.
        assert all(_alive(*p) for p in theirs)
        assert other.proc is not None and other.proc.poll() is None
        assert json.loads((other.data_dir / "agent.json").read_text())["pid"] == other.proc.pid
    finally:
        with srv.client() as c:
            c.delete(f"/api/v1/namespaces/{ns}/pods/theirs")
        from tests.e2e.leaks import wait_clean

        leaked = wait_clean(other.data_dir, timeout=30)
        other.stop()
        finish(other.data_dir, leaked, other.output())
