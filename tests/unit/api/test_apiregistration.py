"""APIService (apiregistration.k8s.io/v1): kube-aggregator's validation, defaults, the
Available condition Fleet derives from the spec, and the table kubectl prints."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds.apiregistration import (
    API_SERVICE,
    LOCAL_MESSAGE,
    NOT_PROXIED_REASON,
    set_availability,
    validate_api_service,
)


def fields(causes: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in causes]


def apiservice(name: str = "v1beta1.metrics.k8s.io", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                            "versionPriority": 100}
    base.update(spec)
    obj = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": name},
           "spec": {k: val for k, val in base.items() if val is not None}}
    assert API_SERVICE.default is not None
    API_SERVICE.default(obj)
    return obj


def test_local_and_service_backed_are_valid():
    assert validate_api_service(apiservice(), None) == []
    svc = apiservice(service={"namespace": "kube-system", "name": "metrics-server"},
                     insecureSkipTLSVerify=True)
    assert svc["spec"]["service"]["port"] == 443  # SetDefaults_ServiceReference
    assert validate_api_service(svc, None) == []
    core = apiservice("v1.", group="", version="v1", groupPriorityMinimum=18000, versionPriority=1)
    assert validate_api_service(core, None) == []


@pytest.mark.parametrize(("obj", "want"), [
    (apiservice("v1.metrics.k8s.io"),
     ("metadata.name", 'Invalid value: "v1.metrics.k8s.io": must be `spec.version+"."+spec.group`: '
                       '"v1beta1.metrics.k8s.io"')),
    (apiservice("v2.", group="", version="v2"),
     ("spec.group", "Required value: only v1 may have an empty group and it better be legacy kube")),
    (apiservice(groupPriorityMinimum=0),
     ("spec.groupPriorityMinimum", "Invalid value: 0: must be positive and less than 20000")),
    (apiservice(groupPriorityMinimum=20001),
     ("spec.groupPriorityMinimum", "Invalid value: 20001: must be positive and less than 20000")),
    (apiservice(versionPriority=None),
     ("spec.versionPriority", "Invalid value: 0: must be positive and less than 1000")),
    (apiservice(caBundle="QUJD"),
     ("spec.caBundle", 'Invalid value: "4 bytes": local APIServices may not have a caBundle')),
    (apiservice(insecureSkipTLSVerify=True),
     ("spec.insecureSkipTLSVerify", "Invalid value: true: local APIServices may not have insecureSkipTLSVerify")),
    (apiservice(service={"namespace": "", "name": "m"}), ("spec.service.namespace", "Required value")),
    (apiservice(service={"namespace": "ns", "name": "m", "port": 70000}),
     ("spec.service.port", "Invalid value: 70000: port is not valid: must be between 1 and 65535, inclusive")),
    (apiservice(service={"namespace": "ns", "name": "m"}, caBundle="QUJD", insecureSkipTLSVerify=True),
     ("spec.insecureSkipTLSVerify", "Invalid value: true: may not be true if caBundle is present")),
    (apiservice("v1_beta.metrics.k8s.io", version="v1_beta"), ("spec.version", None)),
])
def test_validation(obj, want):
    got = fields(validate_api_service(obj, None))
    path, message = want
    assert any(f == path for f, _ in got), got
    if message is not None:
        assert (path, message) in got, got


def test_condition_status_values_are_checked():
    obj = apiservice()
    obj["status"] = {"conditions": [{"type": "Available", "status": "Maybe"}]}
    assert fields(validate_api_service(obj, None)) == [
        ("status.conditions[0].status",
         'Unsupported value: "Maybe": supported values: "True", "False", "Unknown"')]


def test_availability_follows_the_spec_on_every_write():
    local = apiservice()
    set_availability(local)
    (cond,) = local["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == \
        ("Available", "True", "Local", LOCAL_MESSAGE)
    # A status write claiming otherwise is put back; the transition time stays.
    written = copy.deepcopy(local)
    written["status"]["conditions"][0].update(status="False", reason="Whatever",
                                              lastTransitionTime="2000-01-01T00:00:00Z")
    set_availability(written, local)
    assert written["status"]["conditions"][0]["status"] == "True"
    # Registering a service-backed server: stored, but not available — Fleet does not proxy.
    external = copy.deepcopy(local)
    external["spec"]["service"] = {"namespace": "kube-system", "name": "metrics-server", "port": 443}
    set_availability(external, local)
    (cond,) = external["status"]["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", NOT_PROXIED_REASON)
    assert 'service/metrics-server in "kube-system"' in cond["message"]
    assert "does not proxy" in cond["message"]


def cells(obj: dict[str, Any]) -> dict[str, Any]:
    return {c.name: c.value(obj) for c in API_SERVICE.table_columns()}


def test_table_is_kube_aggregators():
    assert [c.name for c in API_SERVICE.table_columns()] == ["Name", "Service", "Available", "Age"]
    local = apiservice()
    assert cells(local)["Available"] == "Unknown"  # no condition yet
    set_availability(local)
    assert (cells(local)["Service"], cells(local)["Available"]) == ("Local", "True")
    ext = apiservice(service={"namespace": "kube-system", "name": "metrics-server"})
    set_availability(ext)
    assert (cells(ext)["Service"], cells(ext)["Available"]) == \
        ("kube-system/metrics-server", f"False ({NOT_PROXIED_REASON})")
    ext["status"]["conditions"][0]["reason"] = ""
    assert cells(ext)["Available"] == "False"
