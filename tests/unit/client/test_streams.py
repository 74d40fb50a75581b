"""Client side of logs/exec/attach: option encoding, exit codes, and one real session.

The session tests run `run_remote_command` against a trio-websocket server on
127.0.0.1 standing in for the API server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio_websocket

from fleet.client.kubeconfig import ClientConfig
from fleet.client.rest import ApiException
from fleet.client.streams import (
    ExecOptions,
    LogOptions,
    parse_duration,
    resize_frame,
    result_from_status,
    run_remote_command,
    websocket_target,
)


@pytest.mark.parametrize("text,seconds", [
    ("10s", 10), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), ("1.5h", 5400), ("0s", 0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "10x", "5m garbage", "-5s"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_log_options_params():
    assert LogOptions().params() == {}
    assert LogOptions(container="c", follow=True, tail_lines=0, since_seconds=10, timestamps=True,
                      previous=True, limit_bytes=5, since_time="t").params() == {
        "container": "c", "follow": "true", "timestamps": "true", "previous": "true",
        "tailLines": "0", "sinceSeconds": "10", "limitBytes": "5", "sinceTime": "t"}


def test_exec_options_query_and_target():
    opts = ExecOptions(command=("sh", "-c", "echo a"), container="app", stdin=True, tty=True)
    # A tty merges stderr into stdout on the remote side, so stderr is not asked for.
    assert opts.query() == [("command", "sh"), ("command", "-c"), ("command", "echo a"),
                            ("container", "app"), ("stdin", "true"), ("stdout", "true"),
                            ("stderr", "false"), ("tty", "true")]
    host, port, resource, tls = websocket_target(ClientConfig("https://example.test:6443/prefix"),
                                                 "ns", "p", "exec", ExecOptions(command=("ls",)))
    assert (host, port, tls) == ("example.test", 6443, True)
    assert resource == ("/prefix/api/v1/namespaces/ns/pods/p/exec"
                        "?command=ls&stdin=false&stdout=true&stderr=true&tty=false")
    assert websocket_target(ClientConfig("http://h"), "ns", "p", "attach", ExecOptions())[1:4:2] == (80, False)


@pytest.mark.parametrize("status,code,message", [
    ({"status": "Success"}, 0, ""),
    ({"status": "Failure", "reason": "NonZeroExitCode", "message": "x",
      "details": {"causes": [{"reason": "ExitCode", "message": "42"}]}},
     42, "command terminated with exit code 42"),
    ({"status": "Failure", "reason": "NonZeroExitCode", "message": "no cause"}, 1, "no cause"),
    ({"status": "Failure", "reason": "NonZeroExitCode", "message": "bad",
      "details": {"causes": [{"reason": "ExitCode", "message": "x"}]}}, 1, "bad"),
    ({"status": "Failure", "reason": "InternalError", "message": 'exec: "x": not found'},
     1, 'exec: "x": not found'),
])
def test_result_from_status(status, code, message):
    r = result_from_status(status)
    assert (r.exit_code, r.message) == (code, message)


def test_resize_frame():
    assert resize_frame(80, 24) == b'\x04{"Width": 80, "Height": 24}'


async def fake_api(nursery: trio.Nursery, protocol: str, received: list[Any]) -> int:
    """Echo stdin until stdin closes or a resize arrives; then exit 7."""

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        received.append(("path", request.path))
        received.append(("auth", dict(request.headers).get(b"authorization")))
        if request.path.startswith("/api/v1/namespaces/ns/pods/gone/"):
            body = json.dumps({"kind": "Status", "code": 404, "reason": "NotFound",
                               "message": 'pods "gone" not found'}).encode()
            await request.reject(404, extra_headers=[(b"content-type", b"application/json")], body=body)
            return
        ws = await request.accept(subprotocol=protocol)
        await ws.send_message(b"\x01")  # an empty open-channel frame, as some servers send
        with trio.move_on_after(5):
            while True:
                msg = await ws.get_message()
                received.append(msg)
                if msg[:1] == b"\x00":
                    await ws.send_message(b"\x01" + msg[1:])
                    await ws.send_message(b"\x02e:" + msg[1:])
                if msg == b"\xff\x00" or msg[:1] == b"\x04":
                    break
        await ws.send_message(b'\x03{"status":"Failure","reason":"NonZeroExitCode",'
                              b'"details":{"causes":[{"reason":"ExitCode","message":"7"}]}}')
        await ws.aclose()

    server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
    return server.port


def stdin_of(*chunks: bytes):
    pending = list(chunks)

    async def read() -> bytes:
        await trio.sleep(0)
        return pending.pop(0) if pending else b""

    return read


async def test_session_v5_sends_stdin_and_its_close(nursery):
    received: list[Any] = []
    port = await fake_api(nursery, "v5.channel.k8s.io", received)
    out, err = bytearray(), bytearray()
    with trio.fail_after(10):
        result = await run_remote_command(
            ClientConfig(f"http://127.0.0.1:{port}", token="tok"), "ns", "p", "exec",
            ExecOptions(command=("cat",), stdin=True), read_stdin=stdin_of(b"ab", b"cd"),
            write_stdout=out.extend, write_stderr=err.extend)
    assert (result.exit_code, bytes(out), bytes(err)) == (7, b"abcd", b"e:abe:cd")
    assert received[:2] == [("path", "/api/v1/namespaces/ns/pods/p/exec?command=cat&stdin=true"
                                     "&stdout=true&stderr=true&tty=false"),
                            ("auth", b"Bearer tok")]
    assert received[2:] == [b"\x00ab", b"\x00cd", b"\xff\x00"]


async def test_session_tty_sends_sizes(nursery):
    received: list[Any] = []
    port = await fake_api(nursery, "v4.channel.k8s.io", received)

    async def sizes():
        yield (100, 40)
        await trio.sleep_forever()

    with trio.fail_after(10):
        result = await run_remote_command(
            ClientConfig(f"http://127.0.0.1:{port}"), "ns", "p", "attach",
            ExecOptions(tty=True), write_stdout=lambda b: None, write_stderr=lambda b: None,
            sizes=sizes())
    assert result.exit_code == 7
    assert received[2:] == [b'\x04{"Width": 100, "Height": 40}']


async def test_session_refused_raises_the_servers_status(nursery):
    port = await fake_api(nursery, "v5.channel.k8s.io", [])
    with trio.fail_after(10), pytest.raises(ApiException) as info:
        await run_remote_command(
            ClientConfig(f"http://127.0.0.1:{port}"), "ns", "gone", "exec",
            ExecOptions(command=("ls",)), write_stdout=lambda b: None, write_stderr=lambda b: None)
    assert (info.value.code, info.value.reason) == (404, "NotFound")
    assert info.value.message == 'pods "gone" not found'
