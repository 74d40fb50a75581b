"""`gateway.networking.k8s.io/v1` GatewayClass, Gateway and HTTPRoute, served as built-in kinds.

Upstream these are CRDs (sigs.k8s.io/gateway-api v1.2, standard channel);
Fleet serves them natively, with nothing to install, so everything a CRD
would declare is declared here instead:

- identity: GatewayClass is cluster-scoped (short name `gc`), Gateway
  (`gtw`) and HTTPRoute are namespaced; all three in the `gateway-api`
  category with a `status` subresource;
- tables: the CRDs' additionalPrinterColumns, with the CRD table converter's
  semantics (a JSONPath's first result; a list printed as JSON; an absent
  value as an empty cell);
- defaulting: the CRDs' OpenAPI `default`s, including the `status` default
  whose conditions say "Waiting for controller" until one takes over;
- validation: fleet/api/kinds/gateway_validation.py (the schemas' constraints
  and CEL rules);
- no strategic merge patch, as for any custom resource (merge and JSON patch work).

The field schema (strict decoding, `/openapi/v3`, `kubectl explain`) is in
k8s_schema.json, from packaging/gateway_api_types.py.  Filling status and
routing traffic is the Gateway controller's job, not this module's.
"""

from __future__ import annotations

import json
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds import gateway_validation as gv
from fleet.api.kinds._common import d, dicts, ensure_dict, lst, set_default
from fleet.api.registry import AGE_COLUMN, NAME_COLUMN, Column, KindInfo

Cause = dict[str, str]

GROUP = gv.GROUP
VERSION = "v1"
CATEGORY = "gateway-api"
#: lastTransitionTime of the CRDs' placeholder conditions (the Unix epoch).
EPOCH = "1970-01-01T00:00:00Z"


def pending_condition(type_: str) -> dict[str, str]:
    """The condition the CRDs default into status before any controller has looked."""
    return {"type": type_, "status": "Unknown", "reason": "Pending", "message": "Waiting for controller",
            "lastTransitionTime": EPOCH}


# ---- tables --------------------------------------------------------------------------------


def _condition_status(obj: dict[str, Any], type_: str) -> str | None:
    """`.status.conditions[?(@.type=="T")].status` (first match), None when absent."""
    for c in dicts(lst(obj, "status", "conditions")):
        if c.get("type") == type_ and c.get("status") is not None:
            return str(c["status"])
    return None


def _first_address(obj: dict[str, Any]) -> str | None:
    """`.status.addresses[*].value`: the CRD table converter shows the first result only."""
    for a in dicts(lst(obj, "status", "addresses")):
        if a.get("value") is not None:
            return str(a["value"])
    return None


def _hostnames(obj: dict[str, Any]) -> str | None:
    """`.spec.hostnames`: a list cell is printed as JSON, as kubectl's JSONPath printer does."""
    hosts = d(obj, "spec").get("hostnames")
    if not isinstance(hosts, list) or not hosts:
        return None
    return json.dumps(hosts, separators=(",", ":"))


def _spec_str(field: str) -> Any:
    def value(obj: dict[str, Any]) -> str | None:
        x = d(obj, "spec").get(field)
        return None if x is None else str(x)
    return value


def _crd_col(name: str, fn: Any, jsonpath: str, priority: int = 0) -> Column:
    # kube-apiserver's description for a CRD column without one of its own.
    return Column(name, fn, priority=priority,
                  description=f"Custom resource definition column (in JSONPath format): {jsonpath}")


GATEWAY_CLASS_COLUMNS = (
    NAME_COLUMN,
    _crd_col("Controller", _spec_str("controllerName"), ".spec.controllerName"),
    _crd_col("Accepted", lambda o: _condition_status(o, "Accepted"),
             '.status.conditions[?(@.type=="Accepted")].status'),
    AGE_COLUMN,
    _crd_col("Description", _spec_str("description"), ".spec.description", priority=1),
)
GATEWAY_COLUMNS = (
    NAME_COLUMN,
    _crd_col("Class", _spec_str("gatewayClassName"), ".spec.gatewayClassName"),
    _crd_col("Address", _first_address, ".status.addresses[*].value"),
    _crd_col("Programmed", lambda o: _condition_status(o, "Programmed"),
             '.status.conditions[?(@.type=="Programmed")].status'),
    AGE_COLUMN,
)
HTTPROUTE_COLUMNS = (NAME_COLUMN, _crd_col("Hostnames", _hostnames, ".spec.hostnames"), AGE_COLUMN)


# ---- defaulting (the CRDs' OpenAPI defaults) -------------------------------------------------


def _default_status(obj: dict[str, Any], *types: str) -> None:
    # A structural default on `status`: applied whenever the object has none.
    if obj.get("status") is None:
        obj["status"] = {"conditions": [pending_condition(t) for t in types]}


def default_parent_ref(ref: dict[str, Any]) -> None:
    set_default(ref, "group", GROUP)
    set_default(ref, "kind", "Gateway")


def _default_backend_object_ref(ref: dict[str, Any]) -> None:
    set_default(ref, "group", "")
    set_default(ref, "kind", "Service")


def _default_filters(filters: list[Any]) -> None:
    for f in dicts(filters):
        redirect = f.get("requestRedirect")
        if isinstance(redirect, dict):
            set_default(redirect, "statusCode", 302)
        mirror = f.get("requestMirror")
        if isinstance(mirror, dict) and isinstance(mirror.get("backendRef"), dict):
            _default_backend_object_ref(mirror["backendRef"])


def _default_match(m: dict[str, Any]) -> None:
    path = ensure_dict(m, "path")
    if path is not None:
        set_default(path, "type", "PathPrefix")
        set_default(path, "value", "/")
    for key in ("headers", "queryParams"):
        for h in dicts(lst(m, key)):
            set_default(h, "type", "Exact")


def default_httproute(obj: dict[str, Any]) -> None:
    spec = ensure_dict(obj, "spec")
    if spec is None:
        return
    for ref in dicts(lst(spec, "parentRefs")):
        default_parent_ref(ref)
    set_default(spec, "rules", [{}])
    for r in dicts(lst(spec, "rules")):
        set_default(r, "matches", [{}])
        for m in dicts(lst(r, "matches")):
            _default_match(m)
        _default_filters(lst(r, "filters"))
        for b in dicts(lst(r, "backendRefs")):
            _default_backend_object_ref(b)
            set_default(b, "weight", 1)
            _default_filters(lst(b, "filters"))
    for parent in dicts(lst(obj, "status", "parents")):
        if isinstance(parent.get("parentRef"), dict):
            default_parent_ref(parent["parentRef"])


def default_gateway(obj: dict[str, Any]) -> None:
    spec = ensure_dict(obj, "spec")
    if spec is not None:
        for lis in dicts(lst(spec, "listeners")):
            allowed = ensure_dict(lis, "allowedRoutes")
            if allowed is not None:
                namespaces = ensure_dict(allowed, "namespaces")
                if namespaces is not None:
                    set_default(namespaces, "from", "Same")
                for k in dicts(lst(allowed, "kinds")):
                    set_default(k, "group", GROUP)
            tls = lis.get("tls")
            if isinstance(tls, dict):
                set_default(tls, "mode", "Terminate")
                for ref in dicts(lst(tls, "certificateRefs")):
                    set_default(ref, "group", "")
                    set_default(ref, "kind", "Secret")
        for a in dicts(lst(spec, "addresses")):
            set_default(a, "type", "IPAddress")
    _default_status(obj, "Accepted", "Programmed")


def default_gatewayclass(obj: dict[str, Any]) -> None:
    _default_status(obj, "Accepted")


# ---- validation ----------------------------------------------------------------------------


def _spec_and_status(obj: dict[str, Any], out: list[Cause]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    spec = obj.get("spec")
    if spec is None:
        out.append(v.required("spec"))
    elif not isinstance(spec, dict):
        out.append(v.type_invalid("spec", spec, "object"))
        spec = None
    status = obj.get("status")
    return spec, status if isinstance(status, dict) else {}


def validate_gatewayclass(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec, status = _spec_and_status(obj, out)
    if spec is not None:
        old_spec = d(old, "spec") if old is not None else None
        out += gv.validate_gatewayclass_spec(spec, old_spec)
    return out + gv.validate_gatewayclass_status(status)


def validate_gateway(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec, status = _spec_and_status(obj, out)
    if spec is not None:
        out += gv.validate_gateway_spec(spec)
    return out + gv.validate_gateway_status(status)


def validate_httproute(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec, status = _spec_and_status(obj, out)
    if spec is not None:
        out += gv.validate_httproute_spec(spec)
    return out + gv.validate_route_status(status)


# ---- kinds ---------------------------------------------------------------------------------

_CRD_LIKE: dict[str, Any] = {
    "group": GROUP, "version": VERSION, "categories": (CATEGORY,), "subresources": ("status",),
    # Custom resources upstream: no strategic merge patch (415), generic merge for the rest.
    "strategic_merge": False, "patch_schema": {},
}

GATEWAY_CLASS = KindInfo(
    kind="GatewayClass", plural="gatewayclasses", singular="gatewayclass", namespaced=False,
    short_names=("gc",), columns_override=GATEWAY_CLASS_COLUMNS,
    default=default_gatewayclass, validate=validate_gatewayclass, **_CRD_LIKE,
)
GATEWAY = KindInfo(
    kind="Gateway", plural="gateways", singular="gateway", short_names=("gtw",),
    columns_override=GATEWAY_COLUMNS, default=default_gateway, validate=validate_gateway, **_CRD_LIKE,
)
HTTPROUTE = KindInfo(
    kind="HTTPRoute", plural="httproutes", singular="httproute", columns_override=HTTPROUTE_COLUMNS,
    default=default_httproute, validate=validate_httproute, **_CRD_LIKE,
)

KINDS = (GATEWAY_CLASS, GATEWAY, HTTPROUTE)
