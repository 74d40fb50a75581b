"""Node conditions from machine facts (fleet.agent.node.node_conditions)."""

from __future__ import annotations

import pytest

from fleet.agent.node import MachineStats, node_conditions, now_micro

GI = 1024 ** 3


def machine(**kw: int) -> MachineStats:
    base = {"mem_total": 8 * GI, "mem_available": 4 * GI, "disk_total": 100 * GI,
            "disk_free": 50 * GI, "pids": 300, "pid_max": 32768}
    base.update(kw)
    return MachineStats(**base)


@pytest.mark.parametrize("m,expect", [
    (machine(), {"MemoryPressure": "False", "DiskPressure": "False", "PIDPressure": "False"}),
    (machine(mem_available=50 * 1024 ** 2), {"MemoryPressure": "True"}),
    (machine(mem_total=1000 * GI, mem_available=40 * GI), {"MemoryPressure": "True"}),
    (machine(disk_free=5 * GI), {"DiskPressure": "True"}),
    (machine(pids=32000), {"PIDPressure": "True"}),
])
def test_pressure(m: MachineStats, expect: dict) -> None:
    conds = {c["type"]: c for c in node_conditions(m, None, "T1")}
    for k, v in expect.items():
        assert conds[k]["status"] == v
    assert conds["Ready"]["status"] == "True"
    assert conds["Ready"]["reason"] == "KubeletReady"
    assert conds["Ready"]["message"] == "kubelet is posting ready status"


def test_transition_time_kept_while_unchanged() -> None:
    first = node_conditions(machine(), None, "T1")
    second = node_conditions(machine(), first, "T2")
    assert all(c["lastTransitionTime"] == "T1" and c["lastHeartbeatTime"] == "T2" for c in second)
    third = node_conditions(machine(disk_free=GI), second, "T3")
    disk = next(c for c in third if c["type"] == "DiskPressure")
    assert disk["lastTransitionTime"] == "T3" and disk["reason"] == "KubeletHasDiskPressure"


def test_micro_time_format() -> None:
    t = now_micro()
    assert t.endswith("Z") and len(t.split(".")[1]) == 7
