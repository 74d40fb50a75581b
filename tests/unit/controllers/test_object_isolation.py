"""One bad object never stops a component: informer dispatch, indexes, the work
queue, the scheduling cycle, the garbage collector's graph and the agent's pod
sync each log it with its key, count it in fleet_object_errors_total and go on
with the other objects.  No server: the pieces are driven directly (MockClock)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from fleet._core.supervise import object_errors
from fleet.api.meta import malformed
from fleet.client.informer import Informer
from fleet.controllers.garbagecollector_graph import Graph, owner_ref_problem
from fleet.controllers.runtime import QueueWorker, SharedInformer
from fleet.scheduler.run import Scheduler, SchedulerConfig


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def pod(name: str, rv: str = "1", ns: str = "default", **fields: Any) -> dict[str, Any]:
    md = {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": rv}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}, "status": {}, **fields}


def poisoned(name: str, **fields: Any) -> dict[str, Any]:
    p = pod(name)
    p.update(fields)
    return p


# -- the envelope check ------------------------------------------------------------------

MALFORMED = [
    ("status is a number", poisoned("a", status=5), "status is a int"),
    ("spec is a string", poisoned("a", spec="x"), "spec is a str"),
    ("labels are a number", {**pod("a"), "metadata": {**pod("a")["metadata"], "labels": 5}},
     "metadata.labels"),
    ("label value not a string", {**pod("a"), "metadata": {**pod("a")["metadata"], "labels": {"x": 1}}},
     "metadata.labels"),
    ("ownerReferences not a list", {**pod("a"), "metadata": {**pod("a")["metadata"], "ownerReferences": 5}},
     "ownerReferences"),
    ("metadata is a list", {"kind": "Pod", "metadata": []}, "metadata is a list"),
    ("name is a number", {"kind": "Pod", "metadata": {"name": 5}}, "metadata.name"),
    ("not an object", 7, "the object is a int"),
]


@pytest.mark.parametrize(("case", "obj", "why"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_envelopes(case: str, obj: Any, why: str) -> None:
    assert why in (malformed(obj) or "")


def test_well_formed_objects_pass() -> None:
    assert malformed(pod("a")) is None
    assert malformed({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}) is None
    assert malformed({**pod("a"), "status": None}) is None


# -- the client informer -----------------------------------------------------------------

def test_informer_skips_malformed_objects_and_survives_a_failing_handler(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, str]] = []

    def handler(etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        o = new if new is not None else old
        assert o is not None
        if o["metadata"]["name"] == "explodes":
            raise AttributeError("'int' object has no attribute 'get'")
        seen.append((etype, o["metadata"]["name"]))

    inf = Informer(None, "v1", "pods", handler, component="unit-informer")  # type: ignore[arg-type]
    before_bad = object_errors("unit-informer", "Pod")
    with caplog.at_level(logging.WARNING):
        inf._replace([pod("a"), poisoned("status5", status=5), pod("explodes"), pod("b")])
        inf._apply("ADDED", poisoned("spec-x", spec="x"))
        inf._apply("ADDED", pod("c"))
        # A good object turning bad keeps its last good version; its deletion still counts.
        inf._apply("MODIFIED", poisoned("a", status=5))
        inf._apply("DELETED", poisoned("a", status=5))
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c"), ("DELETED", "a")]
    assert "default/status5" not in inf.items and "default/spec-x" not in inf.items
    assert "default/explodes" in inf.items  # cached: only its handler failed
    # status5, spec-x, a (turned bad) were malformed; explodes' handler raised once.
    assert object_errors("unit-informer", "Pod") == before_bad + 4
    text = caplog.text
    assert "default/status5" in text and "default/explodes" in text and "has no attribute" in text


def test_a_relist_keeps_the_last_good_version_of_an_object_gone_bad() -> None:
    events: list[str] = []
    inf = Informer(None, "v1", "pods", lambda t, o, n: events.append(t),  # type: ignore[arg-type]
                   component="unit-informer")
    inf._replace([pod("a", rv="1")])
    inf._replace([poisoned("a", status=5)])
    assert events == ["ADDED"]  # neither DELETED nor MODIFIED
    assert inf.items["default/a"]["status"] == {}


# -- the controller runtime --------------------------------------------------------------

def test_shared_informer_index_failure_spares_the_other_objects() -> None:
    inf = SharedInformer(None, "v1", "pods", component="unit-shared")  # type: ignore[arg-type]

    def by_replicas(o: dict[str, Any]) -> list[str]:
        return [str(int(o["spec"]["replicas"]))]  # "abc" raises

    inf.add_index("replicas", by_replicas)
    handled: list[str] = []
    inf.add_handler(lambda t, old, new: handled.append((new or old or {})["metadata"]["name"]))
    before = object_errors("unit-shared", "Deployment")
    good = {"kind": "Deployment", "metadata": {"name": "ok", "namespace": "d"}, "spec": {"replicas": 2}}
    bad = {"kind": "Deployment", "metadata": {"name": "bad", "namespace": "d"},
           "spec": {"replicas": "abc", "template": 7}}
    inf._apply("ADDED", bad)
    inf._apply("ADDED", good)
    assert [o["metadata"]["name"] for o in inf.by_index("replicas", "2")] == ["ok"]
    assert handled == ["bad", "ok"]  # the bad one still reaches the handlers (and its controller)
    assert sorted(o["metadata"]["name"] for o in inf.list("d")) == ["bad", "ok"]
    assert object_errors("unit-shared", "Deployment") == before + 1


async def test_reconcile_failure_on_one_key_is_counted_and_backed_off(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    calls: dict[str, list[float]] = {}

    class W(QueueWorker):
        name = "unit-worker"
        kind = "Deployment"

        async def reconcile(self, key: str) -> float | None:
            calls.setdefault(key, []).append(trio.current_time())
            if key == "ns/poisoned":
                raise TypeError("'int' object is not subscriptable")
            return None

    w = W()
    before = object_errors("unit-worker", "Deployment")
    with caplog.at_level(logging.WARNING):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run, None)
            w.queue.add("ns/poisoned")
            for i in range(5):
                w.queue.add(f"ns/good-{i}")
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    assert all(len(calls[f"ns/good-{i}"]) == 1 for i in range(5))
    tries = calls["ns/poisoned"]
    assert len(tries) >= 5
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:], strict=False))  # growing back-off
    assert object_errors("unit-worker", "Deployment") - before == len(tries)
    assert "ns/poisoned" in caplog.text


# -- the scheduler -----------------------------------------------------------------------

class FakeClient:
    """Records bindings (POST pods/{name}/binding) and swallows events."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str | None = None,
                     *, name: str | None = None, subresource: str | None = None) -> dict[str, Any]:
        if subresource == "binding":
            self.bound[f"{namespace}/{name}"] = body["target"]["name"]
        return body

    async def patch(self, *args: Any, **kw: Any) -> dict[str, Any]:
        return {}


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


async def test_a_scheduling_cycle_that_raises_backs_off_that_pod_only(
        autojump_clock: trio.testing.MockClock) -> None:
    client = FakeClient()
    sched = Scheduler(client, SchedulerConfig(initial_backoff=1.0, max_backoff=4.0))  # type: ignore[arg-type]
    sched.on_node("ADDED", None, node("n1"))
    # Containers that are not objects: passes the envelope, trips the plugins.
    bad = pod("bad")
    bad["spec"] = {"containers": 5}
    sched.on_pod("ADDED", None, bad)
    sched.on_pod("ADDED", None, pod("good"))
    before = object_errors("default-scheduler", "Pod")
    async with trio.open_nursery() as nursery:
        async def loop() -> None:
            while True:
                await sched.schedule_one(nursery)
        nursery.start_soon(loop)
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert client.bound == {"default/good": "n1"}
    failures = object_errors("default-scheduler", "Pod") - before
    # Retried with back-off 1, 2, 4, 4, ... s: a handful of cycles in 30 s, not a busy loop.
    assert 3 <= failures <= 12, failures
    assert sched._cycle_failures["default/bad"] == failures
    assert "default/bad" in sched.pending


# -- the garbage collector ---------------------------------------------------------------

REFS = [
    ("empty kind, numeric name", {"apiVersion": "v1", "kind": "", "name": 5, "uid": "u1"}, "kind"),
    ("no uid", {"apiVersion": "v1", "kind": "ReplicaSet", "name": "rs"}, "uid"),
    ("not an object", "rs", "is a str"),
    ("numeric uid", {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": 7}, "uid"),
]


@pytest.mark.parametrize(("case", "ref", "why"), REFS, ids=[c[0] for c in REFS])
def test_malformed_owner_references(case: str, ref: Any, why: str) -> None:
    assert why in (owner_ref_problem(ref) or "")


def test_gc_graph_ignores_malformed_owner_references_with_one_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    to_delete: list[str] = []
    graph = Graph(to_delete.append, lambda uid: None)
    before = object_errors("garbagecollector", "Pod")
    bad = pod("victim")
    bad["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "", "name": 5, "uid": "owner-x"}]
    good = pod("child")
    good["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                            "uid": "uid-rs"}]
    with caplog.at_level(logging.WARNING):
        for rv in ("1", "2", "3"):  # three versions of the bad object: one line, not three
            bad["metadata"]["resourceVersion"] = rv
            graph.observe(bad)
        graph.observe(good)
    assert "owner-x" not in graph.nodes and "uid-victim" not in graph.nodes
    assert to_delete == ["uid-rs"]  # only the well-formed owner is verified
    assert object_errors("garbagecollector", "Pod") == before + 1
    assert caplog.text.count("default/victim") == 1


# -- the agent's pod sync ----------------------------------------------------------------

class FakeEvents:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    async def record(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.recorded.append((pod["metadata"]["name"], type_, reason))


async def test_agent_sync_skips_a_garbage_pod_with_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.agent import sync as sync_mod

    started: list[str] = []

    class FakeWorker:
        def __init__(self, pod: dict[str, Any], env: Any, adopted: Any) -> None:
            self.pod, self.uid = pod, pod["metadata"]["uid"]
            self.namespace, self.name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            if not isinstance(pod["spec"].get("containers"), list):
                raise TypeError("containers is not a list")

        def update(self, pod: dict[str, Any]) -> None:
            pass

        async def run(self) -> None:
            started.append(self.name)

    monkeypatch.setattr(sync_mod, "PodWorker", FakeWorker)
    events = FakeEvents()
    env = type("Env", (), {"events": events})()
    ps = sync_mod.PodSync("n1", env)  # type: ignore[arg-type]
    before = object_errors("agent", "Pod")
    async with trio.open_nursery() as n:
        ps._nursery = n
        spec_x = poisoned("spec-x", spec="x")
        worker_breaks = pod("worker-breaks")
        worker_breaks["spec"] = {"nodeName": "n1", "containers": 5}
        fine = pod("fine")
        fine["spec"]["nodeName"] = "n1"
        ps._relisted([spec_x, worker_breaks, fine])
        await trio.testing.wait_all_tasks_blocked()
    assert started == ["fine"]
    assert object_errors("agent", "Pod") == before + 2
    assert sorted(events.recorded) == [("spec-x", "Warning", "FailedSync"),
                                       ("worker-breaks", "Warning", "FailedSync")]
