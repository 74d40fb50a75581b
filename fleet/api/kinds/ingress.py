"""`networking.k8s.io/v1` Ingress and IngressClass: HTTP routing declared as objects.

An Ingress maps hosts and paths to Services (or to another resource); an
IngressClass names the controller that implements a set of Ingresses, and the
class annotated `ingressclass.kubernetes.io/is-default-class: "true"` is given
to new Ingresses that name none (the DefaultIngressClass admission plugin,
`fleet/admission/defaultingressclass.py`).  What is here follows kube-apiserver
1.32: validation is `ValidateIngressCreate` / `ValidateIngressUpdate` /
`ValidateIngressStatusUpdate` / `ValidateIngressClass[Update]` of
pkg/apis/networking/validation, with their messages and field paths, the
defaulting of IngressClass parameters' scope is the v1 `SetDefaults_IngressClass`,
and the tables are kubectl's `printIngress` / `printIngressClass`.

An Ingress's status is the controller's to write, through `/status` only: the
generic write path drops it on create and keeps the stored one on update
(kube's ingressStrategy), so validation here sees a status only on the status
path or as it was stored.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from fleet.api import validation as v
from fleet.api.errors import cause
from fleet.api.kinds._common import NONE, col, d, dicts, lst
from fleet.api.kinds.core import is_dns1035_label
from fleet.api.registry import KindInfo

Cause = dict[str, str]

GROUP = "networking.k8s.io"
#: The legacy class annotation; spec.ingressClassName replaces it.
ANNOTATION_INGRESS_CLASS = "kubernetes.io/ingress.class"
#: Marks the IngressClass new Ingresses without a class get.
ANNOTATION_IS_DEFAULT_CLASS = "ingressclass.kubernetes.io/is-default-class"

PATH_TYPES = ("Exact", "ImplementationSpecific", "Prefix")  # sets.NewString(...).List(): sorted
INVALID_PATH_SEQUENCES = ("//", "/./", "/../", "%2f", "%2F")
INVALID_PATH_SUFFIXES = ("/..", "/.")
PARAMETER_SCOPES = ("Cluster", "Namespace")
MAX_CONTROLLER_LEN = 250

WILDCARD_DNS1123_SUBDOMAIN_FMT = r"\*\." + v.DNS1123_SUBDOMAIN_FMT
_WILDCARD_RE = re.compile(WILDCARD_DNS1123_SUBDOMAIN_FMT)
WILDCARD_DNS1123_SUBDOMAIN_ERR = (
    "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must "
    "consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character "
    f"(e.g. '*.example.com', regex used for validation is '{WILDCARD_DNS1123_SUBDOMAIN_FMT}')")
# RFC 3986 path characters (validation.IsDomainPrefixedPath).
HTTP_PATH_FMT = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"
_HTTP_PATH_RE = re.compile(HTTP_PATH_FMT)


# ---------------------------------------------------------------------------
# String checks (apimachinery/pkg/util/validation, api/validate/content).
# ---------------------------------------------------------------------------


def is_wildcard_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > v.DNS1123_SUBDOMAIN_MAX:
        errs.append(v.max_len_error(v.DNS1123_SUBDOMAIN_MAX))
    if not _WILDCARD_RE.fullmatch(value):
        errs.append(WILDCARD_DNS1123_SUBDOMAIN_ERR)
    return errs


def is_path_segment_name(name: str) -> list[str]:
    """content.IsPathSegmentName: usable as one segment of a REST path."""
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def domain_prefixed_path_errors(path: str, value: str) -> list[Cause]:
    """validation.IsDomainPrefixedPath: `acme.io/foo`, host a DNS subdomain, the rest an HTTP path."""
    if not value:
        return [v.required(path)]
    host, sep, rest = value.partition("/")
    if not sep or not host or not rest:
        return [v.invalid(path, value, 'must be a domain-prefixed path (such as "acme.io/foo")')]
    out = [v.invalid(path, host, msg) for msg in v.is_dns1123_subdomain(host)]
    if not _HTTP_PATH_RE.fullmatch(rest):
        out.append(v.invalid(path, rest, f"Invalid path (regex used for validation is '{HTTP_PATH_FMT}')"))
    return out


def parses_as_ip(value: str) -> bool:
    """netutils.ParseIPSloppy != nil (which also takes IPv4 with leading zeros)."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    parts = value.split(".")
    return len(parts) == 4 and all(p.isdigit() and len(p) <= 3 and int(p) <= 255 for p in parts)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# ---------------------------------------------------------------------------
# Ingress.
# ---------------------------------------------------------------------------


def _backend_errors(backend: dict[str, Any], path: str) -> list[Cause]:
    """validateIngressBackend: exactly one of resource and service; a service needs a port."""
    resource, service = backend.get("resource"), backend.get("service")
    if resource is not None and service is not None:
        return [v.invalid(path, "", "cannot set both resource and service backends")]
    if isinstance(resource, dict):
        return _typed_local_ref_errors(resource, f"{path}.resource")
    if not isinstance(service, dict):
        return [v.invalid(path, "", "resource or service backend is required")]
    out: list[Cause] = []
    name = _str(service.get("name"))
    if not name:
        out.append(v.required(f"{path}.service.name"))
    else:
        # RelaxedServiceNameValidation is off in 1.32: a Service name is a DNS-1035 label.
        out += [v.invalid(f"{path}.service.name", name, msg) for msg in is_dns1035_label(name)]
    port = d(service, "port")
    port_name = _str(port.get("name"))
    number = v.as_int(port.get("number")) or 0
    if port_name and number:
        out.append(v.invalid(path, "", "cannot set both port name & port number"))
    elif port_name:
        out += [v.invalid(f"{path}.service.port.name", port_name, m) for m in v.is_valid_port_name(port_name)]
    elif number:
        out += [v.invalid(f"{path}.service.port.number", number, m) for m in v.is_valid_port_num(number)]
    else:
        out.append(v.required(path, "port name or number is required"))
    return out


def _typed_local_ref_errors(ref: dict[str, Any], path: str) -> list[Cause]:
    """validateIngressTypedLocalObjectReference (a resource backend)."""
    out: list[Cause] = []
    group = ref.get("apiGroup")
    if isinstance(group, str):
        out += [v.invalid(f"{path}.apiGroup", group, m) for m in v.is_dns1123_subdomain(group)]
    for f in ("kind", "name"):
        val = _str(ref.get(f))
        if not val:
            out.append(v.required(f"{path}.{f}"))
        else:
            out += [v.invalid(f"{path}.{f}", val, m) for m in is_path_segment_name(val)]
    return out


def _http_path_errors(p: dict[str, Any], path: str) -> list[Cause]:
    """validateHTTPIngressPath: pathType required; Exact/Prefix paths absolute and clean."""
    ptype = p.get("pathType")
    if ptype is None:
        return [v.required(f"{path}.pathType", "pathType must be specified")]
    value = _str(p.get("path"))
    out: list[Cause] = []
    if ptype in ("Exact", "Prefix"):
        if not value.startswith("/"):
            out.append(v.invalid(f"{path}.path", value, "must be an absolute path"))
        for seq in INVALID_PATH_SEQUENCES:
            if seq in value:
                out.append(v.invalid(f"{path}.path", value, f"must not contain '{seq}'"))
        for suffix in INVALID_PATH_SUFFIXES:
            if value.endswith(suffix):
                out.append(v.invalid(f"{path}.path", value, f"cannot end with '{suffix}'"))
    elif ptype == "ImplementationSpecific":
        if value and not value.startswith("/"):
            out.append(v.invalid(f"{path}.path", value, "must be an absolute path"))
    else:
        out.append(v.not_supported(f"{path}.pathType", ptype, PATH_TYPES))
    return out + _backend_errors(d(p, "backend"), f"{path}.backend")


def _rule_value_errors(rule: dict[str, Any], path: str) -> list[Cause]:
    http = rule.get("http")
    if not isinstance(http, dict):
        return []
    paths = dicts(lst(http, "paths"))
    out = [v.required(f"{path}.http.paths")] if not paths else []
    for i, p in enumerate(paths):
        out += _http_path_errors(p, f"{path}.http.paths[{i}]")
    return out


def _host_errors(host: str) -> list[str]:
    if "*" in host:
        return is_wildcard_dns1123_subdomain(host)
    return v.is_dns1123_subdomain(host)


def _invalid_wildcard_rule_allowed(old: dict[str, Any] | None) -> bool:
    """allowInvalidWildcardHostRule: a stored wildcard rule kube once let through stays editable."""
    return any("*" in _str(r.get("host")) and _rule_value_errors(r, "")
               for r in dicts(lst(old, "spec", "rules")))


def _invalid_secret_name_allowed(old: dict[str, Any] | None) -> bool:
    return any(_str(t.get("secretName")) and v.is_dns1123_subdomain(_str(t["secretName"]))
               for t in dicts(lst(old, "spec", "tls")))


def validate_ingress_spec(spec: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    """ValidateIngressSpec (with the update-time allowances for stored legacy values)."""
    out: list[Cause] = []
    rules = dicts(lst(spec, "rules"))
    default_backend = spec.get("defaultBackend")
    if not rules and default_backend is None:
        # field.Invalid(spec, spec.Rules, ...): Go prints the (empty) slice with %#v.
        shown = "[]networking.IngressRule(nil)" if spec.get("rules") is None else "[]networking.IngressRule{}"
        out.append(cause("spec", f"Invalid value: {shown}: either `defaultBackend` or `rules` must be specified",
                         "FieldValueInvalid"))
    if isinstance(default_backend, dict):
        out += _backend_errors(default_backend, "spec.defaultBackend")
    allow_wildcard = _invalid_wildcard_rule_allowed(old)
    for i, rule in enumerate(rules):
        path = f"spec.rules[{i}]"
        host = _str(rule.get("host"))
        if host:
            if parses_as_ip(host):
                out.append(v.invalid(f"{path}.host", host, "must be a DNS name, not an IP address"))
            out += [v.invalid(f"{path}.host", host, m) for m in _host_errors(host)]
        if "*" not in host or not allow_wildcard:
            out += _rule_value_errors(rule, path)
    allow_secret = _invalid_secret_name_allowed(old)
    for i, tls in enumerate(dicts(lst(spec, "tls"))):
        for j, host in enumerate(lst(tls, "hosts")):
            host = _str(host)
            out += [v.invalid(f"spec.tls[{i}].hosts[{j}]", host, m) for m in _host_errors(host)]
        secret = _str(tls.get("secretName"))
        if secret and not allow_secret:
            out += [v.invalid(f"spec.tls[{i}].secretName", secret, m) for m in v.is_dns1123_subdomain(secret)]
    cls = spec.get("ingressClassName")
    if isinstance(cls, str):
        out += [v.invalid("spec.ingressClassName", cls, m) for m in v.is_dns1123_subdomain(cls)]
    return out


def validate_ingress_status(status: dict[str, Any]) -> list[Cause]:
    """ValidateIngressLoadBalancerStatus (1.32): IPs parse, hostnames are DNS names and not IPs."""
    out: list[Cause] = []
    for i, ing in enumerate(dicts(lst(status, "loadBalancer", "ingress"))):
        path = f"status.loadBalancer.ingress[{i}]"
        ip = _str(ing.get("ip"))
        if ip and not parses_as_ip(ip):
            out.append(v.invalid(f"{path}.ip", ip, "must be a valid IP address"))
        hostname = _str(ing.get("hostname"))
        if hostname:
            out += [v.invalid(f"{path}.hostname", hostname, m) for m in v.is_dns1123_subdomain(hostname)]
            if parses_as_ip(hostname):
                out.append(v.invalid(f"{path}.hostname", hostname, "must be a DNS name, not an IP address"))
    return out


def validate_ingress(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if spec is not None and not isinstance(spec, dict):
        return out + [v.type_invalid("spec", spec, "object")]
    out += validate_ingress_spec(spec or {}, old)
    if old is None:
        # ValidateIngressCreate only: stored Ingresses that predate the rule stay updatable.
        annotations = d(obj, "metadata", "annotations")
        cls = (spec or {}).get("ingressClassName")
        if ANNOTATION_INGRESS_CLASS in annotations and isinstance(cls, str) \
                and annotations[ANNOTATION_INGRESS_CLASS] != cls:
            out.append(v.invalid(f"annotations.{ANNOTATION_INGRESS_CLASS}", annotations[ANNOTATION_INGRESS_CLASS],
                                 "must match `ingressClassName` when both are specified"))
    # On create the status was dropped and on a main-resource update it is the stored
    # one, so this judges what a /status write brings (ValidateIngressStatusUpdate).
    out += validate_ingress_status(d(obj, "status"))
    return out


def ingress_hosts(o: dict[str, Any]) -> str:
    """printers.go formatHosts: up to three hosts, `*` when no rule names one."""
    rules = dicts(lst(o, "spec", "rules"))
    shown: list[str] = []
    more = False
    for rule in rules:
        if len(shown) == 3:
            more = True
        host = _str(rule.get("host"))
        if not more and host:
            shown.append(host)
    if not shown:
        return "*"
    out = ",".join(shown)
    return f"{out} + {len(rules) - 3} more..." if more else out


def ingress_address(o: dict[str, Any]) -> str:
    """ingressLoadBalancerStatusStringer (wide, as the server prints tables): sorted unique IPs/hostnames."""
    seen = set()
    for ing in dicts(lst(o, "status", "loadBalancer", "ingress")):
        val = _str(ing.get("ip")) or _str(ing.get("hostname"))
        if val:
            seen.add(val)
    return ",".join(sorted(seen))


def ingress_ports(o: dict[str, Any]) -> str:
    return "80, 443" if lst(o, "spec", "tls") else "80"


def ingress_class_name(o: dict[str, Any]) -> str:
    cls = d(o, "spec").get("ingressClassName")
    return cls if isinstance(cls, str) else NONE


# ---------------------------------------------------------------------------
# IngressClass.
# ---------------------------------------------------------------------------


def default_ingress_class(obj: dict[str, Any]) -> None:
    """SetDefaults_IngressClass: parameters without a scope refer to a cluster-scoped resource."""
    params = d(obj, "spec").get("parameters")
    if isinstance(params, dict) and params.get("scope") is None:
        params["scope"] = "Cluster"


def _parameters_errors(params: Any) -> list[Cause]:
    """validateIngressClassParametersReference."""
    if not isinstance(params, dict):
        return []
    path = "spec.parameters"
    out: list[Cause] = []
    group = params.get("apiGroup")
    if isinstance(group, str):
        out += [v.invalid(f"{path}.apiGroup", group, m) for m in v.is_dns1123_subdomain(group)]
    for f in ("kind", "name"):
        val = _str(params.get(f))
        if not val:
            out.append(v.required(f"{path}.{f}"))
        else:
            out += [v.invalid(f"{path}.{f}", val, m) for m in is_path_segment_name(val)]
    scope = params.get("scope")
    if scope is None:
        return out + [v.required(f"{path}.scope")]
    namespace = params.get("namespace")
    if scope not in PARAMETER_SCOPES:
        out.append(v.not_supported(f"{path}.scope", scope, PARAMETER_SCOPES))
    elif scope == "Namespace":
        if namespace is None:
            out.append(v.required(f"{path}.namespace", "`parameters.scope` is set to 'Namespace'"))
        else:
            out += [v.invalid(f"{path}.namespace", namespace, m) for m in v.is_dns1123_label(_str(namespace))]
    elif namespace is not None:
        out.append(v.forbidden(f"{path}.namespace", "`parameters.scope` is set to 'Cluster'"))
    return out


def validate_ingress_class(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec = d(obj, "spec")
    controller = _str(spec.get("controller"))
    if old is not None:
        out += v.immutable(spec.get("controller"), d(old, "spec").get("controller"), "spec.controller")
    if not controller:
        out.append(v.required("spec.controller"))
    else:
        if len(controller) > MAX_CONTROLLER_LEN:
            out.append(v.too_long("spec.controller", MAX_CONTROLLER_LEN))
        out += domain_prefixed_path_errors("spec.controller", controller)
    return out + _parameters_errors(spec.get("parameters"))


def ingress_class_parameters(o: dict[str, Any]) -> str:
    """printIngressClass's PARAMETERS: `Kind[.apiGroup]/name`."""
    params = d(o, "spec", "parameters")
    if not params:
        return NONE
    out = _str(params.get("kind"))
    if isinstance(params.get("apiGroup"), str):
        out += "." + params["apiGroup"]
    return out + "/" + _str(params.get("name"))


INGRESS = KindInfo(
    zero_status={"loadBalancer": {}},
    group=GROUP, version="v1", kind="Ingress", plural="ingresses", singular="ingress",
    short_names=("ing",), subresources=("status",),
    columns=(
        col("Class", ingress_class_name,
            description="The name of the IngressClass resource that should be used for additional configuration"),
        col("Hosts", ingress_hosts,
            description="Hosts that incoming requests are matched against before the ingress rule"),
        col("Address", ingress_address,
            description="Address is a list containing ingress points for the load-balancer"),
        col("Ports", ingress_ports, description="Ports of TLS configurations that open"),
    ),
    validate=validate_ingress,
)

INGRESS_CLASS = KindInfo(
    group=GROUP, version="v1", kind="IngressClass", plural="ingressclasses", singular="ingressclass",
    namespaced=False,
    columns=(
        col("Controller", lambda o: _str(d(o, "spec").get("controller")),
            description="Controller that is responsible for handling this class"),
        col("Parameters", ingress_class_parameters,
            description="A reference to a resource with additional parameters"),
    ),
    default=default_ingress_class, validate=validate_ingress_class,
)

KINDS = (INGRESS, INGRESS_CLASS)
