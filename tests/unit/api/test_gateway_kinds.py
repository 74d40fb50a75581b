"""Gateway API kinds: the CRDs' defaults, OpenAPI constraints and CEL rules, one case per rule.

Each case starts from a valid object, changes one thing, runs the kind's
defaulting then validation (the server's order) and expects exactly the
Kubernetes-style cause a CRD-backed kube-apiserver would give: its field path
and message.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from fleet.api import schema, typecheck
from fleet.api.kinds import gateway as g
from fleet.api.registry import default_registry

REG = default_registry()
EPOCH = "1970-01-01T00:00:00Z"


def gatewayclass() -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "fleet"},
            "spec": {"controllerName": "fleet.dev/gateway-controller", "description": "Fleet's gateway"}}


def gateway() -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"gatewayClassName": "fleet", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com"},
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                 "tls": {"certificateRefs": [{"name": "example-cert"}]}},
            ]}}


def httproute() -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "shop", "namespace": "default"},
            "spec": {"parentRefs": [{"name": "web"}], "hostnames": ["shop.example.com"], "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/cart"},
                              "headers": [{"name": "X-Canary", "value": "yes"}]}],
                 "filters": [{"type": "RequestHeaderModifier",
                              "requestHeaderModifier": {"set": [{"name": "X-Via", "value": "fleet"}]}}],
                 "backendRefs": [{"name": "cart", "port": 80, "weight": 90},
                                 {"name": "cart-canary", "port": 80, "weight": 10}]},
            ]}}


def check(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[dict[str, str]]:
    info = REG.by_kind(obj["apiVersion"], obj["kind"])
    assert info is not None and info.default is not None and info.validate is not None
    info.default(obj)
    return info.validate(obj, old)


def rule0(o: dict[str, Any]) -> dict[str, Any]:
    return o["spec"]["rules"][0]


def match0(o: dict[str, Any]) -> dict[str, Any]:
    return rule0(o)["matches"][0]


def set_path(value: str, type_: str = "PathPrefix") -> Callable[[dict[str, Any]], None]:
    def mutate(o: dict[str, Any]) -> None:
        match0(o)["path"] = {"type": type_, "value": value}
    return mutate


CEL_PATH = "when type one of ['Exact', 'PathPrefix']"
M0 = "spec.rules[0].matches[0]"

# (id, object factory, mutation, field, message)
CASES: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None], str, str]] = [
    # ---- HTTPRoute: hostnames, max items, parents
    ("hostname-uppercase", httproute, lambda o: o["spec"].__setitem__("hostnames", ["Shop.example.com"]),
     "spec.hostnames[0]", 'Invalid value: "Shop.example.com": spec.hostnames[0] in body should match'),
    ("hostname-double-wildcard", httproute, lambda o: o["spec"].__setitem__("hostnames", ["*.*.example.com"]),
     "spec.hostnames[0]", "in body should match '^(\\*\\.)?[a-z0-9]"),
    ("hostnames-max", httproute, lambda o: o["spec"].__setitem__("hostnames", [f"h{i}.example.com"
                                                                               for i in range(17)]),
     "spec.hostnames", "Too many: 17: must have at most 16 items"),
    ("rules-max", httproute, lambda o: o["spec"].__setitem__("rules", [{} for _ in range(17)]),
     "spec.rules", "Too many: 17: must have at most 16 items"),
    ("matches-max", httproute, lambda o: rule0(o).__setitem__("matches", [{} for _ in range(65)]),
     "spec.rules[0].matches", "Too many: 65: must have at most 64 items"),
    ("matches-total", httproute,
     lambda o: o["spec"].__setitem__("rules", [{"matches": [{} for _ in range(60)]} for _ in range(3)]),
     "spec.rules", "the total number of matches across all rules in a route must be less than 128"),
    ("filters-max", httproute, lambda o: rule0(o).__setitem__("filters", [
        {"type": "ExtensionRef", "extensionRef": {"group": "x.io", "kind": "F", "name": str(i)}}
        for i in range(17)]),
     "spec.rules[0].filters", "Too many: 17: must have at most 16 items"),
    ("backendrefs-max", httproute, lambda o: rule0(o).__setitem__("backendRefs", [
        {"name": f"b{i}", "port": 80} for i in range(17)]),
     "spec.rules[0].backendRefs", "Too many: 17: must have at most 16 items"),
    ("parentrefs-max", httproute, lambda o: o["spec"].__setitem__("parentRefs", [
        {"name": f"g{i}"} for i in range(33)]),
     "spec.parentRefs", "Too many: 33: must have at most 32 items"),
    ("parentref-name-required", httproute, lambda o: o["spec"]["parentRefs"][0].pop("name"),
     "spec.parentRefs[0].name", "Required value"),
    ("parentrefs-same-parent-no-section", httproute,
     lambda o: o["spec"].__setitem__("parentRefs", [{"name": "web"}, {"name": "web", "sectionName": "http"}]),
     "spec.parentRefs", 'Invalid value: "array": sectionName must be specified when parentRefs includes 2 '
                        "or more references to the same parent"),
    ("parentrefs-same-section", httproute,
     lambda o: o["spec"].__setitem__("parentRefs", [{"name": "web", "sectionName": "http"},
                                                     {"name": "web", "sectionName": "http"}]),
     "spec.parentRefs", "sectionName must be unique when parentRefs includes 2 or more references"),
    # ---- path matches
    ("path-relative", httproute, set_path("cart"),
     f"{M0}.path", f"value must be an absolute path and start with '/' {CEL_PATH}"),
    ("path-double-slash", httproute, set_path("/a//b"), f"{M0}.path", f"must not contain '//' {CEL_PATH}"),
    ("path-dot", httproute, set_path("/a/./b", "Exact"), f"{M0}.path", f"must not contain '/./' {CEL_PATH}"),
    ("path-dotdot", httproute, set_path("/a/../b"), f"{M0}.path", f"must not contain '/../' {CEL_PATH}"),
    ("path-encoded-slash", httproute, set_path("/a%2fb"), f"{M0}.path", f"must not contain '%2f' {CEL_PATH}"),
    ("path-encoded-slash-upper", httproute, set_path("/a%2Fb"), f"{M0}.path",
     f"must not contain '%2F' {CEL_PATH}"),
    ("path-fragment", httproute, set_path("/a#b"), f"{M0}.path", f"must not contain '#' {CEL_PATH}"),
    ("path-ends-dotdot", httproute, set_path("/a/.."), f"{M0}.path", f"must not end with '/..' {CEL_PATH}"),
    ("path-bad-chars", httproute, set_path("/a b"), f"{M0}.path", "must only contain valid characters"),
    ("path-type", httproute, set_path("/x", "Prefix"), f"{M0}.path.type",
     'Unsupported value: "Prefix": supported values: "Exact", "PathPrefix", "RegularExpression"'),
    ("path-bad-regex", httproute, set_path("/api/(v1", "RegularExpression"), f"{M0}.path.value",
     'Invalid value: "/api/(v1": must be a valid regular expression: missing ), unterminated subpattern'),
    ("header-bad-regex", httproute,
     lambda o: match0(o).__setitem__("headers", [{"name": "X-A", "type": "RegularExpression", "value": "[a"}]),
     f"{M0}.headers[0].value", "must be a valid regular expression"),
    ("query-bad-regex", httproute,
     lambda o: match0(o).__setitem__("queryParams", [{"name": "q", "type": "RegularExpression",
                                                      "value": "*x"}]),
     f"{M0}.queryParams[0].value", "must be a valid regular expression"),
    # ---- header and query matches
    ("header-name-invalid", httproute,
     lambda o: match0(o).__setitem__("headers", [{"name": "X Bad", "value": "v"}]),
     f"{M0}.headers[0].name", 'Invalid value: "X Bad": spec.rules[0].matches[0].headers[0].name in body '
                              "should match"),
    ("header-value-required", httproute,
     lambda o: match0(o).__setitem__("headers", [{"name": "X-A"}]), f"{M0}.headers[0].value", "Required value"),
    ("header-duplicate", httproute,
     lambda o: match0(o).__setitem__("headers", [{"name": "X-A", "value": "1"}, {"name": "X-A", "value": "2"}]),
     f"{M0}.headers[1]", 'Duplicate value: {"name":"X-A"}'),
    ("header-type", httproute,
     lambda o: match0(o).__setitem__("headers", [{"name": "X-A", "value": "1", "type": "Prefix"}]),
     f"{M0}.headers[0].type", 'supported values: "Exact", "RegularExpression"'),
    ("method", httproute, lambda o: match0(o).__setitem__("method", "FETCH"), f"{M0}.method",
     'Unsupported value: "FETCH"'),
    # ---- filters
    ("filter-config-missing", httproute, lambda o: rule0(o)["filters"][0].pop("requestHeaderModifier"),
     "spec.rules[0].filters[0]", 'Invalid value: "object": filter.requestHeaderModifier must be specified '
                                 "for RequestHeaderModifier filter.type"),
    ("filter-config-mismatch", httproute,
     lambda o: rule0(o)["filters"][0].__setitem__("urlRewrite", {"hostname": "a.example.com"}),
     "spec.rules[0].filters[0]", "filter.urlRewrite must be nil if the filter.type is not URLRewrite"),
    ("filter-type-required", httproute, lambda o: rule0(o)["filters"][0].pop("type"),
     "spec.rules[0].filters[0].type", "Required value"),
    ("filter-repeated", httproute, lambda o: rule0(o)["filters"].append(copy.deepcopy(rule0(o)["filters"][0])),
     "spec.rules[0].filters", "RequestHeaderModifier filter cannot be repeated"),
    ("redirect-and-rewrite", httproute, lambda o: (rule0(o).pop("backendRefs"), rule0(o).__setitem__(
        "filters", [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}},
                    {"type": "URLRewrite", "urlRewrite": {"hostname": "b.example.com"}}])),
     "spec.rules[0].filters", "May specify either httpRouteFilterRequestRedirect or "
                              "httpRouteFilterRequestRewrite, but not both"),
    ("redirect-with-backends", httproute, lambda o: rule0(o).__setitem__(
        "filters", [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}]),
     "spec.rules[0]", 'Invalid value: "object": RequestRedirect filter must not be used together with '
                      "backendRefs"),
    ("redirect-status", httproute, lambda o: (rule0(o).pop("backendRefs"), rule0(o).__setitem__(
        "filters", [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 307}}])),
     "spec.rules[0].filters[0].requestRedirect.statusCode", 'Unsupported value: 307: supported values: '
                                                            '"301", "302"'),
    ("redirect-hostname-wildcard", httproute, lambda o: (rule0(o).pop("backendRefs"), rule0(o).__setitem__(
        "filters", [{"type": "RequestRedirect", "requestRedirect": {"hostname": "*.example.com"}}])),
     "spec.rules[0].filters[0].requestRedirect.hostname", "in body should match"),
    ("replace-prefix-needs-prefix-match", httproute, lambda o: (set_path("/cart", "Exact")(o), rule0(o).__setitem__(
        "filters", [{"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/basket"}}}])),
     "spec.rules[0]", "When using URLRewrite filter with path.replacePrefixMatch, exactly one PathPrefix "
                      "match must be specified"),
    ("replace-prefix-in-backend-filter", httproute, lambda o: (set_path("/cart", "Exact")(o),
                                                             rule0(o)["backendRefs"][0].__setitem__(
        "filters", [{"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/basket"}}}])),
     "spec.rules[0]", "Within backendRefs, When using URLRewrite filter with path.replacePrefixMatch"),
    ("redirect-replace-prefix-needs-prefix-match", httproute, lambda o: (
        rule0(o).pop("backendRefs"), rule0(o)["matches"].append({}), rule0(o).__setitem__(
            "filters", [{"type": "RequestRedirect", "requestRedirect": {
                "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/basket"}}}])),
     "spec.rules[0]", "When using RequestRedirect filter with path.replacePrefixMatch, exactly one PathPrefix "
                      "match must be specified"),
    ("path-modifier-field-missing", httproute, lambda o: rule0(o).__setitem__(
        "filters", [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath"}}}]),
     "spec.rules[0].filters[0].urlRewrite.path", "replaceFullPath must be specified when type is set to "
                                                 "'ReplaceFullPath'"),
    ("path-modifier-field-mismatch", httproute, lambda o: rule0(o).__setitem__(
        "filters", [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath",
                                                                   "replaceFullPath": "/x",
                                                                   "replacePrefixMatch": "/y"}}}]),
     "spec.rules[0].filters[0].urlRewrite.path", "type must be 'ReplacePrefixMatch' when replacePrefixMatch "
                                                 "is set"),
    ("header-modifier-bad-name", httproute,
     lambda o: rule0(o)["filters"][0]["requestHeaderModifier"].__setitem__("remove", ["ok", "ok"]),
     "spec.rules[0].filters[0].requestHeaderModifier.remove[1]", 'Duplicate value: "ok"'),
    ("mirror-needs-port", httproute, lambda o: rule0(o)["filters"].append(
        {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow"}}}),
     "spec.rules[0].filters[1].requestMirror.backendRef", 'Invalid value: "object": Must have port for '
                                                          "Service reference"),
    # ---- backendRefs
    ("weight-negative", httproute, lambda o: rule0(o)["backendRefs"][0].__setitem__("weight", -1),
     "spec.rules[0].backendRefs[0].weight", "Invalid value: -1: spec.rules[0].backendRefs[0].weight in body "
                                            "should be greater than or equal to 0"),
    ("weight-too-big", httproute, lambda o: rule0(o)["backendRefs"][0].__setitem__("weight", 1000001),
     "spec.rules[0].backendRefs[0].weight", "should be less than or equal to 1000000"),
    ("backend-port-range", httproute, lambda o: rule0(o)["backendRefs"][0].__setitem__("port", 70000),
     "spec.rules[0].backendRefs[0].port", "should be less than or equal to 65535"),
    ("backend-service-needs-port", httproute, lambda o: rule0(o)["backendRefs"][0].pop("port"),
     "spec.rules[0].backendRefs[0]", "Must have port for Service reference"),
    ("backend-name-required", httproute, lambda o: rule0(o)["backendRefs"][0].pop("name"),
     "spec.rules[0].backendRefs[0].name", "Required value"),
    # ---- timeouts
    ("timeout-format", httproute, lambda o: rule0(o).__setitem__("timeouts", {"request": "10 seconds"}),
     "spec.rules[0].timeouts.request", "in body should match '^([0-9]{1,5}(h|m|s|ms)){1,4}$'"),
    ("timeout-backend-longer", httproute,
     lambda o: rule0(o).__setitem__("timeouts", {"request": "10s", "backendRequest": "1m"}),
     "spec.rules[0].timeouts", 'Invalid value: "object": backendRequest timeout cannot be longer than '
                               "request timeout"),
    # ---- Gateway listeners
    ("listener-name-invalid", gateway, lambda o: o["spec"]["listeners"][0].__setitem__("name", "HTTP_1"),
     "spec.listeners[0].name", "in body should match"),
    ("listener-name-unique", gateway, lambda o: o["spec"]["listeners"][1].__setitem__("name", "http"),
     "spec.listeners", 'Invalid value: "array": Listener name must be unique within the Gateway'),
    ("listener-port-zero", gateway, lambda o: o["spec"]["listeners"][0].__setitem__("port", 0),
     "spec.listeners[0].port", "should be greater than or equal to 1"),
    ("listener-port-high", gateway, lambda o: o["spec"]["listeners"][0].__setitem__("port", 65536),
     "spec.listeners[0].port", "should be less than or equal to 65535"),
    ("listener-port-required", gateway, lambda o: o["spec"]["listeners"][0].pop("port"),
     "spec.listeners[0].port", "Required value"),
    ("listener-hostname", gateway, lambda o: o["spec"]["listeners"][0].__setitem__("hostname", "a_b.com"),
     "spec.listeners[0].hostname", "in body should match"),
    ("http-with-tls", gateway, lambda o: o["spec"]["listeners"][0].__setitem__(
        "tls", {"certificateRefs": [{"name": "c"}]}),
     "spec.listeners", "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']"),
    ("https-passthrough", gateway, lambda o: o["spec"]["listeners"][1]["tls"].__setitem__("mode", "Passthrough"),
     "spec.listeners", 'Invalid value: "array": tls mode must be Terminate for protocol HTTPS'),
    ("terminate-without-certs", gateway, lambda o: o["spec"]["listeners"][1].__setitem__("tls", {}),
     "spec.listeners[1].tls", 'Invalid value: "object": certificateRefs or options must be specified when '
                              "mode is Terminate"),
    ("tls-mode", gateway, lambda o: o["spec"]["listeners"][1]["tls"].__setitem__("mode", "Reencrypt"),
     "spec.listeners[1].tls.mode", 'supported values: "Terminate", "Passthrough"'),
    ("tcp-with-hostname", gateway, lambda o: o["spec"]["listeners"].append(
        {"name": "tcp", "port": 5432, "protocol": "TCP", "hostname": "db.example.com"}),
     "spec.listeners", "hostname must not be specified for protocols ['TCP', 'UDP']"),
    ("listener-combination", gateway, lambda o: o["spec"]["listeners"].append(
        {"name": "http2", "port": 80, "protocol": "HTTP", "hostname": "*.example.com"}),
     "spec.listeners", "Combination of port, protocol and hostname must be unique for each listener"),
    ("listeners-max", gateway, lambda o: o["spec"].__setitem__("listeners", [
        {"name": f"l{i}", "port": 1000 + i, "protocol": "HTTP"} for i in range(65)]),
     "spec.listeners", "Too many: 65: must have at most 64 items"),
    ("listeners-required", gateway, lambda o: o["spec"].pop("listeners"), "spec.listeners", "Required value"),
    ("listeners-empty", gateway, lambda o: o["spec"].__setitem__("listeners", []),
     "spec.listeners", "spec.listeners in body should have at least 1 items"),
    ("class-name-required", gateway, lambda o: o["spec"].pop("gatewayClassName"),
     "spec.gatewayClassName", "Required value"),
    ("allowed-routes-from", gateway, lambda o: o["spec"]["listeners"][0].__setitem__(
        "allowedRoutes", {"namespaces": {"from": "Others"}}),
     "spec.listeners[0].allowedRoutes.namespaces.from", 'supported values: "All", "Selector", "Same"'),
    ("address-hostname", gateway, lambda o: o["spec"].__setitem__(
        "addresses", [{"type": "Hostname", "value": "Not_A_Host"}]),
     "spec.addresses[0]", "Hostname value must only contain valid characters"),
    ("address-not-ip", gateway, lambda o: o["spec"].__setitem__("addresses", [{"value": "1.2.3.4:8080"}]),
     "spec.addresses[0].value", 'Invalid value: "1.2.3.4:8080": spec.addresses[0].value in body must be of '
                                "type ipv4"),
    ("address-unique", gateway, lambda o: o["spec"].__setitem__(
        "addresses", [{"value": "10.0.0.1"}, {"value": "10.0.0.1"}]),
     "spec.addresses", "IPAddress values must be unique"),
    # ---- GatewayClass
    ("controller-name-not-domain-path", gatewayclass,
     lambda o: o["spec"].__setitem__("controllerName", "gateway-controller"),
     "spec.controllerName", 'Invalid value: "gateway-controller": spec.controllerName in body should match'),
    ("controller-name-required", gatewayclass, lambda o: o["spec"].pop("controllerName"),
     "spec.controllerName", "Required value"),
    ("description-too-long", gatewayclass, lambda o: o["spec"].__setitem__("description", "x" * 65),
     "spec.description", "Too long: may not be more than 64 bytes"),
]


@pytest.mark.parametrize("factory", [gatewayclass, gateway, httproute])
def test_base_objects_are_valid(factory):
    assert check(factory()) == []


@pytest.mark.parametrize(("factory", "mutate", "field", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_invalid(factory, mutate, field, message):
    obj = factory()
    mutate(obj)
    causes = check(obj)
    hits = [c for c in causes if c["field"] == field and message in c["message"]]
    assert hits, f"expected {field}: ...{message}... in {causes}"


def test_https_listener_without_tls_is_left_to_the_controller():
    o = gateway()
    del o["spec"]["listeners"][1]["tls"]
    assert check(o) == []  # upstream's CRD accepts it; the controller marks the listener invalid


def test_controller_name_is_immutable():
    old = gatewayclass()
    check(old)
    new = copy.deepcopy(old)
    new["spec"]["controllerName"] = "other.dev/controller"
    causes = check(new, old)
    assert {"field": "spec.controllerName", "message": 'Invalid value: "string": Value is immutable',
            "reason": "FieldValueInvalid"} in causes
    assert check(copy.deepcopy(old), old) == []


def test_httproute_defaults():
    o = httproute()
    o["spec"]["rules"].append({"backendRefs": [{"name": "b", "port": 8080}]})
    o["spec"]["rules"][0]["matches"].append({"headers": [{"name": "X-A", "value": "1"}],
                                             "queryParams": [{"name": "q", "value": "1"}]})
    o["spec"]["rules"].append({"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}},
                                           {"type": "RequestMirror", "requestMirror": {
                                               "backendRef": {"name": "m", "port": 80}}}]})
    assert check(o) == []
    spec = o["spec"]
    assert spec["parentRefs"] == [{"name": "web", "group": "gateway.networking.k8s.io", "kind": "Gateway"}]
    assert spec["rules"][0]["backendRefs"][0] == {"name": "cart", "port": 80, "weight": 90, "group": "",
                                                  "kind": "Service"}
    assert spec["rules"][0]["matches"][0]["headers"][0]["type"] == "Exact"
    assert spec["rules"][0]["matches"][1] == {
        "path": {"type": "PathPrefix", "value": "/"},
        "headers": [{"name": "X-A", "value": "1", "type": "Exact"}],
        "queryParams": [{"name": "q", "value": "1", "type": "Exact"}]}
    assert spec["rules"][1]["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert spec["rules"][1]["backendRefs"][0]["weight"] == 1
    redirect, mirror = spec["rules"][2]["filters"]
    assert redirect["requestRedirect"]["statusCode"] == 302
    assert mirror["requestMirror"]["backendRef"] == {"name": "m", "port": 80, "group": "", "kind": "Service"}
    assert "status" not in o  # HTTPRoute's status has no default


def test_httproute_without_rules_matches_everything():
    o = httproute()
    del o["spec"]["rules"]
    assert check(o) == []
    assert o["spec"]["rules"] == [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]


def test_path_match_defaults_fill_a_partial_path():
    o = httproute()
    match0(o)["path"] = {"value": "/x"}
    assert check(o) == []
    assert match0(o)["path"] == {"type": "PathPrefix", "value": "/x"}


def test_gateway_defaults():
    o = gateway()
    o["spec"]["listeners"][0]["allowedRoutes"] = {"kinds": [{"kind": "HTTPRoute"}]}
    o["spec"]["addresses"] = [{"value": "10.0.0.1"}]
    assert check(o) == []
    http, https = o["spec"]["listeners"]
    assert http["allowedRoutes"] == {"namespaces": {"from": "Same"},
                                     "kinds": [{"kind": "HTTPRoute", "group": "gateway.networking.k8s.io"}]}
    assert https["allowedRoutes"] == {"namespaces": {"from": "Same"}}
    assert https["tls"] == {"mode": "Terminate",
                            "certificateRefs": [{"name": "example-cert", "group": "", "kind": "Secret"}]}
    assert o["spec"]["addresses"] == [{"type": "IPAddress", "value": "10.0.0.1"}]
    assert o["status"] == {"conditions": [
        {"type": "Accepted", "status": "Unknown", "reason": "Pending", "message": "Waiting for controller",
         "lastTransitionTime": EPOCH},
        {"type": "Programmed", "status": "Unknown", "reason": "Pending", "message": "Waiting for controller",
         "lastTransitionTime": EPOCH}]}


def test_gatewayclass_status_default_and_kept():
    o = gatewayclass()
    assert check(o) == []
    assert o["status"] == {"conditions": [
        {"type": "Accepted", "status": "Unknown", "reason": "Pending", "message": "Waiting for controller",
         "lastTransitionTime": EPOCH}]}
    written = {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    o["status"] = copy.deepcopy(written)
    check(o)
    assert o["status"] == written  # a controller's status is never overwritten by the default


def test_tables():
    gc, gw, rt = gatewayclass(), gateway(), httproute()
    for o in (gc, gw, rt):
        check(o)
        o["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    gw["status"]["addresses"] = [{"type": "IPAddress", "value": "10.0.0.7"}, {"value": "10.0.0.8"}]
    rt["spec"]["hostnames"].append("www.example.com")

    def cells(o: dict[str, Any]) -> dict[str, Any]:
        info = REG.by_kind(o["apiVersion"], o["kind"])
        assert info is not None
        return {c.name: c.value(o) for c in info.table_columns()}

    row = cells(gc)
    assert [c.name for c in g.GATEWAY_CLASS.table_columns()] == ["Name", "Controller", "Accepted", "Age",
                                                                 "Description"]
    assert [c.priority for c in g.GATEWAY_CLASS.table_columns()] == [0, 0, 0, 0, 1]
    assert (row["Name"], row["Controller"], row["Accepted"], row["Description"]) == (
        "fleet", "fleet.dev/gateway-controller", "Unknown", "Fleet's gateway")
    row = cells(gw)
    assert list(row) == ["Name", "Class", "Address", "Programmed", "Age"]
    assert (row["Class"], row["Address"], row["Programmed"]) == ("fleet", "10.0.0.7", "Unknown")
    row = cells(rt)
    assert list(row) == ["Name", "Hostnames", "Age"]
    assert row["Hostnames"] == '["shop.example.com","www.example.com"]'
    del rt["spec"]["hostnames"]
    assert cells(rt)["Hostnames"] is None


def test_kinds_are_custom_resource_like():
    for info in g.KINDS:
        assert info.strategic_merge is False
        assert info.strategic_schema() == {}
        assert info.categories == ("gateway-api",)
    assert REG.resolve("gc") is g.GATEWAY_CLASS
    assert REG.resolve("gtw") is g.GATEWAY
    assert REG.resolve("httproutes.gateway.networking.k8s.io") is g.HTTPROUTE


def test_schema_types_and_pruning():
    """The generated schema knows every standard field and drops experimental ones."""
    o = httproute()
    rule0(o)["sessionPersistence"] = {"sessionName": "x"}  # experimental channel only
    rule0(o)["timeouts"] = {"request": "10s", "backendRequest": "2s"}
    t = schema.root_type("gateway.networking.k8s.io", "v1", "HTTPRoute")
    report = typecheck.check(t, o)
    assert report.unknown == [".spec.rules[0].sessionPersistence"]
    assert report.causes == []
    o["spec"]["rules"][0]["backendRefs"][0]["weight"] = "ninety"
    report = typecheck.check(t, o)
    assert [c["field"] for c in report.causes] == ["spec.rules[0].backendRefs[0].weight"]
    for kind in ("GatewayClass", "Gateway"):
        assert schema.root_type("gateway.networking.k8s.io", "v1", kind) == f"GatewayV1{kind}"
    gw = gateway()
    gw["spec"]["listeners"][1]["tls"]["options"] = {"example.com/cipher": "x"}
    assert typecheck.check("GatewayV1Gateway", gw).unknown == []
