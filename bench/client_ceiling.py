"""What the load generator alone can push: closed-loop GETs against a trivial stub server.

`python -m bench.client_ceiling [--with-fleet]`

The stub (`bench.stub_server`, plain asyncio, answers `200 ok`) costs almost nothing per
request, so its req/s is the ceiling of `bench.loadgen` (httpx on asyncio) with 1 and 2
processes.  With `--with-fleet` it also hits Fleet's `/healthz`, which is the ceiling of
the server's HTTP stack with no store work: the floor under every API number.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    REPO,
    FleetServer,
    ServerInfo,
    cpu_s,
    free_port,
    log,
    merge_closed_loop,
    run_loadgen,
    write_results,
)


def closed_get(info: ServerInfo, path: str, procs: int, clients: int, count: int, duration: float) -> dict[str, Any]:
    start_at = time.time() + 1.5  # let every process finish importing first
    specs = [
        {
            **info.as_args(),
            "mode": "closed",
            "op": "get",
            "path": path,
            "concurrency": clients // procs,
            "count": count // procs,
            "duration": duration,
            "start_at": start_at,
        }
        for _ in range(procs)
    ]
    return merge_closed_loop(run_loadgen(specs, timeout=duration + 60))


def self_signed(dirpath: Path) -> tuple[Path, Path, str]:
    """An ECDSA P-256 certificate for 127.0.0.1 (like Fleet's serving cert): cert, key, PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench-stub")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (dirpath / "stub.crt").write_bytes(pem)
    (dirpath / "stub.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return dirpath / "stub.crt", dirpath / "stub.key", pem.decode()


def stub_ceiling(clients: int = 50, count: int = 20_000, duration: float = 10.0,
                 tls: bool = True) -> dict[str, Any]:
    """The load generator against the stub, over TLS by default (Fleet serves https)."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-stub-"))
    args: list[str] = []
    ca_pem = None
    if tls:
        cert, key, ca_pem = self_signed(tmp)
        args = [str(cert), str(key)]
    stub = subprocess.Popen(
        [PYTHON, "-m", "bench.stub_server", str(port), str(2 * duration + 60), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stub.stdout is not None and stub.stdout.readline().strip() == "READY"
        scheme = "https" if tls else "http"
        info = ServerInfo(base_url=f"{scheme}://127.0.0.1:{port}", token=None, ca_pem=ca_pem)
        out: dict[str, Any] = {"tls": tls}
        for procs in (1, 2):
            r = closed_get(info, "/healthz", procs, clients, count, duration)
            out[f"procs_{procs}"] = r
            log(f"client ceiling ({scheme} stub), {procs} proc: {r['ok_per_s']:.0f} req/s, "
                f"client CPU {r['client_cpu_s']} s over {r['wall_s']} s")
        return out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stub.pid, signal.SIGTERM)
        stub.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def fleet_healthz(srv: FleetServer, clients: int = 50, count: int = 10_000, duration: float = 10.0) -> dict[str, Any]:
    assert srv.info is not None
    c0 = cpu_s(srv.pid)
    r = closed_get(srv.info, "/healthz", 2, clients, count, duration)
    c1 = cpu_s(srv.pid)
    r["server_cpu_s"] = round((c1 or 0) - (c0 or 0), 2)
    log(f"fleet /healthz, 2 procs: {r['ok_per_s']:.0f} req/s (p99 {r['latency']['p99_ms']} ms), "
        f"server CPU {r['server_cpu_s']} s over {r['wall_s']} s")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--with-fleet", action="store_true")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--plain", action="store_true", help="stub over plain http instead of TLS")
    a = ap.parse_args()
    result: dict[str, Any] = {"stub": stub_ceiling(duration=a.seconds, tls=not a.plain)}
    if a.with_fleet:
        with FleetServer() as srv:
            result["fleet_healthz"] = fleet_healthz(srv, duration=a.seconds)
    write_results("client_ceiling", result)


if __name__ == "__main__":
    main()
