"""Service-link environment variables, as the kubelet injects them into every container.

Programs find Services through these as much as through DNS: the Python client's and
client-go's in-cluster configuration read `KUBERNETES_SERVICE_HOST`/`_PORT`, and older
images read Docker-link style `REDIS_PORT_6379_TCP_ADDR`.  The rules (kubelet
`getServiceEnvVarMap` and `pkg/kubelet/envvars`):

* the `kubernetes` Service of the `default` namespace is always included;
* with `enableServiceLinks` (the default) so is every Service of the pod's namespace;
* only Services with a cluster IP (not headless, not ExternalName) give variables;
* per Service `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (the first port),
  `<NAME>_SERVICE_PORT_<PORTNAME>` per named port, and the Docker-link set
  `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`; names upper-cased
  with `-` → `_`.

They are the lowest layer of a container's environment: the container's own `env` and
`envFrom` override them (`fleet.agent.env.resolve_env` takes them as `base_env`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

MASTER_NAMESPACE = "default"
MASTER_SERVICES = frozenset({"kubernetes"})


def _var_name(name: str) -> str:
    return name.replace("-", "_").upper()


def _cluster_ip(svc: Mapping[str, Any]) -> str | None:
    ip = (svc.get("spec") or {}).get("clusterIP")
    if not isinstance(ip, str) or not ip or ip == "None":
        return None
    return ip


def _host_port(ip: str, port: int) -> str:
    try:
        v6 = ipaddress.ip_address(ip).version == 6
    except ValueError:
        v6 = False
    return f"[{ip}]:{port}" if v6 else f"{ip}:{port}"


def env_for_service(svc: Mapping[str, Any]) -> dict[str, str]:
    """The variables one Service contributes (empty without a cluster IP or ports)."""
    ip = _cluster_ip(svc)
    ports = [p for p in ((svc.get("spec") or {}).get("ports") or []) if isinstance(p, Mapping)]
    if ip is None or not ports:
        return {}
    prefix = _var_name(str((svc.get("metadata") or {}).get("name") or ""))
    out = {f"{prefix}_SERVICE_HOST": ip, f"{prefix}_SERVICE_PORT": str(ports[0].get("port"))}
    for p in ports:
        if p.get("name"):
            out[f"{prefix}_SERVICE_PORT_{_var_name(str(p['name']))}"] = str(p.get("port"))
    for i, p in enumerate(ports):
        proto = str(p.get("protocol") or "TCP")
        url = f"{proto.lower()}://{_host_port(ip, int(p.get('port') or 0))}"
        if i == 0:
            out[f"{prefix}_PORT"] = url
        pp = f"{prefix}_PORT_{p.get('port')}_{proto.upper()}"
        out[pp] = url
        out[f"{pp}_PROTO"] = proto.lower()
        out[f"{pp}_PORT"] = str(p.get("port"))
        out[f"{pp}_ADDR"] = ip
    return out


def service_link_env(services: Iterable[Mapping[str, Any]], namespace: str,
                     enable_service_links: bool = True) -> dict[str, str]:
    """Every service-link variable for a pod in `namespace`.

    A Service of the pod's own namespace wins over a master Service of the same name
    (the kubelet builds its map the same way)."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for svc in services:
        meta = svc.get("metadata") or {}
        name, ns = meta.get("name"), meta.get("namespace")
        if not name or _cluster_ip(svc) is None:
            continue
        if ns == MASTER_NAMESPACE and name in MASTER_SERVICES:
            chosen.setdefault(name, svc)
        if ns == namespace and enable_service_links:
            chosen[name] = svc
    out: dict[str, str] = {}
    for name in sorted(chosen):
        out.update(env_for_service(chosen[name]))
    return out
