"""Ingress and Gateway API through a real `fleet server`: real busybox httpd pods behind
Services, the server's ingress listening on loopback ports picked free, kubectl driving.

* Two hosts and two paths routed to two Services, over HTTP and over HTTPS (curl with
  `--resolve` and `--cacert`: SNI picks the certificate of the right TLS Secret, made
  with `kubectl create secret tls`); `kubectl get ing` shows the ADDRESS, which goes
  when the Ingress moves to another controller's class.
* An Ingress to a missing Service: 503 naming it, and a Warning Event.
* A rule change applied while a slow request is in flight does not cut it; a streamed
  response arrives piece by piece.
* A Gateway and an HTTPRoute splitting 90/10: over 1,000 requests ~10% ± 3% reach the
  canary, and a header match sends one client to the canary only; the route's
  Accepted/ResolvedRefs conditions and the GatewayClass `fleet`'s Accepted are visible
  with kubectl.
* The request metrics are on the server's /metrics.

The routing cases run once per engine (`builtin`, then `nginx`: the server is restarted
with the other `--ingress-engine`).  The bridge (`ic12-br0`), its tables and the pod
range (10.212.0.0/16) are this module's own and removed at the end.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import busybox_problem
from tests.conftest import KUBECTL, FleetServer, create_namespace, free_port, run_kubectl
from tests.e2e.agentcluster import agent_cluster
from tests.e2e.helpers import wait_until
from tests.e2e.test_agent import IMAGE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runc, bridge networking)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl"),
]

BRIDGE = "ic12-br0"
CLUSTER_CIDR = "10.212.0.0/16"
ENGINES = ["builtin", "nginx"]

# Every file says which Service answered; cgi-bin/slow takes 3 s, cgi-bin/stream
# sends a line a second.
SERVE = r"""
mkdir -p /www/a /www/b /www/cgi-bin
for d in /www /www/a /www/b; do echo "$NAME" > $d/index.html; done
printf '#!/bin/sh\necho Content-Type: text/plain\necho\nsleep 3\necho slow-%s\n' "$NAME" > /www/cgi-bin/slow
printf '#!/bin/sh\necho Content-Type: text/plain\necho\nfor i in 1 2 3; do echo chunk$i; sleep 1; done\n' \
  > /www/cgi-bin/stream
chmod +x /www/cgi-bin/slow /www/cgi-bin/stream
exec httpd -f -p 8080 -h /www
"""


@dataclass
class Cluster:
    srv: FleetServer
    ns: str
    http: int
    https: int
    certs: Path
    engine: str = "builtin"


def ingress_args(engine: str, http: int, https: int) -> list[str]:
    return ["--ingress-bind", "127.0.0.1", "--ingress-http-port", str(http),
            "--ingress-https-port", str(https), "--ingress-engine", engine]


def kubectl(srv: FleetServer, *args: str, input: str | None = None) -> str:
    rc, out, err = run_kubectl(srv, *args, input=input, timeout=120)
    assert rc == 0, f"kubectl {' '.join(args)} -> {rc}\n{out}\n{err}"
    return out


def apply(c: Cluster, obj: dict[str, Any]) -> None:
    kubectl(c.srv, "-n", c.ns, "apply", "-f", "-", input=json.dumps(obj))


def get(c: Cluster, host: str, path: str, headers: dict[str, str] | None = None,
        timeout: float = 10.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", c.http, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": host, **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace").strip()
    finally:
        conn.close()


def serves(c: Cluster, host: str, path: str, body: str) -> bool:
    try:
        return get(c, host, path) == (200, body)
    except OSError:
        return False


def app(name: str) -> list[dict[str, Any]]:
    labels = {"app": name}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "terminationGracePeriodSeconds": 0,
                      "containers": [{"name": "web", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                                      "command": ["sh", "-c", SERVE], "env": [{"name": "NAME", "value": name}],
                                      "ports": [{"name": "http", "containerPort": 8080}],
                                      "readinessProbe": {"httpGet": {"path": "/", "port": "http"},
                                                         "periodSeconds": 1}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}},
    ]


def backend(service: str) -> dict[str, Any]:
    return {"service": {"name": service, "port": {"number": 80}}}


def prefix(path: str, service: str) -> dict[str, Any]:
    return {"path": path, "pathType": "Prefix", "backend": backend(service)}


ROUTES = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "ic-routes"},
          "spec": {"tls": [{"hosts": ["host-a.example"], "secretName": "tls-a"},
                           {"hosts": ["host-b.example"], "secretName": "tls-b"}],
                   "rules": [{"host": "host-a.example", "http": {"paths": [
                       prefix("/a", "ic-a"), prefix("/b", "ic-b"), prefix("/cgi-bin", "ic-a")]}},
                             {"host": "host-b.example", "http": {"paths": [prefix("/", "ic-b")]}}]}}


def self_signed(host: str, directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    crt, pem = directory / f"{host}.crt", directory / f"{host}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("ic12-ingress")
    http_port, https_port = free_port(), free_port()
    with agent_cluster(request, base, bridge=BRIDGE, cluster_cidr=CLUSTER_CIDR, delete_pods=True, grace=0,
                       extra_args=ingress_args("builtin", http_port, https_port)) as srv:
        ns = f"ic-{uuid.uuid4().hex[:6]}"
        create_namespace(srv, ns)
        c = Cluster(srv, ns, http_port, https_port, base / "certs")
        c.certs.mkdir()
        for name in ("ic-a", "ic-b"):
            for obj in app(name):
                apply(c, obj)
        for host, secret in (("host-a.example", "tls-a"), ("host-b.example", "tls-b")):
            crt, key = self_signed(host, c.certs)
            kubectl(srv, "-n", ns, "create", "secret", "tls", secret, "--cert", str(crt), "--key", str(key))
        apply(c, ROUTES)
        wait_until(lambda: serves(c, "host-a.example", "/a/", "ic-a") and serves(c, "host-b.example", "/", "ic-b"),
                   timeout=150, what="both Services served through the ingress")
        yield c


@pytest.fixture(scope="module", params=ENGINES)
def env(request: pytest.FixtureRequest, cluster: Cluster) -> Cluster:
    engine = request.param
    if engine == "nginx" and shutil.which("nginx") is None:
        pytest.skip("needs nginx")
    if cluster.engine != engine:
        srv = cluster.srv
        srv.stop()
        old = ingress_args(cluster.engine, cluster.http, cluster.https)
        assert srv.extra_args[-len(old):] == old  # agent_cluster put them last
        srv.extra_args = srv.extra_args[:-len(old)] + ingress_args(engine, cluster.http, cluster.https)
        srv.start()
        cluster.engine = engine
        wait_until(lambda: serves(cluster, "host-a.example", "/a/", "ic-a"), timeout=150,
                   what=f"the ingress served by {engine}")
    return cluster


def test_hosts_and_paths_over_http(env: Cluster) -> None:
    assert get(env, "host-a.example", "/a/") == (200, "ic-a")
    assert get(env, "host-a.example", "/b/") == (200, "ic-b")
    assert get(env, "host-b.example", "/a/") == (200, "ic-b")
    assert get(env, "HOST-B.example:80", "/") == (200, "ic-b")  # case and port do not matter
    assert get(env, "host-c.example", "/a/")[0] == 404


def curl_https(env: Cluster, host: str, path: str, cacert: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", "--max-time", "10", "--resolve", f"{host}:{env.https}:127.0.0.1",
                           "--cacert", str(env.certs / cacert), f"https://{host}:{env.https}{path}"],
                          capture_output=True, text=True, timeout=20)


def test_https_picks_the_certificate_by_sni(env: Cluster) -> None:
    a = curl_https(env, "host-a.example", "/a/", "host-a.example.crt")
    assert (a.returncode, a.stdout.strip()) == (0, "ic-a"), a.stderr
    a2 = curl_https(env, "host-a.example", "/b/", "host-a.example.crt")
    assert (a2.returncode, a2.stdout.strip()) == (0, "ic-b"), a2.stderr
    b = curl_https(env, "host-b.example", "/", "host-b.example.crt")
    assert (b.returncode, b.stdout.strip()) == (0, "ic-b"), b.stderr
    # host-a's name is served with host-a's certificate: b's CA does not verify it.
    wrong = curl_https(env, "host-a.example", "/a/", "host-b.example.crt")
    assert wrong.returncode != 0


def test_kubectl_shows_the_address(env: Cluster) -> None:
    def address() -> str:
        out = kubectl(env.srv, "-n", env.ns, "get", "ing", "ic-routes", "--no-headers")
        return out.split()[3] if len(out.split()) > 3 else ""
    assert wait_until(lambda: address() == "127.0.0.1" and address(), timeout=20, what="the ADDRESS")
    out = kubectl(env.srv, "-n", env.ns, "get", "ing", "ic-routes")
    assert "ADDRESS" in out.splitlines()[0] and "127.0.0.1" in out
    # Moved to another controller's class: our address leaves its status.
    kubectl(env.srv, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "ic-other"},
        "spec": {"controller": "example.com/other"}}))
    moving = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "ic-moving"},
              "spec": {"ingressClassName": "fleet",
                       "rules": [{"host": "moving.example", "http": {"paths": [prefix("/", "ic-a")]}}]}}
    apply(env, moving)

    def lb() -> Any:
        obj = json.loads(kubectl(env.srv, "-n", env.ns, "get", "ing", "ic-moving", "-o", "json"))
        return (obj.get("status") or {}).get("loadBalancer") or {}
    wait_until(lambda: lb() == {"ingress": [{"ip": "127.0.0.1"}]}, timeout=20, what="ic-moving's address")
    moving["spec"]["ingressClassName"] = "ic-other"
    apply(env, moving)
    wait_until(lambda: lb() == {}, timeout=20, what="ic-moving's address gone")
    assert get(env, "moving.example", "/a/")[0] == 404
    moving["spec"]["ingressClassName"] = "fleet"  # as it was, for the other engine's run
    apply(env, moving)


def test_a_missing_service_is_503_naming_it_and_a_warning_event(env: Cluster) -> None:
    # Names of this engine's run: the server restarted between the engines, and a new
    # process reports a problem it finds again.
    name, missing, host = f"ic-missing-{env.engine}", f"ic-nope-{env.engine}", f"missing-{env.engine}.example"
    apply(env, {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name},
                "spec": {"rules": [{"host": host, "http": {"paths": [prefix("/", missing)]}}]}})
    status, body = wait_until(lambda: (r := get(env, host, "/"))[0] == 503 and r,
                              timeout=20, what="503 for the missing Service")
    assert missing in body

    def warning() -> list[dict[str, Any]]:
        out = kubectl(env.srv, "-n", env.ns, "get", "events", "-o", "json",
                      "--field-selector", f"involvedObject.kind=Ingress,involvedObject.name={name}")
        return [e for e in json.loads(out)["items"] if e["type"] == "Warning" and missing in e["message"]]
    events = wait_until(warning, timeout=20, what="a Warning Event naming the Service")
    # Once, however many passes found the same problem (endpoint changes keep coming).
    apply(env, {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": f"{name}-2"},
                "spec": {"rules": [{"host": f"2.{host}", "http": {"paths": [prefix("/", "ic-a")]}}]}})
    wait_until(lambda: serves(env, f"2.{host}", "/a/", "ic-a"), timeout=20, what="a later pass")
    assert len(events) == 1 and len(warning()) == 1 and warning()[0]["count"] == 1


def test_a_rule_change_does_not_cut_a_request_in_flight(env: Cluster) -> None:
    change = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "ic-change"},
              "spec": {"rules": [{"host": "change.example", "http": {"paths": [
                  prefix("/cgi-bin", "ic-a"), prefix("/", "ic-a")]}}]}}
    apply(env, change)
    wait_until(lambda: serves(env, "change.example", "/", "ic-a"), timeout=20, what="change.example → ic-a")
    result: list[Any] = []

    def slow() -> None:
        try:
            result.append(get(env, "change.example", "/cgi-bin/slow", timeout=20))
        except OSError as e:
            result.append(e)
    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.5)
    change["spec"]["rules"][0]["http"]["paths"] = [prefix("/cgi-bin", "ic-b"), prefix("/", "ic-b")]
    apply(env, change)
    wait_until(lambda: serves(env, "change.example", "/", "ic-b"), timeout=20, what="change.example → ic-b")
    t.join(20)
    assert result == [(200, "slow-ic-a")]  # the old rule finished what it started


def test_a_streamed_response_arrives_piece_by_piece(env: Cluster) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", env.http, timeout=10)
    try:
        t0 = time.monotonic()
        conn.request("GET", "/cgi-bin/stream", headers={"Host": "host-a.example"})
        r = conn.getresponse()
        assert r.status == 200
        first = r.readline()
        t_first = time.monotonic() - t0
        rest = r.read()
        t_all = time.monotonic() - t0
    finally:
        conn.close()
    assert first.strip() == b"chunk1" and b"chunk3" in rest
    assert t_first < 1.5 <= t_all


def gateway(c: Cluster) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "ic-gw"},
            "spec": {"gatewayClassName": "fleet",
                     "listeners": [{"name": "http", "protocol": "HTTP", "port": c.http}]}}


SPLIT = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "ic-split"},
         "spec": {"parentRefs": [{"name": "ic-gw"}], "hostnames": ["split.example"],
                  "rules": [{"matches": [{"headers": [{"name": "x-canary", "value": "always"}]}],
                             "backendRefs": [{"name": "ic-b", "port": 80}]},
                            {"backendRefs": [{"name": "ic-a", "port": 80, "weight": 90},
                                             {"name": "ic-b", "port": 80, "weight": 10}]}]}}


def test_a_weighted_split_and_a_header_match(env: Cluster) -> None:
    apply(env, gateway(env))
    apply(env, SPLIT)
    wait_until(lambda: get(env, "split.example", "/")[0] == 200, timeout=30, what="split.example served")
    counts: dict[str, int] = {}
    # Keep-alive where the engine keeps it: the split is per request, not per connection.
    conn = http.client.HTTPConnection("127.0.0.1", env.http, timeout=10)
    try:
        for _ in range(1000):
            conn.request("GET", "/", headers={"Host": "split.example"})
            r = conn.getresponse()
            body = r.read().decode().strip()
            assert r.status == 200
            counts[body] = counts.get(body, 0) + 1
            if r.will_close:  # nginx ends a connection after keepalive_requests (1000)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", env.http, timeout=10)
    finally:
        conn.close()
    assert set(counts) == {"ic-a", "ic-b"}
    assert 70 <= counts["ic-b"] <= 130, counts
    assert {get(env, "split.example", "/", {"X-Canary": "always"}) for _ in range(20)} == {(200, "ic-b")}


def conditions(c: Cluster, *args: str) -> dict[str, str]:
    obj = json.loads(kubectl(c.srv, *args, "-o", "json"))
    st = obj.get("status") or {}
    conds = st.get("conditions") or [x for p in st.get("parents") or [] for x in p.get("conditions") or []]
    return {x["type"]: x["status"] for x in conds}


def test_route_and_class_status_with_kubectl(env: Cluster) -> None:
    apply(env, gateway(env))
    apply(env, SPLIT)
    wait_until(lambda: conditions(env, "-n", env.ns, "get", "httproute", "ic-split").items()
               >= {("Accepted", "True"), ("ResolvedRefs", "True")}, timeout=20, what="the route's conditions")
    assert conditions(env, "get", "gatewayclass", "fleet").get("Accepted") == "True"
    assert conditions(env, "-n", env.ns, "get", "gateway", "ic-gw").get("Accepted") == "True"


def test_request_metrics_on_the_server(env: Cluster) -> None:
    assert get(env, "host-a.example", "/a/") == (200, "ic-a")
    import urllib.request
    text = urllib.request.urlopen(env.srv.metrics_url, timeout=10).read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("fleet_ingress_requests_total{")]
    assert any('kind="Ingress"' in ln and f'namespace="{env.ns}"' in ln and 'name="ic-routes"' in ln
               and 'code="200"' in ln for ln in lines), lines
    assert "fleet_ingress_request_duration_seconds_bucket{" in text
    assert "fleet_ingress_sync_seconds_count" in text



@pytest.mark.parametrize("args,message", [
    (["--ingress-engine", "haproxy"], "builtin or nginx"),
    (["--ingress-http-port", "9443", "--ingress-https-port", "9443"], "must differ"),
    (["--ingress-bind", "ingress.example"], "not an IP address"),
    (["--ingress-https-port", "70000"], "between 0 and 65535"),
])
def test_bad_ingress_flags_stop_the_server_with_a_clear_error(tmp_path: Path, args: list[str],
                                                              message: str) -> None:
    import sys

    from tests.conftest import _server_env

    p = subprocess.run([sys.executable, "-m", "fleet.cli.main", "server", "--data-dir", str(tmp_path),
                        "--port", str(free_port()), "--metrics-port", str(free_port()), "--no-agent",
                        *args], capture_output=True, text=True, timeout=60, env=_server_env())
    out = p.stdout + p.stderr
    assert p.returncode != 0 and message in out and "Traceback" not in out, out
