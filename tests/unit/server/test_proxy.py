"""The API server's agent proxy: pure parts table-driven, then the relay in process.

The in-process tests drive `FleetASGI` with hand-made ASGI websocket messages
(no HTTP server) against a real trio-websocket "agent" on 127.0.0.1, and
`APIServer.handle` for the HTTP forms of the subresources.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio_websocket

from fleet.api import errors
from fleet.server import proxy
from fleet.server.asgi import create_app
from fleet.server.proxy import (
    AgentAddress,
    agent_address,
    agent_error,
    log_query,
    log_url,
    negotiate,
    offered_protocols,
    pump,
    select_container,
    stream_resource,
)
from fleet.testing.apiserver import TOKEN, open_api


def pod(*containers: str, inits: tuple[str, ...] = (), node: str | None = "n1") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": c, "image": "busybox"} for c in containers]}
    if inits:
        spec["initContainers"] = [{"name": c, "image": "busybox"} for c in inits]
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


# ---------------------------------------------------------------- containers
@pytest.mark.parametrize("containers,inits,requested,expected", [
    (("app",), (), None, "app"),
    (("app",), (), "", "app"),
    (("a", "b"), (), "b", "b"),
    (("a",), ("init",), "init", "init"),
    (("a", "b"), (), None,
     "a container name must be specified for pod p, choose one of: [a b]"),
    (("a", "b"), ("i",), None,
     "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [i]"),
    (("a",), (), "zzz", "container zzz is not valid for pod p"),
    ((), (), None, "pod p has no containers"),
])
def test_select_container(containers, inits, requested, expected):
    p = pod(*containers, inits=inits)
    if expected.startswith(("a container", "container ", "pod ")):
        with pytest.raises(errors.BadRequest) as info:
            select_container(p, requested)
        assert info.value.message == expected
    else:
        assert select_container(p, requested) == expected


# ------------------------------------------------------------ agent address
def node(addresses: list[tuple[str, str]], port: Any = 9301) -> dict[str, Any]:
    status: dict[str, Any] = {"addresses": [{"type": t, "address": a} for t, a in addresses]}
    if port is not None:
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
    return {"metadata": {"name": "n1"}, "status": status}


@pytest.mark.parametrize("addresses,port,expected", [
    ([("InternalIP", "10.0.0.5")], 9301, "10.0.0.5:9301"),
    ([("Hostname", "h1"), ("InternalIP", "10.0.0.5")], 9301, "10.0.0.5:9301"),
    ([("Hostname", "h1"), ("ExternalIP", "1.2.3.4")], 10250, "1.2.3.4:10250"),
    ([("Hostname", "h1")], 9301, "h1:9301"),
    ([("InternalIP", "fd00::5")], 9301, "[fd00::5]:9301"),
])
def test_agent_address(addresses, port, expected):
    assert agent_address(node(addresses, port)).netloc == expected


@pytest.mark.parametrize("addresses,port,fragment", [
    ([], 9301, "no preferred addresses found for node n1"),
    ([("InternalIP", "")], 9301, "no preferred addresses"),
    ([("InternalIP", "10.0.0.5")], None, "does not report its agent port"),
    ([("InternalIP", "10.0.0.5")], 0, "does not report its agent port"),
    ([("InternalIP", "10.0.0.5")], "9301", "does not report its agent port"),
])
def test_agent_address_errors(addresses, port, fragment):
    with pytest.raises(errors.ServiceUnavailable) as info:
        agent_address(node(addresses, port))
    assert fragment in info.value.message


# --------------------------------------------------------------------- logs
@pytest.mark.parametrize("query,expected", [
    ({}, {}),
    ({"follow": "true", "timestamps": "1", "previous": "false"}, {"follow": "true", "timestamps": "true"}),
    ({"tailLines": "0"}, {"tailLines": "0"}),
    ({"tailLines": "10", "sinceSeconds": "5", "limitBytes": "100"},
     {"tailLines": "10", "sinceSeconds": "5", "limitBytes": "100"}),
    ({"sinceTime": "2026-01-01T00:00:00Z"}, {"sinceTime": "2026-01-01T00:00:00Z"}),
    ({"container": "c", "pretty": "true", "insecureSkipTLSVerifyBackend": "true"}, {}),
])
def test_log_query(query, expected):
    assert log_query(query) == expected


@pytest.mark.parametrize("query,fragment", [
    ({"tailLines": "x"}, 'tailLines: Invalid value: "x": must be an integer'),
    ({"tailLines": "-1"}, "must be non-negative"),
    ({"sinceSeconds": "0"}, "sinceSeconds: Invalid value: 0: must be greater than 0"),
    ({"limitBytes": "0"}, "must be greater than 0"),
    ({"sinceSeconds": "5", "sinceTime": "2026-01-01T00:00:00Z"},
     "at most one of sinceTime or sinceSeconds may be specified"),
])
def test_log_query_errors(query, fragment):
    with pytest.raises(errors.BadRequest) as info:
        log_query(query)
    assert fragment in info.value.message


def test_log_url_quotes_path_and_passes_options():
    url = log_url(AgentAddress("127.0.0.1", 9301, "http"), "ns", "p", "c/1", {"follow": "true", "tailLines": "2"})
    assert url == "http://127.0.0.1:9301/containerLogs/ns/p/c%2F1?tailLines=2&follow=true"
    assert log_url(AgentAddress("::1", 1, "http"), "ns", "p", "c", {}) == "http://[::1]:1/containerLogs/ns/p/c"


def test_agent_scheme_from_the_node_annotation():
    # HTTPS unless the node says its agent has no TLS (a token-only agent).
    assert agent_address(node([("InternalIP", "10.0.0.1")])).scheme == "https"
    n = node([("InternalIP", "10.0.0.1")])
    n["metadata"]["annotations"] = {"fleet.dev/agent-api-scheme": "http"}
    assert agent_address(n).url("/x") == "http://10.0.0.1:9301/x"
    n["metadata"]["annotations"] = {"fleet.dev/agent-api-scheme": "bogus"}
    assert agent_address(n).url("/x") == "https://10.0.0.1:9301/x"


# --------------------------------------------------------------- exec query
def test_stream_resource_keeps_argv_and_normalizes_flags():
    q = [("command", "sh"), ("command", "-c"), ("command", "echo a b"), ("container", "c"),
         ("stdin", "1"), ("stdout", "true"), ("tty", "false"), ("other", "x")]
    assert stream_resource("exec", "ns", "p", "c", q) == (
        "/exec/ns/p/c?command=sh&command=-c&command=echo+a+b"
        "&stdin=true&stdout=true&stderr=false&tty=false")
    # attach carries no command, even when a client sends one
    assert stream_resource("attach", "ns", "p", "c", [("command", "x"), ("stdout", "true")]) == (
        "/attach/ns/p/c?stdin=false&stdout=true&stderr=false&tty=false")


@pytest.mark.parametrize("kind,query,fragment", [
    ("exec", [("stdout", "true")], "you must specify at least 1 command"),
    ("exec", [("command", "ls"), ("tty", "true")], "at least 1 of stdin, stdout, stderr"),
    ("attach", [], "at least 1 of stdin, stdout, stderr"),
])
def test_stream_resource_errors(kind, query, fragment):
    with pytest.raises(errors.BadRequest) as info:
        stream_resource(kind, "ns", "p", "c", query)
    assert fragment in info.value.message


# -------------------------------------------------------------- subprotocols
@pytest.mark.parametrize("offered,relayed,chosen", [
    (["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"],
     ["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"],
     "v5.channel.k8s.io"),
    (["v4.channel.k8s.io", "v5.channel.k8s.io"], ["v4.channel.k8s.io", "v5.channel.k8s.io"],
     "v4.channel.k8s.io"),
    (["chat", " channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"],
     ["channel.k8s.io", "v4.channel.k8s.io"], "channel.k8s.io"),
    (["chat", "superchat"], [], None),
    ([], [], None),
])
def test_subprotocols(offered, relayed, chosen):
    assert offered_protocols(offered) == relayed
    assert negotiate(offered) == chosen


def test_negotiate_respects_what_is_supported():
    assert negotiate(["v5.channel.k8s.io", "v4.channel.k8s.io"], ["v4.channel.k8s.io"]) == "v4.channel.k8s.io"


# ------------------------------------------------------------- agent errors
def test_agent_error_passes_status_through():
    body = json.dumps({"kind": "Status", "status": "Failure", "code": 400, "reason": "BadRequest",
                       "message": 'container "app" in pod "p" is waiting to start: ContainerCreating',
                       "details": {"name": "p", "kind": "pods"}}).encode()
    err = agent_error(400, body)
    assert (err.code, err.reason, err.name) == (400, "BadRequest", "p")
    assert err.status()["message"].endswith("ContainerCreating")


@pytest.mark.parametrize("code,body,reason", [
    (404, b"404 page not found", "NotFound"),
    (401, b"Unauthorized", "Unauthorized"),
    (500, b"boom", "InternalError"),
    (502, b"", "InternalError"),
])
def test_agent_error_from_text(code, body, reason):
    err = agent_error(code, body)
    assert err.reason == reason
    assert err.message == (body.decode() or f"the agent answered {code}")


# --------------------------------------------------------------------- pump
class FakeEndpoint:
    """Messages scripted in, messages recorded out; `None` in the script closes."""

    def __init__(self, script: list[bytes | str | None], *, stall: bool = False) -> None:
        self.script = list(script)
        self.stall = stall
        self.sent: list[bytes | str] = []
        self.closed_with: tuple[int, str] | None = None

    async def receive(self) -> bytes | str | None:
        await trio.sleep(0.001)
        if not self.script:
            if self.stall:
                await trio.sleep_forever()
            return None
        return self.script.pop(0)

    async def send(self, message: bytes | str) -> None:
        self.sent.append(message)

    async def close(self, code: int, reason: str) -> None:
        self.closed_with = (code, reason)


async def test_pump_agent_closes_first_client_gets_its_close_code():
    client = FakeEndpoint([b"\x00hello", "text frame"], stall=True)
    agent = FakeEndpoint([b"\x01out", b"\x03{}", None])
    with trio.fail_after(5):
        result = await pump(client, agent, lambda: (1000, "done"))
    assert result.closed_by == "agent"
    assert client.sent == [b"\x01out", b"\x03{}"]
    assert client.closed_with == (1000, "done")
    assert agent.closed_with is None


async def test_pump_client_closes_first_agent_is_closed():
    client = FakeEndpoint([b"\x00a", b"\x00b", b"\xff\x00", None])
    agent = FakeEndpoint([], stall=True)
    with trio.fail_after(5):
        result = await pump(client, agent, lambda: (1001, ""))
    assert (result.closed_by, result.to_agent, result.to_client) == ("client", 3, 0)
    assert agent.sent == [b"\x00a", b"\x00b", b"\xff\x00"]
    assert agent.closed_with == (1001, "")
    assert client.closed_with is None


# ------------------------------------------------------- through the server
NODE_NAME = "n1"


async def put_node(api: Any, port: int, *, with_port: bool = True) -> None:
    # A plain-HTTP test agent: the node says so (fleet.server.proxy.agent_address).
    code, body = await api.json("POST", "/api/v1/nodes", {"metadata": {"name": NODE_NAME, "annotations": {"fleet.dev/agent-api-scheme": "http"}}})
    assert code == 201, body
    status: dict[str, Any] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
    if with_port:
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
    code, body = await api.json("PATCH", f"/api/v1/nodes/{NODE_NAME}/status", {"status": status},
                                content_type="application/merge-patch+json")
    assert code == 200, body


async def put_pod(api: Any, name: str, *containers: str, node: str | None = NODE_NAME) -> None:
    p = pod(*containers, node=node)
    p["metadata"]["name"] = name
    code, body = await api.json("POST", "/api/v1/namespaces/default/pods", p)
    assert code == 201, body


async def test_http_forms_of_the_subresources(tmp_path):
    async with open_api(tmp_path) as api:
        await put_node(api, 1, with_port=False)
        await put_pod(api, "bound", "app")
        await put_pod(api, "unbound", "app", node=None)
        base = "/api/v1/namespaces/default/pods"
        cases = [
            ("GET", f"{base}/missing/log", {}, 404, 'pods "missing" not found'),
            ("GET", f"{base}/unbound/log", {}, 400, "pod unbound does not have a host assigned"),
            ("GET", f"{base}/bound/log", {"container": "x"}, 400, "container x is not valid for pod bound"),
            ("GET", f"{base}/bound/log", {}, 503, "does not report its agent port"),
            ("PUT", f"{base}/bound/log", {}, 405, "PUT is not supported on pods/log"),
            ("POST", f"{base}/bound/exec", {"command": "ls"}, 503, "does not report its agent port"),
            ("POST", f"{base}/unbound/exec", {"command": "ls"}, 400, "does not have a host assigned"),
            ("DELETE", f"{base}/bound/attach", {}, 405, "DELETE is not supported on pods/attach"),
            ("GET", "/api/v1/nodes/n1/log", {}, 404, "could not find the requested resource"),
        ]
        for method, path, query, code, fragment in cases:
            got, body = await api.json(method, path, query=query)
            assert (got, body["kind"]) == (code, "Status"), (method, path, body)
            assert fragment in body["message"], (method, path, body)
        got, body = await api.json("GET", f"{base}/bound/log", token=None)
        assert got == 401


async def test_spdy_post_is_refused_when_the_pod_resolves(tmp_path):
    async with open_api(tmp_path) as api:
        await put_node(api, 9301)
        await put_pod(api, "p", "app")
        got, body = await api.json("POST", "/api/v1/namespaces/default/pods/p/exec",
                                   query={"command": "ls", "stdout": "true"})
        assert got == 400
        assert "over WebSocket only" in body["message"]


async def test_logs_agent_unreachable_is_503(tmp_path):
    # A port nothing listens on: bind, learn the number, close.
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()
    async with open_api(tmp_path) as api:
        await put_node(api, port)
        await put_pod(api, "p", "app")
        got, body = await api.json("GET", "/api/v1/namespaces/default/pods/p/log")
        assert got == 503
        assert f"127.0.0.1:{port}/containerLogs/default/p/app" in body["message"]


class ASGIClient:
    """Plays hypercorn's part for one websocket scope: scripted receive, recorded send."""

    def __init__(self, path: str, query: bytes, *, token: str | None = TOKEN,
                 subprotocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io")) -> None:
        headers = [(b"host", b"127.0.0.1")]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        self.scope = {"type": "websocket", "path": path, "query_string": query, "headers": headers,
                      "subprotocols": list(subprotocols),
                      "extensions": {"websocket.http.response": {}}}
        self.inbox_send, self.inbox = trio.open_memory_channel[dict[str, Any]](100)
        self.sent: list[dict[str, Any]] = []
        self.accepted = trio.Event()
        self.closed = trio.Event()
        self.inbox_send.send_nowait({"type": "websocket.connect"})

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.receive()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "websocket.accept":
            self.accepted.set()
        if message["type"] in ("websocket.close", "websocket.http.response.body"):
            self.closed.set()

    def client_sends(self, data: bytes) -> None:
        self.inbox_send.send_nowait({"type": "websocket.receive", "bytes": data})

    def frames(self) -> list[bytes]:
        return [m["bytes"] for m in self.sent if m["type"] == "websocket.send"]

    def rejection(self) -> tuple[int, dict[str, Any]]:
        start = next(m for m in self.sent if m["type"] == "websocket.http.response.start")
        body = next(m for m in self.sent if m["type"] == "websocket.http.response.body")
        return start["status"], json.loads(body["body"])


async def serve_agent(nursery: trio.Nursery, seen: list[Any]) -> int:
    """A trio-websocket agent: checks the token, echoes stdin until [255, 0], exits 3."""

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        auth = dict(request.headers).get(b"authorization", b"").decode()
        seen.append((request.path, request.proposed_subprotocols, auth))
        if auth != f"Bearer {TOKEN}":
            await request.reject(401, body=b"Unauthorized")
            return
        proto = next(p for p in request.proposed_subprotocols if p in ("v5.channel.k8s.io",
                                                                       "v4.channel.k8s.io"))
        ws = await request.accept(subprotocol=proto)
        while True:
            msg = await ws.get_message()
            if msg == b"\xff\x00":
                break
            await ws.send_message(b"\x01" + msg[1:])
        await ws.send_message(b'\x03{"status":"Failure","reason":"NonZeroExitCode",'
                              b'"details":{"causes":[{"reason":"ExitCode","message":"3"}]}}')
        await ws.aclose(1000, "exited")

    server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
    return server.port


async def test_websocket_relay_end_to_end_in_process(tmp_path):
    seen: list[Any] = []
    async with open_api(tmp_path) as api, trio.open_nursery() as nursery:
        port = await serve_agent(nursery, seen)
        await put_node(api, port)
        await put_pod(api, "p", "app")
        app = create_app(api.server)
        client = ASGIClient("/api/v1/namespaces/default/pods/p/exec",
                            b"command=cat&command=-u&stdin=true&stdout=true",
                            subprotocols=("v4.channel.k8s.io", "v5.channel.k8s.io"))
        with trio.fail_after(10):
            async with trio.open_nursery() as inner:
                inner.start_soon(app, client.scope, client.receive, client.send)
                await client.accepted.wait()
                client.client_sends(b"\x00hello")
                client.client_sends(b"\xff\x00")
                await client.closed.wait()
        nursery.cancel_scope.cancel()
    accept = client.sent[0]
    # The client's first choice, which the agent also supports, is what both sides speak.
    assert accept == {"type": "websocket.accept", "subprotocol": "v4.channel.k8s.io"}
    assert client.frames()[0] == b"\x01hello"
    assert json.loads(client.frames()[1][1:])["reason"] == "NonZeroExitCode"
    assert client.sent[-1] == {"type": "websocket.close", "code": 1000, "reason": "exited"}
    path, protocols, auth = seen[0]
    assert path == ("/exec/default/p/app?command=cat&command=-u"
                    "&stdin=true&stdout=true&stderr=false&tty=false")
    assert list(protocols) == ["v4.channel.k8s.io", "v5.channel.k8s.io"]
    assert auth == f"Bearer {TOKEN}"


@pytest.mark.parametrize("path,query,token,protocols,code,fragment", [
    ("/api/v1/namespaces/default/pods/p/exec", b"command=ls&stdout=1", None,
     ("v5.channel.k8s.io",), 401, "Unauthorized"),
    ("/api/v1/namespaces/default/pods/nope/exec", b"command=ls&stdout=1", TOKEN,
     ("v5.channel.k8s.io",), 404, 'pods "nope" not found'),
    ("/api/v1/namespaces/default/pods/p/exec", b"stdout=1", TOKEN,
     ("v5.channel.k8s.io",), 400, "you must specify at least 1 command"),
    ("/api/v1/namespaces/default/pods/p/attach", b"stdout=1&container=zz", TOKEN,
     ("v5.channel.k8s.io",), 400, "container zz is not valid for pod p"),
    ("/api/v1/namespaces/default/pods/p/exec", b"command=ls&stdout=1", TOKEN,
     ("chat",), 400, "none of the requested subprotocols are supported"),
    ("/api/v1/namespaces/default/configmaps/p/exec", b"command=ls&stdout=1", TOKEN,
     ("v5.channel.k8s.io",), 404, "could not find the requested resource"),
])
async def test_websocket_refusals_carry_a_status(tmp_path, path, query, token, protocols, code, fragment):
    async with open_api(tmp_path) as api:
        await put_node(api, 9301)
        await put_pod(api, "p", "app")
        client = ASGIClient(path, query, token=token, subprotocols=protocols)
        with trio.fail_after(10):
            await create_app(api.server)(client.scope, client.receive, client.send)
        status, body = client.rejection()
        assert (status, body["kind"], body["code"]) == (code, "Status", code)
        assert fragment in body["message"]


async def test_websocket_agent_refusal_is_passed_on(tmp_path):
    seen: list[Any] = []
    async with open_api(tmp_path) as api, trio.open_nursery() as nursery:
        port = await serve_agent(nursery, seen)
        await put_node(api, port)
        await put_pod(api, "p", "app")
        api.server.pods.token = "wrong"
        client = ASGIClient("/api/v1/namespaces/default/pods/p/exec", b"command=ls&stdout=1")
        with trio.fail_after(10):
            await create_app(api.server)(client.scope, client.receive, client.send)
        nursery.cancel_scope.cancel()
    status, body = client.rejection()
    assert (status, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")


def test_admin_token_from_authenticator():
    from fleet.auth import ADMIN, TokenAuthenticator, UserInfo

    auth = TokenAuthenticator({"someone": UserInfo("bob"), "root-token": ADMIN})
    assert proxy.admin_token_from(auth) == "root-token"
    assert proxy.admin_token_from(object()) is None
