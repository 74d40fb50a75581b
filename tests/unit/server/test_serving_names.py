"""The API server's certificate names the `kubernetes` Service as pods reach it."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509

from fleet.auth.pki import ensure_serving_tls
from fleet.server.run import ServerConfig, serving_names


def test_serving_certificate_covers_the_kubernetes_service(tmp_path: Path) -> None:
    cfg = ServerConfig(data_dir=str(tmp_path), address="127.0.0.1", service_cidr="10.96.0.0/12",
                       advertise_address="192.0.2.7")
    names = serving_names(cfg)
    tls = ensure_serving_tls(tmp_path, names)
    cert = x509.load_pem_x509_certificate(Path(tls.cert_file).read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.96.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("192.0.2.7") in sans.get_values_for_type(x509.IPAddress)
    dns = sans.get_values_for_type(x509.DNSName)
    for name in ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"):
        assert name in dns
