"""DaemonSets with kubectl against a real `fleet server`, simulated nodes and (as root) a real node.

The module shares one server and three simulated nodes.  As root with runc and
busybox-static, the server also runs its built-in agent — a real node running
real containers (network `none`) with a busybox image imported beforehand — so
the DaemonSet has to cover a real node and simulated ones alike; otherwise the
real-node part is skipped and only simulated nodes take part.

- a DaemonSet gets one pod on every node (`kubectl rollout status` returns),
  follows two more simulated nodes joining, and leaves them when they are
  deleted;
- nodeSelector and taints: only matching nodes, a NoSchedule-tainted node only
  for a DaemonSet that tolerates it, and a node that stops matching loses its
  pod;
- RollingUpdate with maxSurge (a new pod beside the old, never fewer than all
  nodes Ready) and with maxUnavailable (never more than one node short), then
  `kubectl rollout history` and `undo` through the ControllerRevisions.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.runtime.images import ImageStore, import_archive_sync
from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import build_busybox_image, busybox_problem, write_oci_archive
from tests.conftest import (
    KUBECTL,
    FleetServer,
    ServerFactory,
    _make_base,
    create_namespace,
    free_port,
)
from tests.e2e.helpers import wait_until
from tests.e2e.simnodes import PodWatch, SimNodes

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

IMAGE = "localhost/fleet-test/busybox:1"
SIM_NODES = 3
TIMEOUT = 180.0
SIM_LABEL = "fleet.dev/simulated"


def real_node_problem() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    if find_runtime() is None:
        return "no runc or crun"
    return busybox_problem()


@dataclass
class Cluster:
    srv: FleetServer
    real_node: str | None  # the built-in agent's node, when it runs

    def nodes(self) -> list[str]:
        with self.srv.client() as c:
            return sorted(n["metadata"]["name"] for n in c.get("/api/v1/nodes").json()["items"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    base = _make_base("fleet-ds-")
    factory = ServerFactory(base)
    sim: SimNodes | None = None
    real = real_node_problem() is None
    # A short node-monitor grace so the pods of deleted nodes are collected quickly.
    args = ["--node-monitor-grace-period", "4", "--node-monitor-period", "1"]
    if real:
        args += ["--agent-port", str(free_port()), "--agent-network", "none", "--agent-driver", "oci"]
    srv = factory.new(extra_args=args)
    try:
        if real:
            archive = write_oci_archive(build_busybox_image(), base / "busybox.tar", IMAGE)
            import_archive_sync(ImageStore(srv.data_dir / "agent" / "images"), archive, IMAGE)
        srv.start()
        sim = SimNodes(srv, count=SIM_NODES, prefix="dsn").start()
        want = SIM_NODES + (1 if real else 0)

        def all_ready() -> dict[str, dict[str, str]] | None:
            r = _ready_nodes(srv)
            return r if len(r) == want else None

        ready = wait_until(all_ready, timeout=90, what=f"{want} Ready nodes")
        real_node = next((n for n, labels in ready.items() if labels.get(SIM_LABEL) != "true"), None)
        yield Cluster(srv, real_node)
    finally:
        if sim is not None:
            sim.stop()
        leaked = _remove_real_pods(srv) if real else []
        problems = factory.stop_all()
        if real:
            from tests.e2e.leaks import finish
            finish(srv.data_dir / "agent", leaked, srv.output())
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


def _ready_nodes(srv: FleetServer) -> dict[str, dict[str, str]]:
    with srv.client() as c:
        items = c.get("/api/v1/nodes").json().get("items") or []
    return {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in items
            if any(x["type"] == "Ready" and x["status"] == "True" for x in n["status"].get("conditions", []))}


def _remove_real_pods(srv: FleetServer) -> list[str]:
    """Delete every pod so the real agent stops its containers before the server goes;
    what the agent left behind (tests/e2e/leaks.py)."""
    from tests.e2e.leaks import delete_pods_and_wait_clean

    if srv.proc is None or srv.proc.poll() is not None:
        return []
    return delete_pods_and_wait_clean(srv, srv.data_dir / "agent", timeout=30, grace=1)


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = f"ds-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster.srv, name)
    yield name
    # Everything in it goes (the real node's containers too).
    with cluster.srv.client() as c:
        c.delete(f"/api/v1/namespaces/{name}")


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = srv.kubectl(*args, input=input, timeout=TIMEOUT + 30)
    assert rc == 0, f"kubectl {' '.join(args)} failed ({rc}): {err}{out}"
    return out


def daemonset(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}
    pod_spec.update(spec.pop("pod", {}))
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}, **spec}}


def apply(srv: FleetServer, obj: dict[str, Any]) -> None:
    kubectl(srv, "apply", "-f", "-", input=yaml.safe_dump(obj))


def rollout(srv: FleetServer, ns: str, name: str) -> str:
    return kubectl(srv, "rollout", "status", f"daemonset/{name}", "-n", ns, f"--timeout={int(TIMEOUT)}s")


def daemon_pods(srv: FleetServer, ns: str, name: str) -> list[dict[str, Any]]:
    out = json.loads(kubectl(srv, "get", "pods", "-n", ns, "-l", f"app={name}", "-o", "json"))["items"]
    return [p for p in out if not p["metadata"].get("deletionTimestamp")]


def ready_nodes_of(srv: FleetServer, ns: str, name: str) -> list[str]:
    """Nodes with a Ready pod of the DaemonSet (each node listed once per pod)."""
    return sorted(p["spec"].get("nodeName", "") for p in daemon_pods(srv, ns, name) if PodWatch.ready(p))


def ds_status(srv: FleetServer, ns: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl(srv, "get", "daemonset", name, "-n", ns, "-o", "json"))["status"]


def covers(srv: FleetServer, ns: str, name: str, nodes: list[str]) -> bool:
    return ready_nodes_of(srv, ns, name) == sorted(nodes) and ds_status(srv, ns, name).get(
        "desiredNumberScheduled") == len(nodes)


def test_daemonset_covers_every_node_and_follows_nodes_joining_and_leaving(cluster: Cluster, ns: str) -> None:
    srv = cluster.srv
    nodes = cluster.nodes()
    apply(srv, daemonset("agent", ns))
    rollout(srv, ns, "agent")
    wait_until(lambda: covers(srv, ns, "agent", nodes), timeout=TIMEOUT, what="one Ready pod per node")
    pods = daemon_pods(srv, ns, "agent")
    if cluster.real_node is not None:
        # The real node runs a real container.
        real = next(p for p in pods if p["spec"]["nodeName"] == cluster.real_node)
        assert real["status"]["containerStatuses"][0]["state"].get("running"), real["status"]
    # Each pod was placed by the scheduler through its node-name affinity.
    for p in pods:
        terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                            "values": [p["spec"]["nodeName"]]}]}]
    table = kubectl(srv, "get", "daemonset", "agent", "-n", ns).splitlines()
    assert table[0].split()[:6] == ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE"]
    assert table[1].split()[1:6] == [str(len(nodes))] * 5

    # Two nodes join: they get their pods.
    joining = SimNodes(srv, count=2, prefix="dsj").start()
    try:
        wait_until(lambda: covers(srv, ns, "agent", nodes + joining.names), timeout=TIMEOUT,
                   what="the DaemonSet to cover the joined nodes")
        rollout(srv, ns, "agent")
    finally:
        joining.stop()
    # They leave (deleted): their pods go, the DaemonSet shrinks back.
    kubectl(srv, "delete", "node", *joining.names)
    wait_until(lambda: covers(srv, ns, "agent", nodes)
               and not {p["spec"].get("nodeName") for p in daemon_pods(srv, ns, "agent")} & set(joining.names),
               timeout=TIMEOUT, what="the pods of the deleted nodes to go")


def test_node_selector_and_taints(cluster: Cluster, ns: str) -> None:
    srv = cluster.srv
    nodes = cluster.nodes()
    picked, tainted = "dsn-0000", "dsn-0001"
    try:
        kubectl(srv, "label", "node", picked, "fleet-test/daemons=yes")
        kubectl(srv, "taint", "node", tainted, "fleet-test/dedicated=db:NoSchedule")
        apply(srv, daemonset("picky", ns, pod={"nodeSelector": {"fleet-test/daemons": "yes"}}))
        apply(srv, daemonset("plain", ns))
        apply(srv, daemonset("tolerant", ns, pod={"tolerations": [
            {"key": "fleet-test/dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]}))
        for name in ("picky", "plain", "tolerant"):
            rollout(srv, ns, name)
        wait_until(lambda: covers(srv, ns, "picky", [picked]), timeout=TIMEOUT, what="picky on its node")
        wait_until(lambda: covers(srv, ns, "plain", [n for n in nodes if n != tainted]), timeout=TIMEOUT,
                   what="plain off the tainted node")
        wait_until(lambda: covers(srv, ns, "tolerant", nodes), timeout=TIMEOUT, what="tolerant everywhere")

        # The node stops matching: its pod goes.
        kubectl(srv, "label", "node", picked, "fleet-test/daemons-")
        wait_until(lambda: covers(srv, ns, "picky", []) and not daemon_pods(srv, ns, "picky"),
                   timeout=TIMEOUT, what="picky's pod to go")
        # A NoExecute taint nobody tolerates empties the node.
        kubectl(srv, "taint", "node", tainted, "fleet-test/evict=now:NoExecute")
        wait_until(lambda: covers(srv, ns, "tolerant", [n for n in nodes if n != tainted]),
                   timeout=TIMEOUT, what="tolerant's pod to leave the NoExecute node")
    finally:
        srv.kubectl("label", "node", picked, "fleet-test/daemons-")
        srv.kubectl("taint", "node", tainted, "fleet-test/dedicated-", "fleet-test/evict-")


def _replay(events: list[tuple[str, dict[str, Any]]], mark: int) -> tuple[int, int, int]:
    """(fewest Ready pods, most live pods, most pods not yet Ready) at any moment after event `mark`.

    Pods being deleted do not count.  The moments are the watch's: one stream, in the
    store's order, so no intermediate state is skipped."""
    live: dict[str, dict[str, Any]] = {}
    fewest_ready, most_live, most_starting = 10**9, 0, 0
    for i, (etype, pod) in enumerate(events):
        uid = pod["metadata"]["uid"]
        if etype == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            live.pop(uid, None)
        else:
            live[uid] = pod
        if i >= mark:
            ready = sum(PodWatch.ready(p) for p in live.values())
            fewest_ready = min(fewest_ready, ready)
            most_live = max(most_live, len(live))
            most_starting = max(most_starting, len(live) - ready)
    return fewest_ready, most_live, most_starting


def test_rolling_update_surge_unavailable_and_undo(cluster: Cluster, ns: str) -> None:
    srv = cluster.srv
    sims = [n for n in cluster.nodes() if n.startswith("dsn-")]
    n = len(sims)
    watch = PodWatch(srv, ns, "app=roll").start()
    try:
        apply(srv, daemonset("roll", ns, pod={"nodeSelector": {SIM_LABEL: "true"}},
                             updateStrategy={"type": "RollingUpdate",
                                             "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}))
        rollout(srv, ns, "roll")
        wait_until(lambda: covers(srv, ns, "roll", sims), timeout=TIMEOUT, what="roll on the simulated nodes")

        # maxSurge 1: the new pod starts beside the old one, one node at a time; every node
        # keeps a Ready pod throughout.
        mark = watch.mark()
        kubectl(srv, "patch", "daemonset", "roll", "-n", ns, "-p",
                json.dumps({"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}))
        rollout(srv, ns, "roll")
        wait_until(lambda: covers(srv, ns, "roll", sims), timeout=TIMEOUT, what="surge rollout")
        fewest_ready, _, most_starting = _replay(watch.snapshot(), mark)
        assert fewest_ready >= n and most_starting <= 1, (fewest_ready, most_starting)

        # maxUnavailable 1, no surge: at most one node without its pod at a time.
        mark = watch.mark()
        kubectl(srv, "patch", "daemonset", "roll", "-n", ns, "-p", json.dumps({"spec": {
            "updateStrategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"annotations": {"rev": "3"}}}}}))
        rollout(srv, ns, "roll")
        wait_until(lambda: covers(srv, ns, "roll", sims), timeout=TIMEOUT, what="maxUnavailable rollout")
        fewest_ready, most_live, _ = _replay(watch.snapshot(), mark)
        assert fewest_ready >= n - 1 and most_live <= n, (fewest_ready, most_live)

        status = ds_status(srv, ns, "roll")
        assert status["updatedNumberScheduled"] == status["numberAvailable"] == n
        history = kubectl(srv, "rollout", "history", "daemonset/roll", "-n", ns)
        assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["1", "2", "3"], history

        kubectl(srv, "rollout", "undo", "daemonset/roll", "-n", ns)
        rollout(srv, ns, "roll")

        def back_at_2() -> bool:
            pods = daemon_pods(srv, ns, "roll")
            return len(pods) == n and all(PodWatch.ready(p) and
                                          (p["metadata"].get("annotations") or {}).get("rev") == "2" for p in pods)

        wait_until(back_at_2, timeout=TIMEOUT, what="the rollback to rev 2")
    finally:
        watch.stop()


def test_real_node_part_runs_only_as_root(cluster: Cluster) -> None:
    """Says plainly in the test report whether the real node took part."""
    problem = real_node_problem()
    if problem is not None:
        pytest.skip(f"real node not used: {problem}")
    assert cluster.real_node is not None and cluster.real_node in cluster.nodes()
    assert Path(cluster.srv.data_dir / "agent").is_dir()
