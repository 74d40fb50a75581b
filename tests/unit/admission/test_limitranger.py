"""LimitRanger admission: container defaults (and their annotation) and the min / max / ratio
bounds with kube-apiserver's messages, pure and through the in-process API."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.admission.limitranger import aggregate, apply_defaults, claim_violations, pod_violations
from fleet.testing.apiserver import open_api

PODS = "/api/v1/namespaces/default/pods"
LIMITS = "/api/v1/namespaces/default/limitranges"


def lr(*items: dict[str, Any], name: str = "lr") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name}, "spec": {"limits": list(items)}}


def c(name: str = "c", requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"name": name, "image": "busybox", "resources": res}


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


DEFAULTS = lr({"type": "Container", "default": {"cpu": "500m", "memory": "256Mi"},
               "defaultRequest": {"cpu": "100m", "memory": "128Mi"}})


def test_defaults_fill_only_what_is_missing_and_say_so() -> None:
    p = pod(c("app", requests={"cpu": "200m"}), c("side", limits={"memory": "1Gi"}), init=[c("init")])
    assert apply_defaults(p, DEFAULTS)
    app, side = p["spec"]["containers"]
    assert app["resources"] == {"requests": {"cpu": "200m", "memory": "128Mi"},
                                "limits": {"cpu": "500m", "memory": "256Mi"}}
    # A limit is its own request (kube-apiserver's pod defaulting), so defaultRequest does not apply.
    assert side["resources"] == {"requests": {"memory": "1Gi", "cpu": "100m"},
                                 "limits": {"memory": "1Gi", "cpu": "500m"}}
    assert p["spec"]["initContainers"][0]["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
    assert p["metadata"]["annotations"]["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: memory request for container app; cpu, memory limit for container app; "
        "cpu request for container side; cpu limit for container side; "
        "cpu, memory request for init container init; cpu, memory limit for init container init")


def test_nothing_to_default() -> None:
    p = pod(c(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"}))
    assert not apply_defaults(p, DEFAULTS)
    assert "annotations" not in p["metadata"]
    assert not apply_defaults(pod(c()), lr({"type": "Pod", "max": {"cpu": "1"}}))


def test_defaults_tolerate_malformed_pods() -> None:
    assert not apply_defaults({"spec": "nope"}, DEFAULTS)
    assert not apply_defaults(pod({"name": "x", "resources": "bad"}), DEFAULTS)


CONTAINER_BOUNDS = lr({"type": "Container", "max": {"cpu": "1", "memory": "1Gi"}, "min": {"cpu": "100m"},
                       "maxLimitRequestRatio": {"memory": "2"}})


@pytest.mark.parametrize(("p", "errors"), [
    (pod(c(requests={"cpu": "500m", "memory": "512Mi"}, limits={"cpu": "1", "memory": "1Gi"})), []),
    (pod(c(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "2", "memory": "1Gi"})),
     ["maximum cpu usage per Container is 1, but limit is 2"]),
    (pod(c(requests={"cpu": "50m", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"})),
     ["minimum cpu usage per Container is 100m, but request is 50m"]),
    (pod(c(requests={"memory": "100Mi"}, limits={"cpu": "500m", "memory": "1Gi"})),
     ["memory max limit to request ratio per Container is 2, but provided ratio is 10.240000"]),
    (pod(c()), ["minimum cpu usage per Container is 100m.  No request is specified",
                "maximum cpu usage per Container is 1.  No limit is specified",
                "maximum memory usage per Container is 1Gi.  No limit is specified",
                "memory max limit to request ratio per Container is 2, but no request is specified or request is 0"]),
])
def test_container_bounds(p: dict[str, Any], errors: list[str]) -> None:
    assert pod_violations(p, CONTAINER_BOUNDS) == errors


def test_pod_bounds_sum_the_containers() -> None:
    bounds = lr({"type": "Pod", "max": {"cpu": "1"}})
    ok = pod(c("a", limits={"cpu": "500m"}), c("b", limits={"cpu": "500m"}))
    too_much = pod(c("a", limits={"cpu": "600m"}), c("b", limits={"cpu": "500m"}))
    assert pod_violations(ok, bounds) == []
    assert pod_violations(too_much, bounds) == ["maximum cpu usage per Pod is 1, but limit is 1100m"]


def test_claim_bounds() -> None:
    bounds = lr({"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}, "max": {"storage": "10Gi"}})
    claim = {"spec": {"resources": {"requests": {"storage": "20Gi"}}}}
    assert claim_violations(claim, bounds) == ["maximum storage usage per PersistentVolumeClaim is 10Gi, but "
                                               "request is 20Gi"]
    claim["spec"]["resources"]["requests"]["storage"] = "500Mi"
    assert claim_violations(claim, bounds) == ["minimum storage usage per PersistentVolumeClaim is 1Gi, but "
                                               "request is 500Mi"]


def test_aggregate() -> None:
    assert aggregate(["a"]) == "a"
    assert aggregate(["a", "b", "a"]) == "[a, b]"


# -- through the in-process API ---------------------------------------------------------


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True) as a:
        yield a


async def test_defaults_are_visible_on_the_created_pod(api):
    assert (await api.json("POST", LIMITS, DEFAULTS))[0] == 201
    code, body = await api.json("POST", PODS, pod(c()))
    assert code == 201, body
    assert body["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                          "limits": {"cpu": "500m", "memory": "256Mi"}}
    assert body["status"]["qosClass"] == "Burstable"  # recomputed after the defaults
    assert "kubernetes.io/limit-ranger" in body["metadata"]["annotations"]


async def test_bounds_are_refused_with_403(api):
    assert (await api.json("POST", LIMITS, lr({"type": "Container", "max": {"cpu": "1"}})))[0] == 201
    # The LimitRange's own defaulting made max the default limit (and request).
    _, stored = await api.json("GET", f"{LIMITS}/lr")
    assert stored["spec"]["limits"][0]["default"] == {"cpu": "1"}
    code, body = await api.json("POST", PODS, pod(c(limits={"cpu": "2"})))
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"] == 'pods "p" is forbidden: maximum cpu usage per Container is 1, but limit is 2'
    code, body = await api.json("POST", PODS, pod(c()))
    assert code == 201 and body["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}


async def test_a_default_request_above_the_stated_limit_is_invalid(api):
    """Defaults come before validation, as in Kubernetes: a container that states a small
    limit and gets a larger default request is refused by validation (422)."""
    await api.json("POST", LIMITS, lr({"type": "Container", "defaultRequest": {"memory": "512Mi"},
                                       "default": {"memory": "1Gi"}}))
    code, body = await api.json("POST", PODS, pod(c(requests={"cpu": "1"}, limits={"cpu": "1"})))
    assert code == 201
    code, body = await api.json("POST", PODS, {**pod(c("x", requests={"memory": "2Gi"})),
                                               "metadata": {"name": "q"}})
    assert code == 422, body
