"""The snapshot's incremental indexes agree with a snapshot built from scratch.

InterPodAffinity and PodTopologySpread read counts the Snapshot maintains as
pods, nodes and namespaces change.  Here random sequences of changes are
applied to one long-lived snapshot, and after each step both plugins must
decide exactly as they do on a snapshot freshly built from the same objects.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from fleet.scheduler import snapshot as snapshot_module
from fleet.scheduler.affinity import parse_selector
from fleet.scheduler.plugins import InterPodAffinity, PodTopologySpread
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
    spread,
    term,
    weighted,
)

APPS = ["web", "db", "cache"]
NAMESPACES = ["default", "team"]


def random_node(rng: random.Random, name: str) -> dict[str, Any]:
    labels = {"rack": f"r{rng.randrange(3)}"} if rng.random() < 0.8 else {}
    zone = f"z{rng.randrange(3)}" if rng.random() < 0.9 else None
    return node(name, zone=zone, labels=labels)


def random_affinity(rng: random.Random) -> dict[str, Any] | None:
    roll = rng.random()
    key = rng.choice([HOSTNAME, ZONE, "rack"])
    t = term(key, match={"app": rng.choice(APPS)})
    if roll < 0.2:
        return pod_affinity(anti_required=[t])
    if roll < 0.3:
        return pod_affinity(required=[t])
    if roll < 0.45:
        return pod_affinity(preferred=[weighted(rng.randint(1, 9), t)])
    if roll < 0.55:
        return pod_affinity(anti_preferred=[weighted(rng.randint(1, 9), t)])
    if roll < 0.6:
        t["namespaceSelector"] = {"matchLabels": {"tier": "x"}}
        return pod_affinity(anti_required=[t])
    return None


def random_pod(rng: random.Random, name: str, nodes: list[str]) -> dict[str, Any]:
    ns = rng.choice(NAMESPACES)
    aff = random_affinity(rng)
    spec: dict[str, Any] = {"affinity": aff} if aff else {}
    return pod(name, namespace=ns, node_name=rng.choice(nodes), labels={"app": rng.choice(APPS)},
               deleting=rng.random() < 0.05, **spec)


QUERIES = [
    pod("q1", labels={"app": "web"}, affinity=pod_affinity(anti_required=[term(HOSTNAME, match={"app": "web"})])),
    pod("q2", labels={"app": "db"}, affinity=pod_affinity(required=[term(ZONE, match={"app": "cache"})],
                                                           preferred=[weighted(3, term("rack", match={"app": "db"}))])),
    pod("q3", namespace="team", labels={"app": "cache"},
        affinity=pod_affinity(anti_preferred=[weighted(5, term(ZONE, match={"app": "web"},
                                                                namespaceSelector={}))])),
    pod("q4", labels={"app": "web"}, topologySpreadConstraints=[spread(1, ZONE, {"app": "web"}),
                                                                spread(2, "rack", {"app": "web"},
                                                                       when="ScheduleAnyway")]),
    pod("q5", labels={"app": "db"}, owner="ReplicaSet"),
    pod("q6", labels={"app": "web"}, nodeSelector={"rack": "r1"},
        topologySpreadConstraints=[spread(1, ZONE, {"app": "web"}), spread(1, HOSTNAME, {"app": "web"},
                                                                            when="ScheduleAnyway")]),
]


def decisions(snap: Snapshot) -> list[Any]:
    out = []
    for q in QUERIES:
        for plugin in (InterPodAffinity(), PodTopologySpread()):
            statuses = filter_nodes(plugin, q, snap)
            out.append({n: st.reasons for n, st in statuses.items()})
            out.append(score_nodes(plugin, q, snap))
    return out


@pytest.mark.parametrize("cache_size", [256, 2], ids=["cache", "tiny-cache"])
@pytest.mark.parametrize("seed", range(10))
def test_incremental_indexes_match_a_fresh_snapshot(seed, cache_size, monkeypatch):
    # A tiny query cache forces evictions and rebuilds mid-sequence.
    monkeypatch.setattr(snapshot_module, "MATCH_CACHE_SIZE", cache_size)
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(6)]
    nodes = {n: random_node(rng, n) for n in names}
    namespaces = {ns: namespace(ns) for ns in NAMESPACES}
    pods: dict[str, dict[str, Any]] = {}
    snap = Snapshot.build(nodes.values(), namespaces=namespaces.values())
    for step in range(60):
        roll = rng.random()
        if roll < 0.5 or not pods:
            p = random_pod(rng, f"p{step}", names)
            pods[f"{p['metadata']['namespace']}/{p['metadata']['name']}"] = p
            snap.set_pod(p)
        elif roll < 0.7:
            key = rng.choice(sorted(pods))
            del pods[key]
            snap.remove_pod(key)
        elif roll < 0.8:
            n = rng.choice(names)
            nodes[n] = random_node(rng, n)
            snap.set_node(nodes[n])
        elif roll < 0.87:
            n = rng.choice(names)
            if n in nodes:
                del nodes[n]
                snap.remove_node(n)
            else:
                nodes[n] = random_node(rng, n)
                snap.set_node(nodes[n])
        elif roll < 0.93:
            ns = rng.choice(NAMESPACES)
            namespaces[ns] = namespace(ns, **({"tier": "x"} if rng.random() < 0.5 else {}))
            snap.set_namespace(namespaces[ns])
        else:
            key = rng.choice(sorted(pods))
            p = copy.deepcopy(pods[key])  # informers deliver a new object per update
            p["metadata"].setdefault("labels", {})["app"] = rng.choice(APPS)
            pods[key] = p
            snap.set_pod(p)
        if step % 5 == 4:
            fresh = Snapshot.build(nodes.values(), pods.values(), namespaces=namespaces.values())
            assert decisions(snap) == decisions(fresh), f"step {step}"
            # The raw aggregates agree too.
            for key in (ZONE, "rack", HOSTNAME):
                assert snap.label_values(key) == fresh.label_values(key)
            sel = parse_selector({"matchLabels": {"app": "web"}})
            clauses = ((frozenset(NAMESPACES), sel),)
            assert snap.match_count(clauses).per_node == fresh.match_count(clauses).per_node
            assert snap.match_count(clauses).topology(ZONE) == fresh.match_count(clauses).topology(ZONE)


def test_node_info_copies_never_copy_the_snapshot():
    snap = Snapshot.build([node("a")], [pod("x", "1", node_name="a", labels={"app": "web"})])
    info = snap.get("a")
    assert info is not None
    deep = copy.deepcopy(info)
    assert deep.snapshot is snap and deep.pods == info.pods and deep.pods is not info.pods
    trial = info.clone()
    trial.remove_pod("default/x")  # a what-if on the clone...
    assert trial.requested == {"cpu": 0} and info.requested == {"cpu": 1000}  # ...leaves the original alone
    assert set(info.pods) == {"default/x"}
