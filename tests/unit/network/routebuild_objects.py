"""Object factories for the route-builder tests: plain Kubernetes dicts as informers hold them."""

from __future__ import annotations

import base64
import datetime
import functools
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CONTROLLER = "fleet.io/ingress"
GW_CONTROLLER = "fleet.io/gateway-controller"


def meta(name: str, ns: str | None = "default", ts: str = "2024-01-01T00:00:00Z", **extra: Any) -> dict:
    md: dict[str, Any] = {"name": name, "creationTimestamp": ts, **extra}
    if ns is not None:
        md["namespace"] = ns
    return md


def ingress_class(name: str = "fleet", controller: str = CONTROLLER, default: bool = False) -> dict:
    ann = {"ingressclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"metadata": meta(name, None, annotations=ann), "spec": {"controller": controller}}


def backend(svc: str, port: int | str = 80) -> dict:
    return {"service": {"name": svc, "port": {"number": port} if isinstance(port, int) else {"name": port}}}


def path(p: str, svc: str, ptype: str = "Prefix", port: int | str = 80) -> dict:
    return {"path": p, "pathType": ptype, "backend": backend(svc, port)}


def rule(host: str | None, *paths: dict) -> dict:
    r: dict[str, Any] = {"http": {"paths": list(paths)}}
    if host is not None:
        r["host"] = host
    return r


def ingress(name: str, *rules: dict, ns: str = "default", cls: str | None = "fleet",
            ts: str = "2024-01-01T00:00:00Z", default_backend: dict | None = None,
            tls: list[dict] | None = None, annotations: dict | None = None) -> dict:
    spec: dict[str, Any] = {"rules": list(rules)}
    if cls is not None:
        spec["ingressClassName"] = cls
    if default_backend is not None:
        spec["defaultBackend"] = default_backend
    if tls is not None:
        spec["tls"] = tls
    return {"metadata": meta(name, ns, ts, annotations=annotations or {}), "spec": spec}


def service(name: str, *ports: tuple[str, int], ns: str = "default", external: str | None = None) -> dict:
    spec: dict[str, Any] = {"ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports]}
    if external is not None:
        spec.update(type="ExternalName", externalName=external)
    else:
        spec.update(type="ClusterIP", clusterIP="10.96.0.10")
    return {"metadata": meta(name, ns), "spec": spec}


def endpoint(ip: str, ready: bool | None = True, serving: bool | None = None,
             terminating: bool | None = None) -> dict:
    conds: dict[str, bool] = {}
    for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating)):
        if v is not None:
            conds[k] = v
    return {"addresses": [ip], "conditions": conds}


def slice_(svc: str, name: str, ports: list[tuple[str, int]], endpoints: list[dict],
           ns: str = "default") -> dict:
    return {"metadata": meta(name, ns, labels={"kubernetes.io/service-name": svc}),
            "addressType": "IPv4",
            "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
            "endpoints": endpoints}


@functools.cache
def keypair(cn: str = "example.com") -> tuple[bytes, bytes]:
    """A self-signed (cert PEM, key PEM) for `cn`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=3650))
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def tls_secret(name: str, cert: bytes, key: bytes, ns: str = "default",
               type_: str = "kubernetes.io/tls") -> dict:
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return {"metadata": meta(name, ns), "type": type_,
            "data": {"tls.crt": b64(cert), "tls.key": b64(key)}}


def namespace(name: str, **labels: str) -> dict:
    return {"metadata": meta(name, None, labels={"kubernetes.io/metadata.name": name, **labels})}


def gateway_class(name: str = "fleet", controller: str = GW_CONTROLLER, generation: int = 1) -> dict:
    return {"metadata": meta(name, None, generation=generation), "spec": {"controllerName": controller}}


def listener(name: str, port: int, protocol: str = "HTTP", hostname: str | None = None,
             certs: list[dict] | None = None, allowed: dict | None = None, **extra: Any) -> dict:
    spec: dict[str, Any] = {"name": name, "port": port, "protocol": protocol, **extra}
    if hostname is not None:
        spec["hostname"] = hostname
    if certs is not None:
        spec["tls"] = {"mode": "Terminate", "certificateRefs": certs}
    if allowed is not None:
        spec["allowedRoutes"] = allowed
    return spec


def gateway(name: str, *listeners: dict, ns: str = "default", cls: str = "fleet",
            ts: str = "2024-01-01T00:00:00Z", generation: int = 3) -> dict:
    return {"metadata": meta(name, ns, ts, generation=generation),
            "spec": {"gatewayClassName": cls, "listeners": list(listeners)}}


def backend_ref(svc: str, port: int | None = 80, weight: int | None = None, **extra: Any) -> dict:
    ref: dict[str, Any] = {"name": svc, **extra}
    if port is not None:
        ref["port"] = port
    if weight is not None:
        ref["weight"] = weight
    return ref


def http_rule(*refs: dict, matches: list[dict] | None = None, filters: list[dict] | None = None,
              **extra: Any) -> dict:
    r: dict[str, Any] = {"backendRefs": list(refs), **extra}
    if matches is not None:
        r["matches"] = matches
    if filters is not None:
        r["filters"] = filters
    return r


def http_route(name: str, *rules: dict, parents: list[dict] | None = None, hostnames: list[str] | None = None,
               ns: str = "default", ts: str = "2024-01-01T00:00:00Z", generation: int = 2,
               status: dict | None = None) -> dict:
    spec: dict[str, Any] = {"parentRefs": parents if parents is not None else [{"name": "gw"}],
                            "rules": list(rules)}
    if hostnames is not None:
        spec["hostnames"] = hostnames
    obj = {"metadata": meta(name, ns, ts, generation=generation), "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj
