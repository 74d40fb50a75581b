"""The replicationcontroller controller: the ReplicaSet machinery with the RC strategy.

Pure part (`plan` and `pod_from_template` with `kind=REPLICATION_CONTROLLER`: a map
selector, core/v1 owner references) and the loop (`ReplicationManager`) against the
in-memory API of the ReplicaSet loop tests.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio.testing

from fleet.controllers.manager import default_controllers
from fleet.controllers.replicaset import (
    REPLICA_SET,
    REPLICATION_CONTROLLER,
    ReplicationManager,
    map_selector_of,
    plan,
    pod_from_template,
    rfc3339,
)
from fleet.controllers.runtime import Context, InformerFactory
from tests.unit.controllers.test_replicaset_loop import Events, FakeAPI, active_pods

NOW = 1_800_000_000.0
RC_UID = "rc-uid"


def rc(replicas: int = 2, *, selector: Any = None, generation: int = 3) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ReplicationController",
            "metadata": {"name": "web", "namespace": "ns", "uid": RC_UID, "generation": generation},
            "spec": {"replicas": replicas,
                     "selector": {"app": "web"} if selector is None else selector,
                     "template": {"metadata": {"labels": {"app": "web", "tier": "fe"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def pod(name: str, *, labels: dict[str, str], owner: str | None = None,
        ready: bool = True) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels,
                          "creationTimestamp": rfc3339(NOW - 100), "resourceVersion": "5"}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "v1", "kind": "ReplicationController", "name": "web",
                                  "uid": owner, "controller": True}]
    return {"metadata": md, "spec": {"nodeName": "n1"},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       "lastTransitionTime": rfc3339(NOW - 50)}]}}


@pytest.mark.parametrize(("selector", "labels", "selected"), [
    ({"app": "web"}, {"app": "web", "x": "y"}, True),
    ({"app": "web", "tier": "fe"}, {"app": "web"}, False),  # every key must match (equality)
    ({"app": "web"}, {"app": "db"}, False),
    ({}, {"anything": "at-all"}, True),   # kube: an empty map selects everything (validation forbids it)
    (None, {"app": "web"}, False),        # no selector at all selects nothing
    ("app=web", {"app": "web"}, False),   # not a map: nothing
])
def test_map_selector(selector: Any, labels: dict[str, str], selected: bool) -> None:
    obj = {"spec": {"selector": selector}}
    assert map_selector_of(obj).matches(labels) is selected
    assert REPLICATION_CONTROLLER.selects(obj, {"metadata": {"labels": labels}}) is selected


def test_plan_counts_adopts_and_releases_by_map_selector() -> None:
    pods = [
        pod("owned", labels={"app": "web", "tier": "fe"}, owner=RC_UID),
        pod("stray", labels={"app": "other"}, owner=RC_UID),   # owned, no longer selected
        pod("orphan", labels={"app": "web"}),                  # selected, not fully labelled
        pod("theirs", labels={"app": "web"}, owner="someone-else"),
    ]
    p = plan(rc(3), pods, now=NOW, kind=REPLICATION_CONTROLLER)
    assert [x["metadata"]["name"] for x in p.adopt] == ["orphan"]
    assert [x["metadata"]["name"] for x in p.release] == ["stray"]
    assert p.create == 1 and p.delete == []
    assert p.status == {"replicas": 2, "fullyLabeledReplicas": 1, "readyReplicas": 2,
                        "availableReplicas": 2, "observedGeneration": 3}


def test_plan_scales_down_with_the_replicaset_ranking() -> None:
    pods = [pod(f"p{i}", labels={"app": "web", "tier": "fe"}, owner=RC_UID, ready=i != 1)
            for i in range(3)]
    p = plan(rc(2), pods, now=NOW, kind=REPLICATION_CONTROLLER)
    assert p.create == 0 and [x["metadata"]["name"] for x in p.delete] == ["p1"]  # not ready first


def test_the_replicaset_strategy_would_misread_a_map_selector() -> None:
    """Read as a LabelSelector, an RC's map has neither matchLabels nor matchExpressions —
    the empty selector, which selects every pod: the RC strategy is what keeps an RC
    from adopting its whole namespace."""
    pods = [pod("web", labels={"app": "web"}), pod("db", labels={"app": "db"})]
    assert len(plan(rc(1), pods, now=NOW, kind=REPLICA_SET).adopt) == 2
    assert [x["metadata"]["name"] for x in plan(rc(1), pods, now=NOW, kind=REPLICATION_CONTROLLER).adopt] \
        == ["web"]


def test_pod_from_template_is_owned_by_the_rc() -> None:
    body = pod_from_template(rc(), REPLICATION_CONTROLLER)
    ref = body["metadata"]["ownerReferences"][0]
    assert (ref["apiVersion"], ref["kind"], ref["name"], ref["uid"]) == \
        ("v1", "ReplicationController", "web", RC_UID)
    assert ref["controller"] is True and ref["blockOwnerDeletion"] is True
    assert body["metadata"]["generateName"] == "web-"
    assert body["metadata"]["labels"] == {"app": "web", "tier": "fe"}


def test_registered_under_kube_controller_managers_name() -> None:
    names = [c.name for c in default_controllers()]
    assert "replicationcontroller" in names and "replicaset" in names


# ---------------------------------------------------------------------------------------
# The loop


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def setup() -> tuple[FakeAPI, ReplicationManager, Events]:
    api = FakeAPI()
    ctx = Context(client=api, informers=InformerFactory(api))  # type: ignore[arg-type]
    events = Events()
    ctx.events = events
    ctl = ReplicationManager()
    ctl.setup(ctx)
    api.informers = {"replicationcontrollers": ctl.replicasets, "pods": ctl.pods}
    return api, ctl, events


async def test_loop_keeps_replicas_adopts_and_reports_status(autojump_clock: Any) -> None:
    api, ctl, events = await setup()
    obj = rc(3)
    del obj["metadata"]["uid"]
    await api.create("v1", "replicationcontrollers", obj, "ns")
    orphan = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan", "labels": {"app": "web"}},
              "spec": {}}
    await api.create("v1", "pods", orphan, "ns")
    api.flush()
    await ctl.reconcile("ns/web")
    api.flush()
    assert len(active_pods(api)) == 3
    assert events.reasons() == ["SuccessfulCreate"] * 2
    stored = api.objects[("replicationcontrollers", "ns", "web")]
    for p in active_pods(api):
        ref = p["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["uid"]) == ("ReplicationController", stored["metadata"]["uid"])
    await ctl.reconcile("ns/web")
    api.flush()
    st = ctl.replicasets.get("ns/web")["status"]
    # The adopted orphan lacks the template's `tier` label: not fully labelled.
    assert st["replicas"] == 3 and st["fullyLabeledReplicas"] == 2 and st["observedGeneration"] == 3
    # Scale down through the spec: one pod goes.
    stored["spec"]["replicas"] = 2
    api.put("replicationcontrollers", stored)
    api.flush()
    await ctl.reconcile("ns/web")
    api.flush()
    assert len(active_pods(api)) == 2 and events.reasons().count("SuccessfulDelete") == 1


async def test_loop_reports_replica_failure(autojump_clock: Any) -> None:
    api, ctl, events = await setup()
    api.fail_creates_after = 0
    await api.create("v1", "replicationcontrollers", rc(2), "ns")
    api.flush()
    with pytest.raises(Exception, match="exceeded quota"):
        await ctl.reconcile("ns/web")
    api.flush()
    cond = ctl.replicasets.get("ns/web")["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("ReplicaFailure", "True", "FailedCreate")
    assert "FailedCreate" in events.reasons()


@pytest.mark.parametrize(("verb", "resource", "subresource"), [
    # What kube 1.32's system:controller:replication-controller role grants, as the
    # controller uses it: read RCs, write their status, create/patch/delete pods, events.
    ("get", "replicationcontrollers", ""), ("list", "replicationcontrollers", ""),
    ("watch", "replicationcontrollers", ""), ("patch", "replicationcontrollers", "status"),
    ("update", "replicationcontrollers", "status"),
    ("create", "pods", ""), ("patch", "pods", ""), ("delete", "pods", ""), ("list", "pods", ""),
    ("create", "events", ""),
])
def test_controller_manager_identity_may_do_what_the_controller_does(verb: str, resource: str,
                                                                     subresource: str) -> None:
    from fleet.auth import AUTHENTICATED, KUBE_CONTROLLER_MANAGER_USER, Attributes, UserInfo
    from tests.unit.auth.test_bootstrap_policy import policy

    user = UserInfo(KUBE_CONTROLLER_MANAGER_USER, groups=(AUTHENTICATED,))
    attrs = Attributes(verb, "", "v1", resource, subresource, "ns", "web")
    assert policy().authorize(user, attrs).allowed
