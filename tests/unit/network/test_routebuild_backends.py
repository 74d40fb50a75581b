"""Backend resolution: Service port (number or name) → EndpointSlice endpoints, readiness, ExternalName."""

from __future__ import annotations

import pytest

from fleet.network.routebuild import BuildInput, BuildOptions, build
from fleet.network.routebuild_backends import Resolver
from fleet.network.routetable import Endpoint
from tests.unit.network.routebuild_objects import (
    endpoint,
    ingress,
    ingress_class,
    path,
    rule,
    service,
    slice_,
)

SVC = service("web", ("http", 80), ("admin", 9000))
SLICES = [
    slice_("web", "web-a", [("http", 8080), ("admin", 9090)],
           [endpoint("10.0.0.2"), endpoint("10.0.0.1"), endpoint("10.0.0.3", ready=False)]),
    slice_("web", "web-b", [("http", 8080), ("admin", 9090)], [endpoint("10.0.0.4", ready=None),
                                                               endpoint("10.0.0.1")]),
    slice_("other", "other-a", [("http", 1)], [endpoint("10.9.9.9")]),
    slice_("web", "web-c", [("http", 1)], [endpoint("10.8.8.8")], ns="elsewhere"),
]


def resolve(port, services=(SVC,), slices=SLICES, ns="default", name="web"):
    return Resolver(list(services), list(slices), []).backend(ns, name, port)


@pytest.mark.parametrize("port,want", [
    (80, [("10.0.0.1", 8080), ("10.0.0.2", 8080), ("10.0.0.4", 8080)]),
    ("http", [("10.0.0.1", 8080), ("10.0.0.2", 8080), ("10.0.0.4", 8080)]),
    (9000, [("10.0.0.1", 9090), ("10.0.0.2", 9090), ("10.0.0.4", 9090)]),
    ("admin", [("10.0.0.1", 9090), ("10.0.0.2", 9090), ("10.0.0.4", 9090)]),
])
def test_service_port_by_number_or_name(port, want):
    b = resolve(port)
    assert [(e.address, e.port) for e in b.endpoints] == want and b.problem == ""


@pytest.mark.parametrize("kw,problem", [
    ({"name": "nope"}, 'service "default/nope" not found'),
    ({"ns": "elsewhere"}, 'service "elsewhere/web" not found'),
    ({"port": 81}, 'service "default/web" has no port 81'),
    ({"port": "grpc"}, "service \"default/web\" has no port 'grpc'"),
    ({"slices": []}, 'no ready endpoints for service "default/web" port 80'),
])
def test_problems(kw, problem):
    b = resolve(kw.pop("port", 80), **kw)
    assert b.endpoints == () and b.problem == problem


def test_terminating_fallback_only_when_nothing_ready():
    eps = [endpoint("10.0.0.1", ready=False, serving=True, terminating=True),
           endpoint("10.0.0.2", ready=False, serving=False, terminating=True)]
    b = resolve(80, slices=[slice_("web", "w", [("http", 8080)], eps)])
    assert b.endpoints == (Endpoint("10.0.0.1", 8080),)
    b = resolve(80, slices=[slice_("web", "w", [("http", 8080)], [*eps, endpoint("10.0.0.3")])])
    assert b.endpoints == (Endpoint("10.0.0.3", 8080),)


def test_unnamed_port():
    svc = service("web", ("", 80))
    b = resolve(80, services=[svc], slices=[slice_("web", "w", [("", 8080)], [endpoint("10.0.0.1")])])
    assert b.endpoints == (Endpoint("10.0.0.1", 8080),)


def test_external_name():
    svc = service("web", ("http", 443), external="api.example.com.")
    assert resolve("http", services=[svc]).endpoints == (Endpoint("api.example.com", 443),)
    assert resolve(8443, services=[svc]).endpoints == (Endpoint("api.example.com", 8443),)
    assert resolve("nope", services=[svc]).problem


def test_missing_service_event_on_ingress_and_503_backend():
    inp = BuildInput(ingresses=[ingress("i", rule("x.com", path("/", "gone"), path("/e", "web")))],
                     ingress_classes=[ingress_class()], services=[SVC], endpoint_slices=[])
    r = build(inp, BuildOptions(now="t"))
    sel = r.table.select(8080, "x.com", "GET", "/")
    assert sel.route.backends[0].endpoints == () and "not found" in sel.route.backends[0].problem
    assert sorted((e.kind, e.name, e.type, e.reason) for e in r.events) == [
        ("Ingress", "i", "Warning", "BackendNotFound"), ("Ingress", "i", "Warning", "NoEndpoints")]
    assert any('"default/gone"' in e.message for e in r.events)
