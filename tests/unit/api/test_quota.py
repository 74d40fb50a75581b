"""Quota arithmetic (fleet/api/quota.py): canonical quantities, resource lists, evaluators."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.api import quota as q

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("raw", "fmt", "text"), [
    ("500m", q.DECIMAL_SI, "500m"),
    ("1500m", q.DECIMAL_SI, "1500m"),
    ("2000", q.DECIMAL_SI, "2k"),
    ("1500", q.DECIMAL_SI, "1500"),
    ("0.5", q.DECIMAL_SI, "500m"),
    (0.25, q.DECIMAL_SI, "250m"),
    (2, q.DECIMAL_SI, "2"),
    ("0", q.DECIMAL_SI, "0"),
    ("1n", q.DECIMAL_SI, "1n"),
    ("1.5", q.DECIMAL_SI, "1500m"),
    ("128974848", q.DECIMAL_SI, "128974848"),
    ("1Gi", q.BINARY_SI, "1Gi"),
    ("1.5Gi", q.BINARY_SI, "1536Mi"),
    ("1536Mi", q.BINARY_SI, "1536Mi"),
    ("1.5Ki", q.BINARY_SI, "1536"),      # not a whole number of Ki
    ("0.5Ki", q.BINARY_SI, "512"),       # below 1024: printed in decimal
    ("0.1Ki", q.BINARY_SI, "102400m"),   # a fraction: decimal, to lose nothing
    ("1e3", q.DECIMAL_EXPONENT, "1e3"),
    ("1e4", q.DECIMAL_EXPONENT, "10e3"),
    ("1E", q.DECIMAL_SI, "1E"),           # exa, not an exponent
])
def test_canonical_strings(raw: Any, fmt: str, text: str) -> None:
    got = q.Quantity.parse(raw)
    assert (got.format, str(got)) == (fmt, text)


def test_sum_keeps_the_first_non_zero_format() -> None:
    assert str(q.Quantity.parse("1Gi") + q.Quantity.parse("512Mi")) == "1536Mi"
    assert str(q.Quantity.of(0) + q.Quantity.parse("512Mi")) == "512Mi"
    assert str(q.Quantity.parse("500m") + q.Quantity.parse("1")) == "1500m"


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from([q.DECIMAL_SI, q.BINARY_SI,
                                                                   q.DECIMAL_EXPONENT]))
def test_canonical_round_trips(nanos: int, fmt: str) -> None:
    value = Decimal(nanos) / 10**9
    text = q.canonical(value, fmt)
    assert q.Quantity.parse(text).value == value


def rl(**kw: str) -> q.ResourceList:
    return {k.replace("_", "."): q.Quantity.parse(v) for k, v in kw.items()}


def test_resource_list_math() -> None:
    a, b = rl(cpu="1", memory="1Gi"), rl(cpu="500m", pods="2")
    assert q.to_json(q.add(a, b)) == {"cpu": "1500m", "memory": "1Gi", "pods": "2"}
    assert q.to_json(q.subtract_non_negative(b, a)) == {"cpu": "0", "memory": "0", "pods": "2"}
    assert q.to_json(q.mask(a, ["cpu", "x"])) == {"cpu": "1"}
    assert q.less_than_or_equal(rl(cpu="2", pods="1"), rl(cpu="1", pods="1", memory="0")) == (False, ["cpu"])
    assert q.less_than_or_equal(rl(cpu="1"), rl(cpu="1000m")) == (True, [])
    assert q.equals(rl(cpu="1"), rl(cpu="1000m")) and not q.equals(rl(cpu="1"), rl(cpu="1", pods="0"))
    assert q.pretty(rl(requests_cpu="500m", pods="1")) == "pods=1,requests.cpu=500m"
    assert q.remove_zeros(rl(cpu="0", pods="1")) == rl(pods="1")


def container(name: str = "c", requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
              **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"name": name, "image": "busybox", "resources": res, **extra}


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, phase: str = "Running",
        **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        s["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": s, "status": {"phase": phase}}


def test_pod_requests_add_up_and_init_containers_peak() -> None:
    p = pod(container("a", {"cpu": "100m", "memory": "64Mi"}), container("b", {"cpu": "200m"}),
            init=[container("i1", {"cpu": "1"}), container("side", {"cpu": "50m"}, restartPolicy="Always"),
                  container("i2", {"cpu": "400m"})],
            overhead={"cpu": "10m"})
    requests, limits = q.pod_requests_limits(p)
    # apps 300m + sidecar 50m = 350m; the init peak is max(1, 400m + 50m) = 1; plus 10m overhead.
    assert q.to_json(requests) == {"cpu": "1010m", "memory": "64Mi"}
    assert limits == {}


def test_a_limit_without_request_counts_as_the_request() -> None:
    requests, limits = q.pod_requests_limits(pod(container(limits={"cpu": "2"})))
    assert q.to_json(requests) == {"cpu": "2"} and q.to_json(limits) == {"cpu": "2"}


def test_pod_usage() -> None:
    ev = q.evaluator_for("", "pods")
    p = pod(container(requests={"cpu": "250m", "memory": "1Gi", "example.com/gpu": "1"},
                      limits={"memory": "2Gi", "hugepages-2Mi": "4Mi"}))
    assert q.to_json(ev.usage(p, NOW)) == {
        "count/pods": "1", "pods": "1", "cpu": "250m", "requests.cpu": "250m", "memory": "1Gi",
        "requests.memory": "1Gi", "limits.memory": "2Gi", "requests.example.com/gpu": "1",
        "hugepages-2Mi": "4Mi", "requests.hugepages-2Mi": "4Mi"}


@pytest.mark.parametrize(("phase", "deleting", "compute"), [
    ("Running", None, True),
    ("Succeeded", None, False),
    ("Failed", None, False),
    ("Running", (NOW - 10, 30), True),    # terminating, within its grace period
    ("Running", (NOW - 100, 30), False),  # overdue: a lost node must not hold the quota
])
def test_finished_pods_cost_only_their_count(phase: str, deleting: tuple[float, int] | None, compute: bool) -> None:
    import datetime as dt

    p = pod(container(requests={"cpu": "1"}), phase=phase)
    if deleting:
        ts = dt.datetime.fromtimestamp(deleting[0], dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        p["metadata"].update(deletionTimestamp=ts, deletionGracePeriodSeconds=deleting[1])
    used = q.evaluator_for("", "pods").usage(p, NOW)
    assert used["count/pods"].value == 1
    assert ("pods" in used) is compute and ("requests.cpu" in used) is compute


@pytest.mark.parametrize(("required", "containers", "want"), [
    (["pods"], [container()], None),
    (["cpu"], [container(requests={"cpu": "1"})], None),
    (["cpu", "memory"], [container("a"), container("b", requests={"cpu": "1"})],
     "must specify cpu for: a; memory for: a,b"),
    (["limits.memory", "requests.cpu"], [container("x", requests={"cpu": "1"})], "must specify limits.memory for: x"),
    (["requests.cpu"], [container("x", limits={"cpu": "1"})], None),  # the limit is the request
    (["requests.storage", "count/pods"], [container()], None),      # only cpu/memory are demanded
])
def test_pods_must_state_quota_tracked_compute(required: list[str], containers: list[dict[str, Any]],
                                               want: str | None) -> None:
    assert q.evaluator_for("", "pods").constraints(required, pod(*containers)) == want


def quota(hard: dict[str, str], *, scopes: list[str] | None = None, selector: list[dict[str, Any]] | None = None,
          used: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard}
    if scopes:
        spec["scopes"] = scopes
    if selector:
        spec["scopeSelector"] = {"matchExpressions": selector}
    return {"metadata": {"name": "q", "namespace": "ns"}, "spec": spec,
            "status": {"hard": hard, "used": used if used is not None else {k: "0" for k in hard}}}


BEST_EFFORT = pod(container())
BURSTABLE = pod(container(requests={"cpu": "1"}))
TERMINATING = pod(container(requests={"cpu": "1"}), activeDeadlineSeconds=60)
HIGH = pod(container(requests={"cpu": "1"}), priorityClassName="high")


@pytest.mark.parametrize(("quota_", "obj", "want"), [
    (quota({"pods": "1"}), BEST_EFFORT, True),
    (quota({"requests.storage": "1Gi"}), BEST_EFFORT, False),  # nothing pods use
    (quota({"pods": "1"}, scopes=["BestEffort"]), BEST_EFFORT, True),
    (quota({"pods": "1"}, scopes=["BestEffort"]), BURSTABLE, False),
    (quota({"pods": "1"}, scopes=["NotBestEffort"]), BURSTABLE, True),
    (quota({"pods": "1"}, scopes=["Terminating"]), TERMINATING, True),
    (quota({"pods": "1"}, scopes=["NotTerminating"]), TERMINATING, False),
    (quota({"pods": "1"}, scopes=["NotTerminating", "NotBestEffort"]), BURSTABLE, True),
    (quota({"pods": "1"}, selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]),
     HIGH, True),
    (quota({"pods": "1"}, selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]),
     BURSTABLE, False),
    (quota({"pods": "1"}, selector=[{"scopeName": "PriorityClass", "operator": "NotIn", "values": ["high"]}]),
     BURSTABLE, True),
    (quota({"pods": "1"}, selector=[{"scopeName": "PriorityClass", "operator": "Exists"}]), HIGH, True),
    (quota({"pods": "1"}, selector=[{"scopeName": "PriorityClass", "operator": "DoesNotExist"}]), HIGH, False),
])
def test_quota_matches_pods_by_resources_and_scopes(quota_: dict[str, Any], obj: dict[str, Any], want: bool) -> None:
    assert q.matches(q.evaluator_for("", "pods"), quota_, obj) is want


def test_scoped_quotas_never_match_other_objects() -> None:
    cm = {"metadata": {"name": "c"}}
    assert q.matches(q.evaluator_for("", "configmaps"), quota({"configmaps": "1"}), cm)
    assert not q.matches(q.evaluator_for("", "configmaps"), quota({"configmaps": "1"}, scopes=["BestEffort"]), cm)


@pytest.mark.parametrize(("group", "resource", "names"), [
    ("", "configmaps", ["count/configmaps", "configmaps"]),
    ("", "secrets", ["count/secrets", "secrets"]),
    ("", "resourcequotas", ["count/resourcequotas", "resourcequotas"]),
    ("", "replicationcontrollers", ["count/replicationcontrollers", "replicationcontrollers"]),
    ("", "endpoints", ["count/endpoints"]),
    ("apps", "deployments", ["count/deployments.apps"]),
])
def test_object_counts_and_legacy_aliases(group: str, resource: str, names: list[str]) -> None:
    ev = q.evaluator_for(group, resource)
    assert sorted(ev.usage({}, NOW)) == sorted(names)
    assert ev.handles("create", "") and not ev.handles("update", "") and not ev.handles("create", "status")
    for n in names:
        assert q.resources_for_quota_name(n) == (group, resource)


@pytest.mark.parametrize(("spec", "want"), [
    ({"type": "ClusterIP", "ports": [{"port": 80}]},
     {"count/services": "1", "services": "1", "services.loadbalancers": "0", "services.nodeports": "0"}),
    ({"type": "NodePort", "ports": [{"port": 80}, {"port": 443}]},
     {"count/services": "1", "services": "1", "services.loadbalancers": "0", "services.nodeports": "2"}),
    ({"type": "LoadBalancer", "ports": [{"port": 80}]},
     {"count/services": "1", "services": "1", "services.loadbalancers": "1", "services.nodeports": "1"}),
    ({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": False,
      "ports": [{"port": 80, "nodePort": 30080}, {"port": 81}]},
     {"count/services": "1", "services": "1", "services.loadbalancers": "1", "services.nodeports": "1"}),
])
def test_service_usage(spec: dict[str, Any], want: dict[str, str]) -> None:
    ev = q.evaluator_for("", "services")
    assert q.to_json(ev.usage({"spec": spec}, NOW)) == want
    assert ev.handles("update", "")


def test_claim_usage_per_storage_class() -> None:
    ev = q.evaluator_for("", "persistentvolumeclaims")
    pvc = {"spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "10Gi"}}}}
    assert q.to_json(ev.usage(pvc, NOW)) == {
        "count/persistentvolumeclaims": "1", "fast.storageclass.storage.k8s.io/persistentvolumeclaims": "1",
        "fast.storageclass.storage.k8s.io/requests.storage": "10Gi", "persistentvolumeclaims": "1",
        "requests.storage": "10Gi"}
    assert ev.matching_resources(["requests.storage", "fast.storageclass.storage.k8s.io/requests.storage",
                                  "pods"]) == ["requests.storage", "fast.storageclass.storage.k8s.io/requests.storage"]


def test_calculate_usage_sums_what_the_scopes_select() -> None:
    qt = quota({"pods": "10", "requests.cpu": "10", "count/pods": "10"}, scopes=["NotBestEffort"])
    objs = [BURSTABLE, BEST_EFFORT, pod(container(requests={"cpu": "500m"}), phase="Succeeded")]
    got = q.calculate_usage(q.evaluator_for("", "pods"), qt, objs, NOW)
    # The finished pod still exists (count/pods) but uses no compute.
    assert q.to_json(got) == {"count/pods": "2", "pods": "1", "requests.cpu": "1"}
    assert q.to_json(q.calculate_usage(q.evaluator_for("", "pods"), qt, [], NOW)) == {
        "count/pods": "0", "pods": "0", "requests.cpu": "0"}
