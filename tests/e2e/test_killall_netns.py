"""`fleet killall` for an agent whose network namespace is pinned nowhere (only the
agent and its detached shims are in it): killall holds the namespace before it stops
the agent, so the agent's bridge is still found and removed there — and the caller's
namespace is never searched for it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from fleet.agent import inventory
from fleet.runtime.procfs import proc_start_time

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None,
                       reason="needs unshare and ip"),
]


def _in_netns(inode: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}/ns/net").st_ino == inode:
                    out.append(int(d))
            except OSError:
                pass
    return out


def test_killall_finds_the_bridge_of_an_agent_in_an_unpinned_namespace(tmp_path: Path) -> None:
    bridge = f"fn-{uuid.uuid4().hex[:6]}k"
    # "The agent": a process in a fresh namespace holding a bridge, and "a shim": a
    # detached process (not the agent's descendant) keeping that namespace alive.
    script = (f"ip link add {bridge} type bridge && (setsid sleep 120 &) && "
              "echo ready && exec sleep 120")
    agent = subprocess.Popen(["unshare", "-n", "sh", "-c", script], stdout=subprocess.PIPE,
                             text=True)
    inode = 0
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "ready"
        inode = os.stat(f"/proc/{agent.pid}/ns/net").st_ino
        assert inode != os.stat("/proc/self/ns/net").st_ino
        inventory.write_record(tmp_path, inventory.AgentRecord(
            pid=agent.pid, pid_start=proc_start_time(agent.pid) or 0, bridge=bridge,
            nft_table="fleet_fn_unused", netns_inode=inode))
        report = inventory.killall(tmp_path)
        assert f"agent process {agent.pid}" in report.removed
        assert f"bridge {bridge}" in report.removed, report
        assert not report.errors, report.errors
        left = _in_netns(inode)
        assert left, "the detached process keeps the namespace alive"
        out = subprocess.run(["nsenter", f"--net=/proc/{left[0]}/ns/net", "ip", "-o", "link"],
                             capture_output=True, text=True, check=True).stdout
        assert bridge not in out
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait(timeout=10)
        # Only our processes are in the namespace this test made.
        deadline = time.monotonic() + 5
        while inode and (pids := _in_netns(inode)) and time.monotonic() < deadline:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
