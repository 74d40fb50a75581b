"""Property tests of the route builder: `RouteTable.select` on the built table agrees with
a brute-force reading of Ingress' rules, and building ignores the order of its inputs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.network.routebuild import BuildInput, BuildOptions, build
from tests.unit.network.routebuild_objects import (
    backend,
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

RULE_HOSTS = ["", "foo.com", "*.foo.com", "a.foo.com", "*.a.foo.com", "bar.com"]
REQ_HOSTS = ["foo.com", "a.foo.com", "b.foo.com", "b.a.foo.com", "c.b.a.foo.com", "bar.com", "x.bar.com"]
RULE_PATHS = ["/", "/a", "/a/", "/a/b", "/ab", "/a/b/c"]
REQ_PATHS = ["/", "/a", "/a/", "/a/b", "/ab", "/a/bc", "/a/b/c", "/a/b/c/d", "/x"]
TYPES = ["Exact", "Prefix", "ImplementationSpecific"]
OPTS = BuildOptions(now="2024-06-01T00:00:00Z")

# One Ingress: (timestamp day, namespace, rules [(host, [(path, type)])], has default backend)
ingress_spec = st.tuples(
    st.integers(1, 3), st.sampled_from(["ns1", "ns2"]),
    st.lists(st.tuples(st.sampled_from(RULE_HOSTS),
                       st.lists(st.tuples(st.sampled_from(RULE_PATHS), st.sampled_from(TYPES)),
                                min_size=1, max_size=3)), max_size=3),
    st.booleans())


def make(specs):
    """Ingress objects; every path's service is named after its position so the winner is known."""
    objs, flat, defaults = [], [], []
    for i, (day, ns, rules, dflt) in enumerate(specs):
        name = f"ing{i}"
        age = (f"2024-01-0{day}T00:00:00Z", ns, name)
        rs = []
        for ri, (host, paths) in enumerate(rules):
            ps = []
            for pi, (p, t) in enumerate(paths):
                svc = f"s{i}-{ri}-{pi}"
                ps.append(path(p, svc, t))
                flat.append((host, p, t, age, ri, pi, svc))
            rs.append(rule(host or None, *ps))
        objs.append(ingress(name, *rs, ns=ns, ts=age[0],
                            default_backend=backend(f"d{i}") if dflt else None))
        if dflt:
            defaults.append((age, f"d{i}"))
    return objs, flat, defaults


def host_matches(pattern: str, host: str) -> bool:
    if pattern == "":
        return True
    if pattern.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == pattern[2:]
    return host == pattern


def path_matches(value: str, ptype: str, req: str) -> bool:
    if ptype == "Exact":
        return req == value
    p = value.rstrip("/")
    return p == "" or req == p or req.startswith(p + "/")


def expected(flat, defaults, host: str, req: str) -> str | None:
    """Ingress semantics read directly: the most specific host that has rules (exact, then
    a one-label wildcard, then none), within it the longest matching path, Exact over
    Prefix on equal length, the oldest Ingress on a full tie; else the oldest default backend."""
    dflt = min(defaults)[1] if defaults else None
    hosts = {h for h, *_ in flat if host_matches(h, host)}
    if not hosts:
        return dflt
    best_host = max(hosts, key=lambda h: (h != "" and not h.startswith("*."), h != "", len(h)))
    cands = [r for r in flat if r[0] == best_host and path_matches(r[1], r[2], req)]
    if not cands:
        return dflt
    def rank(r):  # noqa: E306
        _, p, t, age, ri, pi, _ = r
        length = len(p) if t == "Exact" else len(p.rstrip("/"))
        return (-length, 0 if t == "Exact" else 1, age, ri, pi)
    return min(cands, key=rank)[6]


@settings(max_examples=300, deadline=None)
@given(st.lists(ingress_spec, min_size=1, max_size=4), st.sampled_from(REQ_HOSTS), st.sampled_from(REQ_PATHS))
def test_select_agrees_with_brute_force_ingress_reading(specs, host, req):
    objs, flat, defaults = make(specs)
    result = build(BuildInput(ingresses=objs, ingress_classes=[ingress_class()]), OPTS)
    sel = result.table.select(8080, host, "GET", req)
    got = sel.route.backends[0].service if sel is not None else None
    assert got == expected(flat, defaults, host, req)


def _scenario():
    crt, key = keypair("x.com")
    return BuildInput(
        ingresses=[ingress("i1", rule("x.com", path("/a", "web"), path("/a", "api", "Exact")),
                           ts="2024-01-02T00:00:00Z", default_backend=backend("web"),
                           tls=[{"hosts": ["x.com"], "secretName": "crt"}]),
                   ingress("i2", rule("x.com", path("/a", "api")), rule("*.x.com", path("/", "web")),
                           ts="2024-01-02T00:00:00Z", default_backend=backend("api"),
                           tls=[{"secretName": "missing"}]),
                   ingress("i3", rule(None, path("/", "gone")), ns="other")],
        ingress_classes=[ingress_class(default=True), ingress_class("b", "x.io/other")],
        gateway_classes=[gateway_class(), gateway_class("z", "x.io/other")],
        gateways=[gateway("g1", listener("h", 8080), listener("t", 9000, "TCP")),
                  gateway("g2", listener("h", 9080, hostname="*.x.com",
                                         allowed={"namespaces": {"from": "All"}}),
                          ts="2023-01-01T00:00:00Z")],
        http_routes=[http_route("r1", http_rule(backend_ref("web", weight=3), backend_ref("api", weight=1)),
                                parents=[{"name": "g1"}, {"name": "g2"}], hostnames=["x.com", "a.x.com"]),
                     http_route("r2", http_rule(backend_ref("web"), matches=[{"path": {"type": "Exact",
                                                                                         "value": "/a"}}]),
                                parents=[{"name": "g2"}], ns="other", ts="2023-06-01T00:00:00Z"),
                     http_route("r3", http_rule(backend_ref("nope")), parents=[{"name": "g1"}])],
        services=[service("web", ("http", 80)), service("api", ("http", 80)), service("web", ("http", 80), ns="other")],
        endpoint_slices=[slice_("web", "w1", [("http", 8080)], [endpoint("10.0.0.2"), endpoint("10.0.0.1")]),
                         slice_("web", "w2", [("http", 8080)], [endpoint("10.0.0.1"), endpoint("10.0.0.3")]),
                         slice_("api", "a1", [("http", 9090)], [endpoint("10.0.1.1", ready=False)])],
        secrets=[tls_secret("crt", crt, key)],
        namespaces=[namespace("default"), namespace("other")])


def _snapshot(result):
    return (result.table, result.events,
            [(s.api_version, s.kind, s.namespace, s.name, s.status) for s in result.statuses])


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_build_is_deterministic_and_input_order_independent(rnd):
    base = _scenario()
    want = _snapshot(build(base, OPTS))
    fields = {}
    for name in ("ingresses", "ingress_classes", "gateway_classes", "gateways", "http_routes", "services",
                 "endpoint_slices", "secrets", "namespaces"):
        items = list(getattr(base, name))
        rnd.shuffle(items)
        fields[name] = items
    assert _snapshot(build(BuildInput(**fields), OPTS)) == want


# --- never raises on odd input ---------------------------------------------------------------

_KEYS = ["metadata", "spec", "status", "name", "namespace", "labels", "annotations", "creationTimestamp",
         "generation", "rules", "http", "paths", "path", "pathType", "backend", "service", "port", "number",
         "host", "tls", "hosts", "secretName", "defaultBackend", "ingressClassName", "controller",
         "controllerName", "gatewayClassName", "listeners", "protocol", "hostname", "allowedRoutes",
         "namespaces", "from", "selector", "matchLabels", "kinds", "kind", "group", "certificateRefs", "mode",
         "parentRefs", "sectionName", "hostnames", "backendRefs", "weight", "matches", "filters", "type",
         "value", "headers", "queryParams", "method", "timeouts", "request", "requestRedirect", "statusCode",
         "requestHeaderModifier", "set", "add", "remove", "conditions", "parents", "ports", "endpoints",
         "addresses", "ready", "data", "externalName", "addressType", "tls.crt", "tls.key"]
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 70000), st.sampled_from(
    ["fleet", "fleet.io/ingress", "fleet.io/gateway-controller", "HTTP", "HTTPS", "TCP", "/", "/a", "x.com",
     "*.x.com", "Exact", "Prefix", "PathPrefix", "RegularExpression", "(", "default", "All", "Selector",
     "Same", "gw", "web", "Service", "Secret", "kubernetes.io/tls", "ExternalName", "IPv4", "10.0.0.1",
     "1s", "RequestRedirect", "RequestHeaderModifier", "", "true"]))
_JSON = st.recursive(_VALUES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=5)), max_leaves=25)
_OBJ = st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(BuildInput.__dataclass_fields__)), _OBJ), max_size=12))
def test_build_never_raises(extra):
    base = _scenario()
    fields = {name: list(getattr(base, name)) for name in BuildInput.__dataclass_fields__}
    for name, obj in extra:
        fields[name].append(obj)
    result = build(BuildInput(**fields), OPTS)
    for lst in result.table.listeners:  # and what it built can be served without raising
        for h in lst.hosts:
            result.table.select(lst.port, h.hostname.replace("*", "a"), "GET", "/a", {"x": "1"}, {"q": "1"})


def _paths(obj, prefix=()):
    """Every (path) to a value inside a JSON-like object."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _replace(obj, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {k: (_replace(v, rest, value) if k == head else v) for k, v in obj.items()}
    return [(_replace(v, rest, value) if i == head else v) for i, v in enumerate(obj)]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_build_never_raises_on_a_corrupted_valid_object(data):
    base = _scenario()
    fields = {name: list(getattr(base, name)) for name in BuildInput.__dataclass_fields__}
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from([n for n, v in fields.items() if v]))
        i = data.draw(st.integers(0, len(fields[name]) - 1))
        path = data.draw(st.sampled_from(list(_paths(fields[name][i]))))
        fields[name][i] = _replace(fields[name][i], path, data.draw(_JSON))
    result = build(BuildInput(**fields), OPTS)
    for lst in result.table.listeners:
        for h in lst.hosts:
            result.table.select(lst.port, h.hostname.replace("*", "a"), "GET", "/a", {"x": "1"}, {"q": "1"})


# --- Gateway API match precedence ---------------------------------------------------------------

GW_PATHS = ["/", "/a", "/a/b"]  # few, so that ties reach the later criteria
match_spec = st.tuples(st.sampled_from(["Exact", "PathPrefix"]), st.sampled_from(GW_PATHS),
                       st.sampled_from([None, "GET", "POST"]),
                       st.lists(st.sampled_from(["h1", "h2", "h3"]), unique=True, max_size=2),
                       st.lists(st.sampled_from(["q1", "q2"]), unique=True, max_size=2))
route_spec = st.tuples(st.integers(1, 3), st.sampled_from(["ns1", "ns2"]),
                       st.lists(st.lists(match_spec, min_size=1, max_size=2), min_size=1, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(route_spec, min_size=1, max_size=3), st.sampled_from(["/a", "/a/b", "/a/b/c"]),
       st.sampled_from(["GET", "POST"]),
       st.one_of(st.just({"h1", "h2", "h3"}), st.sets(st.sampled_from(["h1", "h2", "h3"]))),
       st.one_of(st.just({"q1", "q2"}), st.sets(st.sampled_from(["q1", "q2"]))))
def test_select_agrees_with_gateway_api_precedence(specs, req, method, hdrs, qs):
    """Across every match of every route: Exact path; the longest Prefix; a method; most
    header matches; most query matches; the oldest route; namespace/name; rule order."""
    routes, flat = [], []
    for i, (day, ns, rules) in enumerate(specs):
        name, objs = f"r{i}", []
        for ri, matches in enumerate(rules):
            ms = []
            for ptype, p, meth, hs, q in matches:
                mm: dict = {"path": {"type": ptype, "value": p}}
                if meth:
                    mm["method"] = meth
                if hs:
                    mm["headers"] = [{"name": h, "value": "v"} for h in hs]
                if q:
                    mm["queryParams"] = [{"name": x, "value": "v"} for x in q]
                ms.append(mm)
                flat.append((ptype, p, meth, hs, q, (f"2024-01-0{day}T00:00:00Z", ns, name), ri, f"s{i}-{ri}"))
            objs.append(http_rule(backend_ref(f"s{i}-{ri}"), matches=ms))
        routes.append(http_route(name, *objs, ns=ns, ts=f"2024-01-0{day}T00:00:00Z", parents=[
            {"name": "gw", "namespace": "default"}]))
    gw = gateway("gw", listener("web", 9080, allowed={"namespaces": {"from": "All"}}))
    inp = BuildInput(gateway_classes=[gateway_class()], gateways=[gw], http_routes=routes,
                     namespaces=[namespace("ns1"), namespace("ns2")])
    sel = build(inp, OPTS).table.select(9080, "h", method, req, {h: "v" for h in hdrs}, {q: "v" for q in qs})

    def applies(f):
        ptype, p, meth, hs, q = f[:5]
        return (path_matches(p, "Exact" if ptype == "Exact" else "Prefix", req)
                and meth in (None, method) and set(hs) <= hdrs and set(q) <= qs)

    def rank(f):
        ptype, p, meth, hs, q, age, ri, _ = f
        return (ptype != "Exact", -len(p.rstrip("/")) if ptype != "Exact" else -len(p), meth is None,
                -len(hs), -len(q), age, ri)

    cands = [f for f in flat if applies(f)]
    want = min(cands, key=rank)[7] if cands else None
    assert (sel.route.backends[0].service if sel else None) == want
