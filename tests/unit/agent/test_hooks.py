"""Lifecycle hooks: exec, httpGet and sleep handlers, their messages and the deadline."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from fleet.agent.hooks import HookResult, run_lifecycle_hook

POD = {"metadata": {"name": "web", "namespace": "ns", "uid": "u1"}}
CONTAINER = {"name": "app", "ports": [{"name": "admin", "containerPort": 0}]}


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class FakeExec:
    def __init__(self, result: int | str = 0, duration: float = 0) -> None:
        self.result = result
        self.duration = duration
        self.calls: list[tuple[list[str], float]] = []

    async def __call__(self, argv: Any, timeout: float) -> int:
        self.calls.append((list(argv), timeout))
        await trio.sleep(self.duration)
        if isinstance(self.result, str):
            raise RuntimeError(self.result)
        return self.result


async def hook(kind: str, handler: dict[str, Any], **kw: Any) -> HookResult:
    kw.setdefault("exec_in_container", FakeExec())
    kw.setdefault("pod_ip", "127.0.0.1")
    return await run_lifecycle_hook(kind, handler, pod=POD, container=kw.pop("container", CONTAINER),
                                    **kw)  # type: ignore[arg-type]


async def test_exec_success_and_failure(autojump: trio.testing.MockClock) -> None:
    fake = FakeExec(0)
    res = await hook("postStart", {"exec": {"command": ["sh", "-c", "init"]}},
                     exec_in_container=fake)
    assert res == HookResult(True)
    assert fake.calls[0][0] == ["sh", "-c", "init"]
    res = await hook("postStart", {"exec": {"command": ["false"]}}, exec_in_container=FakeExec(3))
    assert not res.ok and res.reason == "FailedPostStartHook"
    assert res.message == ("Exec lifecycle hook (['false']) for Container \"app\" in Pod "
                           "\"web_ns(u1)\" failed - error: command ['false'] exited with 3")
    res = await hook("preStop", {"exec": {"command": ["x"]}},
                     exec_in_container=FakeExec("container not running"))
    assert not res.ok and res.reason == "FailedPreStopHook"
    assert "container not running" in res.message
    res = await hook("preStop", {"exec": {"command": ["x"]}}, exec_in_container=None)
    assert not res.ok and "not available" in res.message


async def test_pre_stop_exec_is_bounded_by_the_deadline(autojump: trio.testing.MockClock) -> None:
    fake = FakeExec(0, duration=100)
    start = trio.current_time()
    res = await hook("preStop", {"exec": {"command": ["drain"]}}, exec_in_container=fake,
                     deadline=start + 30)
    assert trio.current_time() - start == 30
    assert not res.ok and "did not finish before the deadline" in res.message
    assert fake.calls[0][1] == 30  # the exec callable is told how long it has


async def test_sleep_action(autojump: trio.testing.MockClock) -> None:
    start = trio.current_time()
    assert (await hook("preStop", {"sleep": {"seconds": 5}}, deadline=start + 30)).ok
    assert trio.current_time() - start == 5
    res = await hook("preStop", {"sleep": {"seconds": 50}}, deadline=start + 30)
    assert trio.current_time() - start == 30
    assert not res.ok
    assert "container terminated before sleep hook finished" in res.message
    assert (await hook("postStart", {"sleep": {"seconds": 2}})).ok  # no deadline


async def test_handler_without_action(autojump: trio.testing.MockClock) -> None:
    res = await hook("postStart", {})
    assert not res.ok and "no action" in res.message


async def _serve(statuses: list[int], hang: bool, stream: trio.SocketStream) -> None:
    try:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = await stream.receive_some(4096)
            if not data:
                return
            buf += data
        if hang:
            await trio.sleep_forever()
        status = statuses.pop(0)
        await stream.send_all(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n"
                              "Connection: close\r\n\r\n".encode())
        await stream.aclose()
    except trio.BrokenResourceError:
        pass


async def test_http_hook(nursery: trio.Nursery) -> None:
    statuses = [200, 500]
    listeners = await nursery.start(partial(trio.serve_tcp, partial(_serve, statuses, False), 0,
                                            host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    container = {"name": "app", "ports": [{"name": "admin", "containerPort": port}]}
    assert (await hook("postStart", {"httpGet": {"port": "admin", "path": "/started"}},
                       container=container)).ok
    # As in the kubelet, a handler's HTTP status is not judged: only transport errors fail.
    assert (await hook("preStop", {"httpGet": {"port": port}})).ok
    assert statuses == []


async def test_http_hook_failures(nursery: trio.Nursery) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    res = await hook("postStart", {"httpGet": {"port": closed, "path": "/x"}})
    assert not res.ok and res.reason == "FailedPostStartHook"
    assert res.message.startswith('HTTP lifecycle hook (/x) for Container "app" in Pod "web_ns(u1)" '
                                  f'failed - error: Get "http://127.0.0.1:{closed}/x": ')
    assert "refused" in res.message.lower()
    res = await hook("postStart", {"httpGet": {"port": "nope"}})
    assert not res.ok and "couldn't find port: nope" in res.message

    listeners = await nursery.start(partial(trio.serve_tcp, partial(_serve, [], True), 0,
                                            host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(5):
        res = await hook("preStop", {"httpGet": {"port": port}},
                         deadline=trio.current_time() + 0.2)
    assert not res.ok and "did not finish before the deadline" in res.message
