"""Object factories shared by the store tests."""

from __future__ import annotations

from typing import Any

import trio

from fleet.store import Event, Watch


def pod(name: str, ns: str = "default", **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    obj.update(extra)
    return obj


def key(name: str, ns: str = "default") -> str:
    return f"/core/pods/{ns}/{name}"


async def next_event(watch: Watch, timeout: float = 5) -> Event:
    """The next event, failing (not hanging) the test when none comes."""
    with trio.fail_after(timeout):
        return await watch.__anext__()
