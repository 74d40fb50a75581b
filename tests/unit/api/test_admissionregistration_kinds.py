"""admissionregistration.k8s.io/v1 kinds: defaults and kube-apiserver's validation messages."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds.admissionregistration import (
    MUTATING_WEBHOOK_CONFIGURATION,
    VALIDATING_ADMISSION_POLICY,
    VALIDATING_ADMISSION_POLICY_BINDING,
    VALIDATING_WEBHOOK_CONFIGURATION,
)
from fleet.api.registry import default_registry

HOOK: dict[str, Any] = {
    "name": "label.example.com",
    "clientConfig": {"url": "https://127.0.0.1:8443/mutate", "caBundle": "Zm9v"},
    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
    "sideEffects": "None",
    "admissionReviewVersions": ["v1"],
}


def config(*hooks: dict[str, Any], kind: str = "ValidatingWebhookConfiguration") -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "cfg"},
            "webhooks": [copy.deepcopy(h) for h in hooks]}


def messages(info: Any, obj: dict[str, Any]) -> list[tuple[str, str]]:
    info.default(obj)
    return [(c["field"], c["message"]) for c in info.validate(obj, None)]


def test_registered_cluster_scoped_with_webhooks_column() -> None:
    reg = default_registry()
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                   "validatingadmissionpolicies", "validatingadmissionpolicybindings"):
        info = reg.get("admissionregistration.k8s.io", "v1", plural)
        assert info is not None and not info.namespaced
    names = [c.name for c in VALIDATING_WEBHOOK_CONFIGURATION.table_columns()]
    assert names == ["Name", "Webhooks", "Age"]
    assert VALIDATING_WEBHOOK_CONFIGURATION.table_columns()[1].value(config(HOOK, HOOK)) == 2


def test_defaults_v1() -> None:
    obj = config({**HOOK, "clientConfig": {"service": {"namespace": "ns", "name": "svc"}}},
                 kind="MutatingWebhookConfiguration")
    MUTATING_WEBHOOK_CONFIGURATION.default(obj)
    h = obj["webhooks"][0]
    assert (h["failurePolicy"], h["matchPolicy"], h["timeoutSeconds"], h["reinvocationPolicy"]) == \
        ("Fail", "Equivalent", 10, "Never")
    assert h["namespaceSelector"] == {} and h["objectSelector"] == {}
    assert h["rules"][0]["scope"] == "*" and h["clientConfig"]["service"]["port"] == 443


def test_valid_configuration() -> None:
    assert messages(VALIDATING_WEBHOOK_CONFIGURATION, config(HOOK)) == []
    assert messages(MUTATING_WEBHOOK_CONFIGURATION, config(HOOK, kind="MutatingWebhookConfiguration")) == []


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"sideEffects": None}, "webhooks[0].sideEffects",
     "Required value: must specify one of None, NoneOnDryRun"),
    ({"sideEffects": "Some"}, "webhooks[0].sideEffects",
     'Unsupported value: "Some": supported values: "None", "NoneOnDryRun"'),
    ({"admissionReviewVersions": None}, "webhooks[0].admissionReviewVersions",
     "Required value: must specify one of v1, v1beta1"),
    ({"admissionReviewVersions": ["v2"]}, "webhooks[0].admissionReviewVersions",
     'Invalid value: ["v2"]: must include at least one of v1, v1beta1'),
    ({"clientConfig": {}}, "webhooks[0].clientConfig",
     "Required value: exactly one of url or service is required"),
    ({"clientConfig": {"url": "https://a.example.com/x", "service": {"namespace": "n", "name": "s"}}},
     "webhooks[0].clientConfig", "Required value: exactly one of url or service is required"),
    ({"clientConfig": {"url": "http://a.example.com/x"}}, "webhooks[0].clientConfig.url",
     'Invalid value: "http": \'https\' is the only allowed URL scheme; desired format: https://host[/path]'),
    ({"clientConfig": {"url": "https://u:p@a.example.com/x"}}, "webhooks[0].clientConfig.url",
     'Invalid value: "u:p": user information is not permitted in the URL'),
    ({"clientConfig": {"url": "https:///x"}}, "webhooks[0].clientConfig.url",
     'Invalid value: "": host must be provided; desired format: https://host[/path]'),
    ({"clientConfig": {"url": "https://a.example.com/x?q=1"}}, "webhooks[0].clientConfig.url",
     'Invalid value: "q=1": query parameters are not permitted in the URL'),
    ({"clientConfig": {"service": {"namespace": "n"}}}, "webhooks[0].clientConfig.service.name",
     "Required value: service name is required"),
    ({"clientConfig": {"service": {"namespace": "n", "name": "s", "path": "x"}}},
     "webhooks[0].clientConfig.service.path", "Invalid value: \"x\": must start with a '/'"),
    ({"timeoutSeconds": 31}, "webhooks[0].timeoutSeconds",
     "Invalid value: 31: the timeout value must be between 1 and 30 seconds"),
    ({"timeoutSeconds": 0}, "webhooks[0].timeoutSeconds",
     "Invalid value: 0: the timeout value must be between 1 and 30 seconds"),
    ({"failurePolicy": "Maybe"}, "webhooks[0].failurePolicy",
     'Unsupported value: "Maybe": supported values: "Fail", "Ignore"'),
    ({"matchPolicy": "Loose"}, "webhooks[0].matchPolicy",
     'Unsupported value: "Loose": supported values: "Equivalent", "Exact"'),
    ({"name": "short.name"}, "webhooks[0].name",
     'Invalid value: "short.name": should be a domain with at least three segments separated by dots'),
    ({"rules": [{"operations": ["CREATE", "*"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["pods"]}]}, "webhooks[0].rules[0].operations",
     "Invalid value: [\"CREATE\",\"*\"]: if '*' is present, must not specify other operations"),
    ({"rules": [{"operations": ["READ"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
     "webhooks[0].rules[0].operations[0]",
     'Unsupported value: "READ": supported values: "*", "CONNECT", "CREATE", "DELETE", "UPDATE"'),
    ({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": []}]},
     "webhooks[0].rules[0].resources", "Required value"),
    ({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                 "scope": "Global"}]}, "webhooks[0].rules[0].scope",
     'Unsupported value: "Global": supported values: "*", "Cluster", "Namespaced"'),
    ({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["*/*", "pods"]}]}, "webhooks[0].rules[0].resources",
     "Invalid value: [\"*/*\",\"pods\"]: if '*/*' is present, must not specify other resources"),
    ({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["*", "pods"]}]}, "webhooks[0].rules[0].resources",
     "Invalid value: [\"*\",\"pods\"]: if '*' is present, must not specify other resources without "
     "subresources"),
    ({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["pods/*", "pods/status"]}]}, "webhooks[0].rules[0].resources[1]",
     "Invalid value: \"pods/status\": if 'pods/*' is present, must not specify pods/status"),
    ({"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["*/status", "pods/status"]}]}, "webhooks[0].rules[0].resources[1]",
     "Invalid value: \"pods/status\": if '*/status' is present, must not specify pods/status"),
])
def test_invalid_webhook(change: dict[str, Any], field: str, message: str) -> None:
    hook = {k: val for k, val in {**HOOK, **change}.items() if val is not None}
    got = messages(VALIDATING_WEBHOOK_CONFIGURATION, config(hook))
    assert (field, message) in got, got


def test_webhook_names_unique() -> None:
    got = messages(VALIDATING_WEBHOOK_CONFIGURATION, config(HOOK, HOOK))
    assert got == [("webhooks[1].name", 'Duplicate value: "label.example.com"')]


def test_reinvocation_policy_enum_on_mutating_only() -> None:
    got = messages(MUTATING_WEBHOOK_CONFIGURATION, config({**HOOK, "reinvocationPolicy": "Always"},
                                                          kind="MutatingWebhookConfiguration"))
    assert got == [("webhooks[0].reinvocationPolicy",
                    'Unsupported value: "Always": supported values: "IfNeeded", "Never"')]


def test_policy_and_binding_structure() -> None:
    pol = {"metadata": {"name": "p"}, "spec": {}}
    VALIDATING_ADMISSION_POLICY.default(pol)
    assert VALIDATING_ADMISSION_POLICY.validate(pol, None)[0]["message"] == \
        "Required value: validations or auditAnnotations must contain at least one item"
    pol["spec"]["validations"] = [{"expression": "object.spec.replicas <= 5"}]
    assert VALIDATING_ADMISSION_POLICY.validate(pol, None) == []
    b = {"metadata": {"name": "b"}, "spec": {"policyName": "p", "validationActions": ["Deny", "Warn"]}}
    assert [c["field"] for c in VALIDATING_ADMISSION_POLICY_BINDING.validate(b, None)] == \
        ["spec.validationActions"]
    b["spec"]["validationActions"] = ["Deny"]
    assert VALIDATING_ADMISSION_POLICY_BINDING.validate(b, None) == []


def test_star_beside_subresources_is_valid() -> None:
    rule = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*", "*/status"]}
    assert messages(VALIDATING_WEBHOOK_CONFIGURATION, config({**HOOK, "rules": [rule]})) == []
