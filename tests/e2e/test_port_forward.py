"""kubectl port-forward, the Python client's portforward() and kubectl cp against a real
`fleet server` with its built-in agent running runc pods on a bridge network.

The workload is the example image (busybox-static, packaging/build_example_image.py):
a Deployment `fp-web` whose pod serves a page with httpd on 8080 and echoes with
`nc -ll -e cat` on 9090, and a Service `fp-svc` (80 → 8080, 7000 → 9090).  Nothing
listens on 81.  Every forwarded connection goes client → API server (WebSocket tunnel
or plain SPDY) → agent WebSocket → a socket made inside the pod's network namespace.
Only loopback is used from the test's side; the pod network lives on the test's own
bridge (`fp-pf0`, 10.198.0.0/16) and is removed with everything else at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.runtime.oci import find_runtime
from fleet.testing.oci_image import busybox_problem
from tests.conftest import (
    KUBECTL,
    REPO_ROOT,
    FleetServer,
    ServerFactory,
    _make_base,
    _server_env,
    free_port,
    run_kubectl,
)
from tests.e2e.helpers import wait_until
from tests.e2e.leaks import finish, wait_clean

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the built-in agent runs runc)"),
    pytest.mark.skipif(find_runtime() is None, reason="needs runc or crun"),
    pytest.mark.skipif(busybox_problem() is not None, reason="needs busybox-static"),
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
    pytest.mark.skipif(shutil.which("nsenter") is None or shutil.which("ss") is None,
                       reason="needs nsenter (util-linux) and ss (iproute2)"),
]

BRIDGE = "fp-pf0"
CLUSTER_CIDR = "10.198.0.0/16"
NS = "fp-pf"
PAGE = "hello-pf"

MANIFEST = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: fp-web, namespace: {NS}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: fp-web}}}}
  template:
    metadata: {{labels: {{app: fp-web}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: docker.io/library/busybox:fleet
        imagePullPolicy: Never
        command: ["sh", "-c", "mkdir -p /www && echo {PAGE} > /www/index.html &&
                  httpd -p 8080 -h /www && exec nc -ll -p 9090 -e cat"]
        ports: [{{containerPort: 8080, name: http}}, {{containerPort: 9090, name: echo}}]
---
apiVersion: v1
kind: Service
metadata: {{name: fp-svc, namespace: {NS}}}
spec:
  selector: {{app: fp-web}}
  ports:
  - {{name: http, port: 80, targetPort: http}}
  - {{name: echo, port: 7000, targetPort: 9090}}
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[FleetServer, str]]:
    """A server + agent with the workload running; (server, pod name)."""
    base = _make_base("fleet-e2e-pf-")
    factory = ServerFactory(base)
    srv = factory.start(extra_args=[
        "--agent-port", str(free_port()), "--agent-network", "bridge", "--agent-bridge", BRIDGE,
        "--cluster-cidr", CLUSTER_CIDR])
    leaked: list[str] = []
    try:
        image = base / "busybox-fleet.tar"
        env = _server_env()
        subprocess.run([sys.executable, str(REPO_ROOT / "packaging" / "build_example_image.py"),
                        str(image)], check=True, capture_output=True, env=env, timeout=120)
        subprocess.run([sys.executable, "-m", "fleet.cli.kfleet", "--kubeconfig",
                        str(srv.kubeconfig), "image", "import", str(image)], check=True,
                       capture_output=True, env=env, timeout=120)
        assert run_kubectl(srv, "create", "namespace", NS)[0] == 0
        manifest = base / "web.yaml"
        manifest.write_text(MANIFEST)
        rc, out, err = run_kubectl(srv, "apply", "-f", str(manifest))
        assert rc == 0, (out, err)
        rc, out, err = run_kubectl(srv, "rollout", "status", "-n", NS, "deployment/fp-web",
                                   "--timeout=120s", timeout=150)
        assert rc == 0, (out, err)
        rc, name, err = run_kubectl(srv, "get", "pods", "-n", NS, "-l", "app=fp-web", "-o",
                                    "jsonpath={.items[0].metadata.name}")
        assert rc == 0 and name, err
        # The pod's servers are up before anything is forwarded to them.
        wait_until(lambda: run_kubectl(srv, "exec", "-n", NS, name, "--", "wget", "-qO-",
                                       "127.0.0.1:8080/index.html")[1].strip() == PAGE,
                   timeout=30, what="httpd in the pod")
        yield srv, name
    finally:
        try:
            run_kubectl(srv, "delete", "namespace", NS, "--timeout=120s", timeout=150)
            leaked = wait_clean(srv.data_dir / "agent", timeout=40)
        finally:
            factory.stop_all()
            finish(srv.data_dir / "agent", leaked, srv.output())
            shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ helpers
class PortForward:
    """A running `kubectl port-forward`, stopped with SIGINT like a user's Ctrl-C."""

    def __init__(self, srv: FleetServer, target: str, ports: list[str],
                 env: dict[str, str] | None = None) -> None:
        assert KUBECTL is not None
        full_env = dict(os.environ, **(env or {}))
        self.proc = subprocess.Popen(
            [KUBECTL, "--kubeconfig", str(srv.kubeconfig), "-n", NS, "port-forward", target,
             *ports], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
            start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._drain, args=(stream, sink), daemon=True)
                        for stream, sink in ((self.proc.stdout, self.out),
                                             (self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()
        wanted = sum(1 for _ in ports)
        wait_until(lambda: sum("Forwarding from 127.0.0.1" in line for line in self.out) >= wanted
                   or self.proc.poll() is not None, timeout=30, what="kubectl listening")
        assert self.proc.poll() is None, f"kubectl ended: {self.err}"

    @staticmethod
    def _drain(stream, sink: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            sink.append(line)

    def wait(self, timeout: float) -> int:
        """kubectl's exit code once it ended and all its output is read."""
        rc = self.proc.wait(timeout=timeout)
        for t in self.readers:
            t.join(timeout=5)
        return rc

    def stop(self) -> int:
        """SIGINT; kubectl must exit on its own (rc 0) and leave no child behind."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError("kubectl port-forward did not exit on SIGINT") from None


@pytest.fixture
def forwards() -> Iterator[list[PortForward]]:
    started: list[PortForward] = []
    yield started
    for pf in started:
        if pf.proc.poll() is None:
            os.killpg(pf.proc.pid, signal.SIGKILL)
            pf.proc.wait()


def http_get(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
        return _read_all(s).decode()


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def echo(port: int, payload: bytes) -> bytes:
    """Send `payload`, half-close, and read the echo until the pod's side ends."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        sender = threading.Thread(target=lambda: (s.sendall(payload), s.shutdown(socket.SHUT_WR)))
        sender.start()
        data = _read_all(s)
        sender.join()
        return data


def two_ports() -> tuple[int, int]:
    a = free_port()
    b = free_port()
    while b == a:
        b = free_port()
    return a, b


def concurrent_traffic(http_port: int, echo_port: int) -> None:
    """Two connections at once per port, a payload both ways on each echo."""
    payloads = [os.urandom(300_000), os.urandom(200_000)]
    results: dict[str, object] = {}

    def run(key: str, fn, *args) -> None:  # type: ignore[no-untyped-def]
        try:
            results[key] = fn(*args)
        except Exception as e:  # reported below
            results[key] = e

    threads = [threading.Thread(target=run, args=(f"echo{i}", echo, echo_port, p))
               for i, p in enumerate(payloads)]
    threads += [threading.Thread(target=run, args=(f"http{i}", http_get, http_port))
                for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i, p in enumerate(payloads):
        assert results.get(f"echo{i}") == p, f"echo {i}: {str(results.get(f'echo{i}'))[:200]}"
    for i in range(2):
        assert str(results.get(f"http{i}")).rstrip().endswith(PAGE), results.get(f"http{i}")


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("transport", ["websocket", "spdy"])
def test_pod_two_ports_concurrent_connections(cluster: tuple[FleetServer, str],
                                              forwards: list[PortForward], transport: str) -> None:
    srv, pod = cluster
    http_port, echo_port = two_ports()
    env = {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"} if transport == "spdy" else {}
    pf = PortForward(srv, f"pod/{pod}", [f"{http_port}:8080", f"{echo_port}:9090"], env)
    forwards.append(pf)
    concurrent_traffic(http_port, echo_port)
    concurrent_traffic(http_port, echo_port)  # and again on the same session
    assert pf.stop() == 0, pf.err
    assert not any("error" in line.lower() for line in pf.err), pf.err


@pytest.mark.parametrize("target", ["svc/fp-svc", "deploy/fp-web"])
def test_service_and_deployment(cluster: tuple[FleetServer, str], forwards: list[PortForward],
                                target: str) -> None:
    srv, _pod = cluster
    http_port, echo_port = two_ports()
    remote = ["80", "7000"] if target.startswith("svc") else ["8080", "9090"]
    pf = PortForward(srv, target, [f"{http_port}:{remote[0]}", f"{echo_port}:{remote[1]}"])
    forwards.append(pf)
    # kubectl resolved the Service's ports to the pod's (80 → 8080 by name, 7000 → 9090).
    assert any("-> 8080" in line for line in pf.out) and any("-> 9090" in line for line in pf.out)
    concurrent_traffic(http_port, echo_port)
    assert pf.stop() == 0, pf.err


def test_port_nothing_listens_on(cluster: tuple[FleetServer, str],
                                 forwards: list[PortForward]) -> None:
    srv, pod = cluster
    good, bad = two_ports()
    pf = PortForward(srv, f"pod/{pod}", [f"{good}:8080", f"{bad}:81"])
    forwards.append(pf)
    assert http_get(good).rstrip().endswith(PAGE)
    with socket.create_connection(("127.0.0.1", bad), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert _read_all(s) == b""
    # kubectl prints what it prints for Kubernetes (containerd's text), then, as kubectl
    # 1.23+ does after any error on an error stream, ends the session.
    rc = pf.wait(timeout=20)
    err = "".join(pf.err)
    assert rc == 1, err
    assert (f"an error occurred forwarding {bad} -> 81: error forwarding port 81 to pod ") in err
    # (kubectl quotes the message: its inner quotes come out as \")
    assert ("failed to connect to localhost:81 inside namespace " in err
            and "IPv4: dial tcp4 127.0.0.1:81: connect: connection refused IPv6 " in err), err
    assert "lost connection to pod" in err
    # The server kept everything else working: a new session forwards fine.
    pf2 = PortForward(srv, f"pod/{pod}", [f"{good}:8080"])
    forwards.append(pf2)
    assert http_get(good).rstrip().endswith(PAGE)
    assert pf2.stop() == 0


def test_python_client_portforward(cluster: tuple[FleetServer, str]) -> None:
    from kubernetes import client, config
    from kubernetes.stream import portforward

    srv, pod = cluster
    api = client.CoreV1Api(config.new_client_from_config(str(srv.kubeconfig)))
    pf = portforward(api.connect_get_namespaced_pod_portforward, pod, NS, ports="8080,9090,81")
    try:
        web = pf.socket(8080)
        web.settimeout(20)
        web.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
        data = b""
        while not data.rstrip().endswith(PAGE.encode()):
            chunk = web.recv(4096)
            assert chunk, data
            data += chunk
        # The refused port reports the agent's error on its error channel and the
        # other ports keep working.
        refused = pf.socket(81)
        refused.settimeout(20)
        assert refused.recv(10) == b""
        assert "connect: connection refused" in (pf.error(81) or "")
        e = pf.socket(9090)
        e.settimeout(20)
        payload = os.urandom(100_000)
        e.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = e.recv(65536)
            assert chunk
            got += chunk
        assert got == payload
        assert pf.error(8080) is None and pf.error(9090) is None
    finally:
        pf.close()


def test_kubectl_cp_in_and_out(cluster: tuple[FleetServer, str], tmp_path: Path) -> None:
    srv, pod = cluster
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom(200_000))
    rc, out, err = run_kubectl(srv, "cp", str(src), f"{NS}/{pod}:/tmp/copied.bin", timeout=60)
    assert rc == 0, (out, err)
    rc, out, err = run_kubectl(srv, "exec", "-n", NS, pod, "--", "wc", "-c", "/tmp/copied.bin")
    assert rc == 0 and out.split()[0] == "200000", (out, err)
    back = tmp_path / "out.bin"
    rc, out, err = run_kubectl(srv, "cp", f"{NS}/{pod}:/tmp/copied.bin", str(back), timeout=60)
    assert rc == 0, (out, err)
    assert back.read_bytes() == src.read_bytes()
    # A directory, out of the pod.
    rc, out, err = run_kubectl(srv, "cp", f"{NS}/{pod}:/www", str(tmp_path / "www"), timeout=60)
    assert rc == 0, (out, err)
    assert (tmp_path / "www" / "index.html").read_text().strip() == PAGE


def test_clean_close_leaves_nothing(cluster: tuple[FleetServer, str],
                                    forwards: list[PortForward]) -> None:
    """SIGINT with a connection still open: kubectl exits 0, the pod's side of the connection
    ends, and the agent (built into the server process) holds no socket in the pod's network
    namespace any more."""
    srv, pod = cluster
    uid = run_kubectl(srv, "get", "pod", "-n", NS, pod, "-o", "jsonpath={.metadata.uid}")[1]
    netns = f"/run/fleet/netns/{uid}"
    assert os.path.exists(netns), netns

    def agent_sockets_in_pod() -> int:
        out = subprocess.run(["nsenter", f"--net={netns}", "ss", "-tnpH"], capture_output=True,
                             text=True, timeout=10).stdout
        return sum(f"pid={srv.pid}," in line for line in out.splitlines())

    def pod_connections() -> str:  # nc -ll runs one `cat` per connection
        return run_kubectl(srv, "exec", "-n", NS, pod, "--", "sh", "-c",
                           "ps -o comm | grep -cx cat || true")[1].strip()

    assert pod_connections() == "0" and agent_sockets_in_pod() == 0
    port = free_port()
    pf = PortForward(srv, f"pod/{pod}", [f"{port}:9090"])
    forwards.append(pf)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"ping\n")
        assert s.recv(10) == b"ping\n"
        assert pod_connections() == "1" and agent_sockets_in_pod() == 1
        assert pf.stop() == 0, pf.err
        assert s.recv(10) == b""  # kubectl closed our connection on its way out
    wait_until(lambda: pod_connections() == "0", timeout=20, what="the pod-side connection to end")
    wait_until(lambda: agent_sockets_in_pod() == 0, timeout=20, what="the agent's socket to close")
