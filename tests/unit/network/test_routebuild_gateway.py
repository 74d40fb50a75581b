"""The route builder's Gateway API half: classes, listeners (merging, conflicts, TLS),
HTTPRoute attachment, hostnames, matches, filters, weights and the statuses' reasons."""

from __future__ import annotations

import pytest

from fleet.network.routebuild import BuildInput, BuildOptions, build
from fleet.network.routebuild_httproute import intersect_hostnames, parse_duration
from fleet.network.routetable import HeaderFilter, Redirect
from tests.unit.network.routebuild_objects import (
    backend_ref,
    endpoint,
    gateway,
    gateway_class,
    http_route,
    http_rule,
    ingress,
    ingress_class,
    keypair,
    listener,
    namespace,
    path,
    rule,
    service,
    slice_,
    tls_secret,
)

NOW = "2024-06-01T00:00:00Z"
OPTS = BuildOptions(now=NOW, addresses=("192.0.2.7",))
NAMES = ("a", "b", "c", "canary")
SERVICES = [service(n, ("http", 80), ns=ns) for n in NAMES for ns in ("default", "team")]
SLICES = [slice_(n, f"{n}-1", [("http", 8080)], [endpoint(f"10.1.0.{i + 1}")], ns=ns)
          for i, n in enumerate(NAMES) for ns in ("default", "team")]
GW = gateway("gw", listener("web", 9080))


def run(*routes: dict, gateways=(GW,), opts: BuildOptions = OPTS, **kw):
    inp = BuildInput(gateway_classes=kw.pop("classes", [gateway_class()]), gateways=list(gateways),
                     http_routes=list(routes), services=kw.pop("services", SERVICES),
                     endpoint_slices=kw.pop("slices", SLICES),
                     namespaces=kw.pop("namespaces", [namespace("default"), namespace("team", env="prod")]),
                     **kw)
    return build(inp, opts)


def status(result, kind: str, name: str, ns: str = "default") -> dict:
    (st,) = [s for s in result.statuses if s.kind == kind and s.name == name and s.namespace == ns]
    return st.status


def cond(conds: list[dict], ctype: str) -> tuple[str, str]:
    (c,) = [c for c in conds if c["type"] == ctype]
    return c["status"], c["reason"]


def parent_conds(result, route: str = "r", ns: str = "default") -> dict[str, tuple[str, str]]:
    (p,) = status(result, "HTTPRoute", route, ns)["parents"]
    return {c["type"]: (c["status"], c["reason"]) for c in p["conditions"]}


def listener_status(result, gw: str = "gw", name: str = "web") -> dict:
    (ls,) = [x for x in status(result, "Gateway", gw)["listeners"] if x["name"] == name]
    return ls


def picked(result, port: int, host: str, p: str, method: str = "GET", headers=None, query=None):
    sel = result.table.select(port, host, method, p, headers or {}, query or {})
    return None if sel is None else sel.route


def svc(route) -> str | None:
    return None if route is None or not route.backends else route.backends[0].service


# --- classes and Gateways ------------------------------------------------------------------

def test_gateway_class_and_gateway_status():
    r = run(http_route("r", http_rule(backend_ref("a"))),
            classes=[gateway_class(), gateway_class("other", "x.io/other")])
    gc = status(r, "GatewayClass", "fleet", ns="")
    assert cond(gc["conditions"], "Accepted") == ("True", "Accepted")
    assert gc["conditions"][0]["observedGeneration"] == 1 and gc["conditions"][0]["lastTransitionTime"] == NOW
    assert not [s for s in r.statuses if s.name == "other"]
    gw = status(r, "Gateway", "gw")
    assert gw["addresses"] == [{"type": "IPAddress", "value": "192.0.2.7"}]
    assert cond(gw["conditions"], "Accepted") == ("True", "Accepted")
    assert cond(gw["conditions"], "Programmed") == ("True", "Programmed")
    ls = listener_status(r)
    assert ls["supportedKinds"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}]
    assert ls["attachedRoutes"] == 1
    assert {c["type"]: (c["status"], c["reason"]) for c in ls["conditions"]} == {
        "Accepted": ("True", "Accepted"), "Programmed": ("True", "Programmed"),
        "ResolvedRefs": ("True", "ResolvedRefs"), "Conflicted": ("False", "NoConflicts")}
    assert all(c["observedGeneration"] == 3 for c in ls["conditions"])
    assert parent_conds(r) == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    (p,) = status(r, "HTTPRoute", "r")["parents"]
    assert p["controllerName"] == "fleet.io/gateway-controller" and p["parentRef"] == {"name": "gw"}
    assert p["conditions"][0]["observedGeneration"] == 2
    assert svc(picked(r, 9080, "any.host", "/x")) == "a"


def test_a_port_the_engine_cannot_listen_on_is_left_out_and_port_unavailable():
    from dataclasses import replace

    gws = [gateway("gw", listener("web", 9080), listener("other", 9081))]
    r = run(http_route("r", http_rule(backend_ref("a"))), gateways=gws,
            opts=replace(OPTS, unavailable_ports=frozenset({9081, OPTS.http_port})))
    assert [lst.port for lst in r.table.listeners] == [9080]  # (no certificate: no 8443 either)
    other = listener_status(r, name="other")
    assert cond(other["conditions"], "Accepted") == ("False", "PortUnavailable")
    assert cond(other["conditions"], "Programmed") == ("False", "Invalid")
    assert cond(listener_status(r)["conditions"], "Accepted") == ("True", "Accepted")
    assert picked(r, 9080, "any.example", "/x") is not None


def test_gateway_of_another_class_is_ignored():
    r = run(http_route("r", http_rule(backend_ref("a"))), gateways=[gateway("gw", listener("web", 9080), cls="x")])
    assert r.table.listener(9080) is None
    assert not [s for s in r.statuses if s.kind in ("Gateway", "HTTPRoute")]


def test_gateway_listener_shares_ingress_port_and_precedence_folds():
    ing = ingress("i", rule("x.com", path("/foo", "a", "Prefix")))
    gw = gateway("gw", listener("web", 8080))
    route = http_route("r", http_rule(backend_ref("b"), matches=[{"path": {"type": "Exact", "value": "/foo"}}]),
                       hostnames=["x.com"])
    r = run(route, gateways=[gw], ingresses=[ing], ingress_classes=[ingress_class()])
    (lst,) = [x for x in r.table.listeners if x.port == 8080]
    assert [h.hostname for h in lst.hosts] == ["x.com"]
    assert svc(picked(r, 8080, "x.com", "/foo")) == "b"  # Exact beats Prefix
    assert svc(picked(r, 8080, "x.com", "/foo/bar")) == "a"


@pytest.mark.parametrize("listeners,other,bad,reasons", [
    # Gateway HTTP on the Ingress HTTPS port
    ([listener("web", 8443)], [], "web",
     {"Conflicted": ("True", "ProtocolConflict"), "Accepted": ("False", "PortUnavailable")}),
    ([listener("tcp", 9000, "TCP"), listener("web", 9080)], [], "tcp",
     {"Accepted": ("False", "UnsupportedProtocol"), "Programmed": ("False", "Invalid")}),
    ([listener("udp", 9000, "UDP"), listener("web", 9080)], [], "udp",
     {"Accepted": ("False", "UnsupportedProtocol")}),
    ([listener("tls", 9000, "TLS"), listener("web", 9080)], [], "tls",
     {"Accepted": ("False", "UnsupportedProtocol")}),
    # an older Gateway claimed 9080 for HTTPS
    ([listener("web", 9080)], [gateway("old", listener("s", 9080, "HTTPS", certs=[{"name": "crt"}]),
                                       ts="2023-01-01T00:00:00Z")], "web",
     {"Conflicted": ("True", "ProtocolConflict"), "Programmed": ("False", "Invalid")}),
])
def test_listener_conflicts_and_protocols(listeners, other, bad, reasons):
    gws = [gateway("gw", *listeners), *other]
    r = run(http_route("r", http_rule(backend_ref("a")), parents=[{"name": "gw", "sectionName": bad}]),
            gateways=gws, secrets=[tls_secret("crt", *keypair())])
    ls = listener_status(r, name=bad)
    got = {c["type"]: (c["status"], c["reason"]) for c in ls["conditions"]}
    assert got.items() >= reasons.items()
    port = [x for x in listeners if x["name"] == bad][0]["port"]
    lst = r.table.listener(port)
    assert lst is None or all(rt.source.kind != "HTTPRoute" for h in lst.hosts for rt in h.routes)
    gw_conds = status(r, "Gateway", "gw")["conditions"]
    assert cond(gw_conds, "Accepted")[1] == "ListenersNotValid"
    assert cond(gw_conds, "Accepted")[0] == ("True" if len(listeners) > 1 else "False")
    # attachment does not depend on the listener's own status, only on allowedRoutes (whose
    # kinds for a TCP/UDP/TLS listener never include HTTPRoute)
    http = [x for x in listeners if x["name"] == bad][0]["protocol"] == "HTTP"
    assert ls["attachedRoutes"] == (1 if http else 0)
    assert ls["supportedKinds"] == ([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}] if http else [])


# --- HTTPS listeners -------------------------------------------------------------------------

@pytest.mark.parametrize("refs,secrets,reason", [
    ([{"name": "crt"}], [tls_secret("crt", *keypair("x.com"))], "ResolvedRefs"),
    ([{"name": "crt", "kind": "Secret", "group": ""}], [tls_secret("crt", *keypair("x.com"))], "ResolvedRefs"),
    ([{"name": "missing"}], [], "InvalidCertificateRef"),
    ([{"name": "crt"}], [tls_secret("crt", b"junk", keypair()[1])], "InvalidCertificateRef"),
    ([{"name": "crt", "kind": "ConfigMap"}], [tls_secret("crt", *keypair())], "InvalidCertificateRef"),
    ([{"name": "crt", "namespace": "team"}], [tls_secret("crt", *keypair(), ns="team")], "RefNotPermitted"),
])
def test_https_listener_certificates(refs, secrets, reason):
    gw = gateway("gw", listener("web", 9443, "HTTPS", hostname="x.com", certs=refs))
    r = run(http_route("r", http_rule(backend_ref("a"))), gateways=[gw], secrets=secrets)
    ls = listener_status(r)
    ok = reason == "ResolvedRefs"
    assert cond(ls["conditions"], "ResolvedRefs") == ("True" if ok else "False", reason)
    lst = r.table.listener(9443)
    if ok:
        assert lst.protocol == "HTTPS" and lst.certificate_for("x.com").hostnames == ("x.com",)
        assert lst.certificate_for("x.com").source.kind == "Gateway"
        assert svc(picked(r, 9443, "x.com", "/")) == "a"
    else:
        assert lst is None and cond(ls["conditions"], "Programmed") == ("False", "Invalid")
        assert [e.reason for e in r.events if e.kind == "Gateway"] == [reason]


def test_https_listener_on_ingress_https_port_shares_certificates():
    crt, key = keypair("gw.example")
    gw = gateway("gw", listener("s", 8443, "HTTPS", certs=[{"name": "gwcrt"}]))
    r = run(http_route("r", http_rule(backend_ref("a"))), gateways=[gw], secrets=[tls_secret("gwcrt", crt, key)])
    lst = r.table.listener(8443)
    assert lst.certificates[0].hostnames == ("",) and lst.certificate_for("any").cert_pem == crt


# --- attachment: parentRefs, allowedRoutes, hostnames ---------------------------------------

SELECTOR = {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"env": "prod"}}}}


@pytest.mark.parametrize("allowed,route_ns,reason", [
    (None, "default", "Accepted"),
    (None, "team", "NotAllowedByListeners"),
    ({"namespaces": {"from": "Same"}}, "team", "NotAllowedByListeners"),
    ({"namespaces": {"from": "All"}}, "team", "Accepted"),
    (SELECTOR, "team", "Accepted"),
    (SELECTOR, "default", "NotAllowedByListeners"),
    ({"kinds": [{"kind": "GRPCRoute"}]}, "default", "NotAllowedByListeners"),
    ({"kinds": [{"kind": "HTTPRoute"}]}, "default", "Accepted"),
])
def test_allowed_routes(allowed, route_ns, reason):
    gw = gateway("gw", listener("web", 9080, allowed=allowed))
    route = http_route("r", http_rule(backend_ref("a")), ns=route_ns,
                       parents=[{"name": "gw", "namespace": "default"}])
    r = run(route, gateways=[gw])
    assert parent_conds(r, ns=route_ns)["Accepted"] == ("True" if reason == "Accepted" else "False", reason)
    assert (svc(picked(r, 9080, "h", "/")) == "a") is (reason == "Accepted")
    assert listener_status(r)["attachedRoutes"] == (1 if reason == "Accepted" else 0)


def test_invalid_route_kinds_listed_and_valid_ones_kept():
    gw = gateway("gw", listener("web", 9080, allowed={"kinds": [{"kind": "TCPRoute"}, {"kind": "HTTPRoute"}]}))
    ls = listener_status(run(gateways=[gw]))
    assert cond(ls["conditions"], "ResolvedRefs") == ("False", "InvalidRouteKinds")
    assert ls["supportedKinds"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}]


@pytest.mark.parametrize("parent,reason,port", [
    ({"name": "gw", "sectionName": "one"}, "Accepted", 9081),
    ({"name": "gw", "port": 9082}, "Accepted", 9082),
    ({"name": "gw", "sectionName": "nope"}, "NoMatchingParent", None),
    ({"name": "gw", "sectionName": "one", "port": 9082}, "NoMatchingParent", None),
])
def test_parent_ref_section_and_port(parent, reason, port):
    gw = gateway("gw", listener("one", 9081), listener("two", 9082))
    r = run(http_route("r", http_rule(backend_ref("a")), parents=[parent]), gateways=[gw])
    assert parent_conds(r)["Accepted"][1] == reason
    for p in (9081, 9082):
        assert (svc(picked(r, p, "h", "/")) == "a") is (p == port)


def test_parent_ref_to_foreign_gateway_writes_no_status_and_keeps_other_controllers():
    theirs = {"parentRef": {"name": "elsewhere"}, "controllerName": "x.io/other", "conditions": []}
    route = http_route("r", http_rule(backend_ref("a")), parents=[{"name": "elsewhere"}],
                       status={"parents": [theirs]})
    assert not [s for s in run(route).statuses if s.kind == "HTTPRoute"]
    route = http_route("r", http_rule(backend_ref("a")), parents=[{"name": "gw"}], status={"parents": [theirs]})
    parents = status(run(route), "HTTPRoute", "r")["parents"]
    assert [p["controllerName"] for p in parents] == ["fleet.io/gateway-controller", "x.io/other"]


@pytest.mark.parametrize("lst,route,want", [
    ("", [], [""]),
    ("", ["a.com", "*.b.com"], ["*.b.com", "a.com"]),
    ("a.com", [], ["a.com"]),
    ("a.com", ["a.com", "b.com"], ["a.com"]),
    ("*.x.com", ["a.x.com", "a.b.x.com", "x.com", "y.com"], ["a.b.x.com", "a.x.com"]),
    ("a.b.x.com", ["*.x.com"], ["a.b.x.com"]),
    ("*.x.com", ["*.b.x.com"], ["*.b.x.com"]),
    ("*.b.x.com", ["*.x.com"], ["*.b.x.com"]),
    ("*.x.com", ["*.y.com"], []),
    ("x.com", ["*.x.com"], []),
])
def test_hostname_intersection(lst, route, want):
    assert intersect_hostnames(lst, route) == want


def test_no_matching_listener_hostname():
    gw = gateway("gw", listener("web", 9080, hostname="*.x.com"))
    r = run(http_route("r", http_rule(backend_ref("a")), hostnames=["y.com"]), gateways=[gw])
    assert parent_conds(r)["Accepted"] == ("False", "NoMatchingListenerHostname")
    r = run(http_route("r", http_rule(backend_ref("a")), hostnames=["deep.a.x.com"]), gateways=[gw])
    assert svc(picked(r, 9080, "deep.a.x.com", "/")) == "a" and picked(r, 9080, "x.com", "/") is None


def test_gateway_wildcard_many_labels_and_host_order_with_ingress():
    gw = gateway("gw", listener("web", 8080))
    ing = ingress("i", rule("*.x.com", path("/", "a")), rule("a.x.com", path("/", "b")), rule(None, path("/", "c")))
    route = http_route("r", http_rule(backend_ref("canary"), matches=[{"path": {"type": "PathPrefix", "value": "/gw"}}]),
                       hostnames=["*.x.com", "*.long.x.com"])
    r = run(route, gateways=[gw], ingresses=[ing], ingress_classes=[ingress_class()])
    hosts = [(h.hostname, h.one_label) for h in r.table.listener(8080).hosts]
    assert hosts == [("a.x.com", False), ("*.long.x.com", False), ("*.x.com", True), ("*.x.com", False), ("", False)]
    assert svc(picked(r, 8080, "q.x.com", "/gw")) == "canary"  # one-label host carries the Gateway's routes
    assert svc(picked(r, 8080, "q.x.com", "/")) == "a"
    assert svc(picked(r, 8080, "p.q.x.com", "/gw")) == "canary"  # many labels: the Gateway's host only
    assert picked(r, 8080, "p.q.x.com", "/") is None


# --- rules: matches, precedence, filters, backends -----------------------------------------

def m(p: str | None = None, ptype: str = "PathPrefix", method=None, headers=(), query=()) -> dict:
    out: dict = {}
    if p is not None:
        out["path"] = {"type": ptype, "value": p}
    if method:
        out["method"] = method
    if headers:
        out["headers"] = [{"name": k, "value": v} for k, v in headers]
    if query:
        out["queryParams"] = [{"name": k, "value": v} for k, v in query]
    return out


PRECEDENCE = [
    # (routes as (name, ts, [(matches, service)]), request (path, method, headers, query), expected)
    ([("r1", "1", [([m("/a")], "a")]), ("r2", "2", [([m("/a", "Exact")], "b")])], ("/a", "GET", {}, {}), "b"),
    ([("r1", "1", [([m("/a")], "a")]), ("r2", "2", [([m("/a/b")], "b")])], ("/a/b/c", "GET", {}, {}), "b"),
    ([("r1", "1", [([m("/a")], "a")]), ("r2", "2", [([m("/a", method="POST")], "b")])], ("/a", "POST", {}, {}), "b"),
    ([("r1", "1", [([m("/a", headers=[("x", "1")])], "a")]),
      ("r2", "2", [([m("/a", headers=[("x", "1"), ("y", "2")])], "b")])], ("/a", "GET", {"x": "1", "y": "2"}, {}), "b"),
    ([("r1", "1", [([m("/a", query=[("q", "1")])], "a")]), ("r2", "2", [([m("/a")], "b")])],
     ("/a", "GET", {}, {"q": "1"}), "a"),
    # method beats headers
    ([("r1", "1", [([m("/a", headers=[("x", "1")])], "a")]), ("r2", "2", [([m("/a", method="GET")], "b")])],
     ("/a", "GET", {"x": "1"}, {}), "b"),
    # tie: the oldest route, whatever its name
    ([("z", "1", [([m("/a")], "a")]), ("b", "2", [([m("/a")], "b")])], ("/a", "GET", {}, {}), "a"),
    # tie on age: namespace/name
    ([("z", "1", [([m("/a")], "a")]), ("b", "1", [([m("/a")], "b")])], ("/a", "GET", {}, {}), "b"),
    # within a route: rule order
    ([("r", "1", [([m("/a")], "c"), ([m("/a")], "a")])], ("/a", "GET", {}, {}), "c"),
    # matches are ordered across rules, not rules as a whole
    ([("r", "1", [([m("/"), m("/x/y")], "a"), ([m("/x")], "b")])], ("/x/y", "GET", {}, {}), "a"),
    ([("r", "1", [([m("/"), m("/x/y")], "a"), ([m("/x")], "b")])], ("/x/z", "GET", {}, {}), "b"),
    ([("r", "1", [([m("/v[0-9]+", "RegularExpression")], "a"), ([m("/")], "b")])], ("/v2", "GET", {}, {}), "a"),
]


@pytest.mark.parametrize("routes,req,want", PRECEDENCE)
def test_match_precedence(routes, req, want):
    objs = [http_route(name, *[http_rule(backend_ref(s), matches=ms) for ms, s in rules],
                       ts=f"2024-01-0{ts}T00:00:00Z") for name, ts, rules in routes]
    for order in (objs, objs[::-1]):
        r = run(*order)
        p, method, headers, query = req
        assert svc(picked(r, 9080, "h", p, method, headers, query)) == want


def test_header_query_method_matches_built():
    route = http_route("r", http_rule(backend_ref("a"), matches=[{
        "path": {"type": "Exact", "value": "/p"}, "method": "get",
        "headers": [{"name": "X-Env", "value": "canary"}, {"type": "RegularExpression", "name": "ua", "value": "c.*"}],
        "queryParams": [{"name": "v", "value": "2"}]}]))
    r = run(route)
    assert svc(picked(r, 9080, "h", "/p", "GET", {"x-env": "canary", "ua": "curl"}, {"v": "2"})) == "a"
    assert picked(r, 9080, "h", "/p", "GET", {"x-env": "canary", "ua": "wget"}, {"v": "2"}) is None
    assert picked(r, 9080, "h", "/p", "POST", {"x-env": "canary", "ua": "curl"}, {"v": "2"}) is None


def test_filters():
    filters = [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": "X-A", "value": "1"}], "add": [{"name": "X-B", "value": "2"}], "remove": ["X-C"]}},
        {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "X-R", "value": "r"}]}},
    ]
    redirect = [{"type": "RequestRedirect", "requestRedirect": {
        "scheme": "https", "hostname": "new.example", "port": 8443, "statusCode": 301,
        "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}}]
    r = run(http_route("r", http_rule(backend_ref("a"), filters=filters, matches=[m("/f")]),
                       http_rule(filters=redirect, matches=[m("/old")])))
    f = picked(r, 9080, "h", "/f")
    assert f.request_headers == HeaderFilter(set=(("X-A", "1"),), add=(("X-B", "2"),), remove=("X-C",))
    assert f.response_headers == HeaderFilter(add=(("X-R", "r"),))
    assert picked(r, 9080, "h", "/old/x").redirect == Redirect("https", "new.example", 8443,
                                                               ("ReplacePrefixMatch", "/v2"), 301)


def test_unsupported_filter_answers_500_with_event():
    r = run(http_route("r", http_rule(backend_ref("a"), filters=[{"type": "RequestMirror"}])))
    route = picked(r, 9080, "h", "/")
    assert route.backends == () and route.redirect is None
    assert [e.reason for e in r.events] == ["UnsupportedFilter"]


def test_weights():
    r = run(http_route("r", http_rule(backend_ref("a", weight=90), backend_ref("canary", weight=10),
                                      backend_ref("b", weight=0))))
    assert [(b.service, b.weight) for b in picked(r, 9080, "h", "/").backends] == [("a", 90), ("canary", 10)]
    r = run(http_route("r", http_rule(backend_ref("a", weight=0), backend_ref("b", weight=0))))
    assert picked(r, 9080, "h", "/").backends == ()  # all weight 0: 500


@pytest.mark.parametrize("ref,reason", [
    (backend_ref("a"), "ResolvedRefs"),
    (backend_ref("missing"), "BackendNotFound"),
    (backend_ref("a", port=81), "BackendNotFound"),
    (backend_ref("a", namespace="team"), "RefNotPermitted"),
    (backend_ref("a", kind="ServiceImport", group="multicluster.x-k8s.io"), "InvalidKind"),
])
def test_backend_ref_resolution(ref, reason):
    r = run(http_route("r", http_rule(ref)))
    ok = reason == "ResolvedRefs"
    assert parent_conds(r)["ResolvedRefs"] == ("True" if ok else "False", reason)
    (b,) = picked(r, 9080, "h", "/").backends
    assert bool(b.endpoints) is ok and bool(b.problem) is not ok
    assert [e.reason for e in r.events if e.kind == "HTTPRoute"] == ([] if ok else [reason])


def test_no_endpoints_is_an_event_not_a_ref_failure():
    r = run(http_route("r", http_rule(backend_ref("a"))), slices=[])
    assert parent_conds(r)["ResolvedRefs"] == ("True", "ResolvedRefs")
    assert [e.reason for e in r.events] == ["NoEndpoints"]


@pytest.mark.parametrize("value,want", [("10s", 10.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0),
                                        ("0s", None), ("10", None), ("abc", None), (None, None)])
def test_timeouts(value, want):
    assert parse_duration(value) == want
    r = run(http_route("r", http_rule(backend_ref("a"), timeouts={"request": value})))
    assert picked(r, 9080, "h", "/").timeout == want


# --- conditions keep their transition time ----------------------------------------------------

def test_last_transition_time_kept_when_status_unchanged():
    first = run(http_route("r", http_rule(backend_ref("a"))))
    old_gw = dict(GW, status=status(first, "Gateway", "gw"))
    foreign = {"type": "x.io/Special", "status": "True", "reason": "X", "message": "",
               "lastTransitionTime": "2000-01-01T00:00:00Z"}
    old_gw["status"] = dict(old_gw["status"], conditions=[*old_gw["status"]["conditions"], foreign])
    route = http_route("r", http_rule(backend_ref("missing")), status=status(first, "HTTPRoute", "r"))
    later = run(route, gateways=[old_gw], opts=BuildOptions(now="2025-01-01T00:00:00Z", addresses=("192.0.2.7",)))
    gw_conds = status(later, "Gateway", "gw")["conditions"]
    assert [c["lastTransitionTime"] for c in gw_conds] == [NOW, NOW, "2000-01-01T00:00:00Z"]
    assert gw_conds[2] == foreign
    conds = status(later, "HTTPRoute", "r")["parents"][0]["conditions"]
    assert {c["type"]: c["lastTransitionTime"] for c in conds} == {
        "Accepted": NOW, "ResolvedRefs": "2025-01-01T00:00:00Z"}  # ResolvedRefs flipped to False


@pytest.mark.parametrize("obj", [
    {}, {"spec": None}, {"spec": {"gatewayClassName": "fleet", "listeners": [None, {"port": "x"}]}},
    {"metadata": {"name": "gw"}, "spec": {"gatewayClassName": "fleet", "listeners": [
        {"name": "s", "port": 9443, "protocol": "HTTPS", "tls": {"certificateRefs": [None, {"name": 3}]}}]}},
])
def test_odd_gateways_do_not_raise(obj):
    routes = [{}, {"spec": {"parentRefs": [{"name": "gw"}], "rules": [None, {"matches": [{"path": None}],
                                                                            "backendRefs": [{"weight": "x"}]}]}}]
    run(*routes, gateways=[obj])


@pytest.mark.parametrize("match", [
    m("/v[0-9", "RegularExpression"),
    {"headers": [{"type": "RegularExpression", "name": "x", "value": "(unclosed"}]},
    {"queryParams": [{"type": "RegularExpression", "name": "q", "value": "*bad"}]},
])
def test_invalid_regex_route_not_served(match):
    r = run(http_route("r", http_rule(backend_ref("a"), matches=[m("/ok")]), http_rule(backend_ref("b"),
                                                                                        matches=[match])))
    assert parent_conds(r)["Accepted"] == ("False", "UnsupportedValue")
    assert picked(r, 9080, "h", "/ok") is None
    assert listener_status(r)["attachedRoutes"] == 0
    assert [e.reason for e in r.events] == ["UnsupportedValue"]
