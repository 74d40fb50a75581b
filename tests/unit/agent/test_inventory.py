"""The agent's inventory (fleet.agent.inventory) on a data dir built by hand.

No root needed: the "containers" are plain `sleep` processes whose pids (with their
/proc start times) are written where a shim writes them, so listing, GC and killall
are checked against real processes, and only processes this test started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.agent import inventory
from fleet.runtime.procfs import proc_start_time
from fleet.runtime.shim import write_pid_file


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _sleep(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    procs.append(p)
    return p


def _container(data_dir: Path, cid: str, pod_uid: str,
               proc: subprocess.Popen[bytes] | None = None) -> Path:
    d = data_dir / "runtime" / "containers" / cid
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"id": cid, "sandbox_id": pod_uid}))
    if proc is not None:
        write_pid_file(d / "container.pid", proc.pid)
    (data_dir / "pods" / pod_uid).mkdir(parents=True, exist_ok=True)
    return d


def _running(p: subprocess.Popen[bytes]) -> bool:
    return p.poll() is None


def test_nft_table_per_bridge() -> None:
    assert inventory.nft_table_for(None) == "fleet"
    assert inventory.nft_table_for("fleet0") == "fleet"
    assert inventory.nft_table_for("fltest-1") == "fleet_fltest_1"
    # The service proxy's table follows the bridge the same way.
    assert inventory.proxy_table_for(None) == "fleet-proxy"
    assert inventory.proxy_table_for("fleet0") == "fleet-proxy"
    assert inventory.proxy_table_for("fltest-1") == "fleet-proxy_fltest_1"
    rec = inventory.current_record(Path("/nonexistent"), node_name="n", netns_dir=None,
                                   bridge="br9", proxy_table="fleet-proxy_br9")
    assert rec.proxy_table == "fleet-proxy_br9"


def test_record_round_trip_and_running(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    rec = inventory.current_record(tmp_path, node_name="n1", netns_dir=None, bridge="br9")
    inventory.write_record(tmp_path, rec)
    back = inventory.read_record(tmp_path)
    assert back == rec and back.running() and back.nft_table == "fleet_br9"
    # A recycled pid (same number, another start time) is not the agent.
    assert not inventory.AgentRecord(pid=rec.pid, pid_start=rec.pid_start + 1).running()
    assert inventory.read_record(tmp_path / "none") is None


def test_listing_attributes_everything_to_its_pod(tmp_path: Path,
                                                  procs: list[subprocess.Popen[bytes]]) -> None:
    p = _sleep(procs)
    _container(tmp_path, "c1", "uid-a", p)
    _container(tmp_path, "c2", "uid-b")
    (tmp_path / "runtime" / "sandboxes" / "uid-c").mkdir(parents=True)
    containers = inventory.list_containers(tmp_path)
    assert [(c.id, c.pod_uid) for c in containers] == [("c1", "uid-a"), ("c2", "uid-b")]
    assert containers[0].live_pids() == [p.pid]
    assert inventory.list_pod_uids(tmp_path, containers) == {"uid-a", "uid-b", "uid-c"}
    left = inventory.pod_leftovers(tmp_path, "uid-a", netns_dir=str(tmp_path / "netns"),
                                   with_veth=False)
    assert left == ["container c1", f"pod directory {tmp_path / 'pods' / 'uid-a'}"]
    netns = tmp_path / "netns"
    netns.mkdir()
    (netns / "uid-a").touch()  # a pin file left by an interrupted create
    assert inventory.list_netns(str(netns), ["uid-a", "uid-b"]) == [str(netns / "uid-a")]


def test_garbage_collection_keeps_live_pods_and_removes_the_rest(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    live, dead = _sleep(procs), _sleep(procs)
    keep = _container(tmp_path, "c-live", "uid-live", live)
    gone = _container(tmp_path, "c-dead", "uid-dead", dead)
    orphan = tmp_path / "runtime" / "containers" / "c-nometa"
    orphan.mkdir()
    netns = tmp_path / "netns"
    netns.mkdir()
    (netns / "uid-dead").touch()
    (netns / "uid-live").touch()
    (netns / "uid-other-agent").touch()
    record = inventory.AgentRecord(pid=0, pid_start=0, netns_dir=str(netns))
    report = inventory.collect_garbage(tmp_path, {"uid-live"}, record)
    assert report.errors == []
    assert _running(live) and keep.exists() and (tmp_path / "pods" / "uid-live").exists()
    assert dead.wait(timeout=5) == -9
    assert not gone.exists() and not orphan.exists()
    assert not (tmp_path / "pods" / "uid-dead").exists()
    assert not (netns / "uid-dead").exists()
    # Another agent's netns in a shared dir, and our live pod's, are untouched.
    assert (netns / "uid-live").exists() and (netns / "uid-other-agent").exists()
    # Idempotent.
    assert inventory.collect_garbage(tmp_path, {"uid-live"}, record).removed == []


def test_killall_stops_the_agent_and_everything_and_is_idempotent(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    agent, container = _sleep(procs), _sleep(procs)
    inventory.write_record(tmp_path, inventory.AgentRecord(
        pid=agent.pid, pid_start=proc_start_time(agent.pid) or 0,
        netns_dir=str(tmp_path / "netns")))
    _container(tmp_path, "c1", "uid-a", container)
    report = inventory.killall(tmp_path)
    assert report.errors == []
    assert f"agent process {agent.pid}" in report.removed
    assert agent.wait(timeout=5) != 0 and container.wait(timeout=5) == -9
    assert inventory.take(tmp_path).describe() == []
    assert not (tmp_path / "pods" / "uid-a").exists()
    assert inventory.killall(tmp_path).removed == []


def test_killall_refuses_a_running_agent_when_asked_to(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    agent = _sleep(procs)
    inventory.write_record(tmp_path, inventory.AgentRecord(
        pid=agent.pid, pid_start=proc_start_time(agent.pid) or 0))
    with pytest.raises(inventory.CleanupError, match="is running"):
        inventory.killall(tmp_path, stop=False)
    assert _running(agent)


def test_the_data_dir_itself_is_never_listed_as_a_mount(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "agent"
    below = data_dir / "runtime" / "containers" / "c1" / "rootfs"
    monkeypatch.setattr(inventory, "mounts_under", lambda root: [below, data_dir])
    assert inventory.list_mounts(data_dir) == [str(below)]


def test_network_things_are_looked_up_in_the_agents_own_namespace(tmp_path: Path) -> None:
    here = os.stat("/proc/thread-self/ns/net").st_ino
    rec = inventory.current_record(tmp_path, node_name="n1", netns_dir=None, bridge="lo")
    assert rec.netns_inode == here
    assert inventory.agent_netns(rec) is None  # ours: no switch
    assert inventory.agent_netns(inventory.AgentRecord(pid=0, pid_start=0)) is None  # old record
    # An agent whose namespace is gone: its links went with it, and a link of the same
    # name here ("lo" plays the agent's bridge) is never taken for its own.
    gone = inventory.AgentRecord(pid=0, pid_start=0, bridge="lo", nft_table="fleet_lo",
                                 netns_inode=here + 1)
    assert inventory.agent_netns(gone) is inventory.GONE
    inv = inventory.take(tmp_path, gone)
    assert inv.bridge is None and inv.veths == [] and inv.net_where is inventory.GONE
    inventory.write_record(tmp_path, gone)
    assert inventory.killall(tmp_path).removed == []
