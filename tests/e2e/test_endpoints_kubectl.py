"""Service endpoints driven by real kubectl, on simulated nodes: the `endpointslice`,
`endpoint` and `endpointslicemirroring` controllers seen the way a user sees them.

One `fleet server --no-agent` and an in-process simulator (3 nodes `fe-NNNN` in
zones, pods Running and Ready 0.2 s after binding, with addresses from the node's
pod CIDR) are shared by the module; each test works in its own namespace `fe-…`.

* `kubectl expose deployment`, then `kubectl get svc,ep,endpointslices -o wide` and
  `kubectl describe svc` show the pods' addresses; scaling the Deployment up and
  down changes them.
* A named targetPort resolves to the container port of that name.
* A headless Service: slices and Endpoints labelled `service.kubernetes.io/headless`.
* Deleting a pod on a node that does not finalize it (the simulator's frozen node,
  a kubelet still stopping containers) marks it terminating — ready false, serving
  true — and drops it from Endpoints; once the pod is gone it leaves the slice.
  `publishNotReadyAddresses` keeps it ready and in Endpoints meanwhile, and a pod
  whose Ready condition is False too.
* A selector-less Service with hand-made Endpoints gets a mirrored slice, and
  `kubectl describe svc` renders it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    KUBECTL,
    FleetServer,
    ServerFactory,
    _make_base,
    create_namespace,
    run_kubectl,
)
from tests.e2e.helpers import wait_until
from tests.e2e.simnodes import SimNodes

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

NODES = 3
SLICE_LABEL = "kubernetes.io/service-name"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[FleetServer, SimNodes]]:
    base = _make_base("fleet-fe-endpoints-")
    factory = ServerFactory(base)
    sim: SimNodes | None = None
    try:
        srv = factory.start()  # --no-agent: the factory default
        sim = SimNodes(srv, count=NODES, prefix="fe", zones=3).start()
        with srv.client() as c:
            wait_until(lambda: sum(
                1 for n in c.get("/api/v1/nodes").json()["items"]
                if any(x["type"] == "Ready" and x["status"] == "True"
                       for x in n["status"].get("conditions", []))) == NODES,
                timeout=60, what=f"{NODES} Ready simulated nodes")
        yield srv, sim
    finally:
        if sim is not None:
            sim.stop()
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


@pytest.fixture
def srv(cluster: tuple[FleetServer, SimNodes]) -> FleetServer:
    return cluster[0]


@pytest.fixture
def ns(srv: FleetServer) -> Iterator[str]:
    name = f"fe-{uuid.uuid4().hex[:6]}"
    create_namespace(srv, name)
    yield name
    with srv.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=90)
    assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
    return out


def slices(srv: FleetServer, ns: str, svc: str) -> list[dict[str, Any]]:
    out = kubectl(srv, "-n", ns, "get", "endpointslices", "-l", f"{SLICE_LABEL}={svc}", "-o", "json")
    return json.loads(out)["items"]


def slice_endpoints(srv: FleetServer, ns: str, svc: str) -> dict[str, dict[str, Any]]:
    """Pod name -> its endpoint, over every slice of the Service."""
    return {e["targetRef"]["name"]: e for s in slices(srv, ns, svc) for e in s.get("endpoints") or []}


def endpoints(srv: FleetServer, ns: str, svc: str) -> dict[str, Any] | None:
    rc, out, _ = run_kubectl(srv, "-n", ns, "get", "endpoints", svc, "-o", "json")
    return json.loads(out) if rc == 0 else None


def ep_ips(ep: dict[str, Any] | None, field: str = "addresses") -> list[str]:
    return sorted(a["ip"] for ss in (ep or {}).get("subsets") or [] for a in ss.get(field) or [])


def pods(srv: FleetServer, ns: str, selector: str) -> list[dict[str, Any]]:
    return json.loads(kubectl(srv, "-n", ns, "get", "pods", "-l", selector, "-o", "json"))["items"]


def running_ips(srv: FleetServer, ns: str, selector: str, n: int) -> list[str]:
    def ips() -> list[str] | None:
        ps = [p for p in pods(srv, ns, selector) if not p["metadata"].get("deletionTimestamp")]
        got = sorted(p["status"].get("podIP") for p in ps if p["status"].get("podIP"))
        return got if len(got) == n and len(ps) == n else None
    return wait_until(ips, timeout=60, what=f"{n} pods {selector} with addresses")


def ready_slice_ips(srv: FleetServer, ns: str, svc: str) -> list[str]:
    return sorted(e["addresses"][0] for e in slice_endpoints(srv, ns, svc).values() if e["conditions"]["ready"])


def test_expose_scale_get_describe(srv: FleetServer, ns: str) -> None:
    kubectl(srv, "-n", ns, "create", "deployment", "fe-web", "--image=busybox", "--replicas=3", "--port=8080")
    kubectl(srv, "-n", ns, "expose", "deployment", "fe-web", "--port=80", "--target-port=8080")
    ips = running_ips(srv, ns, "app=fe-web", 3)
    wait_until(lambda: ready_slice_ips(srv, ns, "fe-web") == ips, timeout=30, what="3 ready endpoints")
    wait_until(lambda: ep_ips(endpoints(srv, ns, "fe-web")) == ips, timeout=30, what="3 addresses in Endpoints")

    [s] = slices(srv, ns, "fe-web")
    md = s["metadata"]
    assert md["name"].startswith("fe-web-") and s["addressType"] == "IPv4"
    assert md["labels"]["endpointslice.kubernetes.io/managed-by"] == "endpointslice-controller.k8s.io"
    assert md["ownerReferences"][0]["kind"] == "Service" and md["ownerReferences"][0]["controller"] is True
    assert s["ports"] == [{"name": "", "port": 8080, "protocol": "TCP"}]
    for e in s["endpoints"]:
        assert e["conditions"] == {"ready": True, "serving": True, "terminating": False}
        assert e["nodeName"].startswith("fe-") and e["zone"] and e["targetRef"]["kind"] == "Pod"

    out = kubectl(srv, "-n", ns, "get", "svc,ep,endpointslices", "-o", "wide")
    assert "service/fe-web" in out and "endpoints/fe-web" in out and f"endpointslice.discovery.k8s.io/{md['name']}" in out
    assert f"{ips[0]}:8080" in out  # the Endpoints column
    assert "app=fe-web" in out  # the Service's SELECTOR column

    desc = kubectl(srv, "-n", ns, "describe", "svc", "fe-web")
    line = next(ln for ln in desc.splitlines() if ln.startswith("Endpoints:"))
    assert sorted(line.split(None, 1)[1].split(",")) == [f"{ip}:8080" for ip in ips], desc
    assert "TargetPort:" in desc and "8080/TCP" in desc

    kubectl(srv, "-n", ns, "scale", "deployment", "fe-web", "--replicas=5")
    ips = running_ips(srv, ns, "app=fe-web", 5)
    wait_until(lambda: ready_slice_ips(srv, ns, "fe-web") == ips, timeout=30, what="5 ready endpoints")
    wait_until(lambda: ep_ips(endpoints(srv, ns, "fe-web")) == ips, timeout=30, what="5 addresses in Endpoints")
    desc = kubectl(srv, "-n", ns, "describe", "svc", "fe-web")
    assert "+ 2 more..." in next(ln for ln in desc.splitlines() if ln.startswith("Endpoints:")), desc

    kubectl(srv, "-n", ns, "scale", "deployment", "fe-web", "--replicas=1")
    ips = running_ips(srv, ns, "app=fe-web", 1)
    wait_until(lambda: ready_slice_ips(srv, ns, "fe-web") == ips, timeout=30, what="1 ready endpoint")
    wait_until(lambda: ep_ips(endpoints(srv, ns, "fe-web")) == ips, timeout=30, what="1 address in Endpoints")
    assert len(slices(srv, ns, "fe-web")) == 1

    # The Service goes: its slices and Endpoints go with it.
    kubectl(srv, "-n", ns, "delete", "svc", "fe-web")
    wait_until(lambda: not slices(srv, ns, "fe-web") and endpoints(srv, ns, "fe-web") is None, timeout=30,
               what="slices and Endpoints of the deleted Service gone")


def deployment(name: str, replicas: int, ports: list[dict[str, Any]], **pod_spec: Any) -> str:
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox", "ports": ports}],
                                       **pod_spec}}}})


def svc_yaml(name: str, *, selector: dict[str, str] | None, ports: list[dict[str, Any]], **spec: Any) -> str:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                            "spec": {"ports": ports, **spec}}
    if selector is not None:
        body["spec"]["selector"] = selector
    return json.dumps(body)


def test_named_target_port(srv: FleetServer, ns: str) -> None:
    kubectl(srv, "-n", ns, "apply", "-f", "-",
            input=deployment("fe-named", 2, [{"name": "web", "containerPort": 9376}]))
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=svc_yaml(
        "fe-named", selector={"app": "fe-named"}, ports=[{"name": "http", "port": 80, "targetPort": "web"}]))
    ips = running_ips(srv, ns, "app=fe-named", 2)
    wait_until(lambda: ready_slice_ips(srv, ns, "fe-named") == ips, timeout=30, what="2 ready endpoints")
    [s] = slices(srv, ns, "fe-named")
    assert s["ports"] == [{"name": "http", "port": 9376, "protocol": "TCP"}]
    wait_until(lambda: ep_ips(endpoints(srv, ns, "fe-named")) == ips, timeout=30, what="Endpoints")
    ep = endpoints(srv, ns, "fe-named")
    assert ep is not None and ep["subsets"][0]["ports"] == [{"name": "http", "port": 9376, "protocol": "TCP"}]
    desc = kubectl(srv, "-n", ns, "describe", "svc", "fe-named")
    assert re.search(r"^TargetPort:\s+web/TCP$", desc, re.M) and f"{ips[0]}:9376" in desc, desc


def test_headless(srv: FleetServer, ns: str) -> None:
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=deployment(
        "fe-hl", 2, [{"containerPort": 80}], hostname="member", subdomain="fe-hl"))
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=svc_yaml(
        "fe-hl", selector={"app": "fe-hl"}, ports=[{"port": 80}], clusterIP="None"))
    ips = running_ips(srv, ns, "app=fe-hl", 2)
    wait_until(lambda: ready_slice_ips(srv, ns, "fe-hl") == ips, timeout=30, what="2 ready endpoints")
    [s] = slices(srv, ns, "fe-hl")
    assert s["metadata"]["labels"]["service.kubernetes.io/headless"] == ""
    assert all(e["hostname"] == "member" for e in s["endpoints"])
    wait_until(lambda: ep_ips(endpoints(srv, ns, "fe-hl")) == ips, timeout=30, what="Endpoints")
    ep = endpoints(srv, ns, "fe-hl")
    assert ep is not None and ep["metadata"]["labels"]["service.kubernetes.io/headless"] == ""
    out = kubectl(srv, "-n", ns, "get", "svc", "fe-hl")
    assert "None" in out.splitlines()[1]


def _pod(name: str, node: str, labels: dict[str, str]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                       "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                                "containers": [{"name": "c", "image": "busybox",
                                                "ports": [{"containerPort": 80}]}]}})


@pytest.mark.parametrize("publish", [False, True], ids=["default", "publishNotReadyAddresses"])
def test_not_ready_and_terminating(cluster: tuple[FleetServer, SimNodes], ns: str, publish: bool) -> None:
    srv, sim = cluster
    node = sim.names[0]
    labels = {"app": "fe-term"}
    for name in ("fe-a", "fe-b", "fe-c"):
        kubectl(srv, "-n", ns, "apply", "-f", "-", input=_pod(name, node, labels))
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=svc_yaml(
        "fe-term", selector=labels, ports=[{"port": 80}], publishNotReadyAddresses=publish))
    running_ips(srv, ns, "app=fe-term", 3)
    wait_until(lambda: len(ready_slice_ips(srv, ns, "fe-term")) == 3, timeout=30, what="3 ready endpoints")
    by_name = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods(srv, ns, "app=fe-term")}

    # fe-b's Ready condition goes False (a failing readiness probe).
    with srv.client() as c:
        r = c.patch(f"/api/v1/namespaces/{ns}/pods/fe-b/status",
                    json={"status": {"conditions": [{"type": "Ready", "status": "False"},
                                                    {"type": "ContainersReady", "status": "False"}]}},
                    headers={"Content-Type": "application/strategic-merge-patch+json"})
        assert r.status_code == 200, r.text
    want_b = {"ready": publish, "serving": False, "terminating": False}
    wait_until(lambda: slice_endpoints(srv, ns, "fe-term")["fe-b"]["conditions"] == want_b, timeout=30,
               what=f"fe-b's endpoint {want_b}")
    field = "addresses" if publish else "notReadyAddresses"
    wait_until(lambda: by_name["fe-b"] in ep_ips(endpoints(srv, ns, "fe-term"), field), timeout=30,
               what=f"fe-b in the Endpoints' {field}")

    # fe-c is deleted while its node does not finalize it: terminating.
    sim.call(lambda: sim.sim.pause_heartbeats(node, freeze_pods=True))  # type: ignore[union-attr]
    try:
        kubectl(srv, "-n", ns, "delete", "pod", "fe-c", "--wait=false")
        want_c = {"ready": publish, "serving": True, "terminating": True}
        wait_until(lambda: slice_endpoints(srv, ns, "fe-term")["fe-c"]["conditions"] == want_c, timeout=30,
                   what=f"fe-c's endpoint {want_c}")
        in_ep = lambda: by_name["fe-c"] in ep_ips(endpoints(srv, ns, "fe-term"))  # noqa: E731
        if publish:
            assert in_ep()
        else:
            wait_until(lambda: not in_ep(), timeout=30, what="fe-c out of the Endpoints")
        desc = kubectl(srv, "-n", ns, "describe", "svc", "fe-term")
        shown = next(ln for ln in desc.splitlines() if ln.startswith("Endpoints:"))
        assert f"{by_name['fe-a']}:80" in shown and (f"{by_name['fe-c']}:80" in shown) == publish, desc
    finally:
        sim.call(lambda: sim.sim.resume_heartbeats(node))  # type: ignore[union-attr]
    wait_until(lambda: "fe-c" not in slice_endpoints(srv, ns, "fe-term"), timeout=30,
               what="fe-c gone from the slice once the pod is gone")
    assert by_name["fe-c"] not in ep_ips(endpoints(srv, ns, "fe-term"))


def test_selectorless_service_is_mirrored(srv: FleetServer, ns: str) -> None:
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=svc_yaml(
        "fe-ext", selector=None, ports=[{"name": "db", "port": 5432, "targetPort": 5432}]))
    kubectl(srv, "-n", ns, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "fe-ext", "labels": {"team": "data"}},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}, {"ip": "192.0.2.11"}],
                     "notReadyAddresses": [{"ip": "192.0.2.12"}],
                     "ports": [{"name": "db", "port": 5432}]}]}))

    def mirrored() -> list[dict[str, Any]]:
        return [s for s in slices(srv, ns, "fe-ext")
                if s["metadata"]["labels"].get("endpointslice.kubernetes.io/managed-by")
                == "endpointslicemirroring-controller.k8s.io" and len(s.get("endpoints") or []) == 3]
    [s] = wait_until(mirrored, timeout=30, what="a mirrored slice with 3 endpoints")
    assert s["metadata"]["labels"]["team"] == "data"
    assert s["metadata"]["ownerReferences"][0]["kind"] == "Endpoints"
    assert s["ports"] == [{"name": "db", "port": 5432, "protocol": "TCP"}]
    assert {e["addresses"][0]: e["conditions"]["ready"] for e in s["endpoints"]} == {
        "192.0.2.10": True, "192.0.2.11": True, "192.0.2.12": False}
    # The Endpoints stay the user's: the endpoints controller leaves them alone.
    ep = endpoints(srv, ns, "fe-ext")
    assert ep is not None and ep_ips(ep) == ["192.0.2.10", "192.0.2.11"]
    desc = kubectl(srv, "-n", ns, "describe", "svc", "fe-ext")
    line = next(ln for ln in desc.splitlines() if ln.startswith("Endpoints:"))
    assert "192.0.2.10:5432" in line and "192.0.2.11:5432" in line and "192.0.2.12" not in line, desc

    # skip-mirror takes the slices away; the Endpoints' deletion too.
    kubectl(srv, "-n", ns, "label", "endpoints", "fe-ext", "endpointslice.kubernetes.io/skip-mirror=true")
    wait_until(lambda: not slices(srv, ns, "fe-ext"), timeout=30, what="mirrored slices removed (skip-mirror)")
    kubectl(srv, "-n", ns, "label", "endpoints", "fe-ext", "endpointslice.kubernetes.io/skip-mirror-")
    wait_until(mirrored, timeout=30, what="mirrored again")
    kubectl(srv, "-n", ns, "delete", "endpoints", "fe-ext")
    wait_until(lambda: not slices(srv, ns, "fe-ext"), timeout=30, what="mirrored slices removed with the Endpoints")


def test_max_endpoints_per_slice_flag(tmp_path: Any) -> None:
    """`fleet server --max-endpoints-per-slice 2`: 5 pods make 3 slices of at most 2,
    which kubectl lists and `describe svc` joins; a value out of 1-1000 is refused."""
    p = subprocess.run([sys.executable, "-m", "fleet.cli.main", "server", "--data-dir", str(tmp_path / "bad"),
                        "--max-endpoints-per-slice", "0"], capture_output=True, text=True, timeout=60,
                       cwd=str(Path(__file__).resolve().parents[2]))
    assert p.returncode != 0 and "--max-endpoints-per-slice must be between 1 and 1000" in p.stderr, p.stderr

    base = _make_base("fleet-fe-maxslice-")
    factory = ServerFactory(base)
    sim: SimNodes | None = None
    try:
        srv = factory.start(extra_args=["--max-endpoints-per-slice", "2"])
        sim = SimNodes(srv, count=1, prefix="fe-m").start()
        kubectl(srv, "create", "deployment", "fe-many", "--image=busybox", "--replicas=5", "--port=80")
        kubectl(srv, "expose", "deployment", "fe-many", "--port=80")
        ips = running_ips(srv, "default", "app=fe-many", 5)
        wait_until(lambda: ready_slice_ips(srv, "default", "fe-many") == ips, timeout=60, what="5 ready endpoints")
        sizes = sorted(len(s["endpoints"]) for s in slices(srv, "default", "fe-many"))
        assert sizes == [1, 2, 2], sizes
        out = kubectl(srv, "get", "endpointslices", "-l", f"{SLICE_LABEL}=fe-many")
        assert len(out.strip().splitlines()) == 4, out  # header + 3 slices
        desc = kubectl(srv, "describe", "svc", "fe-many")
        assert "+ 2 more..." in next(ln for ln in desc.splitlines() if ln.startswith("Endpoints:")), desc
    finally:
        if sim is not None:
            sim.stop()
        problems = factory.stop_all()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


def test_namespace_with_services_is_deleted(srv: FleetServer) -> None:
    """Deleting a namespace with Services, their pods, Endpoints and slices finishes: the
    controllers do not fight the namespace controller by re-creating what it removes."""
    name = f"fe-{uuid.uuid4().hex[:6]}"
    kubectl(srv, "create", "namespace", name)
    kubectl(srv, "-n", name, "create", "deployment", "fe-web", "--image=busybox", "--replicas=2", "--port=80")
    kubectl(srv, "-n", name, "expose", "deployment", "fe-web", "--port=80")
    running_ips(srv, name, "app=fe-web", 2)
    wait_until(lambda: len(ready_slice_ips(srv, name, "fe-web")) == 2, timeout=30, what="2 ready endpoints")
    rc, out, err = run_kubectl(srv, "delete", "namespace", name, "--timeout=90s", timeout=120)
    assert rc == 0, (out, err)
    rc, _, err = run_kubectl(srv, "get", "namespace", name)
    assert rc != 0 and "NotFound" in err, err
