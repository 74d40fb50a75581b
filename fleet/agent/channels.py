"""The Kubernetes channel protocol that exec and attach speak over WebSocket.

Shared by the agent's exec/attach endpoints, the API server's proxy and `kfleet exec`,
so all three agree byte for byte.  The protocol (k8s.io/apimachinery `wsstream`, and
client-go's `remotecommand` on the other end):

* the client offers subprotocols; `v5.channel.k8s.io` and `v4.channel.k8s.io` are what
  kubectl 1.30+ and the Python client send, `channel.k8s.io` (v1) is the original;
* every binary message starts with one byte naming its channel — 0 stdin, 1 stdout,
  2 stderr, 3 error, 4 resize — and the rest is that channel's data;
* resize data is JSON `{"Width": cols, "Height": rows}` (terminal size changes);
* the error channel carries, once the command is done, a `meta/v1 Status`: Success, or
  Failure with reason `NonZeroExitCode` and an `ExitCode` cause holding the exit code
  (client-go turns that into the exit code kubectl returns).  Before v4 it carried the
  error text alone;
* v5 adds channel 255, "close": `[255, n]` says the sender will write no more on
  channel n — the client's way to send EOF on stdin, which a WebSocket (no half-close)
  cannot otherwise express.

The kubelet also writes an empty message on the first output channel right after the
upgrade (stdout, else stderr, else error) to tell the client the stream is live;
`ready_frame` builds it.  client-go ignores empty data, so it never hurts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

STDIN = 0
STDOUT = 1
STDERR = 2
ERROR = 3
RESIZE = 4
CLOSE = 255

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
V1 = "channel.k8s.io"
# The server's preference, newest first: negotiation picks the newest both sides know.
SUPPORTED = (V5, V4, V1)


class ProtocolError(ValueError):
    """A message that does not follow the channel protocol."""


def negotiate(offered: Sequence[str]) -> str | None:
    """The subprotocol to answer with, given what the client offered (comma-separated
    header values already split); None if nothing offered is supported.  A client that
    offers nothing gets v1 semantics without a subprotocol header (as wsstream does):
    the caller treats "" as V1."""
    wanted = {p.strip() for p in offered if p.strip()}
    if not wanted:
        return ""
    for proto in SUPPORTED:
        if proto in wanted:
            return proto
    return None


def encode(channel: int, data: bytes = b"") -> bytes:
    """One message: the channel byte, then the data."""
    if not 0 <= channel <= 255:
        raise ValueError(f"channel {channel} out of range")
    return bytes((channel,)) + data


def decode(message: bytes) -> tuple[int, bytes]:
    """(channel, data) of one binary message."""
    if not message:
        raise ProtocolError("empty message: no channel byte")
    return message[0], message[1:]


def encode_resize(width: int, height: int) -> bytes:
    return encode(RESIZE, json.dumps({"Width": width, "Height": height}).encode())


def decode_resize(data: bytes) -> tuple[int, int]:
    """(cols, rows) from a resize channel's data."""
    try:
        obj = json.loads(data)
        width, height = int(obj["Width"]), int(obj["Height"])
    except (ValueError, TypeError, KeyError) as e:
        raise ProtocolError(f"bad resize message {data[:100]!r}") from e
    if width < 0 or height < 0 or width > 65535 or height > 65535:
        raise ProtocolError(f"terminal size out of range: {width}x{height}")
    return width, height


def encode_close(channel: int) -> bytes:
    """v5: "no more data from me on `channel`" (stdin EOF from a client)."""
    return encode(CLOSE, bytes((channel,)))


def ready_frame(stdout: bool, stderr: bool) -> bytes:
    """The empty message the kubelet sends first, on the lowest output channel."""
    return encode(STDOUT if stdout else STDERR if stderr else ERROR)


# ---------------------------------------------------------------------------------------
# The error channel


def success_status() -> dict[str, Any]:
    return {"metadata": {}, "status": "Success"}


def exit_status(exit_code: int, argv: Sequence[str]) -> dict[str, Any]:
    """The Status the kubelet sends when a command ends with `exit_code`."""
    if exit_code == 0:
        return success_status()
    command = "[" + " ".join(argv) + "]"  # Go's %v of a []string
    return {
        "metadata": {},
        "status": "Failure",
        "message": (f"command terminated with non-zero exit code: error executing command "
                    f"{command}, exit code {exit_code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
    }


def error_status(message: str, reason: str = "InternalError") -> dict[str, Any]:
    """A Status for a failure that is not the command's exit (it could not run...)."""
    return {"metadata": {}, "status": "Failure", "message": message, "reason": reason}


def status_frame(protocol: str, status: dict[str, Any]) -> bytes | None:
    """The error-channel message carrying `status` in `protocol`'s form; None when the
    protocol has nothing to send (v1 reports only failures, as text)."""
    if protocol in (V4, V5):
        return encode(ERROR, json.dumps(status, separators=(",", ":")).encode())
    if status.get("status") == "Success":
        return None
    return encode(ERROR, str(status.get("message", "")).encode())


class RemoteCommandError(Exception):
    """The error channel reported a failure that is not a plain exit code."""


def exit_code_from_status(data: bytes, protocol: str = V5) -> int:
    """What a client makes of the error channel: the command's exit code (0 on Success
    or, before v4, on an empty error); raises RemoteCommandError for other failures."""
    if protocol not in (V4, V5):
        if data:
            raise RemoteCommandError(data.decode(errors="replace"))
        return 0
    try:
        status = json.loads(data)
    except ValueError as e:
        raise RemoteCommandError(f"bad status on the error channel: {data[:200]!r}") from e
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for c in (status.get("details") or {}).get("causes") or []:
            if c.get("reason") == "ExitCode":
                try:
                    return int(c.get("message", ""))
                except ValueError:
                    break
    raise RemoteCommandError(status.get("message") or "remote command failed")
