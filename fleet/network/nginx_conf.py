"""nginx.conf from a RouteTable: the pure half of the nginx ingress engine.

`render(table, options, paths=..., stamp=...)` returns the configuration text, the
files it refers to (per-listener includes, certificates and keys) and a route-id →
Source map for the access-log metrics.  No I/O: `fleet.network.ingress_nginx` writes
the files, checks them with `nginx -t` and reloads.

How first-match routing is expressed without Lua (the semantics are
`RouteTable.select`: the first host of the listener that matches, then its first
route that matches):

* Every condition of every match (path, method, one header, one query parameter)
  becomes a `map` to "1"/"0" over one nginx variable (`$uri`, `$request_method`,
  `$http_<name>`, a first-value extraction of `$args`).  Per virtual host, the
  conditions' digits are concatenated into one string ("1011…") and a `map` of
  regexes over it — which nginx tries in order of appearance — yields the first
  route id whose conditions are all "1".  Because the string is made only of
  digits we put there, no header or path value can make one route's regex match
  another's position (a composite of raw values joined by a separator could be
  forged by a value containing the separator).
* Per listener, `map $host` picks the virtual host, again by regexes in table order
  (an exact host is a hash key only while no wildcard precedes it, since nginx
  checks hash keys before regexes); its value is the virtual host's route variable,
  so only the chosen host's conditions are ever evaluated (map values are lazy).
  Ingress wildcards (`one_label`) match one label (`[^.]+`), Gateway ones `.+`.
* Dispatch: `location / { try_files /.fleet-none @$fleet_route_<port>; }` jumps
  to a named location per route.  Named locations are unreachable from outside,
  keep `$uri`/`$request_uri` untouched (so `proxy_pass` sends the request's own URI
  and no second rewrite pass can re-route), and a route's directives live in its
  own block instead of `if` blocks (nginx's "if is evil": only `return` inside
  `if` is used, for a split's empty backend).  The root is an empty directory, so
  the `try_files` probe is one failed stat.

Escaping: every string from the table reaches the config through `_q` (a quoted
token: backslashes and quotes escaped, control characters refused) or `_qv` (the
same, and `$` turned into `${fleet_dollar}`, a geo variable holding "$", for
values nginx interpolates).  Header names must be HTTP tokens, hosts DNS names,
endpoints IPs or DNS names, regexes compile in Python and lose named groups (PCRE
would turn them into nginx variables).  A route that cannot be expressed answers
500 with the reason; an invalid host or certificate name is left out.  Nothing a
table holds can add a directive.

Known differences from `RouteTable.select` (what nginx does not let us see): a
header or query parameter that is present but empty counts as absent; query names
and values compare as sent (percent-encoded, case-sensitively: we extract the first
non-empty value from `$args` ourselves rather than use `$arg_<name>`); headers whose
names hold characters other than letters, digits and '-' never reach nginx variables
(nginx drops them), so a match on one never holds; the path is nginx' normalised
`$uri` (dot segments resolved; slashes are not merged); `Route.timeout` bounds each
read from the backend, not the whole exchange.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.network.routetable import (
    Backend,
    Certificate,
    EngineOptions,
    HeaderFilter,
    Listener,
    Match,
    Route,
    RouteTable,
    Source,
    StringMatch,
    VirtualHost,
)

TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VAR_HEADER = re.compile(r"^[A-Za-z0-9-]+$")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
_METHOD = re.compile(r"^[A-Z][A-Z_-]{0,31}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
NO_ROUTE = "fleet_none"


class ConfigError(ValueError):
    """A value cannot be put into nginx.conf safely."""


@dataclass(frozen=True)
class NginxPaths:
    """Where the rendered configuration points.  `config_dir` is this generation's
    own directory (includes, certificates); the rest are fixed under `runtime_dir`."""

    runtime_dir: str
    config_dir: str
    worker_user: str | None = None  # "nobody nogroup" when the master runs as root

    @property
    def pid(self) -> str:
        return f"{self.runtime_dir}/nginx.pid"

    @property
    def error_log(self) -> str:
        return f"{self.runtime_dir}/error.log"

    @property
    def access_socket(self) -> str:
        return f"{self.runtime_dir}/log/access.sock"

    @property
    def status_socket(self) -> str:
        return f"{self.runtime_dir}/status.sock"

    @property
    def temp_dir(self) -> str:
        return f"{self.runtime_dir}/tmp"

    @property
    def empty_dir(self) -> str:
        return f"{self.runtime_dir}/empty"


@dataclass(frozen=True)
class ConfigFile:
    path: str  # absolute
    data: bytes
    mode: int = 0o600


@dataclass(frozen=True)
class RenderedConfig:
    text: str  # nginx.conf
    files: tuple[ConfigFile, ...]
    sources: Mapping[str, Source] = field(default_factory=dict)  # route id → Source
    stamp: int = 0


# ---------------------------------------------------------------- escaping


def _q(value: str) -> str:
    """A quoted nginx token carrying `value` literally (where nginx does not interpolate)."""
    if _CONTROL.search(value):
        raise ConfigError(f"control character in {value!r}")
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    out = out.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{out}"'


def _qv(value: str) -> str:
    """A quoted token for a place nginx interpolates variables in: `$` stays literal."""
    return _q(value).replace("$", "${fleet_dollar}")


def _regex(pattern: str) -> str:
    """A Python regex (as the table holds it) as a PCRE fragment for a whole-value match.

    Named groups become plain groups: nginx turns PCRE named captures into variables
    (`(?P<host>…)` would collide with `$host`, `(?P<fleet_route_80>…)` would steer routing)."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"invalid regular expression {pattern!r}: {exc}") from exc
    if compiled.groupindex:
        out, i, in_class = [], 0, False
        numbers = compiled.groupindex
        while i < len(pattern):
            ch = pattern[i]
            if ch == "\\":
                out.append(pattern[i:i + 2])
                i += 2
                continue
            if in_class:
                in_class = ch != "]"
            elif ch == "[":
                in_class = True
            elif pattern.startswith("(?P<", i):
                i = pattern.index(">", i) + 1
                out.append("(")
                continue
            elif pattern.startswith("(?P=", i):
                end = pattern.index(")", i)
                out.append(f"(?:\\{numbers[pattern[i + 4:end]]})")
                i = end + 1
                continue
            out.append(ch)
            i += 1
        pattern = "".join(out)
    return f"(?:{pattern})"


def _literal(value: str) -> str:
    """A literal string as a PCRE fragment."""
    return re.escape(value)


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _host_regex(pattern: str, one_label: bool) -> str:
    """The `$host` regex for a VirtualHost/Certificate pattern (`^…$` form, lower case)."""
    pattern = pattern.lower()
    if pattern == "":
        return "^"
    if pattern.startswith("*."):
        label = "[^.]+" if one_label else ".+"
        return f"^{label}{_literal(pattern[1:])}$"
    return f"^{_literal(pattern)}$"


def _valid_host(pattern: str) -> bool:
    name = pattern.lower()
    if name.startswith("*."):
        name = name[2:]
    return name == "" and pattern == "" or bool(_DNS_NAME.match(name))


def _endpoint_address(address: str, port: int) -> str | None:
    if not isinstance(port, int) or not 0 < port < 65536:
        return None
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{address.lower()}:{port}" if _DNS_NAME.match(address.lower()) else None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _listen_address(address: str, port: int) -> str:
    ip = ipaddress.ip_address(address)  # EngineOptions.bind_address: an IP
    if ip.version == 4:
        return f"{ip}:{port}"
    # "::" serves IPv4 too, as a plain socket bound to :: does (nginx defaults to v6 only).
    return f"[{ip}]:{port}" + (" ipv6only=off" if ip.is_unspecified else "")


# ---------------------------------------------------------------- the renderer


class _Unexpressible(Exception):
    """A route that cannot be rendered: it answers 500 with this reason instead."""


@dataclass
class _ListenerMaps:
    port: int
    protocol: str
    lines: list[str] = field(default_factory=list)
    conditions: dict[tuple[str, str], str] = field(default_factory=dict)
    extracts: dict[str, str] = field(default_factory=dict)


class _Renderer:
    def __init__(self, options: EngineOptions, paths: NginxPaths, stamp: int) -> None:
        self.options = options
        self.paths = paths
        self.stamp = stamp
        self.http: list[str] = []  # maps, upstreams, split_clients
        self.files: list[ConfigFile] = []
        self.sources: dict[str, Source] = {}
        self.upstreams: dict[tuple[str, ...], str] = {}
        self.certs: dict[tuple[bytes, bytes], tuple[str, str]] = {}
        self.route_count = 0

    # -- conditions

    def _condition(self, lm: _ListenerMaps, source: str, regex: str) -> str:
        key = (source, regex)
        if key not in lm.conditions:
            name = f"fleet_c_{lm.port}_{len(lm.conditions)}"
            lm.conditions[key] = name
            lm.lines += [f"map {source} ${name} {{", f"    {_q('~' + regex)} 1;", "    default 0;", "}"]
        return lm.conditions[key]

    def _query_value(self, lm: _ListenerMaps, name: str) -> str:
        # The first non-empty value of `name` in the raw query string (as sent).
        if name not in lm.extracts:
            var = f"fleet_q_{lm.port}_{len(lm.extracts)}"
            lm.extracts[name] = var
            lm.lines += [f"map $args ${var} {{", f"    {_q('~(?:^|&)' + _literal(name) + '=([^&]+)')} $1;",
                         '    default "";', "}"]
        return lm.extracts[name]

    @staticmethod
    def _value_regex(m: StringMatch) -> str:
        # Non-empty, whole value: an empty variable is how nginx shows "absent".
        body = _regex(m.value) if m.type == "RegularExpression" else _literal(m.value)
        return rf"^(?=[\s\S]){body}\z"

    def _match_conditions(self, lm: _ListenerMaps, match: Match) -> list[str] | None:
        """Condition variables that must all be "1"; None: this match can never hold."""
        out: list[str] = []
        path = match.path
        if path.type == "Exact":
            out.append(self._condition(lm, "$uri", rf"^{_literal(path.value)}\z"))
        elif path.type == "RegularExpression":
            out.append(self._condition(lm, "$uri", rf"^{_regex(path.value)}\z"))
        else:
            prefix = path.value.rstrip("/")
            if prefix:
                out.append(self._condition(lm, "$uri", rf"^{_literal(prefix)}(?:/|\z)"))
        if match.method is not None:
            method = match.method.upper()
            if not _METHOD.match(method):
                raise _Unexpressible(f"invalid method {match.method!r}")
            out.append(self._condition(lm, "$request_method", rf"^{method}\z"))
        for h in match.headers:
            if not TOKEN.match(h.name):
                raise _Unexpressible(f"invalid header name {h.name!r}")
            if not _VAR_HEADER.match(h.name):
                return None  # nginx drops such headers: never present
            var = "$http_" + h.name.lower().replace("-", "_")
            out.append(self._condition(lm, var, self._value_regex(h)))
        for qm in match.query:
            if not qm.name or _CONTROL.search(qm.name):
                raise _Unexpressible(f"invalid query parameter name {qm.name!r}")
            var = "$" + self._query_value(lm, qm.name)
            out.append(self._condition(lm, var, self._value_regex(qm)))
        return out

    def _vhost_route_map(self, lm: _ListenerMaps, index: int, vhost: VirtualHost) -> str:
        """The value for the vhost in the listener's `$host` map: a route id, or a variable."""
        entries: list[tuple[list[list[str]], str]] = []  # (alternatives of condition lists, route id)
        for route in vhost.routes:
            rid = f"fleet_r{self.route_count}"
            self.route_count += 1
            self.sources[rid] = route.source
            alternatives: list[list[str]] = []
            try:
                for match in route.matches:
                    conds = self._match_conditions(lm, match)
                    if conds is not None:
                        alternatives.append(conds)
            except (_Unexpressible, ConfigError) as exc:
                # Cannot tell when it matches: it matches like its paths would, and answers 500.
                alternatives = [[]]
                self._route_location(rid, route, lm, error=str(exc))
            else:
                self._route_location(rid, route, lm)
            if alternatives:
                entries.append((alternatives, rid))
            if any(not alt for alt in alternatives):
                break  # always matches: later routes are unreachable
        used = sorted({c for alts, _ in entries for alt in alts for c in alt},
                      key=lambda n: int(n.rsplit("_", 1)[1]))
        if not entries:
            return NO_ROUTE
        if not used:
            return entries[0][1]
        pos = {name: i for i, name in enumerate(used)}
        var = f"fleet_v_{lm.port}_{index}"
        lm.lines.append("map " + _q("".join("${" + n + "}" for n in used)) + f" ${var} {{")
        for alternatives, rid in entries:
            pats = []
            for alt in alternatives:
                bits = ["."] * len(used)
                for c in alt:
                    bits[pos[c]] = "1"
                pats.append("".join(bits))
            lm.lines.append(f"    {_q('~^(?:' + '|'.join(pats) + ')')} {rid};")
        lm.lines += [f"    default {NO_ROUTE};", "}"]
        return "$" + var

    # -- listeners

    def listener(self, lst: Listener) -> list[str]:
        """The http-level maps for one listener; its include file is added to `files`."""
        lm = _ListenerMaps(lst.port, lst.protocol)
        self.locations: list[str] = []
        host_entries: list[str] = []
        exact_allowed = True
        for index, vhost in enumerate(lst.hosts):
            if not _valid_host(vhost.hostname):
                continue
            value = self._vhost_route_map(lm, index, vhost)
            value_token = _q(value)
            name = vhost.hostname.lower()
            if exact_allowed and name and not name.startswith("*."):
                host_entries.append(f"    {_q(name)} {value_token};")
            else:
                exact_allowed = False
                host_entries.append(f"    {_q('~' + _host_regex(name, vhost.one_label))} {value_token};")
            if name == "":
                break  # matches every host: later ones are unreachable
        route_var = f"fleet_route_{lst.port}"
        lm.lines += [f"map $host ${route_var} {{", *host_entries, f"    default {NO_ROUTE};", "}"]
        include = self._listener_include(lst, route_var)
        self.files.append(ConfigFile(f"{self.paths.config_dir}/listener-{lst.port}.conf",
                                     include.encode(), 0o600))
        return lm.lines

    def _listener_include(self, lst: Listener, route_var: str) -> str:
        o = self.options
        limit = f"{o.max_body_bytes} bytes" if o.max_body_bytes else "the limit"
        lines = [
            "error_page 400 =400 @fleet_e400;",
            "error_page 414 494 =431 @fleet_e431;",
            "error_page 413 =413 @fleet_e413;",
            "error_page 502 =502 @fleet_e502;",
            "error_page 504 =504 @fleet_e504;",
            "location / {",
            f"    root {_q(self.paths.empty_dir)};",
            f"    try_files /.fleet-none @${route_var};",
            "}",
            f"location @{NO_ROUTE} {{",
            "    set $fleet_via -;",
            "    default_type text/plain;",
            _text(404, "404 Not Found: no route for host $host path $uri", raw=True),
            "}",
            "location @fleet_e400 {", "    default_type text/plain;", _text(400, "400 Bad Request: malformed request"), "}",
            "location @fleet_e431 {", "    default_type text/plain;",
            _text(431, f"431 Request Header Fields Too Large: the request line and headers "
                       f"exceed {o.max_header_bytes} bytes"),
            "}",
            "location @fleet_e413 {", "    default_type text/plain;",
            _text(413, f"413 Content Too Large: the request body exceeds {limit}"), "}",
            "location @fleet_e502 {", "    default_type text/plain;",
            _text(502, "502 Bad Gateway: the backend could not be reached or broke the connection "
                       "(tried: $upstream_addr)", raw=True),
            "}",
            "location @fleet_e504 {", "    default_type text/plain;",
            _text(504, "504 Gateway Timeout: the backend did not answer in time (tried: $upstream_addr)",
                  raw=True),
            "}",
            *self.locations,
        ]
        return "\n".join(lines) + "\n"

    # -- route locations

    def _route_location(self, rid: str, route: Route, lm: _ListenerMaps, error: str = "") -> None:
        src = f"{route.source.kind} {route.source.namespace}/{route.source.name}"
        # A route that fails half-way must leave no half-written map or upstream behind.
        http_len, upstreams = len(self.http), dict(self.upstreams)
        try:
            if error:
                raise _Unexpressible(error)
            if route.redirect is not None:
                body = self._redirect(rid, route, lm)
            elif not route.backends:
                body = [_text(500, f"500 Internal Server Error: no backends for this route ({src})")]
            else:
                body = self._proxy(rid, route, src)
        except (_Unexpressible, ConfigError) as exc:
            del self.http[http_len:]
            self.upstreams = upstreams
            body = [_text(500, f"500 Internal Server Error: {src} cannot be served: {exc}")]
        self.locations += [f"location @{rid} {{", f"    set $fleet_via {rid};",
                           "    default_type text/plain;", *body, "}"]

    def _redirect(self, rid: str, route: Route, lm: _ListenerMaps) -> list[str]:
        r = route.redirect
        assert r is not None
        listener_scheme = "https" if lm.protocol == "HTTPS" else "http"
        scheme = (r.scheme or listener_scheme).lower()
        if scheme not in ("http", "https"):
            raise _Unexpressible(f"redirect scheme {r.scheme!r}")
        # Gateway API: no port → the scheme's well-known port if the scheme was set,
        # else the listener's; a well-known port is left out of Location.
        port = r.port or ({"http": 80, "https": 443}[scheme] if r.scheme else lm.port)
        default_port = {"http": 80, "https": 443}[scheme]
        if r.hostname is not None:
            if not _DNS_NAME.match(r.hostname.lower()):
                raise _Unexpressible(f"invalid redirect hostname {r.hostname!r}")
            host = _qv(r.hostname.lower())[1:-1]
        else:
            host = "${host}"
        origin = f"{_qv(scheme + '://')[1:-1]}{host}" + ("" if port == default_port else f":{int(port)}")
        if r.path is not None:
            _header_value(r.path[1])  # it ends up in Location
        if r.path is None:
            path = "${request_uri}"
        elif r.path[0] == "ReplaceFullPath":
            path = _qv(r.path[1])[1:-1] + "${is_args}${args}"
        else:
            # ReplacePrefixMatch: the first of the route's prefixes that the raw path has
            # (Gateway API allows it only with PathPrefix matches).
            var = f"{rid}_path"
            new = r.path[1].rstrip("/")
            prefixes = [m.path.value.rstrip("/") for m in route.matches if m.path.type == "Prefix"] or [""]
            only_query, rest = r"(\?.*)?$", r"(/[^?]*)?(\?.*)?$"
            lines = [f"map $request_uri ${var} {{"]
            if not new:  # "/foo" replaced by "/": "/foo?q" must become "/?q", not "?q"
                lines += [f"    {_q('~^' + _literal(p) + only_query)} " + '"/$1";' for p in prefixes]
            lines += [f"    {_q('~^' + _literal(p) + rest)} {_qv(new)[:-1]}" + '$1$2";' for p in prefixes]
            self.http += [*lines, "    default $request_uri;", "}"]
            path = "${" + var + "}"
        code = r.status_code if r.status_code in (301, 302, 303, 307, 308) else 302
        return [f'    return {code} "{origin}{path}";']

    def _upstream(self, backend: Backend) -> str | None:
        servers = [a for a in (_endpoint_address(e.address, e.port) for e in backend.endpoints) if a]
        if not servers:
            return None
        key = tuple(sorted(set(servers)))
        if key not in self.upstreams:
            name = f"fleet_u{len(self.upstreams)}"
            self.upstreams[key] = name
            # max_fails=0: no passive "down" marking, an endpoint list is the ready
            # endpoints and a failed connect is retried on the next one anyway (as the
            # built-in engine does).
            self.http += [f"upstream {name} {{", *(f"    server {s} max_fails=0;" for s in key),
                          "    keepalive 64;", "    keepalive_timeout 60s;", "}"]
        return self.upstreams[key]

    def _proxy(self, rid: str, route: Route, src: str) -> list[str]:
        lines: list[str] = []
        if route.timeout is not None:
            t = _duration(route.timeout)
            lines += [f"    proxy_connect_timeout {_duration(min(route.timeout, self.options.connect_timeout))};",
                      f"    proxy_read_timeout {t};", f"    proxy_send_timeout {t};"]
        lines += self._request_headers(rid, route.request_headers)
        lines += self._response_headers(route.response_headers)
        weighted = [b for b in route.backends if b.weight > 0]
        if not weighted:
            return lines + [_text(500, f"500 Internal Server Error: every backend of {src} has weight 0")]
        targets: list[tuple[Backend, str | None]] = [(b, self._upstream(b)) for b in weighted]
        if len(targets) == 1:
            backend, upstream = targets[0]
            if upstream is None:
                return lines + [_text(503, _unavailable(backend))]
            return lines + [f"    proxy_pass http://{upstream};"]
        pick = f"{rid}_pick"
        total = sum(b.weight for b, _ in targets)
        split = [f'split_clients "${{request_id}}" ${pick} {{']
        cumulative, previous = 0, 0
        for i, (backend, upstream) in enumerate(targets):
            value = upstream or f"fleet_503_{i}"
            cumulative += backend.weight
            bound = cumulative * 10000 // total
            if i == len(targets) - 1:
                split.append(f"    * {value};")
            elif bound > previous:
                share = bound - previous
                split.append(f"    {share // 100}.{share % 100:02d}% {value};")
            previous = bound
        self.http += [*split, "}"]
        for i, (backend, upstream) in enumerate(targets):
            if upstream is None:
                lines += [f"    if (${pick} = fleet_503_{i}) {{", "    " + _text(503, _unavailable(backend)), "    }"]
        return lines + [f"    proxy_pass http://${pick};"]

    def _request_headers(self, rid: str, f: HeaderFilter | None) -> list[str]:
        if f is None:
            return []
        headers = dict(STANDARD_REQUEST_HEADERS)
        for name, value in f.set:
            headers[_header_name(name).lower()] = (name, _header_value(value))
        for n, (name, value) in enumerate(f.add):
            _header_value(value)
            key = _header_name(name).lower()
            if _VAR_HEADER.match(name) and key not in headers:
                var = f"{rid}_add{n}"
                existing = "$http_" + key.replace("-", "_")
                self.http += [f"map {existing} ${var} {{", f'    "" {_qv(value)};',
                              f'    default "{existing},{_qv(value)[1:-1]}";', "}"]
                headers[key] = (name, "$" + var)
            elif key in headers:
                prev_name, prev = headers[key]
                headers[key] = (prev_name, prev[:-1] + "," + _qv(value)[1:])
            else:
                headers[key] = (name, _qv(value))
        for name in f.remove:
            headers[_header_name(name).lower()] = (name, '""')
        return [f"    proxy_set_header {_q(name)} {value};" for name, value in headers.values()]

    @staticmethod
    def _response_headers(f: HeaderFilter | None) -> list[str]:
        if f is None:
            return []
        lines = []
        for name, value in f.set:
            lines += [f"    proxy_hide_header {_q(_header_name(name))};",
                      f"    add_header {_q(name)} {_header_value(value)} always;"]
        for name, value in f.add:
            lines.append(f"    add_header {_q(_header_name(name))} {_header_value(value)} always;")
        for name in f.remove:
            lines.append(f"    proxy_hide_header {_q(_header_name(name))};")
        return lines

    # -- TLS

    def _cert_files(self, cert: Certificate) -> tuple[str, str]:
        key = (cert.cert_pem, cert.key_pem)
        if key not in self.certs:
            n = len(self.certs)
            crt, pem = f"{self.paths.config_dir}/tls/cert-{n}.pem", f"{self.paths.config_dir}/tls/key-{n}.pem"
            self.files += [ConfigFile(crt, cert.cert_pem, 0o600), ConfigFile(pem, cert.key_pem, 0o600)]
            self.certs[key] = (crt, pem)
        return self.certs[key]

    def servers(self, lst: Listener) -> list[str]:
        listen = _listen_address(self.options.bind_address, lst.port)
        address = listen.split(" ")[0]  # socket options only once, on the default server
        include = f"    include {_q(f'{self.paths.config_dir}/listener-{lst.port}.conf')};"
        if lst.protocol != "HTTPS":
            return ["server {", f"    listen {address} default_server{listen[len(address):]};",
                    '    server_name "";', include, "}"]
        # SNI: one server per certificate host pattern (exact names are nginx' hash keys,
        # checked first; one-label wildcards are regexes, longest suffix first, as in
        # Listener.certificate_for); the default server has the catch-all or default one.
        by_pattern: dict[str, Certificate] = {}
        catch_all: Certificate | None = None
        for cert in lst.certificates:
            for pattern in cert.hostnames:
                pattern = pattern.lower()
                if pattern == "":
                    catch_all = catch_all or cert
                elif _valid_host(pattern) and pattern not in by_pattern:
                    by_pattern[pattern] = cert
        out = ["server {", f"    listen {address} ssl default_server{listen[len(address):]};", '    server_name "";']
        default = catch_all or lst.default_certificate
        if default is None:
            out.append("    ssl_reject_handshake on;")
        else:
            out += self._ssl(default)
        out += [include, "}"]
        ordered = sorted(by_pattern.items(), key=lambda kv: (kv[0].startswith("*."), -len(kv[0])))
        for pattern, cert in ordered:
            name = _q("~" + _host_regex(pattern, True)) if pattern.startswith("*.") else _q(pattern)
            out += ["server {", f"    listen {address} ssl;", f"    server_name {name};",
                    *self._ssl(cert), include, "}"]
        return out

    def _ssl(self, cert: Certificate) -> list[str]:
        crt, key = self._cert_files(cert)
        return [f"    ssl_certificate {_q(crt)};", f"    ssl_certificate_key {_q(key)};"]


def _header_name(name: str) -> str:
    if not TOKEN.match(name):
        raise _Unexpressible(f"invalid header name {name!r}")
    return name


def _header_value(value: str) -> str:
    """A header value as a quoted, interpolation-safe token: CR/LF would start a new header."""
    if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", value):
        raise _Unexpressible(f"control character in header value {value!r}")
    return _qv(value)


def _text(code: int, text: str, *, raw: bool = False) -> str:
    """`return` of a plain-text body (raw: `text` may use nginx variables and is ours).
    The location sets `default_type text/plain` (not allowed inside `if`)."""
    text = _CONTROL.sub("?", text) + "\n"
    return f"    return {code} {_q(text) if raw else _qv(text)};"


def _unavailable(backend: Backend) -> str:
    why = backend.problem or (f'no ready endpoints for service "{backend.namespace}/{backend.service}" '
                              f"port {backend.port}")
    return f"503 Service Unavailable: {why}"


#: The request headers every proxied request carries (Host as the client sent it;
#: X-Forwarded-For and RFC 7239 Forwarded appended to what came in).
STANDARD_REQUEST_HEADERS: dict[str, tuple[str, str]] = {
    "host": ("Host", "$fleet_host"),
    "x-forwarded-for": ("X-Forwarded-For", "$proxy_add_x_forwarded_for"),
    "x-forwarded-proto": ("X-Forwarded-Proto", "$scheme"),
    "x-forwarded-host": ("X-Forwarded-Host", "$fleet_host"),
    "x-forwarded-port": ("X-Forwarded-Port", "$server_port"),
    "forwarded": ("Forwarded", '"${fleet_fwd_prev}for=${fleet_fwd_for};host=\\"${fleet_host}\\";proto=${scheme}"'),
    "upgrade": ("Upgrade", "$http_upgrade"),
    "connection": ("Connection", "$fleet_connection"),
    # hop-by-hop headers nginx would pass on (it cannot drop names listed in Connection)
    "proxy-authorization": ("Proxy-Authorization", '""'),
    "proxy-connection": ("Proxy-Connection", '""'),
    "keep-alive": ("Keep-Alive", '""'),
    "te": ("TE", '""'),
}


def render(table: RouteTable, options: EngineOptions, *, paths: NginxPaths, stamp: int = 0,
           workers: int | str = "auto") -> RenderedConfig:
    """The whole configuration for `table`; `stamp` is served on the status socket so
    the engine can tell when a reload is live, and tags every access-log line.  With no
    `options.observe` nothing reads the access log, so nginx writes none (a datagram
    per request costs it a sixth of its throughput)."""
    if workers != "auto" and not (isinstance(workers, int) and workers > 0):
        raise ConfigError(f"worker count {workers!r}")
    r = _Renderer(options, paths, stamp)
    listener_maps: list[str] = []
    servers: list[str] = []
    seen: set[int] = set()
    for lst in table.listeners:
        if lst.port in seen or not 0 < lst.port < 65536:
            continue  # RouteTable.listener() takes the first listener on a port
        seen.add(lst.port)
        listener_maps += r.listener(lst)
        servers += r.servers(lst)
    o = options
    header_buffer = max(1024, o.max_header_bytes)
    http = [
        "default_type application/octet-stream;",
        "server_tokens off;",
        "uninitialized_variable_warn off;",
        "merge_slashes off;",
        "map_hash_bucket_size 256;",
        "server_names_hash_bucket_size 256;",
        f"log_format fleet \"fleet {int(stamp)} $fleet_via $status $request_time\";",
        (f"access_log {_q('syslog:server=unix:' + paths.access_socket + ',nohostname,tag=nginx')} fleet;"
         if o.observe is not None else "access_log off;"),
        *(f"{kind}_temp_path {_q(f'{paths.temp_dir}/{kind}')};"
          for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")),
        "client_header_buffer_size 1k;",
        f"large_client_header_buffers 1 {header_buffer};",
        f"client_max_body_size {int(o.max_body_bytes)};",
        f"keepalive_timeout {_duration(o.keepalive_timeout)};",
        # A head never finished (slowloris) is closed like an idle connection.
        f"client_header_timeout {_duration(o.keepalive_timeout)};",
        # After an error answer (413, 400) nginx reads what the client still sends
        # before closing; 1 s of silence is enough (the default 5 s holds sockets).
        "lingering_timeout 1s;",
        "proxy_http_version 1.1;",
        "proxy_buffering off;",
        "proxy_request_buffering off;",
        "proxy_redirect off;",
        f"proxy_connect_timeout {_duration(o.connect_timeout)};",
        f"proxy_read_timeout {_duration(o.response_timeout)};",
        f"proxy_send_timeout {_duration(o.response_timeout)};",
        "proxy_next_upstream error timeout;",  # never non_idempotent: POST is not retried
        f"proxy_next_upstream_tries {1 + max(0, int(o.retries))};",
        *(f"proxy_set_header {_q(name)} {value};" for name, value in STANDARD_REQUEST_HEADERS.values()),
        'geo $fleet_dollar { default "$"; }',
        'map $http_upgrade $fleet_connection { default upgrade; "" ""; }',
        'map $remote_addr $fleet_fwd_for { "~:" "\\"[$remote_addr]\\""; default $remote_addr; }',
        'map $http_forwarded $fleet_fwd_prev { "" ""; default "$http_forwarded, "; }',
        'map $http_host $fleet_host { "" $host; default $http_host; }',
        *listener_maps,
        *r.http,
        "server {",
        f"    listen {_q('unix:' + paths.status_socket)};",
        "    access_log off;",
        "    set $fleet_via -;  # declares the variable the log format names, even with no route",
        f"    location = /generation {{ default_type text/plain; return 200 \"{int(stamp)}\"; }}",
        "    location / { return 404; }",
        "}",
        *servers,
    ]
    head = [f"# rendered by fleet for table generation {int(table.generation)}, stamp {int(stamp)}"]
    if paths.worker_user:
        head.append(f"user {paths.worker_user};")
    head += [
        f"worker_processes {workers};",
        f"pid {_q(paths.pid)};",
        f"error_log {_q(paths.error_log)} warn;",
        "events { worker_connections 4096; }",
        "http {",
        *("    " + line for block in http for line in block.split("\n")),
        "}",
    ]
    return RenderedConfig("\n".join(head) + "\n", tuple(r.files), dict(r.sources), stamp)

