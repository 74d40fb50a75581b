"""`apiregistration.k8s.io/v1` APIService: which server answers each group-version.

In Kubernetes the aggregator in front of kube-apiserver keeps one APIService per
group-version: "Local" ones (no `spec.service`) for everything kube-apiserver
serves itself, created by its autoregister controller, and service-backed ones
that register an aggregated API server (metrics-server's `v1beta1.metrics.k8s.io`).
Fleet stores and serves the kind with kube-aggregator's validation, defaults and
table, and keeps a Local APIService for every group-version it serves
(fleet/server/apiservices.py, reconciled at start).

**Availability.**  kube-aggregator's availability controller sets the `Available`
condition.  Fleet decides it from the spec alone, as a strategy on every write
(create, update and `/status`), so it is never stale and cannot be written to
anything else:

* Local → `Available=True`, reason `Local`, kube's message;
* service-backed → `Available=False`, reason `ServiceNotProxied`: Fleet does not
  proxy requests to aggregated API servers (a Fleet limitation, said in the
  message, rather than one of kube's reasons — none of them is true here).
"""

from __future__ import annotations

from typing import Any

from fleet.api import meta
from fleet.api import validation as v
from fleet.api.conditions import find, set_status_condition
from fleet.api.kinds._common import col, d, ensure_dict, set_default
from fleet.api.kinds.core import is_dns1035_label
from fleet.api.kinds.ingress import is_path_segment_name
from fleet.api.registry import AGE_COLUMN, NAME_COLUMN, KindInfo

Cause = dict[str, str]

GROUP = "apiregistration.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
AVAILABLE = "Available"
LOCAL_REASON = "Local"
LOCAL_MESSAGE = "Local APIServices are always available"
NOT_PROXIED_REASON = "ServiceNotProxied"


def default_api_service(obj: dict[str, Any]) -> None:
    """SetDefaults_ServiceReference: a service reference's port is 443."""
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("service"), dict):
        set_default(spec["service"], "port", 443)


def availability(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(status, reason, message) of the Available condition `obj`'s spec amounts to."""
    svc = d(obj, "spec").get("service")
    if not isinstance(svc, dict):
        return "True", LOCAL_REASON, LOCAL_MESSAGE
    spec = d(obj, "spec")
    gv = f"{spec.get('group') or ''}/{spec.get('version') or ''}".lstrip("/")
    return ("False", NOT_PROXIED_REASON,
            f"service/{svc.get('name')} in \"{svc.get('namespace')}\" is registered, but this API "
            f"server does not proxy requests to aggregated API servers: {gv} is not served")


def set_availability(obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    """The strategy: status.conditions[Available] from the spec (transition time kept while
    the status stays the same)."""
    status, reason, message = availability(obj)
    st = ensure_dict(obj, "status")
    if st is None:
        obj["status"] = st = {}
    conditions = st.get("conditions")
    current = find(conditions, AVAILABLE)
    if current is None and old is not None:
        # A write that dropped the conditions keeps the stored transition time.
        current = find(d(old, "status").get("conditions"), AVAILABLE)
        if current is not None:
            conditions = [*(conditions if isinstance(conditions, list) else []), dict(current)]
    st["conditions"] = set_status_condition(conditions, AVAILABLE, status, reason, message,
                                            meta.now_rfc3339())


def validate_api_service(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """kube-aggregator's ValidateAPIService (and its Update and Status forms)."""
    spec = d(obj, "spec")
    group, version = spec.get("group") or "", spec.get("version") or ""
    required_name = f"{version}.{group}"

    def name_ok(name: str) -> list[str]:
        problems = is_path_segment_name(name)
        if problems:
            return problems
        return [] if name == required_name else \
            [f'must be `spec.version+"."+spec.group`: "{required_name}"']

    out = v.validate_object_meta(obj.get("metadata"), namespaced=False, name_validator=name_ok)
    if not isinstance(obj.get("spec"), dict):
        out.append(v.required("spec") if obj.get("spec") is None else v.type_invalid("spec", obj["spec"], "object"))
        return out
    if not isinstance(group, str) or not isinstance(version, str):
        out.append(v.invalid("spec.group" if not isinstance(group, str) else "spec.version",
                             group if not isinstance(group, str) else version, "must be of type string"))
        return out
    if not group and version != "v1":
        out.append(v.required("spec.group", "only v1 may have an empty group and it better be legacy kube"))
    if group:
        out += [v.invalid("spec.group", group, msg) for msg in v.is_dns1123_subdomain(group)]
    out += [v.invalid("spec.version", version, msg) for msg in is_dns1035_label(version)]
    gpm = v.as_int(spec.get("groupPriorityMinimum")) or 0
    if gpm <= 0 or gpm > 20000:
        out.append(v.invalid("spec.groupPriorityMinimum", gpm, "must be positive and less than 20000"))
    vp = v.as_int(spec.get("versionPriority")) or 0
    if vp <= 0 or vp > 1000:
        out.append(v.invalid("spec.versionPriority", vp, "must be positive and less than 1000"))
    ca = spec.get("caBundle") or ""
    skip = bool(spec.get("insecureSkipTLSVerify"))
    svc = spec.get("service")
    if svc is None:
        if ca:
            out.append(v.invalid("spec.caBundle", f"{len(ca)} bytes", "local APIServices may not have a caBundle"))
        if skip:
            out.append(v.invalid("spec.insecureSkipTLSVerify", skip,
                                 "local APIServices may not have insecureSkipTLSVerify"))
    elif not isinstance(svc, dict):
        out.append(v.type_invalid("spec.service", svc, "object"))
    else:
        if not svc.get("namespace"):
            out.append(v.required("spec.service.namespace"))
        if not svc.get("name"):
            out.append(v.required("spec.service.name"))
        port = svc.get("port")
        errs = v.is_valid_port_num(port)
        if errs:
            out.append(v.invalid("spec.service.port", port, "port is not valid: " + ", ".join(errs)))
        if skip and ca:
            out.append(v.invalid("spec.insecureSkipTLSVerify", skip, "may not be true if caBundle is present"))
    for i, c in enumerate(d(obj, "status").get("conditions") or []):
        if isinstance(c, dict) and c.get("status") not in ("True", "False", "Unknown"):
            out.append(v.not_supported(f"status.conditions[{i}].status", c.get("status"),
                                       ("True", "False", "Unknown")))
    return out


def _service_cell(o: dict[str, Any]) -> str:
    svc = d(o, "spec").get("service")
    if not isinstance(svc, dict):
        return "Local"
    return f"{svc.get('namespace') or ''}/{svc.get('name') or ''}"


def _available_cell(o: dict[str, Any]) -> str:
    """kube-aggregator's table: True, or `False (Reason)`, or Unknown without a condition."""
    c = find(d(o, "status").get("conditions"), AVAILABLE)
    if c is None:
        return "Unknown"
    status = str(c.get("status") or "")
    if status == "True" or not c.get("reason"):
        return status
    return f"{status} ({c['reason']})"


API_SERVICE = KindInfo(
    group=GROUP, version=VERSION, kind="APIService", plural="apiservices", singular="apiservice",
    namespaced=False, subresources=("status",),
    columns_override=(
        NAME_COLUMN,
        col("Service", _service_cell, description="The reference to the service that hosts this API endpoint."),
        col("Available", _available_cell, description="Whether this service is available."),
        AGE_COLUMN,
    ),
    default=default_api_service, validate=validate_api_service,
    prepare_create=lambda obj, _user: set_availability(obj), prepare_update=set_availability,
    prepare_status_update=set_availability,
)

KINDS = (API_SERVICE,)

__all__ = ["API_SERVICE", "API_VERSION", "AVAILABLE", "GROUP", "KINDS", "LOCAL_MESSAGE", "LOCAL_REASON",
           "NOT_PROXIED_REASON", "availability", "set_availability", "validate_api_service"]
