"""Local APIServices (kube-apiserver's autoregistration) and the group order of discovery."""

from __future__ import annotations

import copy
from pathlib import Path

from fleet.api.registry import default_registry
from fleet.server import apiservices, discovery
from fleet.store import open_store

REG = default_registry()


def test_discovery_lists_groups_as_the_aggregator_does():
    groups = [g["name"] for g in discovery.api_group_list(REG)["groups"]]
    assert groups[:4] == ["apiregistration.k8s.io", "apps", "events.k8s.io", "authentication.k8s.io"]
    # metrics-server's priority (100): last, as in a cluster running metrics-server.
    assert groups[-1] == "metrics.k8s.io"
    autoscaling = next(g for g in discovery.api_group_list(REG)["groups"] if g["name"] == "autoscaling")
    assert [v["version"] for v in autoscaling["versions"]] == ["v2", "v1"]
    assert autoscaling["preferredVersion"]["version"] == "v2"
    agg = [i["metadata"]["name"] for i in discovery.aggregated(REG, core=False)["items"]]
    assert agg == groups
    assert discovery.api_group(REG, "metrics.k8s.io")["preferredVersion"]["groupVersion"] == \
        "metrics.k8s.io/v1beta1"


def test_version_order_is_kube_aware():
    assert sorted(["v1alpha1", "v1", "v2beta1", "v2", "v10", "foo"], key=apiservices._version_key) == \
        ["v10", "v2", "v1", "v2beta1", "v1alpha1", "foo"]


def test_desired_local_apiservices():
    want = {o["metadata"]["name"]: o for o in apiservices.desired(REG)}
    for name in ("v1.", "v1.apps", "v2.autoscaling", "v1.autoscaling", "v1beta1.metrics.k8s.io",
                 "v1.rbac.authorization.k8s.io"):
        assert name in want
    assert "v1.apiregistration.k8s.io" not in want  # kube registers none for its own group
    core = want["v1."]
    assert core["spec"] == {"group": "", "version": "v1", "groupPriorityMinimum": 18000, "versionPriority": 1}
    assert core["metadata"]["labels"] == {apiservices.AUTOMANAGED: "onstart"}
    assert want["v1beta1.metrics.k8s.io"]["spec"]["groupPriorityMinimum"] == 100
    assert "service" not in want["v1.apps"]["spec"]
    # Every one passes the kind's own validation.
    from fleet.api.kinds.apiregistration import validate_api_service

    for obj in want.values():
        assert validate_api_service(obj, None) == [], obj["metadata"]["name"]


def test_plan_follows_autoregister_rules():
    want = apiservices.desired(REG)
    existing = copy.deepcopy([o for o in want if o["metadata"]["name"] != "v1.apps"])
    drifted = next(o for o in existing if o["metadata"]["name"] == "v1.batch")
    drifted["spec"]["versionPriority"] = 99
    # A user's registration for a group Fleet serves, without the label: left alone.
    users = next(o for o in existing if o["metadata"]["name"] == "v1beta1.metrics.k8s.io")
    users["metadata"]["labels"] = {}
    users["spec"]["service"] = {"namespace": "kube-system", "name": "metrics-server", "port": 443}
    gone = {"metadata": {"name": "v1alpha1.old.example", "labels": {apiservices.AUTOMANAGED: "onstart"}},
            "spec": {"group": "old.example", "version": "v1alpha1"}}
    foreign = {"metadata": {"name": "v1.custom.example"}, "spec": {"group": "custom.example", "version": "v1"}}
    p = apiservices.plan(want, [*existing, gone, foreign])
    assert [o["metadata"]["name"] for o in p.create] == ["v1.apps"]
    assert [(o["metadata"]["name"], o["spec"]["versionPriority"]) for o in p.update] == [("v1.batch", 15)]
    assert [o["metadata"]["name"] for o in p.delete] == ["v1alpha1.old.example"]
    assert apiservices.plan(want, copy.deepcopy(want)) == apiservices.Plan()


async def test_reconcile_against_a_store(tmp_path: Path) -> None:
    info = REG.get("apiregistration.k8s.io", "v1", "apiservices")
    assert info is not None
    async with open_store(tmp_path / "fleet.db") as store:
        done = await apiservices.reconcile(store, REG)
        assert len(done) == len(apiservices.desired(REG))
        stored = await store.get(info.key(None, "v1.apps"))
        (cond,) = stored["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("Available", "True", "Local")
        assert stored["metadata"]["uid"] and stored["metadata"]["creationTimestamp"]
        # A second start changes nothing.
        assert await apiservices.reconcile(store, REG) == []
