"""The agent survives its server going away and catches up when it returns.

A real server and a real agent (runc) run a pod; the server is stopped for a few
seconds and started again on the same data dir and port; the pod's container is
untouched, the node's Lease is renewed again, and a pod created after the
restart runs — the agent's watch resumed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from tests.conftest import FleetServer
from tests.e2e.helpers import wait_until
from tests.e2e.test_agent import (
    Agent,
    _container_pid,
    cluster,
    create,
    get,
    pod,
    pod_status,
    pytestmark,
)

__all__ = ["cluster", "pytestmark"]  # the fixture and the skip marks come from test_agent


def _renew_time(srv: FleetServer, node: str) -> float:
    with srv.client() as c:
        r = c.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
    if r.status_code != 200:
        return 0.0
    ts = (r.json().get("spec") or {}).get("renewTime") or ""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() if ts else 0.0


def test_agent_catches_up_after_server_restart(cluster: tuple[FleetServer, Agent, str]) -> None:
    srv, agent, ns = cluster
    create(srv, ns, pod("before", agent.node, ["sh", "-c", "sleep 3600"]))

    def running(name: str) -> dict[str, Any] | None:
        st = pod_status(srv, ns, name)
        cs = (st.get("containerStatuses") or [{}])[0]
        return st if "running" in (cs.get("state") or {}) else None

    wait_until(lambda: running("before"), timeout=60, what="the first pod to run")
    pid = _container_pid(agent, "before")

    srv.stop()
    time.sleep(3)  # the agent's requests fail meanwhile; it must keep its pods
    assert agent.proc is not None and agent.proc.poll() is None, agent.output()
    restarted_at = datetime.now(UTC).timestamp()
    srv.start()

    # The Lease is renewed again (heartbeats every 10 s, back-off while it was down).
    wait_until(lambda: _renew_time(srv, agent.node) > restarted_at, timeout=40,
               what="the lease to be renewed after the restart")
    # The running container was not touched.
    assert _container_pid(agent, "before") == pid
    st = running("before")
    assert st is not None and st["containerStatuses"][0]["restartCount"] == 0
    # The pod watch resumed: a pod created now runs.
    create(srv, ns, pod("after", agent.node, ["sh", "-c", "sleep 3600"]))
    wait_until(lambda: running("after"), timeout=60, what="a pod created after the restart to run")


def _containers_of(agent: Agent, pod_name: str) -> list[str]:
    import json
    out = []
    for d in (agent.data_dir / "runtime" / "containers").glob("*"):
        try:
            h = json.loads((d / "handle.json").read_text())
        except (OSError, ValueError):
            out.append(d.name)  # half-written or half-removed: still there
            continue
        if h["labels"].get("fleet.io/pod-name") == pod_name:
            out.append(d.name)
    return out


def test_pod_deleted_while_the_agent_is_down_is_gone_soon_after_it_returns(
        cluster: tuple[FleetServer, Agent, str]) -> None:
    """Kill the agent, force-delete a pod meanwhile, start the agent: within seconds the
    pod's container is gone (the pod object is gone already, only the agent's re-list
    can tell) and the other pod is adopted, not restarted.  The graceful case, and the
    pods' netns and veths, are test_agent_cleanup's agent-restart test."""
    srv, agent, ns = cluster
    create(srv, ns, pod("doomed", agent.node, ["sh", "-c", "sleep 3600"]))
    create(srv, ns, pod("kept", agent.node, ["sh", "-c", "sleep 3600"]))

    def running(name: str) -> bool:
        cs = (pod_status(srv, ns, name).get("containerStatuses") or [{}])[0]
        return "running" in (cs.get("state") or {})

    wait_until(lambda: running("doomed") and running("kept"), timeout=60, what="both pods to run")
    kept_pid = _container_pid(agent, "kept")
    agent.kill()
    with srv.client() as c:
        r = c.request("DELETE", f"/api/v1/namespaces/{ns}/pods/doomed",
                      json={"gracePeriodSeconds": 0})
        assert r.status_code in (200, 202), r.text
    agent.start()
    t0 = time.monotonic()
    wait_until(lambda: not _containers_of(agent, "doomed"), timeout=20,
               what="the deleted pod's container to be removed after the agent returned")
    wait_until(lambda: get(srv, f"/api/v1/namespaces/{ns}/pods/doomed")[0] == 404, timeout=20,
               what="the deleted pod's object to be gone")
    assert time.monotonic() - t0 < 20
    assert _container_pid(agent, "kept") == kept_pid  # the other pod was adopted, not restarted
