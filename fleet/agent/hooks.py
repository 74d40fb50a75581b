"""Container lifecycle handlers: postStart and preStop.

The pod worker calls `run_lifecycle_hook` right after a container starts (postStart:
the container is not Running until it returns; a failure kills the container) and before
it stops one (preStop: then SIGTERM).  A handler is one of:

- exec     — `exec_in_container(argv, timeout)` (the same callable probes use); exit 0
             is success, anything else is a failure with the exit code;
- httpGet  — a GET to host (default: the pod IP), port (number or named container port),
             path, scheme, headers.  Like the kubelet, only a transport error fails the
             hook — the status code is not judged (lifecycle handlers are notifications,
             not health checks);
- sleep    — wait `seconds`.

`deadline` (an absolute `trio.current_time()` value) bounds the whole handler: for
preStop it is the end of the pod's termination grace period, so a hanging hook never
delays the kill.  A handler cut off by the deadline is a failure.  The result's message
is the kubelet's `FailedPostStartHook` / `FailedPreStopHook` event text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import trio

from fleet.agent.probes import (
    ExecInContainer,
    describe_error,
    http_url,
    new_http_client,
    request_headers,
)

HookKind = Literal["postStart", "preStop"]
EVENT_REASON = {"postStart": "FailedPostStartHook", "preStop": "FailedPreStopHook"}


@dataclass(frozen=True)
class HookResult:
    ok: bool
    message: str = ""
    # The event reason on failure (FailedPostStartHook / FailedPreStopHook); "" on success.
    reason: str = ""


async def run_lifecycle_hook(kind: HookKind, handler: Mapping[str, Any], *,
                             pod: Mapping[str, Any], container: Mapping[str, Any],
                             pod_ip: str | None,
                             exec_in_container: ExecInContainer | None,
                             deadline: float | None = None,
                             client: httpx.AsyncClient | None = None) -> HookResult:
    """Run one postStart/preStop handler; never raises for the handler's own failure."""
    where = (f'for Container "{container.get("name", "")}" in Pod '
             f'"{(pod.get("metadata") or {}).get("name", "")}_'
             f'{(pod.get("metadata") or {}).get("namespace", "")}'
             f'({(pod.get("metadata") or {}).get("uid", "")})"')
    limit = math.inf if deadline is None else deadline
    if "exec" in handler:
        argv = list((handler["exec"] or {}).get("command") or [])
        what = f"Exec lifecycle hook ({argv})"
        error = await _run_exec(argv, exec_in_container, limit)
    elif "httpGet" in handler:
        action = handler["httpGet"] or {}
        what = f"HTTP lifecycle hook ({action.get('path') or '/'})"
        error = await _run_http(action, pod_ip, container, limit, client)
    elif "sleep" in handler:
        seconds = (handler["sleep"] or {}).get("seconds") or 0
        what = f"Sleep lifecycle hook ({seconds})"
        error = await _run_sleep(float(seconds), limit)
    else:
        what = "Lifecycle hook"
        error = "handler has no action (exec, httpGet or sleep)"
    if error is None:
        return HookResult(True)
    return HookResult(False, f"{what} {where} failed - error: {error}", EVENT_REASON[kind])


def _remaining(limit: float) -> float:
    return max(limit - trio.current_time(), 0.0)


async def _run_exec(argv: list[str], exec_in_container: ExecInContainer | None,
                    limit: float) -> str | None:
    if exec_in_container is None:
        return "exec is not available for this container"
    if not argv:
        return "exec hook has no command"
    try:
        with trio.move_on_at(limit) as scope:
            code = await exec_in_container(argv, _remaining(limit))
    except Exception as e:  # the runtime's failure (container gone...) is the hook's
        return f"command {argv!r} failed: {e}"
    if scope.cancelled_caught:
        return f"command {argv!r} did not finish before the deadline"
    if code != 0:
        return f"command {argv!r} exited with {code}"
    return None


async def _run_http(action: Mapping[str, Any], pod_ip: str | None,
                    container: Mapping[str, Any], limit: float,
                    client: httpx.AsyncClient | None) -> str | None:
    try:
        url = http_url(action, pod_ip, container)
    except ValueError as e:
        return str(e)
    own = client is None
    client = client or new_http_client()
    try:
        with trio.move_on_at(limit) as scope:
            async with client.stream("GET", url, headers=request_headers(action)) as resp:
                # Read (and drop) a bounded body so the server is not cut mid-response.
                read = 0
                async for chunk in resp.aiter_raw():
                    read += len(chunk)
                    if read >= 10 * 1024:
                        break
        if scope.cancelled_caught:
            return f'Get "{url}": the request did not finish before the deadline'
    except (httpx.HTTPError, OSError) as e:
        return f'Get "{url}": {describe_error(e)}'
    finally:
        if own:
            await client.aclose()
    return None


async def _run_sleep(seconds: float, limit: float) -> str | None:
    if seconds < 0:
        return f"invalid sleep seconds {seconds:g}"
    with trio.move_on_at(limit) as scope:
        await trio.sleep(seconds)
    if scope.cancelled_caught:
        return "container terminated before sleep hook finished"
    return None
