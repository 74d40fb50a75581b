"""The service proxy inside a real `fleet agent` process: rules follow the API, survive
an agent restart untouched, and are reconciled once the agent is back.

Uses test_agent_cleanup's agent on a bridge of its own (`env`), whose proxy table is
`fleet-proxy_<bridge>` in the machine's namespace; the Service is a hand-made one with a
hand-made EndpointSlice (no traffic is sent: the e2e of the packet path is
tests/e2e/test_service_proxy.py, inside namespaces).  `fleet killall` at the end of the
fixture removes the table (test_agent_cleanup's killall test checks that it does).
"""

from __future__ import annotations

import random
import subprocess
from typing import Any

from fleet.agent import inventory
from tests.e2e.helpers import wait_until
from tests.e2e.test_agent_cleanup import (
    env,  # noqa: F401 - the fixture
    pytestmark,  # noqa: F401 - the same skips
)


def _map(table: str, name: str) -> str:
    p = subprocess.run(["nft", "list", "map", "ip", table, name], capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else ""


def _post(srv: Any, path: str, body: dict[str, Any]) -> None:
    with srv.client() as c:
        r = c.post(path, json=body)
    assert r.status_code == 201, r.text


def test_rules_survive_an_agent_restart_and_are_reconciled(env: Any) -> None:  # noqa: F811
    srv, agent, ns = env
    wait_until(lambda: inventory.read_record(agent.data_dir) is not None, timeout=30,
               what="the agent's record")
    record = inventory.read_record(agent.data_dir)
    assert record is not None and record.proxy_table == inventory.proxy_table_for(agent.bridge)
    table = record.proxy_table
    cip = f"10.43.{random.randrange(100, 250)}.{random.randrange(2, 250)}"
    key = f"{cip} . tcp . 80"
    _post(srv, f"/api/v1/namespaces/{ns}/services", {
        "metadata": {"name": "web"},
        "spec": {"clusterIP": cip, "ports": [{"name": "http", "port": 80}]}})
    _post(srv, f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", {
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.42.250.2"]}, {"addresses": ["10.42.250.3"]}]})
    wait_until(lambda: key in _map(table, "service-ips"), timeout=30,
               what=f"{cip}:80 in {table}'s service-ips")

    agent.stop()
    # Stopped: the rules stay as they were (pods keep reaching their Services).
    assert key in _map(table, "service-ips")
    with srv.client() as c:
        r = c.delete(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/web-1")
    assert r.status_code == 200, r.text
    assert key in _map(table, "service-ips")

    agent.start()
    # Back: the world changed while it was down (no endpoints any more) → reject.
    wait_until(lambda: key in _map(table, "no-endpoint-services")
               and key not in _map(table, "service-ips"), timeout=30,
               what=f"{cip}:80 moved to no-endpoint-services after the restart")
    assert "service proxy: full sync" in agent.output()
