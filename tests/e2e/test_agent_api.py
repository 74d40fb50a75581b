"""The agent API end to end: real containers, `serve()` on a free loopback port, and
clients speaking HTTP (httpx) and the WebSocket channel protocol (trio-websocket), the
way the API server's proxy and kubectl do.

Containers run under `select_driver`: the oci driver (runc, a busybox layer built here
as in test_runtime_oci) when root with runc, else the process driver — the API is the
same either way, which is the point of the Driver protocol.  Every test gets its own
state dir, pod and server; the fixture removes all containers and checks nothing stayed
mounted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    open_websocket_url,
)

from fleet.agent import channels
from fleet.agent.api import ContainerLocator, LocatedContainer, LocateError, serve
from fleet.runtime.driver import ContainerHandle, ShimDriver, select_driver
from tests.e2e.test_runtime_oci import BUSYBOX, make_busybox_layer, mounts_under
from tests.e2e.test_runtime_process import cleanup_driver, sandbox_spec, wait_log

TOKEN = "agent-test-token"
NS = "default"
POD = "web"
PROTOCOLS = [channels.V5, channels.V4]
LONG = 20000  # longer than the shim's 16 KiB line limit: logged as P + F records

# The main container: a stderr line, a stdout line, an over-long line, then it echoes
# stdin lines ("got X" on stdout, "err X" on stderr) until it reads "quit".
MAIN_SCRIPT = (
    "echo one >&2; sleep 0.2; echo two; "
    f"head -c {LONG} /dev/zero | tr '\\0' x; echo; "
    'while read line; do [ "$line" = quit ] && exit 0; '
    'echo "got $line"; echo "err $line" >&2; done'
)

pytestmark = pytest.mark.skipif(
    os.geteuid() == 0 and not os.path.exists(BUSYBOX),
    reason="needs busybox-static for the container image when running the oci driver")


@dataclass
class Pod:
    uid: str
    containers: dict[str, LocatedContainer] = field(default_factory=dict)


class Locator(ContainerLocator):
    """The agent's pod sync, reduced to a dict."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Pod] = {}

    def find(self, namespace: str, pod: str, container: str | None) -> LocatedContainer | None:
        p = self.pods.get((namespace, pod))
        if p is None:
            return None
        if container is None:
            if len(p.containers) != 1:
                raise LocateError.container_required(pod, sorted(p.containers))
            return next(iter(p.containers.values()))
        if container not in p.containers:
            raise LocateError.invalid_container(container, pod)
        return p.containers[container]

    def all(self) -> list[tuple[str, str, str, list[tuple[str, LocatedContainer]]]]:
        return [(ns, name, p.uid, list(p.containers.items()))
                for (ns, name), p in self.pods.items()]


@dataclass
class Agent:
    driver: ShimDriver
    locator: Locator
    url: str
    layer: Path
    sandbox: Any

    @property
    def ws_url(self) -> str:
        return "ws" + self.url[len("http"):]

    async def start(self, name: str, script: str, *, stdin: bool = False, tty: bool = False,
                    pod: str = POD) -> ContainerHandle:
        from fleet.runtime.driver import ContainerSpec
        h = await self.driver.start(self.sandbox, ContainerSpec(
            name=name, layers=[self.layer], command=["sh", "-c", script], stdin=stdin,
            tty=tty))
        p = self.locator.pods.setdefault((NS, pod), Pod(self.sandbox.id))
        p.containers[name] = LocatedContainer(
            driver=self.driver, handle=h, log_path=h.log_path,
            previous_log_path=None,
            stdin_path=self.driver.stdin_path(h) if stdin else None, tty=tty, name=name)
        return h

    def http(self, token: str | None = TOKEN) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10)


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        return Path("/")  # the process driver ignores layers
    return make_busybox_layer(tmp_path_factory.mktemp("layer") / "busybox")


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="fleet-agent-api-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        for m in sorted(mounts_under(d), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=False)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def agent(base: Path, layer: Path, nursery: trio.Nursery) -> AsyncIterator[Agent]:
    driver = select_driver(base / "state")
    assert isinstance(driver, ShimDriver)
    sandbox = await driver.create_sandbox(sandbox_spec(base, POD))
    locator = Locator()
    try:
        url = await nursery.start(lambda task_status: serve(
            locator, address="127.0.0.1", port=0, token=TOKEN, node_name="node-a",
            task_status=task_status))
        a = Agent(driver, locator, url, layer, sandbox)
        yield a
    finally:
        problems = await cleanup_driver(driver)
        assert not problems, problems
        assert not mounts_under(base), f"still mounted: {mounts_under(base)}"


async def main(agent: Agent) -> ContainerHandle:
    h = await agent.start("main", MAIN_SCRIPT, stdin=True)
    await wait_log(h, "x" * 100)
    return h


def open_files() -> set[str]:
    """Paths this (test + server) process has open."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return out


def write_stdin(agent: Agent, line: str) -> None:
    path = agent.locator.pods[(NS, POD)].containers["main"].stdin_path
    assert path is not None
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------
# WebSocket client, as client-go's remotecommand does it


@dataclass
class Session:
    protocol: str
    frames: list[tuple[int, bytes]] = field(default_factory=list)

    def data(self, channel: int) -> bytes:
        return b"".join(d for c, d in self.frames if c == channel)

    def status(self) -> dict[str, Any]:
        raw = self.data(channels.ERROR)
        assert raw, f"no status on the error channel: {self.frames}"
        return json.loads(raw)


async def connect(agent: Agent, path: str, protocols: list[str] | None = None,
                  token: str = TOKEN) -> Any:
    return open_websocket_url(
        agent.ws_url + path, subprotocols=protocols or PROTOCOLS,
        extra_headers=[(b"authorization", f"Bearer {token}".encode())])


async def read_all(ws: WebSocketConnection, session: Session, *,
                   until: bytes | None = None, channel: int = channels.STDOUT) -> None:
    """Collect frames until the server closes (or `until` shows up on `channel`)."""
    while True:
        try:
            msg = await ws.get_message()
        except ConnectionClosed:
            return
        assert isinstance(msg, bytes), msg
        session.frames.append(channels.decode(msg))
        if until is not None and until in session.data(channel):
            return


def exec_path(*argv: str, stdin: bool = False, tty: bool = False,
              container: str = "main") -> str:
    q = str(httpx.QueryParams([("command", a) for a in argv]))
    flags = "&stdout=1" + ("&stderr=1" if not tty else "") + ("&stdin=1" if stdin else "") + \
        ("&tty=1" if tty else "")
    return f"/exec/{NS}/{POD}/{container}?{q}{flags}"


# ---------------------------------------------------------------------------------------
# Tests


async def test_auth_and_health(agent: Agent) -> None:
    async with agent.http(token=None) as c:
        r = await c.get("/healthz")
        assert (r.status_code, r.text) == (200, "ok")
        r = await c.get(f"/containerLogs/{NS}/{POD}/main")
        assert r.status_code == 401
        assert r.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": "Unauthorized",
                            "reason": "Unauthorized", "code": 401}
        r = await c.get("/stats/summary", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    async with agent.http() as c:
        r = await c.get("/no/such/path")
        assert (r.status_code, r.json()["kind"], r.json()["reason"]) == (404, "Status", "NotFound")
        # The agent's own counters, clean-up failures among them.
        import fleet.agent.inventory  # noqa: F401 - registers the counter, as the agent does
        r = await c.get("/metrics")
        assert r.status_code == 200 and "# TYPE fleet_agent_cleanup_failures_total counter" in r.text
    async with agent.http(token=None) as c:
        assert (await c.get("/metrics")).status_code == 401
    with pytest.raises(ConnectionRejected) as exc:
        async with await connect(agent, exec_path("true"), token="wrong"):
            pass
    assert exc.value.status_code == 401
    assert json.loads(exc.value.body or b"{}")["reason"] == "Unauthorized"


async def test_container_logs(agent: Agent) -> None:
    await main(agent)
    long_line = b"x" * LONG + b"\n"
    async with agent.http() as c:
        base = f"/containerLogs/{NS}/{POD}/main"
        r = await c.get(base)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain")
        # The over-long line was logged in pieces and comes back whole.
        assert r.content == b"one\ntwo\n" + long_line
        assert (await c.get(base, params={"tailLines": 1})).content == long_line
        assert (await c.get(base, params={"tailLines": 2})).content == b"two\n" + long_line
        assert (await c.get(base, params={"limitBytes": 6})).content == b"one\ntw"
        r = await c.get(base, params={"timestamps": "true", "tailLines": 3})
        lines = r.content.split(b"\n")[:-1]
        assert len(lines) == 3
        for line, text in zip(lines, [b"one", b"two", b"x" * LONG], strict=True):
            m = re.fullmatch(rb"(\S+) (.*)", line)
            assert m and m.group(2) == text, line[:80]
            assert re.fullmatch(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", m.group(1))
        assert (await c.get(base, params={"sinceSeconds": 3600})).content.startswith(b"one\n")
        r = await c.get(base, params={"sinceTime": "2999-01-01T00:00:00Z"})
        assert (r.status_code, r.content) == (200, b"")
        # With one container the name may be left out.
        assert (await c.get(f"/containerLogs/{NS}/{POD}")).content.startswith(b"one\n")

        r = await c.get(base, params={"previous": "true"})
        assert r.status_code == 400
        assert r.json()["message"] == \
            'previous terminated container "main" in pod "web" not found'
        r = await c.get(base, params={"tailLines": "many"})
        assert (r.status_code, r.json()["reason"]) == (400, "BadRequest")
        r = await c.get(f"/containerLogs/{NS}/nope/main")
        assert (r.status_code, r.json()["reason"]) == (404, "NotFound")
        r = await c.get(f"/containerLogs/{NS}/{POD}/sidecar")
        assert r.status_code == 400
        assert r.json()["message"] == "container sidecar is not valid for pod web"


async def test_container_logs_follow(agent: Agent) -> None:
    await main(agent)
    log_path = str(agent.locator.pods[(NS, POD)].containers["main"].log_path)
    async with agent.http() as c:
        got = b""
        following = False
        with trio.fail_after(10):
            async with c.stream("GET", f"/containerLogs/{NS}/{POD}/main",
                                params={"follow": "true", "tailLines": 1}) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_bytes():
                    got += chunk
                    if got == b"x" * LONG + b"\n":
                        # Printed after the request started: it must still arrive.
                        await trio.to_thread.run_sync(write_stdin, agent, "late\n")
                    if b"got late\n" in got:
                        following = log_path in open_files()
                        break
        assert got.endswith(b"got late\n") or b"got late\nerr late\n" in got
        # The client left: the server stops following (no handle on the log is kept).
        assert following
        with trio.fail_after(5):
            while log_path in open_files():
                await trio.sleep(0.02)

        # A container that exits ends the stream by itself, with its last lines.
        await agent.start("short", "echo a; sleep 0.5; echo b")
        with trio.fail_after(10):
            r2 = await c.get(f"/containerLogs/{NS}/{POD}/short", params={"follow": "1"})
        assert (r2.status_code, r2.content) == (200, b"a\nb\n")


async def test_exec_exit_code_and_streams(agent: Agent) -> None:
    await main(agent)
    session = Session(channels.V5)
    with trio.fail_after(15):
        async with await connect(agent, exec_path("sh", "-c", "echo out; echo err >&2; exit 3")) as ws:
            assert ws.subprotocol == channels.V5
            await read_all(ws, session)
    # The kubelet's "stream is live" frame comes first.
    assert session.frames[0] == (channels.STDOUT, b"")
    assert session.data(channels.STDOUT) == b"out\n"
    assert session.data(channels.STDERR) == b"err\n"
    assert session.status() == {
        "metadata": {}, "status": "Failure",
        "message": "command terminated with non-zero exit code: error executing command "
                   "[sh -c echo out; echo err >&2; exit 3], exit code 3",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}
    assert channels.exit_code_from_status(session.data(channels.ERROR)) == 3

    # v4 gets the same Status; a successful command gets Success.
    s4 = Session(channels.V4)
    with trio.fail_after(15):
        async with await connect(agent, exec_path("true"), [channels.V4]) as ws:
            assert ws.subprotocol == channels.V4
            await read_all(ws, s4)
    assert s4.status() == {"metadata": {}, "status": "Success"}

    # Bad requests are refused before the upgrade, with a Status.
    with pytest.raises(ConnectionRejected) as exc:
        async with await connect(agent, exec_path("true", container="sidecar")):
            pass
    assert exc.value.status_code == 400
    with pytest.raises(ConnectionRejected) as exc:
        async with await connect(agent, f"/exec/{NS}/{POD}/main?stdout=1"):
            pass
    assert exc.value.status_code == 400
    with pytest.raises(ConnectionRejected) as exc:
        async with await connect(agent, exec_path("true"), ["v3.channel.k8s.io"]):
            pass
    assert exc.value.status_code == 400


async def test_exec_stdin_and_close(agent: Agent) -> None:
    await main(agent)
    session = Session(channels.V5)
    payload = b"hello\n" + b"y" * 100_000 + b"\nbye\n"
    with trio.fail_after(15):
        async with await connect(agent, exec_path("cat", stdin=True)) as ws:
            for i in range(0, len(payload), 8192):
                await ws.send_message(channels.encode(channels.STDIN, payload[i:i + 8192]))
            # v5: stdin EOF — cat ends, and so does the session.
            await ws.send_message(channels.encode_close(channels.STDIN))
            await read_all(ws, session)
    assert session.data(channels.STDOUT) == payload
    assert session.status()["status"] == "Success"


async def test_exec_tty_and_resize(agent: Agent) -> None:
    await main(agent)
    session = Session(channels.V5)
    with trio.fail_after(15):
        async with await connect(
                agent, exec_path("sh", "-c", "while read x; do stty size; done",
                                 stdin=True, tty=True)) as ws:
            await ws.send_message(channels.encode_resize(123, 45))
            # The resize and stdin travel separately; ask until the new size shows.
            for _ in range(50):
                await ws.send_message(channels.encode(channels.STDIN, b"go\n"))
                with trio.move_on_after(0.2):
                    await read_all(ws, session, until=b"45 123")
                if b"45 123" in session.data(channels.STDOUT):
                    break
            await ws.send_message(channels.encode_close(channels.STDIN))
            await read_all(ws, session)
    out = session.data(channels.STDOUT)
    assert b"45 123" in out, out
    assert b"\r\n" in out  # a terminal's line endings: this really was a tty
    assert session.data(channels.STDERR) == b""  # a tty has one output stream
    assert session.status()["status"] == "Success"


async def test_attach(agent: Agent) -> None:
    h = await main(agent)
    session = Session(channels.V5)
    with trio.fail_after(15):
        async with await connect(
                agent, f"/attach/{NS}/{POD}/main?stdin=1&stdout=1&stderr=1") as ws:
            await ws.send_message(channels.encode(channels.STDIN, b"ping\n"))
            await read_all(ws, session, until=b"err ping\n", channel=channels.STDERR)
            await wait_log(h, "got ping")
            # The container exits: the attach session ends with Success.
            await ws.send_message(channels.encode(channels.STDIN, b"quit\n"))
            await read_all(ws, session)
    # Only what was written after attaching, each stream on its own channel.
    assert session.data(channels.STDOUT) == b"got ping\n"
    assert session.data(channels.STDERR) == b"err ping\n"
    assert session.status() == {"metadata": {}, "status": "Success"}


async def test_attach_tty_resize(agent: Agent) -> None:
    """attach -t: a resize frame reaches the container's terminal (owned by its shim)."""
    await agent.start("term", "while read x; do stty size; done", stdin=True, tty=True)
    session = Session(channels.V5)
    with trio.fail_after(15):
        async with await connect(
                agent, f"/attach/{NS}/{POD}/term?stdin=1&stdout=1&tty=1") as ws:
            await ws.send_message(channels.encode_resize(101, 33))
            for _ in range(50):
                await ws.send_message(channels.encode(channels.STDIN, b"go\n"))
                with trio.move_on_after(0.2):
                    await read_all(ws, session, until=b"33 101")
                if b"33 101" in session.data(channels.STDOUT):
                    break
            await ws.send_message(channels.encode_resize(80, 24))
            for _ in range(50):
                await ws.send_message(channels.encode(channels.STDIN, b"go\n"))
                with trio.move_on_after(0.2):
                    await read_all(ws, session, until=b"24 80")
                if b"24 80" in session.data(channels.STDOUT):
                    break
    out = session.data(channels.STDOUT)
    assert b"33 101" in out and b"24 80" in out, out


async def test_attach_without_stdin_fifo_is_refused(agent: Agent) -> None:
    await agent.start("nostdin", "sleep 1000")
    with pytest.raises(ConnectionRejected) as exc:
        async with await connect(agent, f"/attach/{NS}/{POD}/nostdin?stdin=1&stdout=1"):
            pass
    assert exc.value.status_code == 400


async def test_locate_errors_and_stats_summary(agent: Agent) -> None:
    await main(agent)
    await agent.start("sidecar", "echo side; sleep 1000")
    async with agent.http() as c:
        r = await c.get(f"/containerLogs/{NS}/{POD}")
        assert r.status_code == 400
        assert r.json()["message"] == \
            "a container name must be specified for pod web, choose one of: [main sidecar]"

        r = await c.get("/stats/summary")
        assert r.status_code == 200, r.text
        doc = r.json()
        node = doc["node"]
        assert node["nodeName"] == "node-a"
        assert node["cpu"]["usageCoreNanoSeconds"] > 0
        assert node["memory"]["workingSetBytes"] > 0
        [pod] = doc["pods"]
        assert pod["podRef"] == {"name": POD, "namespace": NS, "uid": agent.sandbox.id}
        names = sorted(ctr["name"] for ctr in pod["containers"])
        assert names == ["main", "sidecar"]
        for ctr in pod["containers"]:
            assert ctr["memory"]["workingSetBytes"] > 0
            assert ctr["cpu"]["usageCoreNanoSeconds"] >= 0
        # The second reading has a rate (cAdvisor-style, from two samples).
        await trio.sleep(0.05)
        again = (await c.get("/stats/summary")).json()
        assert "usageNanoCores" in again["node"]["cpu"]


async def test_exec_client_gone_ends_the_session(agent: Agent) -> None:
    await main(agent)
    marker = f"{os.getpid() % 1000 + 4000}"  # an unusual sleep length to look for

    def exec_process_running() -> bool:
        """Is the process the driver runs for this exec still there?  (`runc exec ...
        sleep N` for oci; `sleep N` itself for the process driver.)"""
        ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
        for line in ps.splitlines():
            line = line.strip()
            if not line.endswith(f"sleep {marker}"):
                continue
            if agent.driver.name == "process" or " exec " in line:
                return True
        return False

    with trio.fail_after(10):
        async with await connect(agent, exec_path("sleep", marker)) as ws:
            assert await ws.get_message() == channels.ready_frame(True, True)
            while not exec_process_running():
                await trio.sleep(0.02)
        # The socket closed without a word: the server cancels the exec.  (The command
        # itself may outlive `runc exec` inside the container, as it does in Kubernetes.)
        while exec_process_running():
            await trio.sleep(0.05)
    # The server is unharmed.
    s = Session(channels.V5)
    with trio.fail_after(10):
        async with await connect(agent, exec_path("true")) as ws:
            await read_all(ws, s)
    assert s.status()["status"] == "Success"
