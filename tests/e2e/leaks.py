"""Leak checks for the e2e fixtures that run a real agent.

After a test deleted its pods, the agent must have removed everything of them from
the machine: `wait_clean` polls the agent's inventory (`fleet.agent.inventory`, the
same listing the agent's GC and `fleet killall` use) until nothing pod-level is
left.  `finish` runs after the agent stopped: it removes the node-level setup (the
bridge, the nftables table) and whatever leaked through the killall machinery, and
then fails the test if something had leaked — a leak is cleaned up, never hidden.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fleet.agent import inventory


def leftovers(data_dir: Path) -> list[str]:
    """Pod-level resources of the agent of `data_dir` still on the machine."""
    return inventory.take(data_dir, node_level=False).describe(node_level=False)


def wait_clean(data_dir: Path, timeout: float = 40.0) -> list[str]:
    """Wait until the agent left nothing pod-level; what is left after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(data_dir)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def finish(data_dir: Path, leaked: list[str], output: str = "") -> None:
    """After the agent stopped: `fleet killall` its data dir, then fail on a leak."""
    report = inventory.killall(data_dir)
    assert not report.errors, f"killall could not remove: {report.errors}"
    assert not leaked, (f"the agent left {leaked} on the machine after its pods were deleted "
                        f"(now removed by killall)\n----- agent output -----\n{output}")


def delete_pods_and_wait_clean(srv: Any, data_dir: Path, namespace: str | None = None, *,
                               timeout: float = 40.0, grace: int | None = None) -> list[str]:
    """Delete every pod (of `namespace`, or of all namespaces) through `srv`'s API and
    wait for the agent of `data_dir` to remove everything of them; what it left."""
    base = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    params = {"gracePeriodSeconds": str(grace)} if grace is not None else None
    with srv.client() as c:
        r = c.get(base)
        for p in r.json().get("items", []) if r.status_code == 200 else []:
            m = p["metadata"]
            c.delete(f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}", params=params)
    return wait_clean(data_dir, timeout=timeout)
