"""The Deployment controller's decision (`plan`) — pure, table-driven.

`Cluster` below plays the rest of the control plane around `plan`: it applies a
plan's writes to its ReplicaSets and stands in for the ReplicaSet controller by
setting their status (pods of a template whose image is "bad" never become ready).
Time is an explicit `now`, so progress deadlines are tested without sleeping.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from fleet.controllers.deployment_plan import failed_create_status, plan
from fleet.controllers.deployment_util import (
    DESIRED_REPLICAS,
    HASH_LABEL,
    MAX_REPLICAS,
    REVISION,
    REVISION_HISTORY,
    equal_ignore_hash,
    max_surge,
    max_unavailable,
    resolve_fenceposts,
    scaled_value,
    template_hash,
)
from fleet.controllers.replicaset import rfc3339

T0 = 1_800_000_000.0
D_UID = "d-uid"


def deployment(replicas: int = 3, *, image: str = "v1", strategy: str = "RollingUpdate",
               surge: Any = 1, unavailable: Any = 0, paused: bool = False, pds: int | None = 600,
               history: int | None = 10, generation: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
                     "spec": {"containers": [{"name": "c", "image": image}]}},
        "strategy": {"type": strategy},
        "minReadySeconds": 0,
    }
    if strategy == "RollingUpdate":
        spec["strategy"]["rollingUpdate"] = {"maxSurge": surge, "maxUnavailable": unavailable}
    if paused:
        spec["paused"] = True
    if pds is not None:
        spec["progressDeadlineSeconds"] = pds
    if history is not None:
        spec["revisionHistoryLimit"] = history
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": D_UID, "generation": generation},
            "spec": spec, "status": {}}


class Cluster:
    """ReplicaSets in memory, `plan` applied to them, pods simulated by counts."""

    def __init__(self, d: dict[str, Any], now: float = T0) -> None:
        self.d = d
        self.now = now
        self.rses: dict[str, dict[str, Any]] = {}
        self.events: list[str] = []
        self.uids = itertools.count(1)
        self.history: list[dict[str, int]] = []
        self.terminating: dict[str, int] = {}  # old pods still shutting down (Recreate)

    def change(self, **spec: Any) -> None:
        """Edit the Deployment's spec as a user would (a new generation)."""
        self.d = copy.deepcopy(self.d)
        for k, v in spec.items():
            if k == "image":
                self.d["spec"]["template"]["spec"]["containers"][0]["image"] = v
            else:
                self.d["spec"][k] = v
        self.d["metadata"]["generation"] += 1

    def step(self, dt: float = 1.0) -> Any:
        self.now += dt
        pods = []
        for name, n in self.terminating.items():
            uid = self.rses[name]["metadata"]["uid"] if name in self.rses else "gone"
            pods += [{"metadata": {"ownerReferences": [{"uid": uid, "controller": True}]},
                      "status": {"phase": "Running"}}] * n
        p = plan(self.d, list(self.rses.values()), pods, now=self.now)
        if p.create is not None:
            rs = copy.deepcopy(p.create.rs)
            rs["metadata"]["uid"] = f"rs-{next(self.uids)}"
            rs["metadata"]["generation"] = 1
            rs["status"] = {}
            self.rses[rs["metadata"]["name"]] = rs
        for w in p.update:
            rs = copy.deepcopy(w.rs)
            if rs["spec"] != self.rses[rs["metadata"]["name"]]["spec"]:
                rs["metadata"]["generation"] = rs["metadata"].get("generation", 1) + 1
            self.rses[rs["metadata"]["name"]] = rs
        for rs in p.delete:
            del self.rses[rs["metadata"]["name"]]
        if p.annotations:
            self.d = copy.deepcopy(self.d)
            self.d["metadata"].setdefault("annotations", {}).update(p.annotations)
        if p.status is not None:
            self.d = copy.deepcopy(self.d)
            self.d["status"] = p.status
        self.events += [e[2] for e in p.events] + [w.event for w in p.update if w.event]
        return p

    def settle_pods(self) -> None:
        """The ReplicaSet controller's part: pods exist, and are available unless "bad"."""
        for rs in self.rses.values():
            n = rs["spec"]["replicas"]
            good = rs["spec"]["template"]["spec"]["containers"][0]["image"] != "bad"
            rs["status"] = {"replicas": n, "readyReplicas": n if good else 0,
                            "availableReplicas": n if good else 0,
                            "observedGeneration": rs["metadata"].get("generation", 1)}
        self.history.append(self.sizes())

    def sizes(self) -> dict[str, int]:
        return {self.image(rs): rs["spec"]["replicas"] for rs in self.rses.values()}

    @staticmethod
    def image(rs: dict[str, Any]) -> str:
        return rs["spec"]["template"]["spec"]["containers"][0]["image"]

    def available(self) -> int:
        return sum(rs["status"].get("availableReplicas", 0) for rs in self.rses.values())

    def total(self) -> int:
        return sum(rs["spec"]["replicas"] for rs in self.rses.values())

    def run(self, steps: int = 50) -> None:
        """Alternate controller passes and pod updates until nothing changes."""
        for _ in range(steps):
            p = self.step()
            self.settle_pods()
            if p.create is None and not p.update and not p.delete and p.status is None:
                return
        raise AssertionError(f"no steady state after {steps} passes: {self.history[-5:]}")

    def cond(self, ctype: str) -> dict[str, Any] | None:
        for c in self.d["status"].get("conditions", []):
            if c["type"] == ctype:
                return c
        return None

    def rs_for(self, image: str) -> dict[str, Any]:
        (rs,) = [rs for rs in self.rses.values() if self.image(rs) == image]
        return rs


# ---------------------------------------------------------------------------------------
# Arithmetic


@pytest.mark.parametrize(("value", "total", "up", "want"), [
    (2, 10, True, 2), (0, 10, False, 0), ("25%", 10, True, 3), ("25%", 10, False, 2),
    ("25%", 3, True, 1), ("25%", 3, False, 0), ("100%", 7, False, 7), ("0%", 7, True, 0),
    ("50%", 1, True, 1), ("50%", 1, False, 0), (None, 5, True, 0), ("33%", 100, True, 33),
])
def test_scaled_value(value: Any, total: int, up: bool, want: int) -> None:
    assert scaled_value(value, total, up) == want


@pytest.mark.parametrize(("surge", "unavailable", "desired", "want"), [
    ("25%", "25%", 4, (1, 1)),
    ("25%", "25%", 3, (1, 0)),    # surge rounds up, unavailable down
    ("25%", "25%", 1, (1, 0)),
    ("0%", "25%", 3, (0, 1)),     # both resolve to 0: unavailable becomes 1
    (0, "10%", 5, (0, 1)),
    (2, 0, 10, (2, 0)),
    ("50%", "50%", 5, (3, 2)),
    ("100%", 0, 3, (3, 0)),
])
def test_resolve_fenceposts(surge: Any, unavailable: Any, desired: int, want: tuple[int, int]) -> None:
    assert resolve_fenceposts(surge, unavailable, desired) == want


def test_max_surge_and_unavailable_by_strategy() -> None:
    d = deployment(4, surge="25%", unavailable="25%")
    assert (max_surge(d), max_unavailable(d)) == (1, 1)
    assert (max_surge(deployment(4, strategy="Recreate")),
            max_unavailable(deployment(4, strategy="Recreate"))) == (0, 0)
    assert max_unavailable(deployment(0, unavailable=5)) == 0
    assert max_unavailable(deployment(2, unavailable=5)) == 2  # never more than replicas


# ---------------------------------------------------------------------------------------
# Hashes and templates


def test_template_hash_shape_and_collision_count() -> None:
    t = deployment()["spec"]["template"]
    h = template_hash(t)
    assert h and set(h) <= set("bcdfghjklmnpqrstvwxz2456789") and len(h) <= 10
    assert template_hash(copy.deepcopy(t)) == h  # stable
    assert template_hash(t, 0) != h and template_hash(t, 1) != template_hash(t, 0)
    other = copy.deepcopy(t)
    other["spec"]["containers"][0]["image"] = "v2"
    assert template_hash(other) != h
    # "absent" and "empty" are the same template
    t2 = copy.deepcopy(t)
    t2["metadata"]["annotations"] = {}
    assert template_hash(t2) == h


def test_equal_ignore_hash() -> None:
    t = deployment()["spec"]["template"]
    labeled = copy.deepcopy(t)
    labeled["metadata"]["labels"][HASH_LABEL] = "abc"
    assert equal_ignore_hash(t, labeled)
    labeled["metadata"]["labels"]["extra"] = "x"
    assert not equal_ignore_hash(t, labeled)


# ---------------------------------------------------------------------------------------
# A new Deployment


@pytest.mark.parametrize("strategy", ["RollingUpdate", "Recreate"])
def test_new_deployment_creates_its_replicaset(strategy: str) -> None:
    c = Cluster(deployment(3, strategy=strategy))
    p = c.step()
    assert p.create is not None
    rs = p.create.rs
    h = template_hash(deployment()["spec"]["template"])
    assert rs["metadata"]["name"] == f"web-{h}"
    assert rs["metadata"]["labels"] == {"app": "web", HASH_LABEL: h}
    assert rs["spec"]["selector"] == {"matchLabels": {"app": "web", HASH_LABEL: h}}
    assert rs["spec"]["template"]["metadata"]["labels"] == {"app": "web", HASH_LABEL: h}
    assert rs["spec"]["replicas"] == 3
    ref = rs["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == \
        ("Deployment", D_UID, True, True)
    ann = rs["metadata"]["annotations"]
    assert ann[REVISION] == "1" and ann[DESIRED_REPLICAS] == "3"
    assert ann[MAX_REPLICAS] == ("4" if strategy == "RollingUpdate" else "3")
    assert p.annotations == {REVISION: "1"}
    assert c.events == [f"Scaled up replica set web-{h} from 0 to 3"]
    assert c.cond("Progressing")["reason"] == "NewReplicaSetCreated"
    assert c.d["status"]["observedGeneration"] == 1
    c.settle_pods()
    c.run()
    st = c.d["status"]
    assert (st["replicas"], st["updatedReplicas"], st["readyReplicas"], st["availableReplicas"]) == \
        (3, 3, 3, 3)
    assert "unavailableReplicas" not in st  # zero counts are omitted, as the API does
    assert c.cond("Progressing")["reason"] == "NewReplicaSetAvailable"
    assert c.cond("Progressing")["message"] == f'ReplicaSet "web-{h}" has successfully progressed.'
    assert c.cond("Available")["status"] == "True"
    assert c.cond("Available")["reason"] == "MinimumReplicasAvailable"


def test_user_annotations_are_copied_to_the_replicaset_but_not_kubectls() -> None:
    d = deployment()
    d["metadata"]["annotations"] = {"kubernetes.io/change-cause": "first",
                                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                                    REVISION: "7"}
    p = plan(d, [], now=T0)
    ann = p.create.rs["metadata"]["annotations"]
    assert ann["kubernetes.io/change-cause"] == "first"
    assert "kubectl.kubernetes.io/last-applied-configuration" not in ann
    assert ann[REVISION] == "1"


# ---------------------------------------------------------------------------------------
# Rolling updates


@pytest.mark.parametrize(("replicas", "surge", "unavailable"), [
    (3, 1, 0), (3, 0, 1), (3, "25%", "25%"), (10, "25%", "25%"), (10, 3, 2), (5, "100%", 0),
    (4, 0, "50%"), (1, 1, 0), (1, 0, 1), (7, "30%", "10%"),
])
def test_rolling_update_respects_surge_and_unavailable(replicas: int, surge: Any,
                                                       unavailable: Any) -> None:
    c = Cluster(deployment(replicas, surge=surge, unavailable=unavailable))
    c.run()
    c.change(image="v2")
    s, u = resolve_fenceposts(surge, unavailable, replicas)
    for _ in range(100):
        p = c.step()
        # Pods start only after the pass: what was just planned must already fit.
        assert c.total() <= replicas + s, c.sizes()
        c.settle_pods()
        assert c.available() >= replicas - u, c.sizes()
        if p.create is None and not p.update and p.status is None:
            break
    assert c.sizes() == {"v1": 0, "v2": replicas}
    st = c.d["status"]
    assert st["updatedReplicas"] == replicas and st["availableReplicas"] == replicas
    assert st["observedGeneration"] == 2
    assert c.cond("Progressing")["reason"] == "NewReplicaSetAvailable"
    assert c.d["metadata"]["annotations"][REVISION] == "2"
    assert c.rs_for("v2")["metadata"]["annotations"][REVISION] == "2"


def test_rolling_update_steps_max_unavailable_zero() -> None:
    c = Cluster(deployment(3, surge=1, unavailable=0))
    c.run()
    c.change(image="v2")
    c.history.clear()
    c.run()
    # Up one, down one, ... never below 3 available, never above 4 pods.
    assert c.history[:7] == [
        {"v1": 3, "v2": 1}, {"v1": 2, "v2": 1}, {"v1": 2, "v2": 2}, {"v1": 1, "v2": 2},
        {"v1": 1, "v2": 3}, {"v1": 0, "v2": 3}, {"v1": 0, "v2": 3}]
    name1, name2 = c.rs_for("v1")["metadata"]["name"], c.rs_for("v2")["metadata"]["name"]
    assert c.events[1:] == [
        f"Scaled up replica set {name2} from 0 to 1", f"Scaled down replica set {name1} from 3 to 2",
        f"Scaled up replica set {name2} from 1 to 2", f"Scaled down replica set {name1} from 2 to 1",
        f"Scaled up replica set {name2} from 2 to 3", f"Scaled down replica set {name1} from 1 to 0"]


def test_progressing_condition_reasons_through_a_rollout() -> None:
    c = Cluster(deployment(2, surge=1, unavailable=0))
    c.run()
    c.change(image="v2")
    c.step()
    assert c.cond("Progressing")["reason"] == "NewReplicaSetCreated"
    assert c.cond("Progressing")["message"].startswith('Created new replica set "web-')
    c.settle_pods()
    c.step()
    assert c.cond("Progressing")["reason"] == "ReplicaSetUpdated"
    assert c.cond("Progressing")["message"].endswith('is progressing.')
    c.settle_pods()
    c.run()
    assert c.cond("Progressing")["reason"] == "NewReplicaSetAvailable"
    assert c.cond("Progressing")["status"] == "True"


def test_rollout_with_unready_new_pods_stalls_and_times_out() -> None:
    c = Cluster(deployment(3, surge="25%", unavailable="25%", pds=30))  # surge 1, unavailable 0
    c.run()
    c.change(image="bad")
    for _ in range(5):
        c.step()
        c.settle_pods()
    assert c.sizes() == {"v1": 3, "bad": 1}  # the old replicas stay: maxUnavailable rounds to 0
    assert c.available() == 3
    cond = c.cond("Progressing")
    assert cond["status"] == "True"
    p = c.step(dt=0)
    # It asks to look again when the deadline would fall.
    assert p.requeue_after is not None and 20 < p.requeue_after <= 31
    c.step(dt=p.requeue_after)
    cond = c.cond("Progressing")
    assert (cond["status"], cond["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert cond["message"] == f'ReplicaSet "{c.rs_for("bad")["metadata"]["name"]}" has timed out progressing.'
    assert c.sizes() == {"v1": 3, "bad": 1}
    # Once timed out it stays so (no requeue needed) until a new rollout.
    assert c.step(dt=100).requeue_after is None
    assert c.cond("Progressing")["reason"] == "ProgressDeadlineExceeded"
    c.change(image="v3")
    c.run()
    assert c.sizes() == {"v1": 0, "bad": 0, "v3": 3}
    assert c.cond("Progressing")["reason"] == "NewReplicaSetAvailable"


def test_no_progress_deadline_means_no_progressing_condition() -> None:
    c = Cluster(deployment(2, pds=2 ** 31 - 1))
    c.run()
    assert c.cond("Progressing") is None
    assert c.cond("Available")["status"] == "True"


def test_unhealthy_old_replicas_are_removed_first() -> None:
    c = Cluster(deployment(4, surge=0, unavailable=1))
    c.run()
    c.change(image="bad")
    c.run()  # stuck: one bad pod (unavailable), three good
    assert c.sizes() == {"v1": 3, "bad": 1}
    c.change(image="v3")
    p = c.step()
    # The bad ReplicaSet's unavailable pod goes first: it costs no availability.
    assert c.sizes()["bad"] == 0, c.sizes()
    assert p.update
    c.settle_pods()
    c.run()
    assert c.sizes() == {"v1": 0, "bad": 0, "v3": 4}


def test_available_condition_false_below_minimum() -> None:
    c = Cluster(deployment(4, surge=1, unavailable=1))
    c.run()
    for rs in c.rses.values():
        rs["status"]["availableReplicas"] = 2
    c.step()
    cond = c.cond("Available")
    assert (cond["status"], cond["reason"]) == ("False", "MinimumReplicasUnavailable")
    assert c.d["status"]["unavailableReplicas"] == 2


# ---------------------------------------------------------------------------------------
# Recreate


def test_recreate_scales_down_waits_for_old_pods_then_creates() -> None:
    c = Cluster(deployment(3, strategy="Recreate"))
    c.run()
    c.change(image="v2")
    p = c.step()
    assert p.create is None and c.sizes() == {"v1": 0}
    old_name = c.rs_for("v1")["metadata"]["name"]
    # The old pods are terminating: nothing new yet.
    c.terminating[old_name] = 2
    c.settle_pods()
    p = c.step()
    assert p.create is None
    c.terminating.clear()
    p = c.step()
    assert p.create is not None and p.create.rs["spec"]["replicas"] == 3
    c.settle_pods()
    c.run()
    assert c.sizes() == {"v1": 0, "v2": 3}
    assert c.cond("Progressing")["reason"] == "NewReplicaSetAvailable"


def test_recreate_waits_for_old_replicaset_status() -> None:
    c = Cluster(deployment(2, strategy="Recreate"))
    c.run()
    c.change(image="v2")
    c.step()  # scaled to 0, status still says 2 pods
    assert c.step().create is None
    c.settle_pods()
    assert c.step().create is not None


# ---------------------------------------------------------------------------------------
# Scaling (proportional while a rollout is in progress)


def test_scale_when_steady_resizes_the_only_replicaset() -> None:
    c = Cluster(deployment(3))
    c.run()
    c.change(replicas=5)
    c.step()
    assert c.sizes() == {"v1": 5}
    rs = c.rs_for("v1")
    assert rs["metadata"]["annotations"][DESIRED_REPLICAS] == "5"
    assert rs["metadata"]["annotations"][MAX_REPLICAS] == "6"
    c.change(replicas=0)
    c.run()
    assert c.sizes() == {"v1": 0}
    assert "replicas" not in c.d["status"]


def test_scale_mid_rollout_is_proportional() -> None:
    c = Cluster(deployment(10, surge=3, unavailable=2))
    c.run()
    c.change(image="bad")  # stuck mid-way: old 8, new 5
    c.run()
    assert c.sizes() == {"v1": 8, "bad": 5}
    c.change(replicas=20)
    c.step()
    # 13 of max 13 become 23 of max 23: +10 shared by size (8 → 14, 5 → 9).
    assert c.sizes() == {"v1": 14, "bad": 9}
    assert sum(c.sizes().values()) == 23


def test_scale_down_mid_rollout_is_proportional() -> None:
    c = Cluster(deployment(10, surge=3, unavailable=2))
    c.run()
    c.change(image="bad")
    c.run()
    c.change(replicas=5)
    c.step()
    # 13 of max 13 become 8 of max 8 (5 + surge 3): -5 shared by size, rounded.
    assert c.sizes() == {"v1": 5, "bad": 3}


# ---------------------------------------------------------------------------------------
# Pause / resume, restart, rollback, history


def test_paused_deployment_does_not_roll_out_but_scales() -> None:
    c = Cluster(deployment(3))
    c.run()
    c.change(paused=True)
    c.step()
    cond = c.cond("Progressing")
    assert (cond["status"], cond["reason"], cond["message"]) == \
        ("Unknown", "DeploymentPaused", "Deployment is paused")
    c.change(image="v2")
    c.run()
    assert c.sizes() == {"v1": 3}  # no new ReplicaSet while paused
    assert c.d["status"]["observedGeneration"] == c.d["metadata"]["generation"]
    c.change(replicas=4)
    c.run()
    assert c.sizes() == {"v1": 4}
    p = c.step(dt=10_000)
    assert p.requeue_after is None  # no deadline runs while paused
    c.change(paused=False)
    c.step()
    # Resumed, and at once a new ReplicaSet for the template edited while paused.
    assert c.cond("Progressing")["reason"] == "NewReplicaSetCreated"
    c.settle_pods()
    c.run()
    assert c.sizes() == {"v1": 0, "v2": 4}


def test_restart_is_a_template_change() -> None:
    c = Cluster(deployment(2))
    c.run()
    c.d = copy.deepcopy(c.d)
    c.d["spec"]["template"]["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"}
    c.d["metadata"]["generation"] += 1
    c.run()
    assert len(c.rses) == 2
    assert sorted(rs["spec"]["replicas"] for rs in c.rses.values()) == [0, 2]


def test_rollback_reuses_the_old_replicaset_with_a_new_revision() -> None:
    c = Cluster(deployment(2))
    c.run()
    c.change(image="v2")
    c.run()
    v1 = c.rs_for("v1")
    assert v1["metadata"]["annotations"][REVISION] == "1"
    # kubectl rollout undo: the old ReplicaSet's template (without the hash) goes back.
    template = copy.deepcopy(v1["spec"]["template"])
    del template["metadata"]["labels"][HASH_LABEL]
    c.d = copy.deepcopy(c.d)
    c.d["spec"]["template"] = template
    c.d["metadata"]["generation"] += 1
    p = c.step()
    assert p.create is None  # no third ReplicaSet
    c.settle_pods()
    c.run()
    assert len(c.rses) == 2 and c.sizes() == {"v1": 2, "v2": 0}
    ann = c.rs_for("v1")["metadata"]["annotations"]
    assert ann[REVISION] == "3" and ann[REVISION_HISTORY] == "1"
    assert c.d["metadata"]["annotations"][REVISION] == "3"
    # And forward again: v2 becomes revision 4, remembering 2.
    c.change(image="v2")
    c.run()
    ann = c.rs_for("v2")["metadata"]["annotations"]
    assert ann[REVISION] == "4" and ann[REVISION_HISTORY] == "2"


def test_revision_history_limit_deletes_oldest_empty_replicasets() -> None:
    c = Cluster(deployment(1, history=2))
    c.run()
    for image in ("v2", "v3", "v4", "v5"):
        c.change(image=image)
        c.run()
    kept = sorted((int(rs["metadata"]["annotations"][REVISION]), c.image(rs))
                  for rs in c.rses.values())
    assert kept == [(3, "v3"), (4, "v4"), (5, "v5")]


def test_history_limit_zero_keeps_only_the_current() -> None:
    c = Cluster(deployment(1, history=0))
    c.run()
    c.change(image="v2")
    c.run()
    assert [c.image(rs) for rs in c.rses.values()] == ["v2"]


def test_paused_deployment_cleans_up_history() -> None:
    c = Cluster(deployment(1, history=5))
    c.run()
    for image in ("v2", "v3"):
        c.change(image=image)
        c.run()
    c.change(paused=True)
    c.change(revisionHistoryLimit=0)
    c.run()
    assert [c.image(rs) for rs in c.rses.values()] == ["v3"]


# ---------------------------------------------------------------------------------------
# Ownership, collisions, failures


def test_adopts_matching_orphan_and_releases_mismatched() -> None:
    d = deployment(2)
    h = template_hash(d["spec"]["template"])
    orphan = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
              "metadata": {"name": f"web-{h}", "namespace": "ns", "uid": "o1",
                           "labels": {"app": "web", HASH_LABEL: h},
                           "creationTimestamp": rfc3339(T0 - 100)},
              "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web", HASH_LABEL: h}},
                       "template": {**copy.deepcopy(d["spec"]["template"]),
                                    "metadata": {"labels": {"app": "web", HASH_LABEL: h}}}},
              "status": {"replicas": 2, "availableReplicas": 2}}
    stray = {"metadata": {"name": "stray", "namespace": "ns", "uid": "s1", "labels": {"app": "other"},
                          "ownerReferences": [{"uid": D_UID, "controller": True, "kind": "Deployment"}]},
             "spec": {"replicas": 0, "template": {}}}
    foreign = {"metadata": {"name": "theirs", "namespace": "ns", "uid": "f1", "labels": {"app": "web"},
                            "ownerReferences": [{"uid": "other", "controller": True}]},
               "spec": {"replicas": 1, "template": {}}}
    p = plan(d, [orphan, stray, foreign], now=T0)
    assert [rs["metadata"]["name"] for rs in p.adopt] == [f"web-{h}"]
    assert [rs["metadata"]["name"] for rs in p.release] == ["stray"]
    assert p.create is None  # the adopted one is the new ReplicaSet
    assert p.status["updatedReplicas"] == 2


def test_name_collision_bumps_collision_count() -> None:
    d = deployment(2)
    h = template_hash(d["spec"]["template"])
    squatter = {"metadata": {"name": f"web-{h}", "namespace": "ns", "uid": "x",
                             "labels": {"app": "nope"}},
                "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "nope"}}}}}
    p = plan(d, [squatter], now=T0)
    assert p.create is None and p.status["collisionCount"] == 1 and p.requeue_after == 0.0
    d["status"] = p.status
    p2 = plan(d, [squatter], now=T0 + 1)
    assert p2.create is not None
    assert p2.create.rs["metadata"]["name"] == f"web-{template_hash(d['spec']['template'], 1)}"


def test_replica_failure_is_surfaced_on_the_deployment() -> None:
    c = Cluster(deployment(2))
    c.step()
    rs = next(iter(c.rses.values()))
    rs["status"] = {"conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                    "message": "exceeded quota", "lastTransitionTime": rfc3339(T0)}]}
    c.step()
    cond = c.cond("ReplicaFailure")
    assert cond["reason"] == "FailedCreate" and cond["message"] == "exceeded quota"
    c.settle_pods()
    c.step()
    assert c.cond("ReplicaFailure") is None


def test_failed_create_status() -> None:
    d = deployment()
    st = failed_create_status(d, 'Failed to create new replica set "web-x": quota', T0)
    cond = st["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == \
        ("Progressing", "False", "ReplicaSetCreateError")
    assert failed_create_status(deployment(pds=None), "x", T0) is None


def test_deleted_deployment_only_updates_status() -> None:
    c = Cluster(deployment(2))
    c.run()
    c.d = copy.deepcopy(c.d)
    c.d["metadata"]["deletionTimestamp"] = rfc3339(T0)
    c.change(image="v2")
    p = c.step()
    assert p.create is None and not p.update and not p.adopt


def test_observed_generation_follows_the_spec() -> None:
    c = Cluster(deployment(2))
    c.run()
    c.change(replicas=3)
    c.step()
    assert c.d["status"]["observedGeneration"] == 2


def test_resume_of_a_complete_deployment() -> None:
    c = Cluster(deployment(2, pds=60))
    c.run()
    c.change(paused=True)
    c.run()
    c.change(paused=False)
    p = c.step(dt=1000)
    cond = c.cond("Progressing")
    # Complete already: resumed, and at once seen to be complete (no deadline to run).
    assert (cond["status"], cond["reason"]) == ("True", "NewReplicaSetAvailable")
    assert p.create is None and p.requeue_after is None
