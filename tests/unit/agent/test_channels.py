"""fleet.agent.channels: frames, resize, subprotocol negotiation, the error-channel
Status in the exact shape client-go parses into an exit code."""

from __future__ import annotations

import json

import pytest

from fleet.agent import channels


@pytest.mark.parametrize(("offered", "chosen"), [
    (["v5.channel.k8s.io", "v4.channel.k8s.io"], "v5.channel.k8s.io"),
    (["v4.channel.k8s.io", "v5.channel.k8s.io"], "v5.channel.k8s.io"),
    (["v4.channel.k8s.io"], "v4.channel.k8s.io"),
    (["base64.channel.k8s.io", "channel.k8s.io"], "channel.k8s.io"),
    ([" v4.channel.k8s.io "], "v4.channel.k8s.io"),
    ([], ""),
    (["v3.channel.k8s.io"], None),
    (["base64.channel.k8s.io"], None),
])
def test_negotiate(offered: list[str], chosen: str | None) -> None:
    assert channels.negotiate(offered) == chosen


def test_encode_decode_roundtrip() -> None:
    for ch in (channels.STDIN, channels.STDOUT, channels.STDERR, channels.ERROR,
               channels.RESIZE, channels.CLOSE):
        for data in (b"", b"x", bytes(range(256))):
            frame = channels.encode(ch, data)
            assert frame[0] == ch and len(frame) == len(data) + 1
            assert channels.decode(frame) == (ch, data)


def test_encode_rejects_bad_channel() -> None:
    with pytest.raises(ValueError):
        channels.encode(256)
    with pytest.raises(ValueError):
        channels.encode(-1)


def test_decode_rejects_empty() -> None:
    with pytest.raises(channels.ProtocolError):
        channels.decode(b"")


def test_resize() -> None:
    frame = channels.encode_resize(120, 40)
    ch, data = channels.decode(frame)
    assert ch == channels.RESIZE
    assert json.loads(data) == {"Width": 120, "Height": 40}
    assert channels.decode_resize(data) == (120, 40)


@pytest.mark.parametrize("bad", [b"", b"{}", b"[1,2]", b'{"Width": "x", "Height": 1}',
                                 b'{"Width": -1, "Height": 1}', b'{"Width": 1}',
                                 b'{"Width": 70000, "Height": 1}'])
def test_resize_rejects(bad: bytes) -> None:
    with pytest.raises(channels.ProtocolError):
        channels.decode_resize(bad)


def test_close_frame() -> None:
    assert channels.encode_close(channels.STDIN) == b"\xff\x00"


def test_ready_frame_is_the_lowest_output_channel() -> None:
    assert channels.ready_frame(True, True) == b"\x01"
    assert channels.ready_frame(False, True) == b"\x02"
    assert channels.ready_frame(False, False) == b"\x03"


def test_exit_status_success() -> None:
    assert channels.exit_status(0, ["true"]) == {"metadata": {}, "status": "Success"}


def test_exit_status_nonzero_is_what_kubectl_parses() -> None:
    assert channels.exit_status(3, ["sh", "-c", "exit 3"]) == {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: error executing command "
                   "[sh -c exit 3], exit code 3",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }


@pytest.mark.parametrize("proto", [channels.V4, channels.V5])
@pytest.mark.parametrize("code", [0, 1, 3, 126, 127, 137, 255])
def test_status_frame_roundtrip(proto: str, code: int) -> None:
    frame = channels.status_frame(proto, channels.exit_status(code, ["x"]))
    assert frame is not None
    ch, data = channels.decode(frame)
    assert ch == channels.ERROR
    assert channels.exit_code_from_status(data, proto) == code


def test_status_frame_v1_is_text_and_silent_on_success() -> None:
    assert channels.status_frame(channels.V1, channels.success_status()) is None
    frame = channels.status_frame(channels.V1, channels.error_status("boom"))
    assert frame == b"\x03boom"
    with pytest.raises(channels.RemoteCommandError, match="boom"):
        channels.exit_code_from_status(b"boom", channels.V1)
    assert channels.exit_code_from_status(b"", channels.V1) == 0


def test_other_failures_raise() -> None:
    data = json.dumps(channels.error_status("container not running")).encode()
    with pytest.raises(channels.RemoteCommandError, match="container not running"):
        channels.exit_code_from_status(data)
    with pytest.raises(channels.RemoteCommandError):
        channels.exit_code_from_status(b"not json")
    bad_cause = json.dumps({"status": "Failure", "reason": "NonZeroExitCode",
                            "message": "m", "details": {"causes": [
                                {"reason": "ExitCode", "message": "x"}]}}).encode()
    with pytest.raises(channels.RemoteCommandError):
        channels.exit_code_from_status(bad_cause)
