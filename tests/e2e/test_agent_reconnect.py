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
from tests.e2e.test_agent import Agent, _container_pid, cluster, create, pod, pod_status, pytestmark

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
