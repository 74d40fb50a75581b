"""Pod phase, conditions and change detection (fleet.agent.status), table-driven."""

from __future__ import annotations

import pytest

from fleet.agent.status import (
    ContainerView,
    build_pod_status,
    pod_conditions,
    pod_phase,
    qos_class,
    status_changed,
)

RUN = {"running": {"startedAt": "t"}}
WAIT = {"waiting": {"reason": "ContainerCreating"}}
BACKOFF = {"waiting": {"reason": "CrashLoopBackOff"}}


def term(code: int) -> dict:
    return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}


def cv(name: str, state: dict, last: dict | None = None, ready: bool = False) -> ContainerView:
    return ContainerView(name=name, image="img", state=state, last_state=last or {}, ready=ready)


@pytest.mark.parametrize("policy,init,apps,phase", [
    ("Always", [], [cv("a", WAIT)], "Pending"),
    ("Always", [], [cv("a", RUN)], "Running"),
    ("Always", [], [cv("a", RUN), cv("b", WAIT)], "Pending"),
    ("Always", [], [cv("a", term(1))], "Running"),
    ("Always", [], [cv("a", BACKOFF, term(1))], "Running"),
    ("Never", [], [cv("a", term(0))], "Succeeded"),
    ("Never", [], [cv("a", term(3))], "Failed"),
    ("Never", [], [cv("a", term(0)), cv("b", term(1))], "Failed"),
    ("Never", [], [cv("a", RUN), cv("b", term(1))], "Running"),
    ("OnFailure", [], [cv("a", term(0))], "Succeeded"),
    ("OnFailure", [], [cv("a", term(2))], "Running"),
    ("OnFailure", [], [cv("a", BACKOFF, term(2))], "Running"),
    ("Always", [cv("i", RUN)], [cv("a", WAIT)], "Pending"),
    ("Always", [cv("i", term(1))], [cv("a", WAIT)], "Pending"),
    ("OnFailure", [cv("i", term(1))], [cv("a", WAIT)], "Pending"),
    ("Never", [cv("i", term(1))], [cv("a", WAIT)], "Failed"),
    ("Never", [cv("i", term(0)), cv("j", WAIT)], [cv("a", WAIT)], "Pending"),
    ("Always", [cv("i", term(0))], [cv("a", RUN)], "Running"),
])
def test_phase(policy: str, init: list, apps: list, phase: str) -> None:
    assert pod_phase(policy, init, apps) == phase


@pytest.mark.parametrize("phase,init,apps,expect", [
    ("Running", [], [cv("a", RUN, ready=True)],
     {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True"}),
    ("Running", [], [cv("a", RUN, ready=True), cv("b", RUN)],
     {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "False", "Ready": "False"}),
    ("Pending", [cv("i", RUN)], [cv("a", WAIT)],
     {"PodScheduled": "True", "Initialized": "False", "ContainersReady": "False", "Ready": "False"}),
    ("Succeeded", [], [cv("a", term(0))],
     {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "False", "Ready": "False"}),
])
def test_conditions(phase: str, init: list, apps: list, expect: dict) -> None:
    conds = pod_conditions(phase, True, init, apps)
    assert {c["type"]: c["status"] for c in conds} == expect
    ready = next(c for c in conds if c["type"] == "Ready")
    if expect["Ready"] == "False":
        assert ready["reason"] in ("ContainersNotReady", "PodCompleted")
    if len(apps) == 2:
        assert ready["message"] == "containers with unready status: [b]"


def _pod(status: dict | None = None) -> dict:
    return {"metadata": {"name": "p", "uid": "u"},
            "spec": {"nodeName": "n", "restartPolicy": "Always",
                     "containers": [{"name": "a", "image": "img"}]},
            "status": status or {}}


def test_build_status_keeps_transition_times_and_change_detection() -> None:
    apps = [cv("a", RUN, ready=True)]
    s1 = build_pod_status(_pod(), [], apps, pod_ips=["10.42.0.5"], host_ip="1.2.3.4",
                          start_time="T0", now="T1")
    assert s1["phase"] == "Running" and s1["podIP"] == "10.42.0.5"
    assert s1["podIPs"] == [{"ip": "10.42.0.5"}] and s1["qosClass"] == "BestEffort"
    assert s1["containerStatuses"][0]["ready"] is True
    s2 = build_pod_status(_pod(s1), [], apps, pod_ips=["10.42.0.5"], host_ip="1.2.3.4",
                          start_time="T0", now="T2")
    assert all(c["lastTransitionTime"] == "T1" for c in s2["conditions"])
    assert not status_changed(s1, s2)
    apps[0].ready = False
    s3 = build_pod_status(_pod(s2), [], apps, pod_ips=["10.42.0.5"], host_ip="1.2.3.4",
                          start_time="T0", now="T3")
    assert status_changed(s2, s3)
    ready = next(c for c in s3["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "T3"


@pytest.mark.parametrize("resources,qos", [
    ({}, "BestEffort"),
    ({"requests": {"cpu": "100m"}}, "Burstable"),
    ({"limits": {"cpu": "1", "memory": "1Gi"}}, "Guaranteed"),
    ({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}}, "Burstable"),
])
def test_qos(resources: dict, qos: str) -> None:
    assert qos_class({"containers": [{"name": "a", "resources": resources}]}) == qos
