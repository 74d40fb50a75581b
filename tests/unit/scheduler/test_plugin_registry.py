"""The default profile and building profiles from names, args and weights."""

from __future__ import annotations

import pytest

from fleet.scheduler.framework import Framework
from fleet.scheduler.plugins import default_plugins, default_weights
from fleet.scheduler.plugins.node_resources_fit import MOST_ALLOCATED, NodeResourcesFit
from fleet.scheduler.registry import REGISTRY, build_profile, build_profile_from_config
from fleet.scheduler.snapshot import Snapshot
from tests.unit.scheduler.factories import node, pod

KUBE_ORDER = ["NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity", "NodePorts",
              "NodeResourcesFit", "VolumeBinding", "PodTopologySpread", "InterPodAffinity",
              "NodeResourcesBalancedAllocation", "ImageLocality"]


def test_default_profile_is_kube_schedulers():
    assert [p.name for p in default_plugins()] == KUBE_ORDER
    assert default_weights() == {"TaintToleration": 3, "NodeAffinity": 2, "PodTopologySpread": 2,
                                 "InterPodAffinity": 2, "NodeResourcesFit": 1,
                                 "NodeResourcesBalancedAllocation": 1, "ImageLocality": 1}
    assert set(REGISTRY) == set(KUBE_ORDER)


def test_build_default_profile():
    plugins, weights = build_profile()
    assert [p.name for p in plugins] == KUBE_ORDER
    assert weights == default_weights()
    Framework(plugins, weights=weights)  # a valid profile


def test_build_profile_with_args_weights_and_disabled():
    plugins, weights = build_profile(
        args={"NodeResourcesFit": {"scoringStrategy": {"type": MOST_ALLOCATED}}},
        weights={"NodeResourcesFit": 5}, disabled=["ImageLocality", "NodePorts"])
    names = [p.name for p in plugins]
    assert "ImageLocality" not in names and "NodePorts" not in names
    fit = plugins[names.index("NodeResourcesFit")]
    assert isinstance(fit, NodeResourcesFit) and fit.strategy == MOST_ALLOCATED
    assert weights["NodeResourcesFit"] == 5 and "ImageLocality" not in weights


def test_bin_packing_profile_packs():
    plugins, weights = build_profile(["NodeResourcesFit"], args={
        "NodeResourcesFit": {"scoringStrategy": {"type": MOST_ALLOCATED}}})
    snap = Snapshot.build([node("busy"), node("idle")], [pod("x", "2", node_name="busy")])
    assert Framework(plugins, weights=weights).schedule(pod(cpu="1"), snap).node == "busy"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"names": ["Nope"]}, "unknown scheduler plugin 'Nope'"),
    ({"names": ["NodeName", "NodeName"]}, "listed twice"),
    ({"args": {"NodeName": {"x": 1}}}, "takes no args"),
    ({"args": {"NodeResourcesFit": {"scoringStrategy": {"type": "Bogus"}}}}, "plugin NodeResourcesFit:"),
    ({"names": ["NodeName"], "args": {"NodeResourcesFit": {}}}, "not in the profile"),
    ({"weights": {"NodeResourcesFit": 0}}, "at least 1"),
    ({"weights": {"Nope": 1}}, "unknown scheduler plugin"),
])
def test_bad_profiles_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_profile(**kwargs)


def test_from_kube_scheduler_configuration_profile():
    plugins, weights = build_profile_from_config({
        "schedulerName": "default-scheduler",
        "plugins": {"multiPoint": {"disabled": [{"name": "ImageLocality"}],
                                   "enabled": [{"name": "PodTopologySpread", "weight": 4}]}},
        "pluginConfig": [{"name": "PodTopologySpread", "args": {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "PodTopologySpreadArgs",
            "defaultingType": "List", "defaultConstraints": []}}],
    })
    names = [p.name for p in plugins]
    assert names == [n for n in KUBE_ORDER if n != "ImageLocality"]
    assert weights["PodTopologySpread"] == 4
    # Only the listed plugins when the defaults are disabled.
    plugins, _ = build_profile_from_config({"plugins": {"multiPoint": {
        "disabled": [{"name": "*"}], "enabled": [{"name": "NodeName"}, {"name": "NodeResourcesFit"}]}}})
    assert [p.name for p in plugins] == ["NodeName", "NodeResourcesFit"]
