"""nginx.conf rendering (fleet.network.nginx_conf): order, splits, TLS, errors, escaping.

The structural checks read the rendered text back with a small tokenizer that
follows nginx' own quoting rules, so "no injected directive" is checked on what
nginx would parse; `nginx -t` then checks the same configurations for real
(skipped when nginx is not installed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.network.ingress_nginx import parse_access_line
from fleet.network.nginx_conf import NginxPaths, RenderedConfig, render
from fleet.network.routetable import (
    Backend,
    Certificate,
    Endpoint,
    EngineOptions,
    HeaderFilter,
    Listener,
    Match,
    PathMatch,
    Redirect,
    Route,
    RouteTable,
    Source,
    StringMatch,
    VirtualHost,
)

EP = (Endpoint("10.0.0.1", 8080), Endpoint("fd00::2", 8080))
OPTIONS = EngineOptions(bind_address="127.0.0.1")


def backend(name: str, weight: int = 1, endpoints: tuple[Endpoint, ...] = EP, problem: str = "") -> Backend:
    return Backend("default", name, 80, weight, endpoints, problem)


def route(name: str, *backends: Backend, matches: tuple[Match, ...] = (Match(),), **kw) -> Route:
    return Route(Source("HTTPRoute", "default", name), matches, backends, **kw)


def table(*hosts: VirtualHost, port: int = 8080, protocol: str = "HTTP", **kw) -> RouteTable:
    return RouteTable((Listener(port, protocol, hosts, **kw),), 7)  # type: ignore[arg-type]


def rendered(t: RouteTable, tmp: str = "/run/fleet-test") -> RenderedConfig:
    return render(t, OPTIONS, paths=NginxPaths(tmp, f"{tmp}/gen/3"), stamp=3)


def all_text(rc: RenderedConfig) -> str:
    return rc.text + "".join(f.data.decode(errors="replace") for f in rc.files if f.path.endswith(".conf"))


# ---------------------------------------------------------------- a reader for nginx' syntax


def tokens(text: str) -> list[str | tuple[str]]:
    """nginx' tokenizer: quoted strings (with its escapes), bare words, ';', '{', '}'
    ('#' comments skipped).  Punctuation comes back as 1-tuples, words as str."""
    out: list[str | tuple[str]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch == "#":
            i = text.index("\n", i) if "\n" in text[i:] else len(text)
        elif ch in ";{}":
            out.append((ch,))
            i += 1
        elif ch in "\"'":
            j, buf = i + 1, []
            while text[j] != ch:
                if text[j] == "\\" and text[j + 1] in "\"'\\":
                    buf.append(text[j + 1])
                    j += 2
                elif text[j] == "\\" and text[j + 1] in "tnr":
                    buf.append({"t": "\t", "n": "\n", "r": "\r"}[text[j + 1]])
                    j += 2
                else:
                    buf.append(text[j])
                    j += 1
            out.append("".join(buf))
            i = j + 1
        else:
            j = i
            # A bare word ends at whitespace or ';' / '{' (nginx keeps '{' inside "${var}").
            while j < len(text) and not text[j].isspace() and text[j] not in ";" and \
                    not (text[j] == "{" and (j == i or text[j - 1] != "$")) and \
                    not (text[j] == "}" and "${" not in text[i:j]):
                j += 1
            out.append(text[i:j])
            i = j
    return out


def directives(text: str) -> list[tuple[tuple[str, ...], list[str]]]:
    """(block path, [name, args...]) for every directive."""
    out, path, current = [], [], []
    for tok in tokens(text):
        if tok == (";",):
            out.append((tuple(path), current))
            current = []
        elif tok == ("{",):
            out.append((tuple(path), current))
            path.append(current[0] if current else "?")
            current = []
        elif tok == ("}",):
            path.pop()
        else:
            current.append(tok)
    return out


ALLOWED = {
    "user", "worker_processes", "pid", "error_log", "events", "worker_connections", "http", "default_type",
    "server_tokens", "uninitialized_variable_warn", "merge_slashes", "map_hash_bucket_size",
    "server_names_hash_bucket_size", "log_format", "access_log", "client_body_temp_path", "proxy_temp_path",
    "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path", "client_header_buffer_size",
    "large_client_header_buffers", "client_max_body_size", "keepalive_timeout", "lingering_timeout", "client_header_timeout", "proxy_http_version",
    "proxy_buffering", "proxy_request_buffering", "proxy_redirect", "proxy_connect_timeout", "proxy_read_timeout",
    "proxy_send_timeout", "proxy_next_upstream", "proxy_next_upstream_tries", "proxy_set_header", "geo", "map",
    "upstream", "server", "keepalive", "split_clients", "listen", "set", "location", "return", "server_name",
    "include", "ssl_certificate", "ssl_certificate_key", "ssl_reject_handshake", "error_page", "root", "try_files",
    "proxy_pass", "if", "proxy_hide_header", "add_header",
}
MAP_LIKE = {"map", "geo", "split_clients", "upstream", "events"}


def check_structure(rc: RenderedConfig) -> list[tuple[tuple[str, ...], list[str]]]:
    found = directives(rc.text)
    for f in rc.files:
        if f.path.endswith(".conf"):
            found += [(("http", "server", *p), d) for p, d in directives(f.data.decode())]
    for path, d in found:
        if any(block in MAP_LIKE for block in path) and path[-1] != "server":
            continue  # map/split/upstream entries are data, not directives
        assert d[0] in ALLOWED, (path, d)
    return found


# ---------------------------------------------------------------- routing order


def test_routes_map_in_table_order_and_stop_at_a_catch_all() -> None:
    routes = (
        route("exact", backend("a"), matches=(Match(PathMatch("Exact", "/x")),)),
        route("canary", backend("b"), matches=(Match(PathMatch("Prefix", "/"), headers=(StringMatch("X-Canary", "yes"),)),)),
        route("all", backend("c")),
        route("unreachable", backend("d"), matches=(Match(PathMatch("Prefix", "/never")),)),
    )
    rc = rendered(table(VirtualHost("", routes)))
    text = all_text(rc)
    ids = re.findall(r'"~\^\(\?:[.1|]+\)" (fleet_r\d+);', text)
    assert [rc.sources[i].name for i in ids] == ["exact", "canary", "all"]
    assert "@fleet_r3" not in text  # after a route matching everything nothing is reachable
    # the conditions each route's regex requires, by position
    assert re.search(r'"~\^\(\?:1\.\)" fleet_r0;\s+"~\^\(\?:\.1\)" fleet_r1;\s+"~\^\(\?:\.\.\)" fleet_r2;', text)


def test_hosts_in_order_exact_keys_only_before_wildcards() -> None:
    hosts = (VirtualHost("a.example.com", (route("a", backend("a")),)),
             VirtualHost("*.example.com", (route("w", backend("w")),), one_label=True),
             VirtualHost("b.example.com", (route("b", backend("b")),)),
             VirtualHost("*.com", (route("g", backend("g")),)),
             VirtualHost("", (route("any", backend("any")),)))
    text = rendered(table(*hosts)).text
    block = text[text.index("map $host $fleet_route_8080"):]
    block = block[:block.index("}")]
    keys = re.findall(r'^\s+"([^"]*)"', block, re.M)
    assert keys == ["a.example.com", r"~^[^.]+\\.example\\.com$", r"~^b\\.example\\.com$", r"~^.+\\.com$", "~^"]


def test_match_conditions() -> None:
    m = Match(PathMatch("RegularExpression", r"/v(?P<n>\d+)/(?P=n)"), method="POST",
              headers=(StringMatch("X-Env", "st.*", "RegularExpression"),), query=(StringMatch("q", "a.b"),))
    text = rendered(table(VirtualHost("", (route("r", backend("a"), matches=(m,)),)))).text
    assert r'"~^(?:/v(\\d+)/(?:\\1))\\z" 1;' in text  # named groups would become nginx variables
    assert "?P<" not in text
    assert r'"~^POST\\z" 1;' in text
    assert "map $http_x_env " in text and r'"~^(?=[\\s\\S])(?:st.*)\\z" 1;' in text
    assert r'"~(?:^|&)q=([^&]+)" $1;' in text and r'"~^(?=[\\s\\S])a\\.b\\z" 1;' in text


# ---------------------------------------------------------------- backends


def test_weighted_backends_split_by_percent() -> None:
    rc = rendered(table(VirtualHost("", (route("split", backend("main", 90), backend("canary", 10,
                                                                                   (Endpoint("10.0.0.9", 80),))),))))
    text = rc.text
    split = text[text.index("split_clients"):]
    split = split[:split.index("\n}")]
    assert '"${request_id}"' in split
    assert re.search(r"90\.00% fleet_u0;\s+\* fleet_u1;", split)
    assert "server 10.0.0.1:8080 max_fails=0;" in text and "server [fd00::2]:8080 max_fails=0;" in text and "keepalive 64;" in text
    three = rendered(table(VirtualHost("", (route("s", backend("a", 1), backend("b", 1, (Endpoint("10.0.0.7", 1),)),
                                                  backend("c", 1, (Endpoint("10.0.0.8", 1),)),
                                                  backend("zero", 0, (Endpoint("10.0.0.9", 1),))),)))).text
    assert re.search(r"33\.33% fleet_u0;\s+33\.33% fleet_u1;\s+\* fleet_u2;", three)
    assert "10.0.0.9" not in three


def test_empty_backends_answer_503_with_the_problem() -> None:
    problem = 'service "default/web" not found'
    rc = rendered(table(VirtualHost("", (
        route("gone", backend("web", endpoints=(), problem=problem), matches=(Match(PathMatch("Prefix", "/a")),)),
        route("half", backend("ok", 50), backend("none", 50, ())),
    ))))
    inc = all_text(rc)
    assert 'return 503 "503 Service Unavailable: service \\"default/web\\" not found\\n";' in inc
    assert re.search(r'if \(\$fleet_r1_pick = fleet_503_1\) \{\s+return 503 "503 Service Unavailable: '
                     r'no ready endpoints for service \\"default/none\\" port 80', inc)
    none = all_text(rendered(table(VirtualHost("", (route("nothing"),)))))
    assert "no backends for this route (HTTPRoute default/nothing)" in none and "return 500" in none


def test_redirects_and_filters() -> None:
    routes = (
        route("r1", redirect=Redirect(scheme="https"), matches=(Match(PathMatch("Prefix", "/a")),)),
        route("r2", redirect=Redirect(hostname="new.example.com", port=8443, path=("ReplaceFullPath", "/x"),
                                      status_code=301), matches=(Match(PathMatch("Prefix", "/b")),)),
        route("r3", redirect=Redirect(path=("ReplacePrefixMatch", "/new")), matches=(Match(PathMatch("Prefix", "/old")),)),
        route("f", backend("a"), request_headers=HeaderFilter(set=(("X-Set", "1"),), add=(("X-Add", "2"),),
                                                              remove=("X-Forwarded-Port",)),
              response_headers=HeaderFilter(set=(("X-Frame", "deny"),), remove=("Server",))),
    )
    rc = rendered(table(VirtualHost("", routes)))
    inc = all_text(rc)
    assert 'return 302 "https://${host}${request_uri}";' in inc
    assert 'return 301 "http://new.example.com:8443/x${is_args}${args}";' in inc
    assert 'return 302 "http://${host}:8080${fleet_r2_path}";' in inc
    assert r'"~^/old(/[^?]*)?(\\?.*)?$" "/new$1$2";' in rc.text
    loc = inc[inc.index("location @fleet_r3"):]
    assert 'proxy_set_header "X-Set" "1";' in loc and 'proxy_set_header "X-Add" $fleet_r3_add0;' in loc
    assert 'proxy_set_header "X-Forwarded-Port" "";' in loc and 'proxy_set_header "Forwarded"' in loc
    assert 'proxy_hide_header "X-Frame";' in loc and 'add_header "X-Frame" "deny" always;' in loc
    assert 'map $http_x_add $fleet_r3_add0 {\n        "" "2";\n        default "$http_x_add,2";' in rc.text


# ---------------------------------------------------------------- TLS


def test_tls_servers_per_certificate_host_and_default() -> None:
    one = Certificate(("one.example.com", "*.one.example.com"), b"CERT1", b"KEY1")
    catch_all = Certificate(("",), b"CERT2", b"KEY2")
    rc = rendered(table(VirtualHost("", (route("a", backend("a")),)), port=8443, protocol="HTTPS",
                        certificates=(one, catch_all), default_certificate=Certificate((), b"C3", b"K3")))
    found = check_structure(rc)
    names = [d[1] for _, d in found if d[0] == "server_name"]
    assert names == ["", "one.example.com", r"~^[^.]+\.one\.example\.com$"]
    listens = [d[1:] for _, d in found if d[0] == "listen"]
    assert listens[1:] == [["127.0.0.1:8443", "ssl", "default_server"], ["127.0.0.1:8443", "ssl"],
                           ["127.0.0.1:8443", "ssl"]]
    files = {Path(f.path).name: f for f in rc.files}
    assert files["cert-0.pem"].data == b"CERT2" and files["key-0.pem"].data == b"KEY2"  # the catch-all is default
    assert all(f.mode == 0o600 for f in rc.files)
    assert sum(1 for f in rc.files if f.path.endswith("listener-8443.conf")) == 1
    bare = rendered(table(port=8443, protocol="HTTPS"))
    assert "ssl_reject_handshake on;" in bare.text


# ---------------------------------------------------------------- escaping


EVIL = 'x"; } server { listen 9; } #\\'


def evil_table() -> RouteTable:
    src = Source("Ingress", "default", EVIL)
    routes = (
        Route(src, (Match(PathMatch("Exact", "/" + EVIL), headers=(StringMatch("X-A", EVIL),),
                          query=(StringMatch(EVIL, EVIL),)),), (backend("a"),),
              request_headers=HeaderFilter(set=(("X-Set", EVIL + " $host ${x}"),), add=(("X-Add", EVIL),)),
              response_headers=HeaderFilter(add=(("X-Resp", "$request_uri" + EVIL),))),
        Route(src, (Match(PathMatch("RegularExpression", '/(?P<host>[a-z]+)"; } #')),),
              (backend("b", endpoints=(), problem=EVIL + " $remote_addr"),)),
        Route(src, (Match(PathMatch("Prefix", "/nl")),), (backend("c"),),
              request_headers=HeaderFilter(set=(("X-NL", "a\r\nInjected: yes"),))),
        Route(src, (Match(PathMatch("Prefix", "/bad")),), (backend("d"),),
              request_headers=HeaderFilter(set=(("Bad Name", "v"),))),
        Route(src, (Match(PathMatch("Prefix", "/r")),), redirect=Redirect(hostname=EVIL)),
        Route(src, (Match(),), (Backend("default", "e", 80, 1, (Endpoint("10.0.0.1; }", 80), Endpoint("10.0.0.5", 80))),)),
    )
    return RouteTable((Listener(8080, "HTTP", (
        VirtualHost(EVIL, routes[:1]),
        VirtualHost("", routes),
    ), (Certificate((EVIL, "ok.example.com"), b"C", b"K"),)),), 1)


def test_no_table_value_can_add_a_directive() -> None:
    rc = rendered(evil_table())
    found = check_structure(rc)
    assert sum(1 for p, d in found if d[0] == "server" and p == ("http",)) == 2  # status + the listener
    assert [d[1] for _, d in found if d[0] == "listen"] == ["unix:/run/fleet-test/status.sock", "127.0.0.1:8080"]
    text = all_text(rc)
    sets = {d[1]: d[2] for _, d in found if d[0] == "proxy_set_header" and len(d) == 3}
    assert sets["X-Set"] == EVIL.replace("$", "${fleet_dollar}") + " ${fleet_dollar}host ${fleet_dollar}{x}"
    assert "X-NL" not in sets  # CR/LF would start a header of its own: the route answers 500 instead
    assert any(d[0] == "return" and "control character in header value" in d[-1] for _, d in found)
    assert "?P<host>" not in text
    assert "10.0.0.1; }" not in text and "server 10.0.0.5:80 max_fails=0;" in text
    bodies = [d[2] for _, d in found if d[0] == "return" and d[1] == "503"]
    assert bodies == [f"503 Service Unavailable: {EVIL} ${{fleet_dollar}}remote_addr\n"]
    assert sum(1 for _, d in found if d[0] == "return" and d[1] == "500") == 3  # newline, bad name, bad host


# ---------------------------------------------------------------- nginx -t


def tls_pair(name: str) -> Certificate:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return Certificate((name,), cert.public_bytes(serialization.Encoding.PEM),
                       key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))


def tables() -> dict[str, RouteTable]:
    split = VirtualHost("*.example.com", (
        route("canary", backend("b"), matches=(Match(headers=(StringMatch("X-Canary", "yes"),)),)),
        route("split", backend("a", 90), backend("b", 10), backend("gone", 5, ())),
    ))
    evil = evil_table()
    return {
        "empty": RouteTable(),
        "http": table(VirtualHost("a.example.com", (route("a", backend("a")),)), split,
                      VirtualHost("", (route("redirect", redirect=Redirect(path=("ReplacePrefixMatch", "/"))),))),
        "tls": RouteTable((Listener(8443, "HTTPS", (split,), (tls_pair("one.example.com"), tls_pair("*.example.com")),
                                    tls_pair("default.local")), Listener(8080, "HTTP", (split,))), 2),
        "evil": RouteTable((Listener(8080, "HTTP", evil.listeners[0].hosts),), 3),
    }


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (apt-get install nginx)")
@pytest.mark.parametrize("name", ["empty", "http", "tls", "evil", "tls-any-address"])
def test_nginx_accepts_the_rendered_configuration(name: str, tmp_path: Path) -> None:
    rt = str(tmp_path)
    options = EngineOptions(bind_address="::") if name == "tls-any-address" else OPTIONS
    rc = render(tables()[name.removesuffix("-any-address")], options, paths=NginxPaths(rt, f"{rt}/gen/1"), stamp=1)
    for f in rc.files:
        os.makedirs(os.path.dirname(f.path), exist_ok=True)
        Path(f.path).write_bytes(f.data)
    for sub in ("tmp", "log", "empty"):
        os.makedirs(f"{rt}/{sub}", exist_ok=True)
    Path(rt, "nginx.conf").write_text(rc.text)
    out = subprocess.run(["nginx", "-t", "-p", rt, "-c", f"{rt}/nginx.conf"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr


def test_access_log_lines() -> None:
    rec = parse_access_line(b"<190>Dec  2 10:00:00 nginx: fleet 3 fleet_r12 504 0.502")
    assert rec is not None and (rec.stamp, rec.route, rec.status, rec.seconds) == (3, "fleet_r12", 504, 0.502)
    assert parse_access_line(b"<190>Dec  2 10:00:00 nginx: fleet 3 - 404 0.000").route == "-"
    assert parse_access_line(b"<190>Dec  2 10:00:00 nginx: fleet 3  431 0.001").route == ""  # before routing
    assert parse_access_line(b"garbage") is None
