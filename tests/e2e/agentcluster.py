"""One real node for a test module: `fleet server` with its built-in agent on a bridge
of the module's own, the busybox test image imported, torn down leak-checked.

    @pytest.fixture(scope="module")
    def cluster(request, tmp_path_factory):
        with agent_cluster(request, tmp_path_factory.mktemp("x"), bridge="xx0",
                           cluster_cidr="10.2xx.0.0/16") as srv:
            yield srv

Teardown: every Deployment is scaled to 0 (and, with `delete_pods`, every pod is
deleted with the given grace), the agent must then remove everything of them
(`tests/e2e/leaks.py`), the server stops, and `finish` removes the bridge and nft
tables — failing the module on a leak.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.testing.oci_image import build_busybox_image, write_oci_archive
from tests.conftest import FleetServer, ServerFactory, free_port
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import delete_pods_and_wait_clean, finish, wait_clean
from tests.e2e.test_agent import IMAGE

APPS = "/apis/apps/v1"


def _node_ready(srv: FleetServer) -> bool:
    with srv.client() as c:
        return any(x["type"] == "Ready" and x["status"] == "True"
                   for n in c.get("/api/v1/nodes").json()["items"]
                   for x in (n.get("status") or {}).get("conditions", []))


@contextlib.contextmanager
def agent_cluster(request: pytest.FixtureRequest, base: Path, *, bridge: str, cluster_cidr: str,
                  delete_pods: bool = False, grace: int | None = None,
                  extra_args: list[str] | None = None) -> Iterator[FleetServer]:
    factory = ServerFactory(base)
    srv = factory.new(extra_args=["--agent-port", str(free_port()), "--agent-network", "bridge",
                                  "--agent-bridge", bridge, "--cluster-cidr", cluster_cidr,
                                  *(extra_args or [])])
    agent_dir = srv.data_dir / "agent"
    archive = write_oci_archive(build_busybox_image(), base / "busybox.tar", IMAGE)
    import_archive_sync(ImageStore(agent_dir / "images"), archive, IMAGE)
    leaked: list[str] = []
    try:
        srv.start()
        wait_until(lambda: _node_ready(srv), timeout=60, what="the node Ready")
        yield srv
    finally:
        try:
            with srv.client() as c:
                for d in c.get(f"{APPS}/deployments").json().get("items", []):
                    md = d["metadata"]
                    c.patch(f"{APPS}/namespaces/{md['namespace']}/deployments/{md['name']}/scale",
                            json={"spec": {"replicas": 0}},
                            headers={"Content-Type": "application/merge-patch+json"})
            leaked = (delete_pods_and_wait_clean(srv, agent_dir, timeout=120, grace=grace)
                      if delete_pods else wait_clean(agent_dir, timeout=120))
        except Exception as e:  # noqa: BLE001 - clean-up goes on regardless
            print(f"clean-up: {e!r}")
        finally:
            factory.stop_all()
            if getattr(request.node, "_fleet_failed", False):
                print(srv.output()[-15000:])
            # Removes the bridge and tables too; fails on a leak.
            finish(agent_dir, leaked, srv.output()[-15000:])
