"""Resolving what routes point at: a Service port to its endpoints, a TLS Secret to a Certificate.

Endpoints come from the Service's EndpointSlices (label kubernetes.io/service-name)
through the service proxy's own readers (`fleet.network.proxy_objects`): the slice
port whose name equals the Service port's name, the first address of each endpoint,
and kube-proxy's choice (KEP-1669) — the ready endpoints, or, when none is ready, the
serving-and-terminating ones.  A headless Service is resolved the same way (its
slices list its pods).  An ExternalName Service resolves to its DNS name.

A TLS Secret must be of type kubernetes.io/tls, and its tls.crt / tls.key must hold
a PEM certificate (chain) and the private key that matches it; anything else is a
problem reported in words, never an exception.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fleet.network.proxy_objects import categorize, slice_endpoints, slices_by_service
from fleet.network.routebuild_common import dicts, get, int_or_none, name_of, namespace_of, text
from fleet.network.routetable import Backend, Certificate, Endpoint, Source

__all__ = ["Resolver", "backend_reason", "parse_tls"]


def _b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def _secret_bytes(secret: Mapping[str, Any], key: str) -> bytes | None:
    data = get(secret, "data", key)
    if data is not None:
        return _b64(data)
    sd = get(secret, "stringData", key)  # never stored by the API server, but harmless to read
    return sd.encode() if isinstance(sd, str) else None


def parse_tls(cert_pem: bytes, key_pem: bytes) -> str:
    """Why this is not a usable serving pair ("" when it is): the PEM must parse as at
    least one certificate, the key as a private key, and the key must be the first
    (leaf) certificate's."""
    try:
        certs = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        return "tls.crt is not a PEM certificate"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return "tls.key is not an unencrypted PEM private key"
    except Exception:  # noqa: BLE001 - an unsupported key algorithm raises UnsupportedAlgorithm
        return "tls.key is not a supported private key"
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        if certs[0].public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
            return "tls.key does not match the certificate in tls.crt"
    except Exception:  # noqa: BLE001 - an exotic key type without SPKI encoding
        return "tls.key does not match the certificate in tls.crt"
    return ""


@dataclass
class Resolver:
    """Lookups over one build's Services, EndpointSlices and Secrets (memoised)."""

    services: Iterable[Mapping[str, Any]]
    endpoint_slices: Iterable[Mapping[str, Any]]
    secrets: Iterable[Mapping[str, Any]]
    _svc: dict[tuple[str, str], Mapping[str, Any]] = field(init=False)
    _slices: dict[tuple[str, str], list[Mapping[str, Any]]] = field(init=False)
    _sec: dict[tuple[str, str], Mapping[str, Any]] = field(init=False)
    _tls: dict[tuple[str, str], tuple[bytes, bytes] | str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._svc = {(namespace_of(s), name_of(s)): s for s in self.services if isinstance(s, Mapping)}
        self._slices = slices_by_service(s for s in self.endpoint_slices if isinstance(s, Mapping))
        self._sec = {(namespace_of(s), name_of(s)): s for s in self.secrets if isinstance(s, Mapping)}

    def service_exists(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._svc

    def backend(self, namespace: str, name: str, port: int | str, weight: int = 1) -> Backend:
        """The Service port `port` (number or name) of namespace/name, with its endpoints,
        or with a `problem` when it cannot be served."""
        ref = f'service "{namespace}/{name}"'
        svc = self._svc.get((namespace, name))
        if svc is None:
            return Backend(namespace, name, port, weight, problem=f"{ref} not found")
        spec = svc.get("spec") if isinstance(svc.get("spec"), Mapping) else {}
        sport = None
        for p in dicts(spec.get("ports")):
            if (isinstance(port, int) and int_or_none(p.get("port")) == port) or \
                    (isinstance(port, str) and text(p.get("name")) == port):
                sport = p
                break
        if spec.get("type") == "ExternalName":
            host = text(spec.get("externalName")).rstrip(".")
            number = int_or_none(sport.get("port")) if sport is not None else (
                port if isinstance(port, int) else None)
            if not host:
                return Backend(namespace, name, port, weight, problem=f"{ref} has no externalName")
            if number is None or not 0 < number < 65536:
                return Backend(namespace, name, port, weight, problem=f"{ref} has no port {port!r}")
            return Backend(namespace, name, port, weight, endpoints=(Endpoint(host, number),))
        if sport is None:
            return Backend(namespace, name, port, weight, problem=f"{ref} has no port {port!r}")
        port_name = text(sport.get("name"))
        protocol = text(sport.get("protocol"), "TCP").lower()
        seen: dict[tuple[str, int], Any] = {}
        for es in sorted(self._slices.get((namespace, name), []), key=name_of):
            for ep in slice_endpoints(es, port_name, protocol):
                seen.setdefault((ep.ip, ep.port), ep)
        chosen = categorize(sorted(seen.values()), "").cluster
        eps = tuple(sorted({Endpoint(e.ip, e.port) for e in chosen}, key=lambda e: (e.address, e.port)))
        if not eps:
            return Backend(namespace, name, port, weight,
                           problem=f"no ready endpoints for {ref} port {port!r}")
        return Backend(namespace, name, port, weight, endpoints=eps)

    def tls(self, namespace: str, name: str) -> tuple[bytes, bytes] | str:
        """(cert PEM, key PEM) of a kubernetes.io/tls Secret, or why it cannot be used."""
        key = (namespace, name)
        if key not in self._tls:
            self._tls[key] = self._load_tls(namespace, name)
        return self._tls[key]

    def _load_tls(self, namespace: str, name: str) -> tuple[bytes, bytes] | str:
        ref = f'secret "{namespace}/{name}"'
        sec = self._sec.get((namespace, name))
        if sec is None:
            return f"{ref} not found"
        if sec.get("type") != "kubernetes.io/tls":
            return f"{ref} is not of type kubernetes.io/tls"
        crt, key = _secret_bytes(sec, "tls.crt"), _secret_bytes(sec, "tls.key")
        if crt is None or key is None:
            return f"{ref} has no tls.crt or tls.key"
        why = parse_tls(crt, key)
        return f"{ref}: {why}" if why else (crt, key)

    def certificate(self, namespace: str, name: str, hostnames: Iterable[str],
                    source: Source) -> Certificate | str:
        got = self.tls(namespace, name)
        if isinstance(got, str):
            return got
        return Certificate(tuple(hostnames), got[0], got[1], source)


def backend_reason(backend: Backend) -> str:
    """The Event reason for a backend that cannot be served ("" when it can)."""
    if not backend.problem:
        return ""
    return "NoEndpoints" if backend.problem.startswith("no ready endpoints") else "BackendNotFound"
