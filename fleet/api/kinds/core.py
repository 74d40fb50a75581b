"""The core (`v1`) kinds: Namespace, Pod, Node, Service, Endpoints, ConfigMap,
Secret, ServiceAccount.  (v1 Event lives in `events.py` beside its
events.k8s.io twin.)

Each kind is a `KindInfo` with kube-apiserver's identity, defaults,
validation and kubectl's table columns.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds import pods
from fleet.api.kinds._common import (
    NONE,
    col,
    d,
    dicts,
    ensure_dict,
    format_labels,
    lst,
    num,
    set_default,
    table,
)
from fleet.api.registry import AGE_COLUMN, NAME_COLUMN, KindInfo

Cause = dict[str, str]

# ---------------------------------------------------------------------------
# Namespace
# ---------------------------------------------------------------------------


def default_namespace(obj: dict[str, Any]) -> None:
    spec = ensure_dict(obj, "spec")
    if spec is not None and spec.get("finalizers") is None:
        spec["finalizers"] = ["kubernetes"]
    status = ensure_dict(obj, "status")
    if status is not None:
        set_default(status, "phase", "Active")
    md = obj.get("metadata")
    # Kubernetes labels every namespace with its own name so that namespace
    # selectors (NetworkPolicy, webhooks) can pick one by name.
    if isinstance(md, dict) and isinstance(md.get("name"), str) and md["name"]:
        labels = md.setdefault("labels", {})
        if isinstance(labels, dict):
            labels["kubernetes.io/metadata.name"] = md["name"]


def validate_namespace(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False,
                                 name_validator=v.is_dns1123_label)
    for i, f in enumerate(lst(obj, "spec", "finalizers")):
        fp = f"spec.finalizers[{i}]"
        if not isinstance(f, str):
            out.append(v.type_invalid(fp, f, "string"))
            continue
        for msg in v.is_qualified_name(f):
            out.append(v.invalid(fp, f, msg))
    phase = d(obj, "status").get("phase")
    if phase is not None and phase not in ("Active", "Terminating"):
        out.append(v.not_supported("status.phase", phase, ("Active", "Terminating")))
    return out


NAMESPACE = KindInfo(
    group="", version="v1", kind="Namespace", plural="namespaces", singular="namespace",
    namespaced=False, short_names=("ns",), subresources=("status", "finalize"),
    # kube-apiserver's namespace storage has no DeleteCollection: `DELETE /api/v1/namespaces`
    # is a 405, never "delete every namespace" (found by tests/e2e/test_fuzz_openapi.py).
    verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    columns=(col("Status", lambda o: d(o, "status").get("phase", ""),
                 description="The status of the namespace"),),
    default=default_namespace, validate=validate_namespace,
    selectable_fields=("status.phase",),
)

# ---------------------------------------------------------------------------
# Pod
# ---------------------------------------------------------------------------

POD = KindInfo(
    group="", version="v1", kind="Pod", plural="pods", singular="pod",
    short_names=("po",), categories=("all",),
    subresources=("status", "binding", "log", "exec", "attach", "portforward", "eviction", "signal"),
    columns_override=table(*pods.POD_COLUMNS, wide=pods.POD_WIDE_COLUMNS),
    default=pods.default_pod, validate=pods.validate_pod, delete_grace=pods.pod_delete_grace,
    selectable_fields=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                       "spec.serviceAccountName", "status.phase", "status.podIP",
                       "status.nominatedNodeName"),
)

# ---------------------------------------------------------------------------
# Node
# ---------------------------------------------------------------------------


def _node_status(o: dict[str, Any]) -> str:
    parts = []
    for c in dicts(lst(o, "status", "conditions")):
        if c.get("type") == "Ready":
            parts = ["Ready" if c.get("status") == "True" else "NotReady"]
    if not parts:
        parts = ["Unknown"]
    if d(o, "spec").get("unschedulable") is True:
        parts.append("SchedulingDisabled")
    return ",".join(parts)


def _node_roles(o: dict[str, Any]) -> str:
    roles = set()
    for k, val in d(o, "metadata", "labels").items():
        if k.startswith("node-role.kubernetes.io/") and k[len("node-role.kubernetes.io/"):]:
            roles.add(k[len("node-role.kubernetes.io/"):])
        elif k == "kubernetes.io/role" and val:
            roles.add(val)
    return ",".join(sorted(roles)) or NONE


def _node_address(kind: str):
    def value(o: dict[str, Any]) -> str:
        for a in dicts(lst(o, "status", "addresses")):
            if a.get("type") == kind:
                return str(a.get("address", ""))
        return NONE
    return value


def _node_info(key: str):
    return lambda o: d(o, "status", "nodeInfo").get(key) or "<unknown>"


def validate_taints(taints: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    if taints is None:
        return out
    if not isinstance(taints, list):
        return [v.type_invalid(path, taints, "array")]
    seen: set[tuple[str, str]] = set()
    for i, t in enumerate(taints):
        tp = f"{path}[{i}]"
        if not isinstance(t, dict):
            out.append(v.type_invalid(tp, t, "object"))
            continue
        key = t.get("key")
        if not key:
            out.append(v.required(f"{tp}.key"))
        else:
            for msg in v.is_qualified_name(str(key)):
                out.append(v.invalid(f"{tp}.key", key, msg))
        val = t.get("value")
        if val:
            for msg in v.is_valid_label_value(str(val)):
                out.append(v.invalid(f"{tp}.value", val, msg))
        eff = t.get("effect")
        if not eff:
            out.append(v.required(f"{tp}.effect"))
        elif eff not in v.TAINT_EFFECTS:
            out.append(v.not_supported(f"{tp}.effect", eff, v.TAINT_EFFECTS))
        pair = (str(key), str(eff))
        if key and eff and pair in seen:
            out.append(v.duplicate(tp, {"key": key, "effect": eff}))
        seen.add(pair)
    return out


def validate_node(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec = d(obj, "spec")
    out += validate_taints(spec.get("taints"), "spec.taints")
    unsched = spec.get("unschedulable")
    if unsched is not None and not isinstance(unsched, bool):
        out.append(v.type_invalid("spec.unschedulable", unsched, "boolean"))
    cidrs = list(lst(spec, "podCIDRs"))
    for i, c in enumerate(cidrs):
        try:
            ipaddress.ip_network(str(c), strict=False)
        except ValueError:
            out.append(v.invalid(f"spec.podCIDRs[{i}]", c, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
    if old is not None:
        old_cidr = d(old, "spec").get("podCIDR")
        if old_cidr and spec.get("podCIDR") != old_cidr:
            out.append(v.forbidden("spec.podCIDR", "node updates may not change podCIDR except from \"\" to valid"))
    return out


NODE = KindInfo(
    # NodeStatus's nested structs: DaemonEndpoint.Port and every NodeSystemInfo field lack omitempty.
    zero_status={"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                 "nodeInfo": {k: "" for k in ("machineID", "systemUUID", "bootID", "kernelVersion", "osImage",
                                              "containerRuntimeVersion", "kubeletVersion", "kubeProxyVersion",
                                              "operatingSystem", "architecture")}},
    group="", version="v1", kind="Node", plural="nodes", singular="node",
    status_on_create=True,
    namespaced=False, short_names=("no",),
    # drain and schedulable are Fleet's node maintenance subresources (fleet/server/drain.py).
    subresources=("status", "drain", "schedulable"),
    # kubectl prints VERSION after AGE, so this table is spelled out.
    columns_override=(
        NAME_COLUMN,
        col("Status", _node_status, description="The status of the node"),
        col("Roles", _node_roles, description="The roles of the node"),
        AGE_COLUMN,
        col("Version", lambda o: d(o, "status", "nodeInfo").get("kubeletVersion", ""),
            description="Kubelet Version reported by the node."),
        col("Internal-IP", _node_address("InternalIP"), priority=1, description="List of addresses reachable to the node."),
        col("External-IP", _node_address("ExternalIP"), priority=1, description="List of addresses reachable to the node."),
        col("OS-Image", _node_info("osImage"), priority=1, description="OS Image reported by the node."),
        col("Kernel-Version", _node_info("kernelVersion"), priority=1, description="Kernel Version reported by the node."),
        col("Container-Runtime", _node_info("containerRuntimeVersion"), priority=1,
            description="ContainerRuntime Version reported by the node."),
    ),
    validate=validate_node,
    selectable_fields=("spec.unschedulable",),
)

# ---------------------------------------------------------------------------
# Service
# ---------------------------------------------------------------------------

SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")

DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_RE = re.compile(DNS1035_LABEL_FMT)
DNS1035_LABEL_ERR = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
    f"regex used for validation is '{DNS1035_LABEL_FMT}')"
)


def is_dns1035_label(value: str) -> list[str]:
    """Service names must be DNS-1035 labels: they become DNS names and env var prefixes."""
    errs = []
    if len(value) > 63:
        errs.append(v.max_len_error(63))
    if not _DNS1035_RE.fullmatch(value):
        errs.append(DNS1035_LABEL_ERR)
    return errs


def default_service(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    set_default(spec, "type", "ClusterIP")
    set_default(spec, "sessionAffinity", "None")
    stype = spec.get("type")
    if spec.get("sessionAffinity") == "ClientIP":
        cfg = spec.setdefault("sessionAffinityConfig", {})
        if isinstance(cfg, dict):
            cip = cfg.setdefault("clientIP", {})
            if isinstance(cip, dict):
                set_default(cip, "timeoutSeconds", 10800)
    for p in dicts(lst(spec, "ports")):
        set_default(p, "protocol", "TCP")
        if p.get("targetPort") in (None, 0, "") and p.get("port") is not None:
            p["targetPort"] = p["port"]
    if stype != "ExternalName":
        set_default(spec, "internalTrafficPolicy", "Cluster")
        set_default(spec, "ipFamilyPolicy", "SingleStack")
    if stype in ("NodePort", "LoadBalancer"):
        set_default(spec, "externalTrafficPolicy", "Cluster")
    if stype == "LoadBalancer":
        set_default(spec, "allocateLoadBalancerNodePorts", True)


def _valid_ip(s: Any) -> bool:
    try:
        ipaddress.ip_address(str(s))
    except ValueError:
        return False
    return True


def validate_service(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True, name_validator=is_dns1035_label)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out + [v.required("spec") if spec is None else v.type_invalid("spec", spec, "object")]
    stype = spec.get("type", "ClusterIP")
    if stype not in SERVICE_TYPES:
        out.append(v.not_supported("spec.type", stype, SERVICE_TYPES))
    cluster_ip = spec.get("clusterIP") or ""
    headless = cluster_ip == "None"
    ports = spec.get("ports")
    if ports is not None and not isinstance(ports, list):
        out.append(v.type_invalid("spec.ports", ports, "array"))
        ports = []
    ports = ports or []
    if not ports and stype != "ExternalName" and not headless:
        out.append(v.required("spec.ports"))
    names: set[str] = set()
    pairs: set[tuple[Any, Any]] = set()
    node_ports: set[tuple[Any, Any]] = set()
    for i, p in enumerate(ports):
        pp = f"spec.ports[{i}]"
        if not isinstance(p, dict):
            out.append(v.type_invalid(pp, p, "object"))
            continue
        name = p.get("name")
        if len(ports) > 1 and not name:
            out.append(v.required(f"{pp}.name"))
        elif name:
            for msg in v.is_dns1123_label(str(name)):
                out.append(v.invalid(f"{pp}.name", name, msg))
            if name in names:
                out.append(v.duplicate(f"{pp}.name", name))
            names.add(name)
        port = p.get("port")
        for msg in v.is_valid_port_num(port):
            out.append(v.invalid(f"{pp}.port", port, msg))
        proto = p.get("protocol") or "TCP"
        if proto not in v.PROTOCOLS:
            out.append(v.not_supported(f"{pp}.protocol", proto, v.PROTOCOLS))
        tp = p.get("targetPort")
        if tp is not None:
            if isinstance(tp, str):
                for msg in v.is_valid_port_name(tp):
                    out.append(v.invalid(f"{pp}.targetPort", tp, msg))
            else:
                for msg in v.is_valid_port_num(tp):
                    out.append(v.invalid(f"{pp}.targetPort", tp, msg))
        np = p.get("nodePort")
        if np not in (None, 0):
            if stype in ("ClusterIP", "ExternalName"):
                out.append(v.forbidden(f"{pp}.nodePort", f"may not be used when `type` is '{stype}'"))
            elif v.as_int(np) is None or not 0 < np <= 65535:
                # The configured range (--service-node-port-range) is the allocator's
                # to check (fleet/server/svcalloc.py), as in kube-apiserver.
                for msg in v.is_valid_port_num(np):
                    out.append(v.invalid(f"{pp}.nodePort", np, msg))
        if np not in (None, 0):
            if (np, proto) in node_ports:
                out.append(v.duplicate(f"{pp}.nodePort", np))
            node_ports.add((np, proto))
        key = (port, proto)
        if key in pairs:
            out.append(v.duplicate(pp, {"port": port, "protocol": proto}))
        pairs.add(key)
    if stype == "ExternalName":
        ext = spec.get("externalName")
        if not ext:
            out.append(v.required("spec.externalName"))
        else:
            name = str(ext).rstrip(".")
            errs = v.is_dns1123_subdomain(name)
            if not errs and "." not in name:
                errs = ["should be a domain with at least two segments separated by dots"]
            for msg in errs:
                out.append(v.invalid("spec.externalName", ext, msg))
    if stype == "ExternalName" and (cluster_ip or lst(spec, "clusterIPs")):
        out.append(v.forbidden("spec.clusterIPs", "may not be set for ExternalName services"))
    hc = spec.get("healthCheckNodePort")
    if hc not in (None, 0) and not (stype == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"):
        out.append(v.invalid("spec.healthCheckNodePort", hc, "may only be set when `type` is 'LoadBalancer' "
                                                            "and `externalTrafficPolicy` is 'Local'"))
    if cluster_ip and not headless and not _valid_ip(cluster_ip):
        out.append(v.invalid("spec.clusterIP", cluster_ip,
                             "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"))
    sa = spec.get("sessionAffinity")
    if sa is not None and sa not in ("ClientIP", "None"):
        out.append(v.not_supported("spec.sessionAffinity", sa, ("ClientIP", "None")))
    out += v.validate_labels(spec.get("selector"), "spec.selector")
    for i, ip in enumerate(lst(spec, "externalIPs")):
        if not _valid_ip(ip):
            out.append(v.invalid(f"spec.externalIPs[{i}]", ip, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"))
    if old is not None:
        old_ip = d(old, "spec").get("clusterIP")
        # An empty clusterIP on update means "keep what was allocated" (the
        # server carries it over); only a different non-empty value is a change.
        if old_ip and cluster_ip and cluster_ip != old_ip and stype != "ExternalName":
            out.append(v.invalid("spec.clusterIP", cluster_ip, "field is immutable"))
    return out


def _needs_node_port(spec: dict[str, Any]) -> bool:
    return spec.get("type") in ("NodePort", "LoadBalancer")


def _needs_health_check_port(spec: dict[str, Any]) -> bool:
    return spec.get("type") == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"


def prepare_service_update(new: dict[str, Any], old: dict[str, Any]) -> None:
    """kube's service strategy on update: `patchAllocatedValues` then `dropTypeDependentFields`.

    Values the server allocated (ClusterIP, NodePorts by port name, the
    healthCheckNodePort) are kept when the update leaves them out and the type still
    has them, so `kubectl apply` of a manifest without them changes nothing; on a
    type change, the fields of the old type the client did not touch go (NodePort →
    ClusterIP drops the nodePorts, → ExternalName drops the ClusterIP), so the
    allocator releases them."""
    nspec, ospec = new.get("spec"), old.get("spec")
    if not isinstance(nspec, dict) or not isinstance(ospec, dict):
        return
    if ospec.get("type", "ClusterIP") != "ExternalName" and nspec.get("type", "ClusterIP") != "ExternalName":
        if not nspec.get("clusterIP") and ospec.get("clusterIP"):
            nspec["clusterIP"] = ospec["clusterIP"]
        if not nspec.get("clusterIPs") and ospec.get("clusterIPs"):
            nspec["clusterIPs"] = list(ospec["clusterIPs"])
    if _needs_node_port(ospec) and _needs_node_port(nspec):
        by_name = {p.get("name") or "": p.get("nodePort") for p in dicts(lst(ospec, "ports"))}
        used = {p.get("nodePort") for p in dicts(lst(nspec, "ports")) if p.get("nodePort")}
        for p in dicts(lst(nspec, "ports")):
            if not p.get("nodePort"):
                was = by_name.get(p.get("name") or "")
                if was and was not in used:
                    p["nodePort"] = was
                    used.add(was)
    if _needs_health_check_port(ospec) and _needs_health_check_port(nspec) and \
            not nspec.get("healthCheckNodePort") and ospec.get("healthCheckNodePort"):
        nspec["healthCheckNodePort"] = ospec["healthCheckNodePort"]
    if nspec.get("type", "ClusterIP") == ospec.get("type", "ClusterIP"):
        return
    if nspec.get("type") == "ExternalName":
        for f in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "internalTrafficPolicy"):
            if nspec.get(f) == ospec.get(f):
                nspec.pop(f, None)
    if not _needs_node_port(nspec):
        old_ports = [p.get("nodePort") for p in dicts(lst(ospec, "ports"))]
        new_ports = [p.get("nodePort") for p in dicts(lst(nspec, "ports"))]
        if old_ports == new_ports:
            for p in dicts(lst(nspec, "ports")):
                p.pop("nodePort", None)
    if not _needs_health_check_port(nspec) and nspec.get("healthCheckNodePort") == ospec.get("healthCheckNodePort"):
        nspec.pop("healthCheckNodePort", None)
    if nspec.get("type") != "LoadBalancer":
        for f in ("allocateLoadBalancerNodePorts", "loadBalancerClass"):
            if nspec.get(f) == ospec.get(f):
                nspec.pop(f, None)
    if nspec.get("type") not in ("NodePort", "LoadBalancer") and \
            nspec.get("externalTrafficPolicy") == ospec.get("externalTrafficPolicy"):
        nspec.pop("externalTrafficPolicy", None)


def _service_external_ip(o: dict[str, Any]) -> str:
    spec = d(o, "spec")
    stype = spec.get("type", "ClusterIP")
    external = [str(x) for x in lst(spec, "externalIPs")]
    if stype in ("ClusterIP", "NodePort"):
        return ",".join(external) or NONE
    if stype == "LoadBalancer":
        lb: list[str] = []
        for ing in dicts(lst(o, "status", "loadBalancer", "ingress")):
            val = ing.get("ip") or ing.get("hostname")
            if val and val not in lb:
                lb.append(str(val))
        if external:
            return ",".join(lb + external)
        return ",".join(lb) or "<pending>"
    if stype == "ExternalName":
        return str(spec.get("externalName", ""))
    return "<unknown>"


def service_ports(o: dict[str, Any]) -> str:
    pieces = []
    for p in dicts(lst(o, "spec", "ports")):
        proto = p.get("protocol", "TCP")
        if num(p.get("nodePort")) > 0:
            pieces.append(f"{p.get('port')}:{p['nodePort']}/{proto}")
        else:
            pieces.append(f"{p.get('port')}/{proto}")
    return ",".join(pieces) or NONE


def _cluster_ip(o: dict[str, Any]) -> str:
    spec = d(o, "spec")
    ips = lst(spec, "clusterIPs")
    return str(ips[0]) if ips else (spec.get("clusterIP") or NONE)


SERVICE = KindInfo(
    zero_status={"loadBalancer": {}},
    group="", version="v1", kind="Service", plural="services", singular="service",
    short_names=("svc",), categories=("all",), subresources=("status",),
    columns_override=table(
        col("Type", lambda o: d(o, "spec").get("type", ""), description="type determines how the Service is exposed."),
        col("Cluster-IP", _cluster_ip, description="clusterIP is the IP address of the service."),
        col("External-IP", _service_external_ip, description="externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service."),
        col("Port(s)", service_ports, description="The list of ports that are exposed by this service."),
        wide=(col("Selector", lambda o: format_labels(d(o, "spec").get("selector")), priority=1,
                  description="Route service traffic to pods with label keys and values matching this selector."),),
    ),
    default=default_service, validate=validate_service, prepare_update=prepare_service_update,
)

# ---------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------


def format_endpoints(o: dict[str, Any]) -> str:
    subsets = dicts(lst(o, "subsets"))
    if not subsets:
        return NONE
    shown: list[str] = []
    limit, count, more = 3, 0, False
    for ss in subsets:
        addrs = dicts(lst(ss, "addresses"))
        ports = dicts(lst(ss, "ports"))
        if not ports:
            # Headless services may publish addresses without ports.
            count += len(addrs)
            for a in addrs:
                if len(shown) == limit:
                    more = True
                    break
                shown.append(str(a.get("ip", "")))
            continue
        for p in ports:
            count += len(addrs)
            for a in addrs:
                if len(shown) == limit:
                    more = True
                    break
                ip = str(a.get("ip", ""))
                host = f"[{ip}]" if ":" in ip else ip
                shown.append(f"{host}:{p.get('port')}")
    out = ",".join(shown)
    if more:
        return f"{out} + {count - limit} more..."
    return out


def default_endpoints(obj: dict[str, Any]) -> None:
    for ss in dicts(lst(obj, "subsets")):
        for p in dicts(lst(ss, "ports")):
            set_default(p, "protocol", "TCP")


def validate_endpoints(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    for i, ss in enumerate(lst(obj, "subsets")):
        sp = f"subsets[{i}]"
        if not isinstance(ss, dict):
            out.append(v.type_invalid(sp, ss, "object"))
            continue
        for key in ("addresses", "notReadyAddresses"):
            for j, a in enumerate(lst(ss, key)):
                ap = f"{sp}.{key}[{j}]"
                ip = a.get("ip") if isinstance(a, dict) else None
                if not ip:
                    out.append(v.required(f"{ap}.ip"))
                elif not _valid_ip(ip):
                    out.append(v.invalid(f"{ap}.ip", ip, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"))
        ports = lst(ss, "ports")
        for j, p in enumerate(ports):
            pp = f"{sp}.ports[{j}]"
            if not isinstance(p, dict):
                out.append(v.type_invalid(pp, p, "object"))
                continue
            if len(ports) > 1 and not p.get("name"):
                out.append(v.required(f"{pp}.name"))
            for msg in v.is_valid_port_num(p.get("port")):
                out.append(v.invalid(f"{pp}.port", p.get("port"), msg))
            proto = p.get("protocol") or "TCP"
            if proto not in v.PROTOCOLS:
                out.append(v.not_supported(f"{pp}.protocol", proto, v.PROTOCOLS))
    return out


ENDPOINTS = KindInfo(
    group="", version="v1", kind="Endpoints", plural="endpoints", singular="endpoints",
    short_names=("ep",),
    columns=(col("Endpoints", format_endpoints, description="The set of all endpoints is the union of all subsets."),),
    default=default_endpoints, validate=validate_endpoints,
)

# ---------------------------------------------------------------------------
# ConfigMap and Secret
# ---------------------------------------------------------------------------

MAX_CONFIG_SIZE = 1024 * 1024  # both ConfigMaps and Secrets are capped at 1 MiB


def _decode_b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def _validate_keys(data: Any, path: str, out: list[Cause]) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        out.append(v.type_invalid(path, data, "object"))
        return {}
    for key in data:
        for msg in v.is_config_map_key(key):
            out.append(v.invalid(f"{path}[{key}]", key, msg))
    return data


def _immutable_contents(obj: dict[str, Any], old: dict[str, Any] | None,
                        fields: tuple[str, ...]) -> list[Cause]:
    """Once `immutable: true`, the contents and the flag itself are frozen."""
    if old is None or old.get("immutable") is not True:
        return []
    out = []
    for f in fields:
        if (obj.get(f) or {}) != (old.get(f) or {}):
            out.append(v.forbidden(f, "field is immutable when `immutable` is set"))
    if obj.get("immutable") is not True:
        out.append(v.forbidden("immutable", "field is immutable when `immutable` is set"))
    return out


def validate_config_map(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    data = _validate_keys(obj.get("data"), "data", out)
    binary = _validate_keys(obj.get("binaryData"), "binaryData", out)
    size = 0
    for key, val in data.items():
        if not isinstance(val, str):
            out.append(v.type_invalid(f"data[{key}]", val, "string"))
            continue
        size += len(key) + len(val.encode())
    for key, val in binary.items():
        if key in data:
            out.append(v.invalid(f"binaryData[{key}]", key, "duplicate of key present in data"))
        raw = _decode_b64(val)
        if raw is None:
            out.append(v.invalid(f"binaryData[{key}]", "<binary data omitted>", "must be base64-encoded"))
            continue
        size += len(key) + len(raw)
    if size > MAX_CONFIG_SIZE:
        out.append(v.too_long("data", MAX_CONFIG_SIZE))
    imm = obj.get("immutable")
    if imm is not None and not isinstance(imm, bool):
        out.append(v.type_invalid("immutable", imm, "boolean"))
    out += _immutable_contents(obj, old, ("data", "binaryData"))
    return out


CONFIG_MAP = KindInfo(
    group="", version="v1", kind="ConfigMap", plural="configmaps", singular="configmap",
    short_names=("cm",),
    columns=(col("Data", lambda o: len(d(o, "data")) + len(d(o, "binaryData")),
                 description="Data contains the configuration data."),),
    validate=validate_config_map,
)

SECRET_TYPE_REQUIRED_KEYS = {
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
}


def default_secret(obj: dict[str, Any]) -> None:
    set_default(obj, "type", "Opaque")
    # stringData is a write-only convenience: kube-apiserver folds it into
    # data (base64) and never stores or returns it.
    sd = obj.get("stringData")
    if isinstance(sd, dict) and all(isinstance(x, str) for x in sd.values()):
        data = obj.get("data")
        if data is None:
            data = obj["data"] = {}
        if isinstance(data, dict):
            for k, val in sd.items():
                data[k] = base64.b64encode(val.encode()).decode()
            del obj["stringData"]


def validate_secret(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    data = _validate_keys(obj.get("data"), "data", out)
    if obj.get("stringData") is not None:
        out.append(v.type_invalid("stringData", obj["stringData"], "map of strings"))
    size = 0
    decoded: dict[str, bytes] = {}
    for key, val in data.items():
        raw = _decode_b64(val)
        if raw is None:
            out.append(v.invalid(f"data[{key}]", "<secret contents redacted>",
                                 "illegal base64 data: values must be base64-encoded"))
            continue
        decoded[key] = raw
        size += len(key) + len(raw)
    if size > MAX_CONFIG_SIZE:
        out.append(v.too_long("data", MAX_CONFIG_SIZE))
    stype = obj.get("type") or "Opaque"
    if not isinstance(stype, str):
        out.append(v.type_invalid("type", stype, "string"))
        stype = "Opaque"
    for key in SECRET_TYPE_REQUIRED_KEYS.get(stype, ()):
        if key not in data:
            out.append(v.required(f"data[{key}]"))
    if stype == "kubernetes.io/dockerconfigjson" and ".dockerconfigjson" in decoded:
        try:
            json.loads(decoded[".dockerconfigjson"])
        except ValueError as e:
            out.append(v.invalid("data[.dockerconfigjson]", "<secret contents redacted>", str(e)))
    if stype == "kubernetes.io/service-account-token":
        if not d(obj, "metadata", "annotations").get("kubernetes.io/service-account.name"):
            out.append(v.required("metadata.annotations[kubernetes.io/service-account.name]"))
    if old is not None:
        old_type = old.get("type") or "Opaque"
        out += v.immutable(stype, old_type, "type")
    out += _immutable_contents(obj, old, ("data",))
    return out


SECRET = KindInfo(
    group="", version="v1", kind="Secret", plural="secrets", singular="secret",
    columns=(
        col("Type", lambda o: o.get("type", ""), description="Used to facilitate programmatic handling of secret data."),
        col("Data", lambda o: len(d(o, "data")), description="Data contains the secret data."),
    ),
    default=default_secret, validate=validate_secret,
    selectable_fields=("type",),
)

# ---------------------------------------------------------------------------
# ServiceAccount
# ---------------------------------------------------------------------------


def validate_service_account(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    for key in ("secrets", "imagePullSecrets"):
        val = obj.get(key)
        if val is not None and not isinstance(val, list):
            out.append(v.type_invalid(key, val, "array"))
    amt = obj.get("automountServiceAccountToken")
    if amt is not None and not isinstance(amt, bool):
        out.append(v.type_invalid("automountServiceAccountToken", amt, "boolean"))
    return out


SERVICE_ACCOUNT = KindInfo(
    group="", version="v1", kind="ServiceAccount", plural="serviceaccounts", singular="serviceaccount",
    short_names=("sa",),
    # serviceaccounts/token: the TokenRequest API (fleet/server/tokenapi.py).
    subresources=("token",),
    columns=(col("Secrets", lambda o: len(lst(o, "secrets")), description="Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use."),),
    validate=validate_service_account,
)

# ---------------------------------------------------------------------------
# Binding: `POST /api/v1/namespaces/{ns}/bindings`, the older spelling of
# pods/{name}/binding (kube-apiserver serves both from one BindingREST; custom
# schedulers written with the Python client call `create_namespaced_binding`).
# Create only: nothing is stored under it (see ResourceAPI.create_strategies).
# ---------------------------------------------------------------------------

BINDING = KindInfo(
    group="", version="v1", kind="Binding", plural="bindings", singular="binding",
    verbs=("create",),
)

KINDS = (NAMESPACE, POD, NODE, SERVICE, ENDPOINTS, CONFIG_MAP, SECRET, SERVICE_ACCOUNT, BINDING)
