"""InterPodAffinity: required/preferred affinity and anti-affinity, symmetry, namespaces.

Filter cases follow kube-scheduler's interpodaffinity filtering_test.go /
scoring_test.go; the Framework cases are the kubernetes.io "Assigning Pods
to Nodes" examples.  Every filter case runs twice: with the snapshot on the
CycleState (as the Framework will provide it) and without (the plugin then
finds it through the nodes).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleet.scheduler.framework import Code, CycleState, FitError, Framework
from fleet.scheduler.plugins import InterPodAffinity, default_plugins, default_weights
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import (
    HOSTNAME,
    ZONE,
    filter_nodes,
    namespace,
    node,
    pod,
    pod_affinity,
    score_nodes,
    term,
    weighted,
)

AFFINITY = "node(s) didn't match pod affinity rules"
ANTI = "node(s) didn't match pod anti-affinity rules"
EXISTING = "node(s) didn't satisfy existing pods anti-affinity rules"
REGION = "region"


@pytest.fixture(params=[True, False], ids=["state-snapshot", "deferred"])
def attach(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)} if values else {"key": key, "operator": op}


def incoming(affinity: dict[str, Any], labels: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    return pod("incoming", labels=labels, affinity=affinity, **kw)


def on(node_name: str, name: str, labels: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    return pod(name, node_name=node_name, labels=labels, **kw)


TWO_REGIONS = [node("n1", labels={REGION: "r1", ZONE: "z11"}), node("n2", labels={REGION: "r1", ZONE: "z12"}),
               node("n3", labels={REGION: "r2", ZONE: "z21"})]
SECURITY = {"service": "securityscan"}


@pytest.mark.parametrize(("bound", "p", "want"), [
    # No affinity at all: nothing to say.
    ([], incoming({}), {"n1": None, "n2": None, "n3": None}),
    # Required affinity (In): the region holding a securityscan pod, every node of it.
    ([on("n1", "scan", SECURITY)],
     incoming(pod_affinity(required=[term(REGION, exprs=[expr("service", "In", "securityscan", "value2")])])),
     {"n1": None, "n2": None, "n3": AFFINITY}),
    # NotIn selects pods without those values (and pods without the label).
    ([on("n1", "scan", SECURITY)],
     incoming(pod_affinity(required=[term(REGION, exprs=[expr("service", "NotIn", "securityscan3", "value3")])])),
     {"n1": None, "n2": None, "n3": AFFINITY}),
    ([on("n1", "scan", SECURITY)],
     incoming(pod_affinity(required=[term(REGION, exprs=[expr("service", "NotIn", "securityscan")])]),
              labels={"service": "securityscan"}),
     {"n1": AFFINITY, "n2": AFFINITY, "n3": AFFINITY}),
    # A matching pod in another namespace does not count (term defaults to the pod's namespace).
    ([on("n1", "scan", SECURITY, namespace="other")],
     incoming(pod_affinity(required=[term(REGION, match=SECURITY)])),
     {"n1": AFFINITY, "n2": AFFINITY, "n3": AFFINITY}),
    # ...unless the term names it.
    ([on("n1", "scan", SECURITY, namespace="other")],
     incoming(pod_affinity(required=[term(REGION, match=SECURITY, namespaces=["other"])])),
     {"n1": None, "n2": None, "n3": AFFINITY}),
    # Several terms: one pod must match them all.
    ([on("n1", "a", {"service": "securityscan"}), on("n3", "b", {"tier": "db"})],
     incoming(pod_affinity(required=[term(REGION, match=SECURITY), term(REGION, match={"tier": "db"})])),
     {"n1": AFFINITY, "n2": AFFINITY, "n3": AFFINITY}),
    ([on("n3", "ab", {"service": "securityscan", "tier": "db"})],
     incoming(pod_affinity(required=[term(REGION, match=SECURITY), term(ZONE, match={"tier": "db"})])),
     {"n1": AFFINITY, "n2": AFFINITY, "n3": None}),
    # Required anti-affinity: not in the zone of a matching pod (preemption could help: resolvable).
    ([on("n1", "scan", SECURITY)], incoming(pod_affinity(anti_required=[term(ZONE, match=SECURITY)])),
     {"n1": ANTI, "n2": None, "n3": None}),
    ([on("n1", "scan", SECURITY)], incoming(pod_affinity(anti_required=[term(REGION, match=SECURITY)])),
     {"n1": ANTI, "n2": ANTI, "n3": None}),
    # Affinity and anti-affinity together.
    ([on("n1", "scan", SECURITY), on("n2", "db", {"tier": "db"})],
     incoming(pod_affinity(required=[term(REGION, match=SECURITY)], anti_required=[term(ZONE, match={"tier": "db"})])),
     {"n1": None, "n2": ANTI, "n3": AFFINITY}),
    # Symmetry: an existing pod's anti-affinity keeps the incoming pod out of its domain.
    ([on("n1", "guard", {"app": "guard"}, affinity=pod_affinity(anti_required=[term(REGION, match={"app": "web"})]))],
     incoming({}, labels={"app": "web"}), {"n1": EXISTING, "n2": EXISTING, "n3": None}),
    # ...only for pods it selects, in its own namespace.
    ([on("n1", "guard", {"app": "guard"}, affinity=pod_affinity(anti_required=[term(REGION, match={"app": "web"})]))],
     incoming({}, labels={"app": "api"}), {"n1": None, "n2": None, "n3": None}),
    ([on("n1", "guard", {"app": "guard"}, namespace="other",
         affinity=pod_affinity(anti_required=[term(REGION, match={"app": "web"})]))],
     incoming({}, labels={"app": "web"}), {"n1": None, "n2": None, "n3": None}),
    # An existing pod's *preferred* anti-affinity never filters.
    ([on("n1", "guard", affinity=pod_affinity(anti_preferred=[weighted(10, term(REGION, match={"app": "web"}))]))],
     incoming({}, labels={"app": "web"}), {"n1": None, "n2": None, "n3": None}),
    # The first pod of a self-affine group may go anywhere that has the key...
    ([], incoming(pod_affinity(required=[term(REGION, match={"app": "db"})]), labels={"app": "db"}),
     {"n1": None, "n2": None, "n3": None}),
    # ...but not when it does not match its own term,
    ([], incoming(pod_affinity(required=[term(REGION, match={"app": "db"})]), labels={"app": "web"}),
     {"n1": AFFINITY, "n2": AFFINITY, "n3": AFFINITY}),
    # ...nor once a matching pod exists elsewhere.
    ([on("n3", "db0", {"app": "db"})],
     incoming(pod_affinity(required=[term(REGION, match={"app": "db"})]), labels={"app": "db"}),
     {"n1": AFFINITY, "n2": AFFINITY, "n3": None}),
])
def test_filter(bound, p, want, attach):
    statuses = filter_nodes(InterPodAffinity(), p, Snapshot.build(TWO_REGIONS, bound), attach=attach)
    got = {name: (st.reasons[0] if st.reasons else None) for name, st in statuses.items()}
    assert got == want
    for st in statuses.values():
        if st.reasons == (AFFINITY,):
            assert st.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        elif st.reasons:
            assert st.code is Code.UNSCHEDULABLE


def test_node_without_the_topology_key(attach):
    snap = Snapshot.build([node("keyed", labels={REGION: "r1"}), node("bare")],
                          [on("keyed", "scan", SECURITY)])
    p = incoming(pod_affinity(required=[term(REGION, match=SECURITY)]))
    got = {n: st.reasons for n, st in filter_nodes(InterPodAffinity(), p, snap, attach=attach).items()}
    assert got == {"keyed": (), "bare": (AFFINITY,)}
    # Anti-affinity has nothing against a node without the key.
    p = incoming(pod_affinity(anti_required=[term(REGION, match=SECURITY)]))
    got = {n: st.reasons for n, st in filter_nodes(InterPodAffinity(), p, snap, attach=attach).items()}
    assert got == {"keyed": (ANTI,), "bare": ()}


@pytest.mark.parametrize(("ns_selector", "want"), [
    ({"matchLabels": {"team": "a"}}, {"n1": None, "n2": None, "n3": AFFINITY}),
    ({"matchLabels": {"team": "b"}}, {"n1": AFFINITY, "n2": AFFINITY, "n3": AFFINITY}),
    ({}, {"n1": None, "n2": None, "n3": AFFINITY}),  # {}: every namespace
])
def test_namespace_selector_of_incoming_pod(ns_selector, want, attach):
    snap = Snapshot.build(TWO_REGIONS, [on("n1", "scan", SECURITY, namespace="team-a")],
                          namespaces=[namespace("team-a", team="a"), namespace("default")])
    p = incoming(pod_affinity(required=[term(REGION, match=SECURITY, namespaceSelector=ns_selector)]))
    got = {n: (st.reasons[0] if st.reasons else None)
           for n, st in filter_nodes(InterPodAffinity(), p, snap, attach=attach).items()}
    assert got == want


def test_namespace_selector_of_existing_pod_matches_incoming_namespace_labels(attach):
    guard = on("n1", "guard", namespace="sec", affinity=pod_affinity(anti_required=[
        term(REGION, match={"app": "web"}, namespaceSelector={"matchLabels": {"env": "prod"}})]))
    snap = Snapshot.build(TWO_REGIONS, [guard],
                          namespaces=[namespace("prod-1", env="prod"), namespace("dev-1", env="dev")])
    prod = pod("w", namespace="prod-1", labels={"app": "web"})
    dev = pod("w", namespace="dev-1", labels={"app": "web"})
    assert filter_nodes(InterPodAffinity(), prod, snap, attach=attach)["n1"].reasons == (EXISTING,)
    assert filter_nodes(InterPodAffinity(), dev, snap, attach=attach)["n1"].ok
    # Namespace labels change: the decision follows.
    snap.set_namespace(namespace("dev-1", env="prod"))
    assert filter_nodes(InterPodAffinity(), dev, snap, attach=attach)["n1"].reasons == (EXISTING,)


def test_match_label_keys(attach):
    """matchLabelKeys pins the selector to the pod's own value (one revision repels only itself)."""
    anti = pod_affinity(anti_required=[term(ZONE, match={"app": "web"}, matchLabelKeys=["rev"])])
    snap = Snapshot.build(TWO_REGIONS, [on("n1", "old", {"app": "web", "rev": "1"})])
    new = incoming(anti, labels={"app": "web", "rev": "2"})
    assert all(st.ok for st in filter_nodes(InterPodAffinity(), new, snap, attach=attach).values())
    same = incoming(anti, labels={"app": "web", "rev": "1"})
    assert filter_nodes(InterPodAffinity(), same, snap, attach=attach)["n1"].reasons == (ANTI,)
    # mismatchLabelKeys: repel pods of *other* tenants.
    tenant = pod_affinity(anti_required=[term(ZONE, exprs=[expr("tenant", "Exists")], mismatchLabelKeys=["tenant"])])
    snap = Snapshot.build(TWO_REGIONS, [on("n1", "t1", {"tenant": "a"})])
    assert filter_nodes(InterPodAffinity(), incoming(tenant, labels={"tenant": "a"}), snap, attach=attach)["n1"].ok
    assert not filter_nodes(InterPodAffinity(), incoming(tenant, labels={"tenant": "b"}), snap,
                            attach=attach)["n1"].ok


def test_malformed_terms_refuse_the_pod():
    bad = incoming(pod_affinity(required=[{"labelSelector": {"matchLabels": {"app": "x"}}}]))  # no topologyKey
    st = InterPodAffinity().pre_filter(CycleState(), bad)
    assert st.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE and st.reasons[0].startswith("parsing pod: ")


def test_pods_without_affinity_skip_the_filter():
    snap = Snapshot.build(TWO_REGIONS, [on("n1", "plain", {"app": "x"})])
    state = CycleState()
    state.snapshot = snap  # type: ignore[attr-defined]
    assert InterPodAffinity().pre_filter(state, pod(labels={"app": "y"})).code is Code.SKIP


# ------------------------------------------------------------------- scoring
@pytest.mark.parametrize(("bound", "p", "want"), [
    # Preferred affinity: the region with a matching pod scores best.
    ([on("n1", "s1", {"security": "S1"}), on("n3", "s2", {"security": "S2"})],
     incoming(pod_affinity(preferred=[weighted(5, term(REGION, match={"security": "S1"}))])),
     {"n1": 100, "n2": 100, "n3": 0}),
    # Preferred anti-affinity: the opposite.
    ([on("n1", "s1", {"security": "S1"}), on("n3", "s2", {"security": "S2"})],
     incoming(pod_affinity(anti_preferred=[weighted(5, term(REGION, match={"security": "S1"}))])),
     {"n1": 0, "n2": 0, "n3": 100}),
    # Weights add up per matching pod and term: n1 5, n2 0, n3 10 + 5; then min-max normalized.
    ([on("n1", "a", {"security": "S1"}), on("n3", "c", {"security": "S2"}), on("n3", "d", {"security": "S1"})],
     incoming(pod_affinity(preferred=[weighted(5, term(ZONE, match={"security": "S1"})),
                                      weighted(10, term(REGION, match={"security": "S2"}))])),
     {"n1": 33, "n2": 0, "n3": 100}),
    # Symmetry: an existing pod's preferred affinity for the incoming pod's labels...
    ([on("n3", "fan", affinity=pod_affinity(preferred=[weighted(7, term(REGION, match={"app": "web"}))]))],
     incoming({}, labels={"app": "web"}), {"n1": 0, "n2": 0, "n3": 100}),
    # ...its preferred anti-affinity,
    ([on("n3", "foe", affinity=pod_affinity(anti_preferred=[weighted(7, term(REGION, match={"app": "web"}))]))],
     incoming({}, labels={"app": "web"}), {"n1": 100, "n2": 100, "n3": 0}),
    # ...and its required affinity (hardPodAffinityWeight).
    ([on("n1", "needy", affinity=pod_affinity(required=[term(ZONE, match={"app": "web"})]))],
     incoming({}, labels={"app": "web"}), {"n1": 100, "n2": 0, "n3": 0}),
])
def test_scoring(bound, p, want):
    assert score_nodes(InterPodAffinity(), p, Snapshot.build(TWO_REGIONS, bound)) == want


def test_scoring_skips_when_nothing_prefers_anything():
    snap = Snapshot.build(TWO_REGIONS, [on("n1", "x", {"app": "web"},
                                           affinity=pod_affinity(anti_required=[term(ZONE, match={"a": "b"})]))])
    assert score_nodes(InterPodAffinity(), pod(labels={"app": "web"}), snap) is None


def test_scoring_args():
    needy = on("n1", "needy", affinity=pod_affinity(required=[term(ZONE, match={"app": "web"})]))
    snap = Snapshot.build(TWO_REGIONS, [needy])
    web = pod(labels={"app": "web"})
    assert score_nodes(InterPodAffinity(hard_pod_affinity_weight=0), web, snap) is None
    fan = on("n3", "fan", affinity=pod_affinity(preferred=[weighted(7, term(REGION, match={"app": "web"}))]))
    snap.set_pod(fan)
    plugin = InterPodAffinity.from_args({"ignorePreferredTermsOfExistingPods": True})
    assert score_nodes(plugin, web, snap) is None
    with pytest.raises(ValueError):
        InterPodAffinity.from_args({"hardPodAffinityWeight": 101})


# ----------------------------------------------------------- documented examples
def framework() -> Framework:
    return Framework(default_plugins(), weights=default_weights(), rng=random.Random(3))


def test_docs_redis_cache_and_web_server_colocate_one_per_node():
    """kubernetes.io: redis-cache spreads one per node; each web-server joins a cache and avoids other webs."""
    snap = Snapshot.build([node(f"node-{i}", zone="z") for i in range(1, 4)])
    fw = framework()
    cache_affinity = pod_affinity(anti_required=[term(HOSTNAME, exprs=[expr("app", "In", "store")])])
    web_affinity = pod_affinity(anti_required=[term(HOSTNAME, exprs=[expr("app", "In", "web-store")])],
                                required=[term(HOSTNAME, exprs=[expr("app", "In", "store")])])
    placed: dict[str, list[str]] = {}
    for i in range(3):
        p = pod(f"redis-cache-{i}", labels={"app": "store"}, affinity=cache_affinity)
        n = fw.schedule(p, snap).node
        p["spec"]["nodeName"] = n
        snap.set_pod(p)
        placed.setdefault(n, []).append("cache")
    for i in range(3):
        p = pod(f"web-server-{i}", labels={"app": "web-store"}, affinity=web_affinity)
        n = fw.schedule(p, snap).node
        p["spec"]["nodeName"] = n
        snap.set_pod(p)
        placed.setdefault(n, []).append("web")
    assert {n: sorted(kinds) for n, kinds in placed.items()} == {
        f"node-{i}": ["cache", "web"] for i in range(1, 4)}
    # A fourth web server has nowhere to go; a fourth cache neither.
    with pytest.raises(FitError) as exc:
        fw.schedule(pod("web-server-3", labels={"app": "web-store"}, affinity=web_affinity), snap)
    assert str(exc.value) == f"0/3 nodes are available: 3 {ANTI}."
    with pytest.raises(FitError) as exc:
        fw.schedule(pod("redis-cache-3", labels={"app": "store"}, affinity=cache_affinity), snap)
    assert str(exc.value) == f"0/3 nodes are available: 3 {ANTI}."


def test_docs_pod_with_pod_affinity():
    """kubernetes.io pod-with-pod-affinity.yaml: required S1 in the zone, preferably no S2 in the zone."""
    nodes = [node("v1", zone="V"), node("v2", zone="V"), node("w1", zone="W"), node("w2", zone="W"),
             node("x1", zone="X")]
    bound = [on("v1", "s1-v", {"security": "S1"}), on("w1", "s1-w", {"security": "S1"}),
             on("w2", "s2-w", {"security": "S2"})]
    snap = Snapshot.build(nodes, bound)
    affinity = pod_affinity(required=[term(ZONE, exprs=[expr("security", "In", "S1")])],
                            anti_preferred=[weighted(100, term(ZONE, exprs=[expr("security", "In", "S2")]))])
    p = pod("with-pod-affinity", affinity=affinity)
    # Zone X has no S1 pod; zone W has one, but also an S2 pod, which the preference avoids.
    statuses = filter_nodes(InterPodAffinity(), p, snap)
    assert {n for n, st in statuses.items() if st.ok} == {"v1", "v2", "w1", "w2"}
    assert score_nodes(InterPodAffinity(), p, snap, ["v1", "v2", "w1", "w2"]) == {
        "v1": 100, "v2": 100, "w1": 0, "w2": 0}
    fw = framework()
    assert fw.schedule(p, snap).node in {"v1", "v2"}
    # Without any S1 pod in the cluster the pod cannot run (it does not match its own term).
    snap = Snapshot.build(nodes, [bound[2]])
    with pytest.raises(FitError) as exc:
        fw.schedule(pod("with-pod-affinity", affinity=affinity), snap)
    assert str(exc.value) == f"0/5 nodes are available: 5 {AFFINITY}."
    assert exc.value.unresolvable


def test_anti_affinity_places_one_per_node_then_refuses():
    snap = Snapshot.build([node(f"n{i}", zone=f"z{i % 2}") for i in range(4)])
    fw = framework()
    anti = pod_affinity(anti_required=[term(HOSTNAME, match={"app": "db"})])
    nodes = []
    for i in range(4):
        p = pod(f"db-{i}", labels={"app": "db"}, affinity=anti)
        p["spec"]["nodeName"] = fw.schedule(p, snap).node
        snap.set_pod(p)
        nodes.append(p["spec"]["nodeName"])
    assert sorted(nodes) == ["n0", "n1", "n2", "n3"]
    with pytest.raises(FitError) as exc:
        fw.schedule(pod("db-4", labels={"app": "db"}, affinity=anti), snap)
    assert str(exc.value) == f"0/4 nodes are available: 4 {ANTI}."
    # A plain pod that happens to match is kept away by symmetry only where
    # existing pods' anti-affinity matches it.
    with pytest.raises(FitError) as exc:
        fw.schedule(pod("intruder", labels={"app": "db"}), snap)
    assert str(exc.value) == f"0/4 nodes are available: 4 {EXISTING}."
    # Deleting one frees its node.
    snap.remove_pod("default/db-2")
    assert fw.schedule(pod("db-4", labels={"app": "db"}, affinity=anti), snap).node == nodes[2]


def test_preemption_extensions_update_counts():
    """add_pod/remove_pod adjust the cycle's counts without touching the snapshot's."""
    victim = on("n1", "victim", {"app": "db"})
    snap = Snapshot.build(TWO_REGIONS, [victim])
    plugin = InterPodAffinity()
    p = incoming(pod_affinity(anti_required=[term(ZONE, match={"app": "db"})]))
    state = CycleState()
    state.snapshot = snap  # type: ignore[attr-defined]
    assert plugin.pre_filter(state, p).ok
    n1 = snap.get("n1")
    assert n1 is not None
    assert plugin.filter(state, p, n1).reasons == (ANTI,)
    plugin.remove_pod(state, p, victim, n1)
    assert plugin.filter(state, p, n1).ok
    plugin.add_pod(state, p, victim, n1)
    assert plugin.filter(state, p, n1).reasons == (ANTI,)
    # The snapshot's own counts are untouched.
    fresh = CycleState()
    fresh.snapshot = snap  # type: ignore[attr-defined]
    plugin.pre_filter(fresh, p)
    assert plugin.filter(fresh, p, n1).reasons == (ANTI,)
