"""The `Store` protocol: a revisioned key/value store of Kubernetes objects.

The model is etcd's: one global, monotonic revision counter; every write gets
the next revision, which becomes the object's `metadata.resourceVersion`;
history is kept so a watch can resume from any retained revision; compaction
trims history, after which older revisions answer `Expired`.

Callers (the API server, controllers) only see this protocol, so an etcd
backend can be dropped in later without touching them.  Keys look like
`/{group or core}/{plural}/{namespace}/{name}` (cluster-scoped kinds omit the
namespace); a prefix ending in `/` selects a kind or a kind within a namespace.

The store owns the server-maintained metadata: `uid`, `creationTimestamp`,
`resourceVersion`, `generation` (bumped only when something outside
`metadata`/`status` changes) and the finalizer protocol (a delete of an
object with finalizers sets `deletionTimestamp` instead; the update that
removes the last finalizer of such an object deletes it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


class StoreError(Exception):
    """Base of store errors; the API server maps each to a Status."""


class KeyNotFound(StoreError):
    pass


class KeyExists(StoreError):
    pass


class RevisionConflict(StoreError):
    """The caller's expected revision (or uid precondition) is not the stored one."""


class RevisionCompacted(StoreError):
    """The requested revision is older than the compacted history (410 Expired)."""

    def __init__(self, requested: int, compacted: int) -> None:
        super().__init__(f"too old resource version: {requested} ({compacted})")
        self.requested = requested
        self.compacted = compacted


class RevisionTooLarge(StoreError):
    """The requested revision is newer than any committed: no client was ever
    given it (a forged or foreign continue token, a made-up resourceVersion)."""

    def __init__(self, requested: int, current: int) -> None:
        super().__init__(f"revision {requested} is newer than the current revision {current}")
        self.requested = requested
        self.current = current


class StoreCorrupt(StoreError):
    """The database file is damaged or is not a Fleet store."""


ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"


@dataclass(slots=True)
class Event:
    type: str  # ADDED | MODIFIED | DELETED
    key: str
    revision: int
    obj: dict[str, Any]  # for DELETED: the last state, resourceVersion = the delete revision
    prev: dict[str, Any] | None = None  # state before this event (None for ADDED)
    # Scratch space for consumers (e.g. the server caches the serialized line).
    cache: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ListResult:
    items: list[dict[str, Any]]
    revision: int  # the revision the list is consistent at
    # Set when `limit` cut the list short: the key to continue after.
    continue_key: str | None = None
    remaining: int | None = None


class Watch(Protocol):
    """An open watch; iterate it for events in revision order.

    `progress` is the highest revision this watch has fully accounted for
    (every event up to it that matches the prefix has been yielded, or is
    queued); the API server uses it for BOOKMARK events.
    """

    progress: int

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def __anext__(self) -> Event: ...

    def take_ready(self, limit: int) -> list[Event]:
        """Events already queued (at most `limit`), without waiting."""

    async def aclose(self) -> None: ...


class Store(Protocol):
    async def create(self, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Insert a new object; KeyExists if the key is live."""

    async def get(self, key: str) -> dict[str, Any]:
        """The latest state; KeyNotFound if absent."""

    async def list(
        self,
        prefix: str,
        *,
        revision: int | None = None,
        limit: int = 0,
        start_after: str | None = None,
    ) -> ListResult:
        """All live objects under `prefix`, ordered by key, consistent at one
        revision (`revision` for a continued list, else the current one);
        RevisionCompacted if that revision is gone, RevisionTooLarge if it is
        newer than the current one.  `start_after` must lie under `prefix` and
        `limit`/`revision` within SQLite's int64, else ValueError."""

    async def update(
        self,
        key: str,
        obj: dict[str, Any],
        *,
        expected_revision: int | None = None,
    ) -> dict[str, Any]:
        """Replace the object. With `expected_revision` the write happens only
        if the stored revision equals it (else RevisionConflict).  Returns the
        stored object, which is deleted (and returned with its final revision)
        when it carries a deletionTimestamp and no finalizers."""

    async def delete(
        self,
        key: str,
        *,
        expected_revision: int | None = None,
        expected_uid: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Delete, honouring finalizers: returns (object, removed).  When the
        object has finalizers it is only marked (deletionTimestamp) and
        `removed` is False."""

    async def watch(self, prefix: str, *, from_revision: int) -> Watch:
        """Events with revision > from_revision under prefix, in order, none lost
        or repeated; RevisionCompacted if from_revision is too old."""

    def current_revision(self) -> int: ...

    def compacted_revision(self) -> int: ...

    async def compact(self, revision: int) -> None:
        """Drop history older than `revision` (the latest state of every key is kept)."""

    def stats(self) -> dict[str, Any]:
        """Numbers for metrics: revision, db_bytes, wal_bytes, watchers, ..."""

    async def aclose(self) -> None: ...
