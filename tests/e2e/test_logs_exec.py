"""kubectl / kfleet logs, exec and attach through the API server's agent proxy.

The API server relays `pods/log`, `pods/exec` and `pods/attach` to the agent of
the pod's node.  These tests put a FAKE agent behind it — a real HTTP and
WebSocket server on 127.0.0.1 with canned answers — so what is checked is the
server's side and the clients: real kubectl 1.32 (WebSocket, v5.channel.k8s.io)
and kfleet.  A Node object points at the fake agent (status.addresses
InternalIP 127.0.0.1, daemonEndpoints.kubeletEndpoint.Port) and the pods are
bound to it by spec.nodeName.

The fake agent's behaviour:
- logs: "line 1" .. "line 3" (timestamps 2026-01-01T00:00:0N.000000000Z when
  asked), `previous` gives "previous run", `follow` adds "line 4" after a
  delay and then ends the stream;
- exec `cat`: stdin echoed to stdout until stdin closes (v5 close frame);
  `sh -c "exit N"`: exit status N (channel 3 NonZeroExitCode);
  `sh -c "echo out; echo err >&2"`: one line each on stdout and stderr;
  `stty size`: waits for a resize frame and prints "rows cols";
- attach: "attached to C" on stdout, then stdin echoed like cat.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import pytest
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from tests.conftest import KUBECTL, REPO_ROOT, FleetServer, _server_env

TIMESTAMP = "2026-01-01T00:00:0{}.000000000Z"
LINES = ["line 1", "line 2", "line 3"]
FOLLOW_DELAY = 0.3
CMD_TIMEOUT = 20.0


def _status(code: int | None, message: str = "") -> bytes:
    if code == 0:
        doc: dict[str, Any] = {"metadata": {}, "status": "Success"}
    elif code is None:
        doc = {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"}
    else:
        doc = {"metadata": {}, "status": "Failure",
               "message": f"command terminated with non-zero exit code: exit status {code}",
               "reason": "NonZeroExitCode",
               "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
    return b"\x03" + json.dumps(doc).encode()


@dataclass
class FakeAgent:
    """A kubelet-style agent API with canned behaviour, served by hypercorn in a thread."""

    token: str
    port: int = 0
    seen: list[tuple[str, str, list[tuple[str, str]], str]] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _trio_token: trio.lowlevel.TrioToken | None = None
    _stop: trio.Event | None = None

    # -- ASGI app ---------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        query = parse_qsl(scope["query_string"].decode(), keep_blank_values=True)
        parts = scope["path"].strip("/").split("/")
        if scope["path"] != "/metrics/resource":  # the API server's periodic metrics scrape
            self.seen.append((scope["type"], scope["path"], query,
                              headers.get("authorization", "")))
        authorized = headers.get("authorization") == f"Bearer {self.token}"
        if scope["type"] == "http":
            await receive()
            if not authorized:
                await _http(send, 401, b"Unauthorized", "text/plain")
            elif parts[0] == "containerLogs" and len(parts) == 4:
                await self.logs(send, parts[3], dict(query))
            else:
                await _http(send, 404, b"404 page not found", "text/plain")
            return
        await receive()  # websocket.connect
        if not authorized:
            await send({"type": "websocket.http.response.start", "status": 401, "headers": []})
            await send({"type": "websocket.http.response.body", "body": b"Unauthorized"})
            return
        if parts[0] not in ("exec", "attach") or len(parts) != 4:
            await send({"type": "websocket.close"})
            return
        offered = scope.get("subprotocols") or []
        proto = next((p for p in offered if p in ("v5.channel.k8s.io", "v4.channel.k8s.io")), None)
        if proto is None:
            await send({"type": "websocket.http.response.start", "status": 400, "headers": []})
            await send({"type": "websocket.http.response.body", "body": b"no supported protocol"})
            return
        await send({"type": "websocket.accept", "subprotocol": proto})
        if parts[0] == "exec":
            await self.exec(receive, send, [v for k, v in query if k == "command"])
        else:
            await send({"type": "websocket.send", "bytes": f"\x01attached to {parts[3]}\n".encode()})
            await self.cat(receive, send)
        await send({"type": "websocket.close", "code": 1000})

    async def logs(self, send: Any, container: str, query: dict[str, str]) -> None:
        lines = ["previous run"] if query.get("previous") == "true" else list(LINES)
        stamps = query.get("timestamps") == "true"
        numbered = list(enumerate(lines, 1))
        if "tailLines" in query:
            numbered = numbered[len(numbered) - int(query["tailLines"]):]
        body = "".join((f"{TIMESTAMP.format(i)} " if stamps else "") + f"{text} [{container}]\n"
                       for i, text in numbered)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body.encode(), "more_body": True})
        if query.get("follow") == "true":
            await trio.sleep(FOLLOW_DELAY)
            tail = (f"{TIMESTAMP.format(4)} " if stamps else "") + f"line 4 [{container}]\n"
            await send({"type": "http.response.body", "body": tail.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def exec(self, receive: Any, send: Any, argv: list[str]) -> None:
        if argv == ["cat"]:
            await self.cat(receive, send)
            await send({"type": "websocket.send", "bytes": _status(0)})
        elif argv[:2] == ["sh", "-c"] and argv[2].startswith("exit "):
            await send({"type": "websocket.send", "bytes": _status(int(argv[2].split()[1]))})
        elif argv == ["sh", "-c", "echo out; echo err >&2"]:
            await send({"type": "websocket.send", "bytes": b"\x01out\n"})
            await send({"type": "websocket.send", "bytes": b"\x02err\n"})
            await send({"type": "websocket.send", "bytes": _status(0)})
        elif argv == ["stty", "size"]:
            with trio.move_on_after(CMD_TIMEOUT):
                while True:
                    msg = await receive()
                    data = msg.get("bytes") or b""
                    if msg["type"] != "websocket.receive":
                        return
                    if data[:1] == b"\x04":
                        size = json.loads(data[1:])
                        out = f"{size['Height']} {size['Width']}\r\n".encode()
                        await send({"type": "websocket.send", "bytes": b"\x01" + out})
                        break
            await send({"type": "websocket.send", "bytes": _status(0)})
        else:
            await send({"type": "websocket.send",
                        "bytes": _status(None, f'exec: "{argv[0] if argv else ""}": not found')})

    async def cat(self, receive: Any, send: Any) -> None:
        """Echo stdin (channel 0) to stdout until stdin closes (v5: 255,0) or the client leaves."""
        with trio.move_on_after(CMD_TIMEOUT):
            while True:
                msg = await receive()
                if msg["type"] != "websocket.receive":
                    return
                data = msg.get("bytes") or b""
                if data[:1] == b"\x00" and len(data) > 1:
                    await send({"type": "websocket.send", "bytes": b"\x01" + data[1:]})
                elif data == b"\xff\x00":
                    return

    # -- lifecycle --------------------------------------------------------
    def start(self) -> FakeAgent:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        ready = threading.Event()

        async def main() -> None:
            self._trio_token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            cfg = HyperConfig()
            cfg.bind = [f"fd://{sock.fileno()}"]
            cfg.accesslog = None
            cfg.graceful_timeout = 1
            ready.set()
            await serve(self, cfg, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        def thread_main() -> None:
            try:
                trio.run(main)
            finally:
                # hypercorn closed the listening fd it was handed; forget it here.
                sock.detach()

        self._thread = threading.Thread(target=thread_main, name="fake-agent", daemon=True)
        self._thread.start()
        assert ready.wait(10), "fake agent did not start"
        return self

    def stop(self) -> None:
        if self._thread is None or self._stop is None:
            return
        try:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._trio_token)
        except trio.RunFinishedError:
            pass
        self._thread.join(10)
        assert not self._thread.is_alive(), "fake agent did not stop"


async def _http(send: Any, status: int, body: bytes, ctype: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype.encode())]})
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def agent(fleet_server: FleetServer) -> Iterator[FakeAgent]:
    fake = FakeAgent(fleet_server.token).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def node(fleet_server: FleetServer, agent: FakeAgent) -> str:
    """A Node whose agent address is the fake agent."""
    name = f"fake-node-{uuid.uuid4().hex[:6]}"
    with fleet_server.client() as c:
        r = c.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node",
                                          "metadata": {"name": name, "annotations": {"fleet.dev/agent-api-scheme": "http"}}})
        assert r.status_code == 201, r.text
        r = c.patch(f"/api/v1/nodes/{name}/status", headers={
            "Content-Type": "application/merge-patch+json"}, content=json.dumps({"status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": agent.port}},
                "conditions": [{"type": "Ready", "status": "True"}]}}))
        assert r.status_code == 200, r.text
    return name


def make_pod(srv: FleetServer, namespace: str, name: str, node: str | None,
             containers: tuple[str, ...] = ("app",)) -> None:
    spec: dict[str, Any] = {"containers": [{"name": c, "image": "busybox"} for c in containers]}
    if node:
        spec["nodeName"] = node
    with srv.client() as c:
        r = c.post(f"/api/v1/namespaces/{namespace}/pods", json={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
        assert r.status_code == 201, r.text
        # kubectl attach/exec refuse completed pods and attach waits for Running.
        r = c.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", headers={
            "Content-Type": "application/merge-patch+json"}, content=json.dumps({"status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": c, "ready": True, "restartCount": 0, "image": "busybox",
                                       "imageID": "", "state": {"running": {
                                           "startedAt": "2026-01-01T00:00:00Z"}}}
                                      for c in containers]}}))
        assert r.status_code == 200, r.text


@pytest.fixture
def pod(fleet_server: FleetServer, namespace: str, node: str) -> tuple[str, str]:
    make_pod(fleet_server, namespace, "p", node)
    return namespace, "p"


def kfleet(srv: FleetServer, *args: str, input: str | None = None,
           timeout: float = CMD_TIMEOUT, env: dict[str, str] | None = None
           ) -> tuple[int, str, str]:
    full_env = _server_env()
    full_env.pop("KUBECONFIG", None)
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-m", "fleet.cli.kfleet", "--kubeconfig", str(srv.kubeconfig),
                        *args], input=input, capture_output=True, text=True, timeout=timeout,
                       env=full_env, cwd=str(REPO_ROOT))
    return p.returncode, p.stdout, p.stderr


needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


# ------------------------------------------------------------- kubectl logs
@needs_kubectl
def test_kubectl_logs(fleet_server: FleetServer, pod: tuple[str, str], agent: FakeAgent) -> None:
    ns, name = pod
    rc, out, err = fleet_server.kubectl("-n", ns, "logs", name, timeout=CMD_TIMEOUT)
    assert rc == 0, err
    assert out == "line 1 [app]\nline 2 [app]\nline 3 [app]\n"
    # The proxy authenticated to the agent with the cluster token.
    kind, path, _, auth = agent.seen[-1]
    assert (kind, path, auth) == ("http", f"/containerLogs/{ns}/{name}/app",
                                  f"Bearer {fleet_server.token}")


@needs_kubectl
def test_kubectl_logs_tail_timestamps_previous(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    ns, name = pod
    rc, out, err = fleet_server.kubectl("-n", ns, "logs", name, "--tail=1", "--timestamps",
                                        timeout=CMD_TIMEOUT)
    assert rc == 0, err
    assert out == f"{TIMESTAMP.format(3)} line 3 [app]\n"
    rc, out, err = fleet_server.kubectl("-n", ns, "logs", name, "--previous", "-c", "app",
                                        timeout=CMD_TIMEOUT)
    assert (rc, out) == (0, "previous run [app]\n"), err


@needs_kubectl
def test_kubectl_logs_follow_streams(fleet_server: FleetServer, pod: tuple[str, str],
                                     agent: FakeAgent) -> None:
    ns, name = pod
    t0 = time.monotonic()
    rc, out, err = fleet_server.kubectl("-n", ns, "logs", "-f", name, "--since=10s",
                                        timeout=CMD_TIMEOUT)
    assert rc == 0, err
    assert out.splitlines() == ["line 1 [app]", "line 2 [app]", "line 3 [app]", "line 4 [app]"]
    assert time.monotonic() - t0 >= FOLLOW_DELAY
    _, _, query, _ = agent.seen[-1]
    assert dict(query) == {"follow": "true", "sinceSeconds": "10"}


@needs_kubectl
def test_kubectl_logs_errors(fleet_server: FleetServer, namespace: str, node: str) -> None:
    rc, _, err = fleet_server.kubectl("-n", namespace, "logs", "nope", timeout=CMD_TIMEOUT)
    assert rc != 0 and 'pods "nope" not found' in err
    make_pod(fleet_server, namespace, "unbound", None)
    rc, _, err = fleet_server.kubectl("-n", namespace, "logs", "unbound", timeout=CMD_TIMEOUT)
    assert rc != 0 and "pod unbound does not have a host assigned" in err
    make_pod(fleet_server, namespace, "two", node, ("a", "b"))
    rc, _, err = fleet_server.kubectl("-n", namespace, "logs", "two", "-c", "zzz",
                                      timeout=CMD_TIMEOUT)
    assert rc != 0 and "container zzz is not valid for pod two" in err
    # Without -c kubectl picks the first container itself (and says so).
    rc, out, err = fleet_server.kubectl("-n", namespace, "logs", "two", timeout=CMD_TIMEOUT)
    assert rc == 0 and out.startswith("line 1 [a]"), err
    # The server's own default-container rule, seen without kubectl's help.
    with fleet_server.client() as c:
        r = c.get(f"/api/v1/namespaces/{namespace}/pods/two/log")
    assert r.status_code == 400
    assert r.json()["message"] == ("a container name must be specified for pod two, "
                                   "choose one of: [a b]")


# ------------------------------------------------------------- kubectl exec
@needs_kubectl
def test_kubectl_exec_exit_code(fleet_server: FleetServer, pod: tuple[str, str],
                                agent: FakeAgent) -> None:
    ns, name = pod
    rc, _, err = fleet_server.kubectl("-n", ns, "exec", name, "--", "sh", "-c", "exit 3",
                                      timeout=CMD_TIMEOUT)
    assert rc == 3, err
    assert "command terminated with exit code 3" in err
    kind, path, query, _ = agent.seen[-1]
    assert (kind, path) == ("websocket", f"/exec/{ns}/{name}/app")
    assert [v for k, v in query if k == "command"] == ["sh", "-c", "exit 3"]


@needs_kubectl
def test_kubectl_exec_stdout_stderr(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    ns, name = pod
    rc, out, err = fleet_server.kubectl("-n", ns, "exec", name, "--", "sh", "-c",
                                        "echo out; echo err >&2", timeout=CMD_TIMEOUT)
    assert (rc, out) == (0, "out\n"), err
    assert "err\n" in err


@needs_kubectl
def test_kubectl_exec_stdin(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    ns, name = pod
    rc, out, err = fleet_server.kubectl("-n", ns, "exec", "-i", name, "--", "cat",
                                        input="hello\n", timeout=CMD_TIMEOUT)
    assert (rc, out) == (0, "hello\n"), err


@needs_kubectl
def test_kubectl_exec_errors(fleet_server: FleetServer, namespace: str) -> None:
    rc, _, err = fleet_server.kubectl("-n", namespace, "exec", "nope", "--", "true",
                                      timeout=CMD_TIMEOUT)
    assert rc != 0 and 'pods "nope" not found' in err
    make_pod(fleet_server, namespace, "unbound", None)
    rc, _, err = fleet_server.kubectl("-n", namespace, "exec", "unbound", "--", "true",
                                      timeout=CMD_TIMEOUT)
    assert rc != 0 and "pod unbound does not have a host assigned" in err


@needs_kubectl
def test_kubectl_agent_down_reports_the_cause(fleet_server: FleetServer, namespace: str) -> None:
    """kubectl retries a refused WebSocket exec over SPDY and prints that error: it must be the cause."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # closed again: nothing listens there
    name = f"dead-node-{uuid.uuid4().hex[:6]}"
    with fleet_server.client() as c:
        assert c.post("/api/v1/nodes", json={"metadata": {"name": name, "annotations": {"fleet.dev/agent-api-scheme": "http"}}}).status_code == 201
        r = c.patch(f"/api/v1/nodes/{name}/status", headers={
            "Content-Type": "application/merge-patch+json"}, content=json.dumps({"status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": dead_port}}}}))
        assert r.status_code == 200, r.text
    make_pod(fleet_server, namespace, "p", name)
    rc, _, err = fleet_server.kubectl("-n", namespace, "exec", "p", "--", "true", timeout=CMD_TIMEOUT)
    assert rc != 0 and f"error dialing the agent at ws://127.0.0.1:{dead_port}/exec/" in err, err
    rc, _, err = fleet_server.kubectl("-n", namespace, "logs", "p", timeout=CMD_TIMEOUT)
    assert rc != 0 and f"127.0.0.1:{dead_port}/containerLogs/{namespace}/p/app" in err, err


@needs_kubectl
def test_kubectl_attach(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    ns, name = pod
    rc, out, err = fleet_server.kubectl("-n", ns, "attach", "-i", name, "-q", input="typed\n",
                                        timeout=CMD_TIMEOUT)
    assert rc == 0, err
    assert out == "attached to app\ntyped\n"


def test_websocket_needs_token(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    """The upgrade is authenticated like every request: no token, no session."""
    ns, name = pod

    async def main() -> int:
        import trio_websocket

        url = fleet_server.url.replace("https://", "wss://")
        with pytest.raises(trio_websocket.ConnectionRejected) as info:
            async with trio_websocket.open_websocket_url(
                    f"{url}/api/v1/namespaces/{ns}/pods/{name}/exec?command=cat&stdin=true",
                    ssl_context=fleet_server.verify(), subprotocols=["v5.channel.k8s.io"]):
                pass
        body = json.loads(info.value.body or b"{}")
        assert body["reason"] == "Unauthorized"
        return info.value.status_code

    assert trio.run(main) == 401


def test_spdy_post_is_refused_with_status(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    ns, name = pod
    with fleet_server.client() as c:
        r = c.post(f"/api/v1/namespaces/{ns}/pods/{name}/exec?command=true&stdout=true",
                   headers={"Upgrade": "SPDY/3.1", "Connection": "Upgrade"})
        assert r.status_code == 400
        assert "WebSocket" in r.json()["message"]
        r = c.post(f"/api/v1/namespaces/{ns}/pods/missing/attach?stdout=true")
        assert r.status_code == 404


def test_discovery_lists_stream_subresources(fleet_server: FleetServer) -> None:
    with fleet_server.client() as c:
        doc = c.get("/api/v1").json()
    names = {r["name"]: r for r in doc["resources"]}
    assert names["pods/log"]["verbs"] == ["get"]
    assert set(names["pods/exec"]["verbs"]) == {"create", "get"}
    assert set(names["pods/attach"]["verbs"]) == {"create", "get"}


# -------------------------------------------------------------- kfleet
def test_kfleet_logs(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    ns, name = pod
    rc, out, err = kfleet(fleet_server, "logs", name, "-n", ns)
    assert (rc, out) == (0, "line 1 [app]\nline 2 [app]\nline 3 [app]\n"), err
    rc, out, err = kfleet(fleet_server, "logs", name, "-n", ns, "--tail", "2", "--timestamps")
    assert rc == 0, err
    assert out == f"{TIMESTAMP.format(2)} line 2 [app]\n{TIMESTAMP.format(3)} line 3 [app]\n"
    rc, out, err = kfleet(fleet_server, "logs", name, "-n", ns, "-f", "--since", "1m", "-c", "app")
    assert rc == 0, err
    assert out.splitlines()[-1] == "line 4 [app]"
    rc, out, err = kfleet(fleet_server, "logs", name, "-n", ns, "--previous")
    assert (rc, out) == (0, "previous run [app]\n"), err
    rc, _, err = kfleet(fleet_server, "logs", "nope", "-n", ns)
    assert rc == 1 and 'Error from server (NotFound): pods "nope" not found' in err


def test_kfleet_exec(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    ns, name = pod
    rc, _, err = kfleet(fleet_server, "exec", name, "-n", ns, "--", "sh", "-c", "exit 3")
    assert rc == 3, err
    assert "command terminated with exit code 3" in err
    rc, out, err = kfleet(fleet_server, "exec", name, "-n", ns, "--", "sh", "-c",
                          "echo out; echo err >&2")
    assert (rc, out, err) == (0, "out\n", "err\n")
    rc, out, err = kfleet(fleet_server, "exec", "-i", name, "-n", ns, "--", "cat",
                          input="hello\nworld\n")
    assert (rc, out) == (0, "hello\nworld\n"), err
    rc, out, err = kfleet(fleet_server, "exec", name, "-n", ns, "--", "nosuchcmd")
    assert rc == 1 and 'exec: "nosuchcmd": not found' in err


def test_kfleet_exec_tty_sends_size(fleet_server: FleetServer, pod: tuple[str, str]) -> None:
    """-it on a terminal: raw mode, tty=true, and the terminal's size as a resize message."""
    ns, name = pod
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 123, 0, 0))
        env = _server_env()
        p = subprocess.run([sys.executable, "-m", "fleet.cli.kfleet", "--kubeconfig",
                            str(fleet_server.kubeconfig), "exec", "-i", "-t", name, "-n", ns, "--",
                            "stty", "size"], stdin=slave, capture_output=True, timeout=CMD_TIMEOUT,
                           env=env, cwd=str(REPO_ROOT))
    finally:
        os.close(slave)
        os.close(master)
    assert (p.returncode, p.stdout) == (0, b"45 123\r\n"), p.stderr


def test_kfleet_attach_errors(fleet_server: FleetServer, namespace: str) -> None:
    rc, _, err = kfleet(fleet_server, "exec", "nope", "-n", namespace, "--", "true")
    assert rc == 1 and 'pods "nope" not found' in err

