"""Validation of the Gateway API kinds: the CRDs' OpenAPI constraints and CEL rules, in Python.

Upstream, GatewayClass, Gateway and HTTPRoute are CRDs whose validity is
declared in their OpenAPI schemas (patterns, enums, bounds, max items) and
`x-kubernetes-validations` CEL rules (sigs.k8s.io/gateway-api v1.2, standard
channel).  Fleet serves them as built-in kinds, so this module rewrites each
of those rules as Python and reports a failure the way kube-apiserver does:

- a schema violation names the field (`spec.rules[0].matches[0].path.type:
  Unsupported value: ...`, `... in body should match '<pattern>'`,
  `Too many: 17: must have at most 16 items`);
- a CEL rule reports `Invalid value: "object"` (or `"array"`, `"string"`, the
  schema type of the node carrying the rule) followed by the rule's message.

One addition beyond the CRDs: a `RegularExpression` path, header or query
match must compile (Python `re`), because Fleet's own proxy evaluates it and a
pattern that cannot compile must be refused at the door, not break routing.
Every function here is pure: objects in, causes out.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from fleet.api import validation as v

Cause = dict[str, str]

GROUP = "gateway.networking.k8s.io"

# Patterns of the Gateway API's named string types (apis/v1/shared_types.go).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
HOSTNAME_RE = r"^(\*\.)?" + _LABEL + r"(\." + _LABEL + r")*$"
PRECISE_HOSTNAME_RE = r"^" + _LABEL + r"(\." + _LABEL + r")*$"
SECTION_NAME_RE = PRECISE_HOSTNAME_RE
NAMESPACE_RE = r"^" + _LABEL + r"$"
GROUP_RE = r"^$|^" + _LABEL + r"(\." + _LABEL + r")*$"
KIND_RE = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
HEADER_NAME_RE = r"^[A-Za-z0-9!#$%&'*+\-.^_\x60|~]+$"
CONTROLLER_RE = r"^" + _LABEL + r"(\." + _LABEL + r")*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$"
DURATION_RE = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"
PROTOCOL_RE = (r"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$|" + _LABEL + r"(\." + _LABEL
               + r")*\/[A-Za-z0-9]+$")
ADDRESS_TYPE_RE = (r"^Hostname|IPAddress|NamedAddress|" + _LABEL + r"(\." + _LABEL
                   + r")*\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$")
PATH_CHARS_RE = r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$"

PATH_MATCH_TYPES = ("Exact", "PathPrefix", "RegularExpression")
VALUE_MATCH_TYPES = ("Exact", "RegularExpression")
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
FILTER_FIELDS = {  # filter type -> the field holding its configuration
    "RequestHeaderModifier": "requestHeaderModifier",
    "ResponseHeaderModifier": "responseHeaderModifier",
    "RequestMirror": "requestMirror",
    "RequestRedirect": "requestRedirect",
    "URLRewrite": "urlRewrite",
    "ExtensionRef": "extensionRef",
}
#: Filter types that may appear at most once in one filters list (the CRD's CEL rules).
UNREPEATABLE_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite")
MAX_LISTENERS, MAX_ADDRESSES, MAX_ROUTE_KINDS, MAX_CERT_REFS, MAX_TLS_OPTIONS = 64, 16, 8, 64, 16
MAX_PARENT_REFS, MAX_HOSTNAMES, MAX_RULES, MAX_MATCHES, MAX_TOTAL_MATCHES = 32, 16, 16, 64, 128
MAX_FILTERS, MAX_BACKEND_REFS, MAX_HEADER_MATCHES, MAX_HEADER_MODS, MAX_CONDITIONS = 16, 16, 16, 16, 8
MAX_WEIGHT = 1_000_000


# ---- Kubernetes-style causes for OpenAPI schema and CEL failures ------------------------


def rule(path: str, node_type: str, message: str) -> Cause:
    """A failed CEL rule: kube shows the node's schema type as the value."""
    return v.invalid(path, node_type, message)


def _pattern(path: str, value: str, regex: str) -> Cause | None:
    # OpenAPI `pattern` is an unanchored search (Go regexp.MatchString); most carry ^...$.
    if re.search(regex, value):
        return None
    return v.invalid(path, value, f"{path} in body should match '{regex}'")


def _string(out: list[Cause], obj: dict[str, Any], key: str, path: str, *, required: bool = False,
            min_len: int = 0, max_len: int = 0, regex: str = "") -> str | None:
    """Check one string field against minLength/maxLength/pattern; its value or None."""
    p = f"{path}.{key}"
    value = obj.get(key)
    if value is None:
        if required:
            out.append(v.required(p))
        return None
    if not isinstance(value, str):
        out.append(v.type_invalid(p, value, "string"))
        return None
    if len(value) < min_len:
        out.append(v.invalid(p, value, f"{p} in body should be at least {min_len} chars long"))
        return value
    if max_len and len(value) > max_len:
        out.append(v.too_long(p, max_len))
        return value
    if regex:
        c = _pattern(p, value, regex)
        if c is not None:
            out.append(c)
    return value


def _int(out: list[Cause], obj: dict[str, Any], key: str, path: str, lo: int, hi: int, *,
         required: bool = False) -> int | None:
    p = f"{path}.{key}"
    value = obj.get(key)
    if value is None:
        if required:
            out.append(v.required(p))
        return None
    n = v.as_int(value)
    if n is None:
        out.append(v.type_invalid(p, value, "integer"))
    elif n < lo:
        out.append(v.invalid(p, n, f"{p} in body should be greater than or equal to {lo}"))
    elif n > hi:
        out.append(v.invalid(p, n, f"{p} in body should be less than or equal to {hi}"))
    return n


def _enum(out: list[Cause], obj: dict[str, Any], key: str, path: str, values: tuple[Any, ...], *,
          required: bool = False) -> Any:
    p = f"{path}.{key}"
    value = obj.get(key)
    if value is None:
        if required:
            out.append(v.required(p))
    elif value not in values or isinstance(value, bool):
        out.append(v.not_supported(p, value, [str(x) for x in values]))
    return value


def _list(out: list[Cause], obj: dict[str, Any], key: str, path: str, max_items: int, *,
          min_items: int = 0, required: bool = False) -> list[Any]:
    p = f"{path}.{key}"
    value = obj.get(key)
    if value is None:
        if required:
            out.append(v.required(p))
        return []
    if not isinstance(value, list):
        out.append(v.type_invalid(p, value, "array"))
        return []
    if len(value) < min_items:
        out.append(v.invalid(p, len(value), f"{p} in body should have at least {min_items} items"))
    if len(value) > max_items:
        out.append(v.too_many(p, len(value), max_items))
    return value


def _obj(out: list[Cause], obj: dict[str, Any], key: str, path: str, *, required: bool = False
         ) -> dict[str, Any] | None:
    value = obj.get(key)
    if value is None:
        if required:
            out.append(v.required(f"{path}.{key}"))
        return None
    if not isinstance(value, dict):
        out.append(v.type_invalid(f"{path}.{key}", value, "object"))
        return None
    return value


def _items(out: list[Cause], items: list[Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, item) for each object in a list; a non-object item is a type error."""
    res = []
    for i, item in enumerate(items):
        p = f"{path}[{i}]"
        if isinstance(item, dict):
            res.append((p, item))
        else:
            out.append(v.type_invalid(p, item, "object"))
    return res


def _unique_keys(out: list[Cause], items: list[tuple[str, dict[str, Any]]], key: str) -> None:
    """A list-map (`x-kubernetes-list-map-keys: [key]`): no two items with the same key."""
    seen: set[Any] = set()
    for p, item in items:
        k = item.get(key)
        if isinstance(k, str) and k in seen:
            out.append(v.duplicate(p, {key: k}))
        seen.add(k)


def _regex(out: list[Cause], path: str, value: Any) -> None:
    if not isinstance(value, str):
        return
    try:
        re.compile(value)
    except re.error as e:
        out.append(v.invalid(path, value, f"must be a valid regular expression: {e}"))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _duration_seconds(text: str) -> float:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|h|m|s)", text))


# ---- shared references -------------------------------------------------------------------


def _conditions(out: list[Cause], obj: dict[str, Any], path: str) -> None:
    _list(out, obj, "conditions", path, MAX_CONDITIONS)


def validate_parent_ref(out: list[Cause], ref: dict[str, Any], p: str) -> None:
    _string(out, ref, "group", p, max_len=253, regex=GROUP_RE)
    _string(out, ref, "kind", p, min_len=1, max_len=63, regex=KIND_RE)
    _string(out, ref, "namespace", p, min_len=1, max_len=63, regex=NAMESPACE_RE)
    _string(out, ref, "name", p, required=True, min_len=1, max_len=253)
    _string(out, ref, "sectionName", p, min_len=1, max_len=253, regex=SECTION_NAME_RE)
    _int(out, ref, "port", p, 1, 65535)


def _parent_refs(out: list[Cause], spec: dict[str, Any], path: str) -> None:
    p = f"{path}.parentRefs"
    refs = _items(out, _list(out, spec, "parentRefs", path, MAX_PARENT_REFS), p)
    for rp, ref in refs:
        validate_parent_ref(out, ref, rp)
    # CEL: references to the same parent need distinct, present sectionNames.
    by_parent: dict[tuple[Any, ...], list[str]] = {}
    for _, ref in refs:
        parent = (ref.get("group"), ref.get("kind"), ref.get("name"), ref.get("namespace") or "")
        by_parent.setdefault(parent, []).append(ref.get("sectionName") or "")
    if any(len(s) > 1 and any(x == "" for x in s) and any(x != "" for x in s) for s in by_parent.values()):
        out.append(rule(p, "array", "sectionName must be specified when parentRefs includes 2 or more "
                                    "references to the same parent"))
    if any(len(s) != len(set(s)) for s in by_parent.values()):
        out.append(rule(p, "array", "sectionName must be unique when parentRefs includes 2 or more "
                                    "references to the same parent"))


def _backend_object_ref(out: list[Cause], ref: dict[str, Any], p: str) -> None:
    group = _string(out, ref, "group", p, max_len=253, regex=GROUP_RE)
    kind = _string(out, ref, "kind", p, min_len=1, max_len=63, regex=KIND_RE)
    _string(out, ref, "name", p, required=True, min_len=1, max_len=253)
    _string(out, ref, "namespace", p, min_len=1, max_len=63, regex=NAMESPACE_RE)
    port = _int(out, ref, "port", p, 1, 65535)
    if not group and (kind or "Service") == "Service" and port is None:
        out.append(rule(p, "object", "Must have port for Service reference"))


# ---- HTTPRoute ---------------------------------------------------------------------------


def _header_modifier(out: list[Cause], mod: dict[str, Any], p: str) -> None:
    for key in ("set", "add"):
        headers = _items(out, _list(out, mod, key, p, MAX_HEADER_MODS), f"{p}.{key}")
        for hp, h in headers:
            _string(out, h, "name", hp, required=True, min_len=1, max_len=256, regex=HEADER_NAME_RE)
            _string(out, h, "value", hp, required=True, min_len=1, max_len=4096)
        _unique_keys(out, headers, "name")
    removed = _list(out, mod, "remove", p, MAX_HEADER_MODS)
    seen: set[str] = set()
    for i, name in enumerate(removed):
        if isinstance(name, str) and name in seen:
            out.append(v.duplicate(f"{p}.remove[{i}]", name))
        seen.add(name)


def _path_modifier(out: list[Cause], mod: dict[str, Any], p: str) -> None:
    kind = _enum(out, mod, "type", p, ("ReplaceFullPath", "ReplacePrefixMatch"), required=True)
    _string(out, mod, "replaceFullPath", p, max_len=1024)
    _string(out, mod, "replacePrefixMatch", p, max_len=1024)
    for t, field in (("ReplaceFullPath", "replaceFullPath"), ("ReplacePrefixMatch", "replacePrefixMatch")):
        if kind == t and field not in mod:
            out.append(rule(p, "object", f"{field} must be specified when type is set to '{t}'"))
        if field in mod and kind != t:
            out.append(rule(p, "object", f"type must be '{t}' when {field} is set"))


def _filter(out: list[Cause], f: dict[str, Any], p: str) -> None:
    ftype = _enum(out, f, "type", p, tuple(FILTER_FIELDS), required=True)
    for t, field in FILTER_FIELDS.items():
        if field in f and ftype != t:
            out.append(rule(p, "object", f"filter.{field} must be nil if the filter.type is not {t}"))
        if field not in f and ftype == t:
            out.append(rule(p, "object", f"filter.{field} must be specified for {t} filter.type"))
    for key in ("requestHeaderModifier", "responseHeaderModifier"):
        mod = _obj(out, f, key, p)
        if mod is not None:
            _header_modifier(out, mod, f"{p}.{key}")
    mirror = _obj(out, f, "requestMirror", p)
    if mirror is not None:
        ref = _obj(out, mirror, "backendRef", f"{p}.requestMirror", required=True)
        if ref is not None:
            _backend_object_ref(out, ref, f"{p}.requestMirror.backendRef")
    redirect = _obj(out, f, "requestRedirect", p)
    if redirect is not None:
        rp = f"{p}.requestRedirect"
        _enum(out, redirect, "scheme", rp, ("http", "https"))
        _string(out, redirect, "hostname", rp, min_len=1, max_len=253, regex=PRECISE_HOSTNAME_RE)
        _int(out, redirect, "port", rp, 1, 65535)
        _enum(out, redirect, "statusCode", rp, (301, 302))
        mod = _obj(out, redirect, "path", rp)
        if mod is not None:
            _path_modifier(out, mod, f"{rp}.path")
    rewrite = _obj(out, f, "urlRewrite", p)
    if rewrite is not None:
        rp = f"{p}.urlRewrite"
        _string(out, rewrite, "hostname", rp, min_len=1, max_len=253, regex=PRECISE_HOSTNAME_RE)
        mod = _obj(out, rewrite, "path", rp)
        if mod is not None:
            _path_modifier(out, mod, f"{rp}.path")
    ext = _obj(out, f, "extensionRef", p)
    if ext is not None:
        ep = f"{p}.extensionRef"
        _string(out, ext, "group", ep, required=True, max_len=253, regex=GROUP_RE)
        _string(out, ext, "kind", ep, required=True, min_len=1, max_len=63, regex=KIND_RE)
        _string(out, ext, "name", ep, required=True, min_len=1, max_len=253)


def _filters(out: list[Cause], holder: dict[str, Any], path: str) -> list[dict[str, Any]]:
    p = f"{path}.filters"
    filters = _items(out, _list(out, holder, "filters", path, MAX_FILTERS), p)
    for fp, f in filters:
        _filter(out, f, fp)
    types = [f.get("type") for _, f in filters]
    if "RequestRedirect" in types and "URLRewrite" in types:
        out.append(rule(p, "array", "May specify either httpRouteFilterRequestRedirect or "
                                    "httpRouteFilterRequestRewrite, but not both"))
    for t in UNREPEATABLE_FILTERS:
        if types.count(t) > 1:
            out.append(rule(p, "array", f"{t} filter cannot be repeated"))
    return [f for _, f in filters]


def _path_match(out: list[Cause], m: dict[str, Any], p: str) -> None:
    kind = _enum(out, m, "type", p, PATH_MATCH_TYPES)
    value = _string(out, m, "value", p, max_len=1024)
    if value is None:
        return
    vp = f"{p}.value"
    if kind == "RegularExpression":
        _regex(out, vp, value)
        return
    if kind not in ("Exact", "PathPrefix"):
        return
    types = "when type one of ['Exact', 'PathPrefix']"
    if not value.startswith("/"):
        out.append(rule(p, "object", f"value must be an absolute path and start with '/' {types}"))
    for bad in ("//", "/./", "/../", "%2f", "%2F", "#"):
        if bad in value:
            out.append(rule(p, "object", f"must not contain '{bad}' {types}"))
    for bad in ("/..", "/."):
        if value.endswith(bad):
            out.append(rule(p, "object", f"must not end with '{bad}' {types}"))
    if not re.search(PATH_CHARS_RE, value):
        out.append(rule(p, "object", f"must only contain valid characters (matching {PATH_CHARS_RE}) "
                                     "for types ['Exact', 'PathPrefix']"))


def _value_matches(out: list[Cause], m: dict[str, Any], key: str, p: str, max_value: int) -> None:
    items = _items(out, _list(out, m, key, p, MAX_HEADER_MATCHES), f"{p}.{key}")
    for ip, item in items:
        kind = _enum(out, item, "type", ip, VALUE_MATCH_TYPES)
        _string(out, item, "name", ip, required=True, min_len=1, max_len=256, regex=HEADER_NAME_RE)
        value = _string(out, item, "value", ip, required=True, min_len=1, max_len=max_value)
        if kind == "RegularExpression":
            _regex(out, f"{ip}.value", value)
    _unique_keys(out, items, "name")


def _match(out: list[Cause], m: dict[str, Any], p: str) -> None:
    path = _obj(out, m, "path", p)
    if path is not None:
        _path_match(out, path, f"{p}.path")
    _value_matches(out, m, "headers", p, 4096)
    _value_matches(out, m, "queryParams", p, 1024)
    _enum(out, m, "method", p, METHODS)


def _uses_prefix_replace(filters: list[dict[str, Any]], kind: str, field: str) -> bool:
    return any(f.get("type") == kind and isinstance(f.get(field), dict)
               and isinstance(f[field].get("path"), dict)
               and f[field]["path"].get("type") == "ReplacePrefixMatch"
               and "replacePrefixMatch" in f[field]["path"] for f in filters)


def _timeouts(out: list[Cause], rule_: dict[str, Any], p: str) -> None:
    t = _obj(out, rule_, "timeouts", p)
    if t is None:
        return
    tp = f"{p}.timeouts"
    request = _string(out, t, "request", tp, regex=DURATION_RE)
    backend = _string(out, t, "backendRequest", tp, regex=DURATION_RE)
    if request and backend and re.search(DURATION_RE, request) and re.search(DURATION_RE, backend):
        req_s = _duration_seconds(request)
        if req_s != 0 and _duration_seconds(backend) > req_s:
            out.append(rule(tp, "object", "backendRequest timeout cannot be longer than request timeout"))


def _rule(out: list[Cause], r: dict[str, Any], p: str) -> int:
    """Check one rule; the number of matches it has (for the route-wide total)."""
    matches = _items(out, _list(out, r, "matches", p, MAX_MATCHES), f"{p}.matches")
    for mp, m in matches:
        _match(out, m, mp)
    filters = _filters(out, r, p)
    refs = _items(out, _list(out, r, "backendRefs", p, MAX_BACKEND_REFS), f"{p}.backendRefs")
    ref_filters: list[dict[str, Any]] = []
    for bp, ref in refs:
        _backend_object_ref(out, ref, bp)
        _int(out, ref, "weight", bp, 0, MAX_WEIGHT)
        ref_filters += _filters(out, ref, bp)
    _timeouts(out, r, p)
    if refs and any("requestRedirect" in f for f in filters):
        out.append(rule(p, "object", "RequestRedirect filter must not be used together with backendRefs"))
    single_prefix = (len(matches) == 1 and isinstance(matches[0][1].get("path"), dict)
                     and matches[0][1]["path"].get("type") == "PathPrefix")
    # The CRD's messages, capitals included ("Within backendRefs, When using URLRewrite").
    for lead, fs, kind, field in (("When", filters, "RequestRedirect", "requestRedirect"),
                                  ("When", filters, "URLRewrite", "urlRewrite"),
                                  ("Within backendRefs, when", ref_filters, "RequestRedirect", "requestRedirect"),
                                  ("Within backendRefs, When", ref_filters, "URLRewrite", "urlRewrite")):
        if _uses_prefix_replace(fs, kind, field) and not single_prefix:
            out.append(rule(p, "object", f"{lead} using {kind} filter with path.replacePrefixMatch, "
                                         "exactly one PathPrefix match must be specified"))
    return len(matches)


def validate_httproute_spec(spec: dict[str, Any], path: str = "spec") -> list[Cause]:
    out: list[Cause] = []
    _parent_refs(out, spec, path)
    hostnames = _list(out, spec, "hostnames", path, MAX_HOSTNAMES)
    for i, h in enumerate(hostnames):
        hp = f"{path}.hostnames[{i}]"
        if not isinstance(h, str):
            out.append(v.type_invalid(hp, h, "string"))
        elif not h:
            out.append(v.invalid(hp, h, f"{hp} in body should be at least 1 chars long"))
        elif len(h) > 253:
            out.append(v.too_long(hp, 253))
        elif (c := _pattern(hp, h, HOSTNAME_RE)) is not None:
            out.append(c)
    total = 0
    for rp, r in _items(out, _list(out, spec, "rules", path, MAX_RULES), f"{path}.rules"):
        total += _rule(out, r, rp)
    if total > MAX_TOTAL_MATCHES:
        out.append(rule(f"{path}.rules", "array", "While 16 rules and 64 matches per rule are allowed, the "
                                                  "total number of matches across all rules in a route must "
                                                  "be less than 128"))
    return out


def validate_route_status(status: dict[str, Any], path: str = "status") -> list[Cause]:
    out: list[Cause] = []
    parents = _items(out, _list(out, status, "parents", path, MAX_PARENT_REFS), f"{path}.parents")
    for pp, parent in parents:
        ref = _obj(out, parent, "parentRef", pp, required=True)
        if ref is not None:
            validate_parent_ref(out, ref, f"{pp}.parentRef")
        _string(out, parent, "controllerName", pp, required=True, min_len=1, max_len=253, regex=CONTROLLER_RE)
        _conditions(out, parent, pp)
    return out


# ---- Gateway -----------------------------------------------------------------------------


def _listener(out: list[Cause], lis: dict[str, Any], p: str) -> None:
    _string(out, lis, "name", p, required=True, min_len=1, max_len=253, regex=SECTION_NAME_RE)
    _string(out, lis, "hostname", p, min_len=1, max_len=253, regex=HOSTNAME_RE)
    _int(out, lis, "port", p, 1, 65535, required=True)
    _string(out, lis, "protocol", p, required=True, min_len=1, max_len=255, regex=PROTOCOL_RE)
    tls = _obj(out, lis, "tls", p)
    if tls is not None:
        tp = f"{p}.tls"
        mode = _enum(out, tls, "mode", tp, ("Terminate", "Passthrough"))
        refs = _items(out, _list(out, tls, "certificateRefs", tp, MAX_CERT_REFS), f"{tp}.certificateRefs")
        for cp, ref in refs:
            _string(out, ref, "group", cp, max_len=253, regex=GROUP_RE)
            _string(out, ref, "kind", cp, min_len=1, max_len=63, regex=KIND_RE)
            _string(out, ref, "name", cp, required=True, min_len=1, max_len=253)
            _string(out, ref, "namespace", cp, min_len=1, max_len=63, regex=NAMESPACE_RE)
        options = _obj(out, tls, "options", tp)
        if options is not None and len(options) > MAX_TLS_OPTIONS:
            out.append(v.invalid(f"{tp}.options", len(options),
                                 f"{tp}.options in body should have at most {MAX_TLS_OPTIONS} properties"))
        if (mode or "Terminate") == "Terminate" and not refs and not options:
            out.append(rule(tp, "object", "certificateRefs or options must be specified when mode is Terminate"))
    allowed = _obj(out, lis, "allowedRoutes", p)
    if allowed is not None:
        ap = f"{p}.allowedRoutes"
        nss = _obj(out, allowed, "namespaces", ap)
        if nss is not None:
            _enum(out, nss, "from", f"{ap}.namespaces", ("All", "Selector", "Same"))
            sel = nss.get("selector")
            if sel is not None:
                out.extend(v.validate_label_selector(sel, f"{ap}.namespaces.selector"))
        kinds = _items(out, _list(out, allowed, "kinds", ap, MAX_ROUTE_KINDS), f"{ap}.kinds")
        for kp, k in kinds:
            _string(out, k, "group", kp, max_len=253, regex=GROUP_RE)
            _string(out, k, "kind", kp, required=True, min_len=1, max_len=63, regex=KIND_RE)


def _listener_rules(out: list[Cause], listeners: list[dict[str, Any]], p: str) -> None:
    """The CEL rules on spec.listeners as a whole."""
    if any(lis.get("protocol") in ("HTTP", "TCP", "UDP") and "tls" in lis for lis in listeners):
        out.append(rule(p, "array", "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']"))
    # An HTTPS listener without `tls` is accepted here; its controller reports it (Programmed False).
    if any(lis.get("protocol") == "HTTPS" and isinstance(lis.get("tls"), dict)
           and lis["tls"].get("mode") not in (None, "", "Terminate") for lis in listeners):
        out.append(rule(p, "array", "tls mode must be Terminate for protocol HTTPS"))
    if any(lis.get("protocol") in ("TCP", "UDP") and lis.get("hostname") for lis in listeners):
        out.append(rule(p, "array", "hostname must not be specified for protocols ['TCP', 'UDP']"))
    names = [lis.get("name") for lis in listeners]
    if len(names) != len(set(map(repr, names))):
        out.append(rule(p, "array", "Listener name must be unique within the Gateway"))
    combos = [(lis.get("port"), lis.get("protocol"), lis.get("hostname") or None) for lis in listeners]
    if len(combos) != len(set(map(repr, combos))):
        out.append(rule(p, "array", "Combination of port, protocol and hostname must be unique for each "
                                    "listener"))


def validate_gateway_spec(spec: dict[str, Any], path: str = "spec") -> list[Cause]:
    out: list[Cause] = []
    _string(out, spec, "gatewayClassName", path, required=True, min_len=1, max_len=253)
    lp = f"{path}.listeners"
    listeners = _items(out, _list(out, spec, "listeners", path, MAX_LISTENERS, min_items=1, required=True), lp)
    for p, lis in listeners:
        _listener(out, lis, p)
    _listener_rules(out, [lis for _, lis in listeners], lp)
    ap = f"{path}.addresses"
    addresses = _items(out, _list(out, spec, "addresses", path, MAX_ADDRESSES), ap)
    for p, a in addresses:
        _string(out, a, "type", p, min_len=1, max_len=253, regex=ADDRESS_TYPE_RE)
        value = _string(out, a, "value", p, required=True, min_len=1, max_len=253)
        if (a.get("type") or "IPAddress") == "IPAddress" and value and not _is_ip(value):
            out.append(v.invalid(f"{p}.value", value, f"{p}.value in body must be of type ipv4"))
        if (a.get("type") or "IPAddress") == "Hostname" and value and not re.search(HOSTNAME_RE, value):
            out.append(rule(p, "object", f"Hostname value must only contain valid characters (matching "
                                         f"{HOSTNAME_RE})"))
    for t in ("IPAddress", "Hostname"):
        values = [a.get("value") for _, a in addresses if (a.get("type") or "IPAddress") == t]
        if len(values) != len(set(map(repr, values))):
            out.append(rule(ap, "array", f"{t} values must be unique"))
    infra = _obj(out, spec, "infrastructure", path)
    if infra is not None:
        ip = f"{path}.infrastructure"
        out.extend(v.validate_labels(infra.get("labels") or {}, f"{ip}.labels"))
        out.extend(v.validate_annotations(infra.get("annotations") or {}, f"{ip}.annotations"))
        ref = _obj(out, infra, "parametersRef", ip)
        if ref is not None:
            rp = f"{ip}.parametersRef"
            _string(out, ref, "group", rp, required=True, max_len=253, regex=GROUP_RE)
            _string(out, ref, "kind", rp, required=True, min_len=1, max_len=63, regex=KIND_RE)
            _string(out, ref, "name", rp, required=True, min_len=1, max_len=253)
    return out


def validate_gateway_status(status: dict[str, Any], path: str = "status") -> list[Cause]:
    out: list[Cause] = []
    _list(out, status, "addresses", path, MAX_ADDRESSES)
    _conditions(out, status, path)
    for lp, lis in _items(out, _list(out, status, "listeners", path, MAX_LISTENERS), f"{path}.listeners"):
        _string(out, lis, "name", lp, required=True, min_len=1, max_len=253, regex=SECTION_NAME_RE)
        _int(out, lis, "attachedRoutes", lp, 0, 2**31 - 1, required=True)
        _conditions(out, lis, lp)
    return out


# ---- GatewayClass ------------------------------------------------------------------------


def validate_gatewayclass_spec(spec: dict[str, Any], old_spec: dict[str, Any] | None,
                               path: str = "spec") -> list[Cause]:
    out: list[Cause] = []
    name = _string(out, spec, "controllerName", path, required=True, min_len=1, max_len=253,
                   regex=CONTROLLER_RE)
    if old_spec is not None and name != old_spec.get("controllerName"):
        out.append(rule(f"{path}.controllerName", "string", "Value is immutable"))
    _string(out, spec, "description", path, max_len=64)
    ref = _obj(out, spec, "parametersRef", path)
    if ref is not None:
        rp = f"{path}.parametersRef"
        _string(out, ref, "group", rp, required=True, max_len=253, regex=GROUP_RE)
        _string(out, ref, "kind", rp, required=True, min_len=1, max_len=63, regex=KIND_RE)
        _string(out, ref, "name", rp, required=True, min_len=1, max_len=253)
        _string(out, ref, "namespace", rp, min_len=1, max_len=63, regex=NAMESPACE_RE)
    return out


def validate_gatewayclass_status(status: dict[str, Any], path: str = "status") -> list[Cause]:
    out: list[Cause] = []
    _conditions(out, status, path)
    return out
