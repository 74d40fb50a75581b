"""Ingress, IngressClass and NetworkPolicy (networking.k8s.io/v1): kube 1.32's validation
causes (field paths and messages), defaulting, kubectl's table cells, and the
DefaultIngressClass admission plugin's choice."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import trio

from fleet.admission.defaultingressclass import (
    DefaultIngressClass,
    IngressClassCache,
    default_class,
)
from fleet.api.kinds.ingress import (
    INGRESS,
    INGRESS_CLASS,
    WILDCARD_DNS1123_SUBDOMAIN_ERR,
    default_ingress_class,
    validate_ingress,
    validate_ingress_class,
)
from fleet.api.kinds.networkpolicy import (
    NETWORK_POLICY,
    default_network_policy,
    parse_cidr_sloppy,
    validate_network_policy,
)
from fleet.api.smp_schema import schema_for
from fleet.api.validation import DNS1123_SUBDOMAIN_ERR
from fleet.auth import Attributes, UserInfo

Obj = dict[str, Any]

SVC = {"service": {"name": "svc1", "port": {"number": 8080}}}
DNS1035_ERR = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
               "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
               "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")


def ingress(**spec: Any) -> Obj:
    base: Obj = {"rules": [{"host": "foo.com", "http": {"paths": [
        {"path": "/bar", "pathType": "Prefix", "backend": copy.deepcopy(SVC)}]}}]}
    base.update(spec)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "namespace": "default"}, "spec": base}


def with_path(path: Any = "/bar", path_type: Any = "Prefix", backend: Any = None) -> Obj:
    p: Obj = {"path": path, "backend": copy.deepcopy(SVC) if backend is None else backend}
    if path_type is not None:
        p["pathType"] = path_type
    return ingress(rules=[{"host": "foo.com", "http": {"paths": [p]}}])


def errs(causes: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in causes]


def test_a_valid_ingress_has_no_causes() -> None:
    obj = ingress(tls=[{"hosts": ["foo.com", "*.foo.com"], "secretName": "my-cert"}],
                  ingressClassName="fleet", defaultBackend={"service": {"name": "svc2", "port": {"name": "http"}}})
    obj["spec"]["rules"].append({"host": "*.bar.com", "http": {"paths": [
        {"path": "/x", "pathType": "Exact", "backend": {"resource": {"apiGroup": "k8s.example.com",
                                                                    "kind": "StorageBucket", "name": "b"}}},
        {"pathType": "ImplementationSpecific", "backend": SVC}]}})
    assert validate_ingress(obj, None) == []


INGRESS_CASES = [
    # rules: host
    (ingress(rules=[{"host": "1.2.3.4"}]),
     [("spec.rules[0].host", 'Invalid value: "1.2.3.4": must be a DNS name, not an IP address')]),
    (ingress(rules=[{"host": "Foo.com"}]),
     [("spec.rules[0].host", f'Invalid value: "Foo.com": {DNS1123_SUBDOMAIN_ERR}')]),
    (ingress(rules=[{"host": "*.*.foo.com"}]),
     [("spec.rules[0].host", f'Invalid value: "*.*.foo.com": {WILDCARD_DNS1123_SUBDOMAIN_ERR}')]),
    (ingress(rules=[{"host": "f*.foo.com"}]),
     [("spec.rules[0].host", f'Invalid value: "f*.foo.com": {WILDCARD_DNS1123_SUBDOMAIN_ERR}')]),
    # paths
    (ingress(rules=[{"http": {"paths": []}}]), [("spec.rules[0].http.paths", "Required value")]),
    (with_path(path_type=None), [("spec.rules[0].http.paths[0].pathType", "Required value: pathType must be specified")]),
    (with_path(path_type="Regex"),
     [("spec.rules[0].http.paths[0].pathType",
       'Unsupported value: "Regex": supported values: "Exact", "ImplementationSpecific", "Prefix"')]),
    (with_path(path="bar"), [("spec.rules[0].http.paths[0].path", 'Invalid value: "bar": must be an absolute path')]),
    (with_path(path="", path_type="Exact"),
     [("spec.rules[0].http.paths[0].path", 'Invalid value: "": must be an absolute path')]),
    (with_path(path="bar", path_type="ImplementationSpecific"),
     [("spec.rules[0].http.paths[0].path", 'Invalid value: "bar": must be an absolute path')]),
    (with_path(path="/a//b"), [("spec.rules[0].http.paths[0].path", "Invalid value: \"/a//b\": must not contain '//'")]),
    (with_path(path="/a/./b"), [("spec.rules[0].http.paths[0].path", "Invalid value: \"/a/./b\": must not contain '/./'")]),
    (with_path(path="/a/../b", path_type="Exact"),
     [("spec.rules[0].http.paths[0].path", "Invalid value: \"/a/../b\": must not contain '/../'")]),
    (with_path(path="/a%2fb"), [("spec.rules[0].http.paths[0].path", "Invalid value: \"/a%2fb\": must not contain '%2f'")]),
    (with_path(path="/a%2Fb"), [("spec.rules[0].http.paths[0].path", "Invalid value: \"/a%2Fb\": must not contain '%2F'")]),
    (with_path(path="/a/.."), [("spec.rules[0].http.paths[0].path", "Invalid value: \"/a/..\": cannot end with '/..'")]),
    (with_path(path="/a/."), [("spec.rules[0].http.paths[0].path", "Invalid value: \"/a/.\": cannot end with '/.'")]),
    # ImplementationSpecific paths are the controller's to interpret.
    (with_path(path="/a//b/..", path_type="ImplementationSpecific"), []),
    # backends
    (with_path(backend={}), [("spec.rules[0].http.paths[0].backend",
                              'Invalid value: "": resource or service backend is required')]),
    (with_path(backend={**SVC, "resource": {"kind": "K", "name": "n"}}),
     [("spec.rules[0].http.paths[0].backend", 'Invalid value: "": cannot set both resource and service backends')]),
    (with_path(backend={"resource": {"kind": "a/b", "name": ".."}}),
     [("spec.rules[0].http.paths[0].backend.resource.kind", "Invalid value: \"a/b\": may not contain '/'"),
      ("spec.rules[0].http.paths[0].backend.resource.name", "Invalid value: \"..\": may not be '..'")]),
    (with_path(backend={"resource": {}}),
     [("spec.rules[0].http.paths[0].backend.resource.kind", "Required value"),
      ("spec.rules[0].http.paths[0].backend.resource.name", "Required value")]),
    (with_path(backend={"service": {"name": "1svc", "port": {"number": 80}}}),
     [("spec.rules[0].http.paths[0].backend.service.name", f'Invalid value: "1svc": {DNS1035_ERR}')]),
    (with_path(backend={"service": {"port": {"number": 80}}}),
     [("spec.rules[0].http.paths[0].backend.service.name", "Required value")]),
    (with_path(backend={"service": {"name": "s", "port": {}}}),
     [("spec.rules[0].http.paths[0].backend", "Required value: port name or number is required")]),
    (with_path(backend={"service": {"name": "s", "port": {"name": "http", "number": 80}}}),
     [("spec.rules[0].http.paths[0].backend", 'Invalid value: "": cannot set both port name & port number')]),
    (with_path(backend={"service": {"name": "s", "port": {"number": 70000}}}),
     [("spec.rules[0].http.paths[0].backend.service.port.number",
       "Invalid value: 70000: must be between 1 and 65535, inclusive")]),
    (with_path(backend={"service": {"name": "s", "port": {"name": "HTTP"}}}),
     [("spec.rules[0].http.paths[0].backend.service.port.name",
       'Invalid value: "HTTP": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)'),
      ("spec.rules[0].http.paths[0].backend.service.port.name",
       'Invalid value: "HTTP": must contain at least one letter (a-z)')]),
    # no rules, no default backend
    (ingress(rules=None),
     [("spec", "Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified")]),
    (ingress(rules=[]),
     [("spec", "Invalid value: []networking.IngressRule{}: either `defaultBackend` or `rules` must be specified")]),
    (ingress(rules=None, defaultBackend={"service": {"name": "s", "port": {"number": 0}}}),
     [("spec.defaultBackend", "Required value: port name or number is required")]),
    # tls and class
    (ingress(tls=[{"hosts": ["a_b.com", "*.x.com", "*x.com"], "secretName": "My-Cert"}]),
     [("spec.tls[0].hosts[0]", f'Invalid value: "a_b.com": {DNS1123_SUBDOMAIN_ERR}'),
      ("spec.tls[0].hosts[2]", f'Invalid value: "*x.com": {WILDCARD_DNS1123_SUBDOMAIN_ERR}'),
      ("spec.tls[0].secretName", f'Invalid value: "My-Cert": {DNS1123_SUBDOMAIN_ERR}')]),
    (ingress(tls=[{"hosts": ["foo.com"]}]), []),  # no secretName: the controller's default certificate
    (ingress(ingressClassName="Fleet"), [("spec.ingressClassName", f'Invalid value: "Fleet": {DNS1123_SUBDOMAIN_ERR}')]),
]


@pytest.mark.parametrize(("obj", "expected"), INGRESS_CASES)
def test_ingress_validation_is_kubes(obj: Obj, expected: list[tuple[str, str]]) -> None:
    assert errs(validate_ingress(obj, None)) == expected


def test_class_annotation_must_match_the_class_field_on_create() -> None:
    obj = ingress(ingressClassName="fleet")
    obj["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "nginx"}
    assert errs(validate_ingress(obj, None)) == [
        ("annotations.kubernetes.io/ingress.class",
         'Invalid value: "nginx": must match `ingressClassName` when both are specified')]
    # Equal values are allowed, and so is either one alone.
    obj["metadata"]["annotations"]["kubernetes.io/ingress.class"] = "fleet"
    assert validate_ingress(obj, None) == []
    del obj["spec"]["ingressClassName"]
    assert validate_ingress(obj, None) == []
    # The rule is ValidateIngressCreate's only: an update does not check it.
    obj["spec"]["ingressClassName"] = "other"
    assert validate_ingress(obj, ingress()) == []


def test_update_keeps_stored_legacy_values_valid() -> None:
    """allowInvalidSecretName / allowInvalidWildcardHostRule: what kube once stored stays updatable."""
    old = ingress(tls=[{"secretName": "Bad_Name"}])
    assert validate_ingress(copy.deepcopy(old), None)
    assert validate_ingress(copy.deepcopy(old), old) == []
    old = ingress(rules=[{"host": "*.foo.com", "http": {"paths": [{"path": "x", "pathType": "Prefix",
                                                                   "backend": SVC}]}}])
    assert validate_ingress(copy.deepcopy(old), None)
    assert validate_ingress(copy.deepcopy(old), old) == []


@pytest.mark.parametrize(("entry", "expected"), [
    ({"ip": "10.0.0.1", "hostname": "lb.example.com", "ports": [{"port": 80, "protocol": "TCP"}]}, []),
    ({"ip": "10.0.0.256"}, [("status.loadBalancer.ingress[0].ip", 'Invalid value: "10.0.0.256": must be a valid IP address')]),
    ({"ip": "010.000.000.001"}, []),  # netutils.ParseIPSloppy takes leading zeros
    ({"hostname": "10.0.0.1"}, [("status.loadBalancer.ingress[0].hostname",
                                 'Invalid value: "10.0.0.1": must be a DNS name, not an IP address')]),
    ({"hostname": "LB"}, [("status.loadBalancer.ingress[0].hostname", f'Invalid value: "LB": {DNS1123_SUBDOMAIN_ERR}')]),
])
def test_ingress_status_validation(entry: Obj, expected: list[tuple[str, str]]) -> None:
    old = ingress()
    new = copy.deepcopy(old)
    new["status"] = {"loadBalancer": {"ingress": [entry]}}
    assert errs(validate_ingress(new, old)) == expected


def cells(info: Any, obj: Obj) -> list[Any]:
    obj.setdefault("metadata", {}).setdefault("creationTimestamp", None)
    return [c.value(obj) for c in info.table_columns()]


def test_ingress_table_is_kubectls() -> None:
    assert [c.name for c in INGRESS.table_columns()] == ["Name", "Class", "Hosts", "Address", "Ports", "Age"]
    obj = ingress()
    assert cells(INGRESS, obj)[1:5] == ["<none>", "foo.com", "", "80"]
    obj = ingress(ingressClassName="fleet", tls=[{"hosts": ["foo.com"]}],
                  rules=[{"host": f"h{i}.com"} for i in range(5)] + [{}])
    obj["status"] = {"loadBalancer": {"ingress": [{"ip": "10.0.0.2"}, {"hostname": "lb.example.com"},
                                                  {"ip": "10.0.0.1", "hostname": "ignored.com"}, {"ip": "10.0.0.2"}]}}
    assert cells(INGRESS, obj)[1:5] == ["fleet", "h0.com,h1.com,h2.com + 3 more...",
                                        "10.0.0.1,10.0.0.2,lb.example.com", "80, 443"]
    assert cells(INGRESS, ingress(rules=[{}, {"host": ""}]))[2] == "*"


# ---------------------------------------------------------------------------
# IngressClass
# ---------------------------------------------------------------------------


def ingress_class(**spec: Any) -> Obj:
    return {"metadata": {"name": "fleet"}, "spec": {"controller": "fleet.dev/ingress", **spec}}


INGRESS_CLASS_CASES = [
    (ingress_class(), []),
    (ingress_class(controller=None), [("spec.controller", "Required value")]),
    (ingress_class(controller="fleet"), [("spec.controller",
                                          'Invalid value: "fleet": must be a domain-prefixed path (such as "acme.io/foo")')]),
    (ingress_class(controller="Fleet.dev/x"), [("spec.controller", f'Invalid value: "Fleet.dev": {DNS1123_SUBDOMAIN_ERR}')]),
    (ingress_class(controller="fleet.dev/a b"),
     [("spec.controller", "Invalid value: \"a b\": Invalid path (regex used for validation is "
                          "'[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')")]),
    (ingress_class(controller="fleet.dev/" + "a" * 241), [("spec.controller", "Too long: may not be more than 250 bytes")]),
    (ingress_class(parameters={"kind": "P", "name": "p", "scope": "Cluster"}), []),
    (ingress_class(parameters={"apiGroup": "k8s.example.com", "kind": "P", "name": "p", "scope": "Namespace",
                               "namespace": "default"}), []),
    (ingress_class(parameters={"scope": "Cluster"}),
     [("spec.parameters.kind", "Required value"), ("spec.parameters.name", "Required value")]),
    (ingress_class(parameters={"apiGroup": "Bad_", "kind": "P", "name": "p", "scope": "Cluster"}),
     [("spec.parameters.apiGroup", f'Invalid value: "Bad_": {DNS1123_SUBDOMAIN_ERR}')]),
    (ingress_class(parameters={"kind": "P", "name": "p"}), [("spec.parameters.scope", "Required value")]),
    (ingress_class(parameters={"kind": "P", "name": "p", "scope": "Global"}),
     [("spec.parameters.scope", 'Unsupported value: "Global": supported values: "Cluster", "Namespace"')]),
    (ingress_class(parameters={"kind": "P", "name": "p", "scope": "Namespace"}),
     [("spec.parameters.namespace", "Required value: `parameters.scope` is set to 'Namespace'")]),
    (ingress_class(parameters={"kind": "P", "name": "p", "scope": "Cluster", "namespace": "default"}),
     [("spec.parameters.namespace", "Forbidden: `parameters.scope` is set to 'Cluster'")]),
]


@pytest.mark.parametrize(("obj", "expected"), INGRESS_CLASS_CASES)
def test_ingress_class_validation_is_kubes(obj: Obj, expected: list[tuple[str, str]]) -> None:
    assert errs(validate_ingress_class(obj, None)) == expected


def test_ingress_class_controller_is_immutable() -> None:
    assert errs(validate_ingress_class(ingress_class(controller="other.dev/x"), ingress_class())) == [
        ("spec.controller", 'Invalid value: "other.dev/x": field is immutable')]


def test_ingress_class_parameters_scope_defaults_to_cluster() -> None:
    obj = ingress_class(parameters={"kind": "P", "name": "p"})
    default_ingress_class(obj)
    assert obj["spec"]["parameters"]["scope"] == "Cluster"
    assert validate_ingress_class(obj, None) == []


def test_ingress_class_table_is_kubectls() -> None:
    assert [c.name for c in INGRESS_CLASS.table_columns()] == ["Name", "Controller", "Parameters", "Age"]
    assert cells(INGRESS_CLASS, ingress_class())[1:3] == ["fleet.dev/ingress", "<none>"]
    obj = ingress_class(parameters={"apiGroup": "k8s.example.com", "kind": "P", "name": "p"})
    assert cells(INGRESS_CLASS, obj)[2] == "P.k8s.example.com/p"
    assert cells(INGRESS_CLASS, ingress_class(parameters={"kind": "P", "name": "p"}))[2] == "P/p"


# ---------------------------------------------------------------------------
# DefaultIngressClass admission
# ---------------------------------------------------------------------------


def klass(name: str, created: str, default: Any = "true") -> Obj:
    md: Obj = {"name": name, "creationTimestamp": created}
    if default is not None:
        md["annotations"] = {"ingressclass.kubernetes.io/is-default-class": default}
    return {"metadata": md, "spec": {"controller": "fleet.dev/ingress"}}


def test_default_class_is_the_newest_annotated_one() -> None:
    old, new = klass("old", "2026-01-01T00:00:00Z"), klass("new", "2026-01-02T00:00:00Z")
    assert default_class([old, new, klass("newest-not-default", "2026-01-03T00:00:00Z", default=None),
                          klass("false", "2026-01-03T00:00:00Z", default="True")]) is new
    assert default_class([klass("b", "2026-01-02T00:00:00Z"), klass("a", "2026-01-02T00:00:00Z")])["metadata"][
        "name"] == "a"
    assert default_class([klass("x", "2026-01-02T00:00:00Z", default=None)]) is None


class FakeStore:
    def __init__(self, items: list[Obj]) -> None:
        self.items = items

    async def list(self, prefix: str) -> Any:
        assert prefix == "/networking.k8s.io/ingressclasses/"
        return self


def attrs(verb: str = "create", resource: str = "ingresses", subresource: str = "") -> Attributes:
    return Attributes(verb, "networking.k8s.io", "v1", resource, subresource, "default", "web", False)


ADMIN = UserInfo("admin", groups=("system:masters",))


@pytest.mark.parametrize(("obj_change", "verb", "expected"), [
    (lambda o: None, "create", "fleet"),
    (lambda o: o["spec"].update(ingressClassName="mine"), "create", "mine"),
    (lambda o: o["metadata"].update(annotations={"kubernetes.io/ingress.class": "nginx"}), "create", None),
    (lambda o: None, "update", None),
])
def test_default_ingress_class_admission(obj_change: Any, verb: str, expected: str | None) -> None:
    plugin = DefaultIngressClass(FakeStore([klass("fleet", "2026-01-01T00:00:00Z")]))  # type: ignore[arg-type]
    obj = ingress()
    obj_change(obj)
    out = trio.run(plugin.mutate, attrs(verb), ADMIN, obj, None)
    assert out["spec"].get("ingressClassName") == expected


def test_default_ingress_class_uses_a_synced_cache() -> None:
    cache = IngressClassCache()
    cache.replace([klass("cached", "2026-01-01T00:00:00Z")])
    cache.synced = True
    plugin = DefaultIngressClass(FakeStore([]), cache)  # type: ignore[arg-type]
    out = trio.run(plugin.mutate, attrs(), ADMIN, ingress(), None)
    assert out["spec"]["ingressClassName"] == "cached"
    # No default class: the Ingress is left without one.
    plugin = DefaultIngressClass(FakeStore([klass("plain", "2026-01-01T00:00:00Z", default=None)]))  # type: ignore[arg-type]
    assert "ingressClassName" not in trio.run(plugin.mutate, attrs(), ADMIN, ingress(), None)["spec"]


# ---------------------------------------------------------------------------
# NetworkPolicy
# ---------------------------------------------------------------------------


def netpol(**spec: Any) -> Obj:
    return {"metadata": {"name": "deny", "namespace": "default"}, "spec": {"podSelector": {}, **spec}}


def test_network_policy_defaults_are_kubes() -> None:
    obj = netpol(ingress=[{"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}],
                 egress=[{"ports": [{"port": "dns"}]}])
    default_network_policy(obj)
    assert [p["protocol"] for p in obj["spec"]["ingress"][0]["ports"]] == ["TCP", "UDP"]
    assert obj["spec"]["egress"][0]["ports"][0]["protocol"] == "TCP"
    assert obj["spec"]["policyTypes"] == ["Ingress", "Egress"]
    obj = netpol()
    default_network_policy(obj)
    assert obj["spec"]["policyTypes"] == ["Ingress"]
    obj = netpol(policyTypes=["Egress"], egress=[{}])
    default_network_policy(obj)
    assert obj["spec"]["policyTypes"] == ["Egress"]  # given types are kept


def test_a_valid_network_policy_has_no_causes() -> None:
    obj = netpol(podSelector={"matchLabels": {"app": "db"}},
                 ingress=[{"from": [{"podSelector": {"matchLabels": {"role": "api"}},
                                     "namespaceSelector": {"matchExpressions": [
                                         {"key": "team", "operator": "In", "values": ["a"]}]}},
                                    {"ipBlock": {"cidr": "10.0.0.1/8", "except": ["10.1.0.0/16"]}}],
                           "ports": [{"port": 5432, "endPort": 5440, "protocol": "TCP"}, {"port": "pg"}, {}]}],
                 egress=[{"to": [{"ipBlock": {"cidr": "fd00::/64"}}]}], policyTypes=["Ingress", "Egress"])
    assert validate_network_policy(obj, None) == []


def rule(**r: Any) -> Obj:
    return netpol(ingress=[r])


NETPOL_CASES = [
    (netpol(podSelector={"matchLabels": {"a": "b c"}}), ["spec.podSelector.matchLabels"]),
    (rule(ports=[{"protocol": "ICMP"}]),
     [("spec.ingress[0].ports[0].protocol", 'Unsupported value: "ICMP": supported values: "TCP", "UDP", "SCTP"')]),
    (rule(ports=[{"port": 0}]),
     [("spec.ingress[0].ports[0].port", "Invalid value: 0: must be between 1 and 65535, inclusive")]),
    (rule(ports=[{"port": "HTTP"}]),
     [("spec.ingress[0].ports[0].port",
       'Invalid value: "HTTP": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)'),
      ("spec.ingress[0].ports[0].port", 'Invalid value: "HTTP": must contain at least one letter (a-z)')]),
    (rule(ports=[{"port": 80, "endPort": 79}]),
     [("spec.ingress[0].ports[0].endPort", "Invalid value: 79: must be greater than or equal to `port`")]),
    (rule(ports=[{"port": 80, "endPort": 70000}]),
     [("spec.ingress[0].ports[0].endPort", "Invalid value: 70000: must be between 1 and 65535, inclusive")]),
    (rule(ports=[{"port": "http", "endPort": 90}]),
     [("spec.ingress[0].ports[0].endPort", "Invalid value: 90: may not be specified when `port` is non-numeric")]),
    (rule(ports=[{"endPort": 90}]),
     [("spec.ingress[0].ports[0].endPort", "Invalid value: 90: may not be specified when `port` is not specified")]),
    (rule(**{"from": [{}]}), [("spec.ingress[0].from[0]", "Required value: must specify a peer")]),
    (netpol(egress=[{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]),
     [("spec.egress[0].to[0]", "Forbidden: may not specify both ipBlock and another peer")]),
    (rule(**{"from": [{"ipBlock": {}}]}), [("spec.ingress[0].from[0].ipBlock.cidr", "Required value")]),
    (rule(**{"from": [{"ipBlock": {"cidr": "10.0.0.0"}}]}),
     [("spec.ingress[0].from[0].ipBlock.cidr", 'Invalid value: "10.0.0.0": not a valid CIDR')]),
    (rule(**{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8", "11.0.0.0/16", "10.1.0.0/16",
                                                                    "fd00::/64"]}}]}),
     [("spec.ingress[0].from[0].ipBlock.except[0]", 'Invalid value: "10.0.0.0/8": must be a strict subset of `cidr`'),
      ("spec.ingress[0].from[0].ipBlock.except[1]", 'Invalid value: "11.0.0.0/16": must be a strict subset of `cidr`'),
      ("spec.ingress[0].from[0].ipBlock.except[3]", 'Invalid value: "fd00::/64": must be a strict subset of `cidr`')]),
    (rule(**{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["x", "11.0.0.0/16"]}}]}),
     [("spec.ingress[0].from[0].ipBlock.except[0]", 'Invalid value: "x": not a valid CIDR')]),
    (netpol(policyTypes=["Ingress", "Egress", "Ingress"]),
     [("spec.policyTypes", 'Invalid value: []networking.PolicyType{"Ingress", "Egress", "Ingress"}: '
                           "may not specify more than two policyTypes")]),
    (netpol(policyTypes=["Ingress", "ingress"]),
     [("spec.policyTypes[1]", 'Unsupported value: "ingress": supported values: "Ingress", "Egress"')]),
]


@pytest.mark.parametrize(("obj", "expected"), NETPOL_CASES)
def test_network_policy_validation_is_kubes(obj: Obj, expected: list[Any]) -> None:
    got = errs(validate_network_policy(obj, None))
    if expected and isinstance(expected[0], str):
        assert [f for f, _ in got] == expected
    else:
        assert got == expected


@pytest.mark.parametrize(("text", "net"), [
    ("10.0.0.1/8", "10.0.0.0/8"), ("010.000.000.001/24", "10.0.0.0/24"), ("fd00::1/64", "fd00::/64"),
    ("10.0.0.1", None), ("10.0.0.0/255.0.0.0", None), ("10.0.0.0/33", None), ("fe80::1%eth0/64", None), (7, None),
])
def test_cidrs_parse_like_go(text: Any, net: str | None) -> None:
    got = parse_cidr_sloppy(text)
    assert (str(got) if got is not None else None) == net


def test_network_policy_table_is_kubectls() -> None:
    assert [c.name for c in NETWORK_POLICY.table_columns()] == ["Name", "Pod-Selector", "Age"]
    assert cells(NETWORK_POLICY, netpol())[1] == "<none>"
    obj = netpol(podSelector={"matchLabels": {"app": "db"},
                              "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a", "b"]}]})
    assert cells(NETWORK_POLICY, obj)[1] == "app=db,tier notin (a,b)"


def test_no_strategic_merge_tags() -> None:
    """k8s.io/api networking/v1 tags none of these kinds' lists (rules, paths, tls, ingress,
    egress, ports, peers are atomic): a strategic merge patch replaces them whole."""
    for info in (INGRESS, INGRESS_CLASS, NETWORK_POLICY):
        assert info.strategic_schema() == schema_for("NoSuchKind")


def test_a_stored_invalid_selector_value_stays_updatable() -> None:
    """ValidationOptionsForNetworking: AllowInvalidLabelValueInSelector when the old podSelector fails."""
    bad_sel = {"matchExpressions": [{"key": "a", "operator": "In", "values": ["not valid!"]}]}
    old = netpol(podSelector=bad_sel)
    assert fields_of(validate_network_policy(copy.deepcopy(old), None)) == ["spec.podSelector.matchExpressions[0].values[0]"]
    new = netpol(podSelector=bad_sel, ingress=[{"from": [{"podSelector": bad_sel}]}])
    assert validate_network_policy(new, old) == []
    # Keys are still checked, and a valid old policy gives no allowance.
    new["spec"]["podSelector"] = {"matchExpressions": [{"key": "b c", "operator": "Exists"}]}
    assert fields_of(validate_network_policy(new, old)) == ["spec.podSelector.matchExpressions[0].key"]
    assert validate_network_policy(copy.deepcopy(old), netpol())


def fields_of(causes: list[dict[str, str]]) -> list[str]:
    return [c["field"] for c in causes]
