"""`eventually`: poll an async check until it returns something truthy (integration tests)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from fleet.client import ApiException

T = TypeVar("T")


async def eventually(check: Callable[[], Awaitable[T]], what: str, timeout: float = 60.0) -> T:
    """The first truthy result of `check` (an ApiException counts as not yet); fail
    naming `what` and the last result after `timeout` seconds."""
    last: Any = None
    with trio.move_on_after(timeout):
        while True:
            try:
                last = await check()
            except ApiException as e:
                last = e
            else:
                if last:
                    return last
            await trio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
