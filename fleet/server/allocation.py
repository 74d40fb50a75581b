"""The per-kind allocation strategy of the generic write path (Kubernetes' Service REST hooks).

Some kinds own resources outside their object that must be unique across the
cluster: a Service's ClusterIP and NodePorts.  Kubernetes gives the Service
REST storage `BeginCreate` / `BeginUpdate` hooks returning a transaction that is
committed when the store write succeeded and reverted when it did not, plus an
`AfterDelete`.  Fleet has the same seam, generic: `ResourceAPI.allocators` maps
(group, plural) to an `AllocationStrategy`, registered by whoever builds the
server (`fleet/server/run.py` registers the Service allocator of
`fleet/server/svcalloc.py`); the REST layer calls it without knowing the kind.

Order in the write path (rest_write.py): defaulting, `KindInfo.prepare_update`,
mutating admission, validation, validating admission, then
`before_create`/`before_update` (may change the object: the allocated values go
into it, or raise an `APIError`), the store write, then `commit()` on success or
`revert()` on any failure (a store conflict that is retried reverts first and
allocates again on the fresh object).  `after_delete(obj)` runs once an object
is really gone — a DELETE that removed it, or the update that removed its last
finalizer.  A crash between allocation and the store write leaks at most what
was allocated; each strategy brings a repair loop for that
(`fleet/server/svcrepair.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

Step = Callable[[], Awaitable[None]]


@dataclass
class Transaction:
    """What to do when the write succeeds (`commit`: release what the old object held
    and the new one no longer does) or fails (`revert`: release what was just taken)."""

    on_commit: list[Step] = field(default_factory=list)
    on_revert: list[Step] = field(default_factory=list)

    async def commit(self) -> None:
        # Shielded too: the write is done; a cancelled request must not leave what
        # the old object held reserved (the repair loop would only free it later).
        with trio.CancelScope(shield=True):
            await _run_all(self.on_commit)

    async def revert(self) -> None:
        # Shielded: a revert usually runs because the request is failing or being
        # cancelled, and what it undoes must not stay allocated because of that.
        with trio.CancelScope(shield=True):
            await _run_all(self.on_revert)


async def _run_all(steps: list[Step]) -> None:
    for step in steps:
        await step()


class AllocationStrategy(Protocol):
    """The hooks of one kind; every method may assume the object passed validation."""

    async def before_create(self, obj: dict[str, Any], *, dry_run: bool) -> Transaction: ...

    async def before_update(self, old: dict[str, Any], new: dict[str, Any], *,
                            dry_run: bool) -> Transaction: ...

    async def after_delete(self, obj: dict[str, Any]) -> None: ...


def removed_by_update(stored: dict[str, Any]) -> bool:
    """Whether an update's stored result is the object's deletion (its last finalizer
    went while it was being deleted: the store removes it in that write)."""
    md = stored.get("metadata") or {}
    return bool(md.get("deletionTimestamp")) and not md.get("finalizers")
