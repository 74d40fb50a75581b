"""A store holding type-poisoned objects cannot take `fleet server` down.

Kubernetes' rule: no stored object may crash the controllers or the scheduler.
The objects below are written straight into the SQLite store (as an old
server without validation, or a bad merge patch, once did) *before* the server
starts — the case where a crash would repeat at every restart.  Then, with
simulated nodes: the server answers /readyz, the scheduler still binds a
normal pod, a normal Deployment still gets its ReplicaSet and pods, the bad
objects are reported (fleet_object_errors_total and log lines naming them), they
can be deleted with kubectl, and the server process never exits.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import trio

from fleet.api.registry import default_registry
from fleet.store import open_store
from tests.conftest import FleetServer, ServerFactory
from tests.e2e.helpers import api_get, wait_until
from tests.e2e.simnodes import SimNodes

NS = "default"

POD_SPEC = {"containers": [{"name": "app", "image": "nginx:1.27",
                            "resources": {"requests": {"cpu": "100m"}}}]}


def _pod(name: str, **fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                           "spec": POD_SPEC}
    obj.update(fields)
    return obj


# (what the registry calls the resource, namespace, object)
POISON: list[tuple[tuple[str, str, str], str | None, dict[str, Any]]] = [
    # The object that crashed the scheduler in issue 9 (is_terminated on an int).
    (("", "v1", "pods"), NS, _pod("status-five", status=5)),
    (("", "v1", "pods"), NS, {"apiVersion": "v1", "kind": "Pod", "spec": "x",
                              "metadata": {"name": "spec-string", "namespace": NS, "labels": 5}}),
    # Sent the garbage collector into endless `no resource serves  in v1` retries.
    (("", "v1", "pods"), NS, _pod("bad-owner", metadata={
        "name": "bad-owner", "namespace": NS,
        "ownerReferences": [{"apiVersion": "v1", "kind": "", "name": 5,
                             "uid": "0b6bd4a4-52b5-4b0e-9d5c-6f1f2f3f4f5f"},
                            {"kind": "", "name": 5}]})),
    (("apps", "v1", "deployments"), NS, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad-deploy", "namespace": NS},
        "spec": {"replicas": "abc", "template": 7}}),
    (("", "v1", "nodes"), None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bad-node"},
                                 "status": 5}),
]


async def _poison_store(srv: FleetServer) -> None:
    registry = default_registry()
    async with open_store(srv.db_path, sync="NORMAL", compact_interval=0) as store:
        for (group, version, plural), namespace, obj in POISON:
            info = registry.get(group, version, plural)
            assert info is not None
            await store.create(info.key(namespace, obj["metadata"]["name"]), obj)


def _metric_sum(srv: FleetServer, name: str) -> float:
    body = httpx.get(srv.metrics_url, timeout=5).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", body, re.M))


def _alive(srv: FleetServer) -> None:
    assert srv.proc is not None
    rc = srv.proc.poll()
    assert rc is None, f"fleet server exited with {rc}\n{srv.output()[-20000:]}"


def test_poisoned_store_does_not_stop_the_cluster(fleet_server_factory: ServerFactory) -> None:
    srv = fleet_server_factory.new()
    trio.run(_poison_store, srv)
    srv.start()
    try:
        sim = SimNodes(srv, count=2, prefix="poison").start()
    except AssertionError:
        _alive(srv)  # the likelier story: the server died on the poisoned store
        raise
    try:
        with srv.client() as c:
            # -- the scheduler binds a normal pod ------------------------------------------
            r = c.post(f"/api/v1/namespaces/{NS}/pods", json=_pod("normal"))
            assert r.status_code == 201, r.text

            def bound() -> str:
                code, p = api_get(srv, f"/api/v1/namespaces/{NS}/pods/normal")
                return p.get("spec", {}).get("nodeName", "") if code == 200 else ""
            assert wait_until(bound, timeout=60, what="the normal pod bound").startswith("poison-")
            _alive(srv)

            # -- the controllers carry on: Deployment → ReplicaSet → pods ------------------
            deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                      "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                               "template": {"metadata": {"labels": {"app": "web"}}, "spec": POD_SPEC}}}
            r = c.post(f"/apis/apps/v1/namespaces/{NS}/deployments", json=deploy)
            assert r.status_code == 201, r.text

            def web_running() -> list[str]:
                code, rs = api_get(srv, f"/apis/apps/v1/namespaces/{NS}/replicasets?labelSelector=app%3Dweb")
                if code != 200 or not rs["items"]:
                    return []
                # A selector is matched against every stored pod, the one whose labels
                # are a number included: that must not fail the list.
                code, pods = api_get(srv, f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dweb")
                assert code == 200, (code, pods)
                running = [p["metadata"]["name"] for p in pods["items"]
                           if isinstance(p.get("status"), dict) and p["status"].get("phase") == "Running"]
                return running if len(running) == 2 else []
            wait_until(web_running, timeout=90, what="the Deployment's 2 pods Running")
            _alive(srv)

            # -- the bad objects are reported ---------------------------------------------
            wait_until(lambda: _metric_sum(srv, "fleet_object_errors_total") > 0, timeout=30,
                       what="fleet_object_errors_total > 0")

            def all_named() -> list[str]:
                out = srv.output()
                missing = [n for n in ("default/status-five", "default/spec-string", "default/bad-owner",
                                       "default/bad-deploy", "/bad-node") if n not in out]
                return [] if missing else ["ok"]
            wait_until(all_named, timeout=30, what="a log line naming each poisoned object")
            assert "no resource serves  in v1" not in srv.output()  # malformed refs are not chased
            assert _metric_sum(srv, "fleet_component_restarts_total") == 0, srv.output()[-20000:]

            # -- and they can be deleted through the API ---------------------------------
            for args in (("pod", "status-five", "spec-string", "bad-owner", "--grace-period=0", "--force"),
                         ("deployment", "bad-deploy"), ("node", "bad-node")):
                rc, out, err = srv.kubectl("delete", "-n", NS, "--wait=false", *args)
                assert rc == 0, (args, out, err)
            for path in (f"/api/v1/namespaces/{NS}/pods/status-five", f"/api/v1/namespaces/{NS}/pods/spec-string",
                         f"/api/v1/namespaces/{NS}/pods/bad-owner",
                         f"/apis/apps/v1/namespaces/{NS}/deployments/bad-deploy", "/api/v1/nodes/bad-node"):
                wait_until(lambda p=path: api_get(srv, p)[0] == 404, timeout=30, what=f"{path} gone")
            code, body = api_get(srv, "/readyz")
            assert code == 200, body
        _alive(srv)
    finally:
        sim.stop()
