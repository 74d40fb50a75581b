"""Cluster DNS across nodes: pods on two machines (tests/e2e/multinode.py) resolve through
10.43.0.10, which each node's Service rules DNAT to the server's DNS listener on the
test LAN.  The records come from the real controllers: a headless Service over a pod with
`hostname`/`subdomain` (as a StatefulSet's), a ClusterIP Service; an outside name is
answered by a dnslib resolver on the host's loopback (tests/e2e/test_cluster_dns.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.conftest import free_port
from tests.e2e.helpers import wait_until
from tests.e2e.multinode import MultiNodeCluster
from tests.e2e.test_cluster_dns import Upstream


def _nslookup(cluster: MultiNodeCluster, ns: str, pod: str, name: str) -> str:
    rc, out, err = cluster.kubectl("-n", ns, "exec", pod, "--", "sh", "-c",
                                   f"nslookup {name} 2>&1 || true")
    return out + err


def test_pods_on_two_nodes_resolve_cluster_and_outside_names(
        multinode_factory: Callable[..., MultiNodeCluster]) -> None:
    up = Upstream()
    try:
        cluster = multinode_factory(nodes=2, server_args=[
            "--cluster-dns-bind", f"0.0.0.0:{free_port()}",
            "--dns-upstream", f"127.0.0.1:{up.port}",
            # The pods (10.42/16) and, when masqueraded, the machines (198.18/15).
            "--cluster-dns-allow", "127.0.0.0/8,10.0.0.0/8,198.18.0.0/15"])
        n0, n1 = cluster.nodes
        ns = cluster.create_namespace()
        with cluster.client() as c:
            for body in (
                {"metadata": {"name": "db"}, "spec": {"clusterIP": "None", "selector": {"app": "db"},
                                                      "ports": [{"name": "pg", "port": 5432}]}},
                {"metadata": {"name": "web"}, "spec": {"selector": {"app": "db"},
                                                       "ports": [{"name": "http", "port": 80}]}},
            ):
                r = c.post(f"/api/v1/namespaces/{ns}/services", json={"apiVersion": "v1",
                                                                      "kind": "Service", **body})
                assert r.status_code == 201, r.text
            web_ip = c.get(f"/api/v1/namespaces/{ns}/services/web").json()["spec"]["clusterIP"]
        member: dict[str, Any] = cluster.pod("db-0", n1, ["sleep", "3600"], hostname="db-0", subdomain="db")
        member["metadata"]["labels"] = {"app": "db"}
        cluster.create_pod(ns, member)
        cluster.create_pod(ns, cluster.pod("client", n0, ["sleep", "3600"]))
        db_ip = cluster.wait_pod_ready(ns, "db-0")["status"]["podIP"]
        cluster.wait_pod_ready(ns, "client")
        for pod in ("client", "db-0"):
            for name, want in ((f"web.{ns}.svc.cluster.local", web_ip),
                               (f"db.{ns}.svc.cluster.local", db_ip),
                               (f"db-0.db.{ns}.svc.cluster.local", db_ip),
                               ("api.fs-up.test", "192.0.2.1")):
                out = wait_until(lambda p=pod, n=name, w=want: (lambda o: o if w in o else None)(
                    _nslookup(cluster, ns, p, n)), timeout=40, what=f"{name} from {pod}")
                assert "10.43.0.10" in out, out
    finally:
        up.close()
