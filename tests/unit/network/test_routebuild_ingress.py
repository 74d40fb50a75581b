"""The route builder's Ingress half: class selection, precedence, wildcards, conflicts,
default backend, TLS certificates and status."""

from __future__ import annotations

import pytest

from fleet.network.routebuild import BuildInput, BuildOptions, build
from fleet.network.routetable import Certificate
from tests.unit.network.routebuild_objects import (
    backend,
    endpoint,
    ingress,
    ingress_class,
    keypair,
    path,
    rule,
    service,
    slice_,
    tls_secret,
)

OPTS = BuildOptions(now="2024-06-01T00:00:00Z")
SERVICES = [service(n, ("http", 80)) for n in ("a", "b", "c", "d", "dflt")]
SLICES = [slice_(n, f"{n}-1", [("http", 8080)], [endpoint(f"10.1.0.{i + 1}")])
          for i, n in enumerate(("a", "b", "c", "d", "dflt"))]


def run(*ings: dict, classes=None, opts: BuildOptions = OPTS, **kw):
    inp = BuildInput(ingresses=list(ings),
                     ingress_classes=classes if classes is not None else [ingress_class()],
                     services=kw.pop("services", SERVICES), endpoint_slices=kw.pop("slices", SLICES), **kw)
    return build(inp, opts)


def svc_for(result, host: str, p: str, port: int = 8080) -> str | None:
    sel = result.table.select(port, host, "GET", p)
    return None if sel is None else sel.route.backends[0].service


# --- which Ingresses are served ------------------------------------------------------

CLASS_CASES = [
    # (ingress kwargs, classes, served?)
    ({"cls": "fleet"}, [ingress_class()], True),
    ({"cls": "other"}, [ingress_class(), ingress_class("other", "x.io/nginx")], False),
    ({"cls": "missing"}, [ingress_class()], False),
    ({"cls": None, "annotations": {"kubernetes.io/ingress.class": "fleet"}}, [ingress_class()], True),
    ({"cls": None, "annotations": {"kubernetes.io/ingress.class": "nginx"}},
     [ingress_class(), ingress_class("nginx", "x.io/nginx", default=True)], False),
    ({"cls": None}, [ingress_class(default=True)], True),
    ({"cls": None}, [ingress_class()], False),
    ({"cls": None}, [ingress_class(), ingress_class("nginx", "x.io/nginx", default=True)], False),
    # a class name wins over the legacy annotation
    ({"cls": "nginx", "annotations": {"kubernetes.io/ingress.class": "fleet"}},
     [ingress_class(), ingress_class("nginx", "x.io/nginx")], False),
]


@pytest.mark.parametrize("kw,classes,served", CLASS_CASES)
def test_class_selection(kw, classes, served):
    r = run(ingress("i", rule("x.com", path("/", "a")), **kw), classes=classes)
    assert (svc_for(r, "x.com", "/") == "a") is served
    assert bool([s for s in r.statuses if s.kind == "Ingress"]) is served


# --- precedence -----------------------------------------------------------------------

PRECEDENCE = [
    # (paths, request path, expected service)
    ([path("/foo", "a", "Prefix"), path("/foo", "b", "Exact")], "/foo", "b"),
    ([path("/foo", "a", "Prefix"), path("/foo", "b", "Exact")], "/foo/x", "a"),
    ([path("/", "a"), path("/foo", "b"), path("/foo/bar", "c")], "/foo/bar/baz", "c"),
    ([path("/", "a"), path("/foo", "b"), path("/foo/bar", "c")], "/foo/ba", "b"),
    ([path("/", "a"), path("/foo", "b")], "/foobar", "a"),  # element-wise prefix
    ([path("/foo/", "b"), path("/", "a")], "/foo", "b"),  # trailing slash ignored
    ([path("/foo", "a", "ImplementationSpecific")], "/foo/x", "a"),  # served as Prefix
    ([path("/foo", "a", "ImplementationSpecific")], "/foox", None),
    ([path("/foo", "a", "Exact")], "/foo/", None),
]


@pytest.mark.parametrize("paths,req,want", PRECEDENCE)
def test_path_precedence(paths, req, want):
    assert svc_for(run(ingress("i", rule("x.com", *paths))), "x.com", req) == want


def test_rules_merge_across_ingresses_per_host_and_hosts_order():
    r = run(ingress("one", rule("x.com", path("/a", "a")), rule("*.x.com", path("/", "c"))),
            ingress("two", rule("x.com", path("/b", "b")), rule(None, path("/", "d"))))
    assert svc_for(r, "x.com", "/a") == "a" and svc_for(r, "x.com", "/b") == "b"
    assert svc_for(r, "x.com", "/z") is None  # exact host matched: no fall-through to ""
    assert svc_for(r, "y.x.com", "/q") == "c"
    assert svc_for(r, "other.org", "/") == "d"
    assert [h.hostname for h in r.table.listener(8080).hosts] == ["x.com", "*.x.com", ""]


@pytest.mark.parametrize("host,want", [("a.foo.com", "a"), ("b.a.foo.com", "d"), ("foo.com", "d")])
def test_ingress_wildcard_matches_one_label(host, want):
    r = run(ingress("i", rule("*.foo.com", path("/", "a")), rule(None, path("/", "d"))))
    assert svc_for(r, host, "/") == want
    assert [h.one_label for h in r.table.listener(8080).hosts] == [True, False]


def test_conflict_oldest_wins_and_loser_warned():
    young = ingress("young", rule("x.com", path("/p", "b")), ts="2024-02-01T00:00:00Z", ns="aaa")
    old = ingress("old", rule("x.com", path("/p", "a")), ts="2024-01-01T00:00:00Z", ns="zzz")
    svcs = SERVICES + [service(n, ("http", 80), ns=ns) for n, ns in (("a", "zzz"), ("b", "aaa"))]
    for order in ([young, old], [old, young]):
        r = run(*order, services=svcs)
        assert svc_for(r, "x.com", "/p") == "a"
        warn = [e for e in r.events if e.reason == "RuleConflict"]
        assert [(e.namespace, e.name, e.type) for e in warn] == [("aaa", "young", "Warning")]
        assert "zzz/old" in warn[0].message


def test_conflict_same_timestamp_falls_back_to_namespace_name():
    r = run(ingress("b", rule("x.com", path("/p", "b"))), ingress("a", rule("x.com", path("/p", "a"))))
    assert svc_for(r, "x.com", "/p") == "a"
    assert [e.name for e in r.events if e.reason == "RuleConflict"] == ["b"]


def test_default_backend_last_route_of_every_host_and_catch_all():
    r = run(ingress("i", rule("x.com", path("/api", "a")), default_backend=backend("dflt")),
            ingress("j", default_backend=backend("b"), ts="2025-01-01T00:00:00Z"))
    assert svc_for(r, "x.com", "/api") == "a"
    assert svc_for(r, "x.com", "/other") == "dflt"
    assert svc_for(r, "nohost.org", "/") == "dflt"
    assert all(h.routes[-1].backends[0].service == "dflt" for h in r.table.listener(8080).hosts)
    assert [e.name for e in r.events if e.reason == "DefaultBackendConflict"] == ["j"]


def test_status_load_balancer_addresses():
    r = run(ingress("i", rule("x.com", path("/", "a"))),
            opts=BuildOptions(addresses=("192.0.2.1", "lb.example.com"), now="t"))
    (st,) = r.statuses
    assert (st.api_version, st.kind, st.namespace, st.name) == ("networking.k8s.io/v1", "Ingress", "default", "i")
    assert st.status == {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "lb.example.com"}]}}
    assert run(ingress("i")).statuses[0].status == {"loadBalancer": {}}


# --- TLS --------------------------------------------------------------------------------

def test_tls_certificates_on_https_listener():
    crt, key = keypair("x.com")
    crt2, key2 = keypair("any")
    ing = ingress("i", rule("x.com", path("/", "a")),
                  tls=[{"hosts": ["x.com"], "secretName": "x"}, {"secretName": "any"}])
    r = run(ing, secrets=[tls_secret("x", crt, key), tls_secret("any", crt2, key2)])
    https = r.table.listener(8443)
    assert https.protocol == "HTTPS" and not r.events
    assert https.certificate_for("x.com").cert_pem == crt
    assert https.certificate_for("other.org").cert_pem == crt2
    assert https.certificates[0].source.name == "i"
    assert svc_for(r, "x.com", "/", port=8443) == "a"
    assert r.table.listener(8080).certificates == ()


BAD_SECRETS = [
    ([], "not found"),
    ([tls_secret("x", *keypair("x.com"), type_="Opaque")], "not of type kubernetes.io/tls"),
    ([tls_secret("x", b"garbage", keypair("x.com")[1])], "not a PEM certificate"),
    ([tls_secret("x", keypair("x.com")[0], b"garbage")], "private key"),
    ([tls_secret("x", keypair("x.com")[0], keypair("y.com")[1])], "does not match"),
    ([{"metadata": {"name": "x", "namespace": "default"}, "type": "kubernetes.io/tls",
       "data": {"tls.crt": "%%%", "tls.key": 7}}], "no tls.crt or tls.key"),
]


@pytest.mark.parametrize("secrets,why", BAD_SECRETS)
def test_bad_tls_secret_left_out_with_warning(secrets, why):
    r = run(ingress("i", rule("x.com", path("/", "a")), tls=[{"hosts": ["x.com"], "secretName": "x"}]),
            secrets=secrets)
    (ev,) = [e for e in r.events if e.reason == "InvalidCertificate"]
    assert ev.type == "Warning" and why in ev.message and '"default/x"' in ev.message
    assert r.table.listener(8443) is None  # no certificate at all: the TLS port stays closed


def test_default_certificate_opens_https_listener():
    crt, key = keypair("default")
    dc = Certificate(("",), crt, key)
    r = run(ingress("i", rule("x.com", path("/", "a"))), opts=BuildOptions(default_certificate=dc, now="t"))
    assert r.table.listener(8443).certificate_for("x.com") is dc


def test_ports_off():
    r = run(ingress("i", rule("x.com", path("/", "a"))),
            opts=BuildOptions(http_port=0, https_port=0, now="t"))
    assert r.table.listeners == ()


# --- odd input never raises --------------------------------------------------------------

@pytest.mark.parametrize("obj", [
    {}, {"metadata": None}, {"spec": None}, {"spec": {"rules": "x"}}, {"spec": {"rules": [None, 3]}},
    {"spec": {"ingressClassName": "fleet", "rules": [{"host": 5, "http": {"paths": [{"backend": None}]}}]}},
    {"spec": {"ingressClassName": "fleet", "rules": [{"http": {"paths": [{"path": "/", "backend": {
        "service": {"name": "a", "port": {"number": "x"}}}}]}}], "tls": [{"hosts": [1], "secretName": "s"}]}},
    {"spec": {"ingressClassName": "fleet", "defaultBackend": {"resource": {"kind": "Bucket"}}}},
])
def test_odd_objects_do_not_raise(obj):
    r = run(obj, secrets=[{"metadata": {"name": "s"}, "type": "kubernetes.io/tls", "data": None}])
    assert r.table.listener(8080) is not None
