"""Watch streams: Kubernetes newline-delimited JSON watch and Fleet's SSE watch.

A watch is the store's watch (every change after a revision, in order, once)
filtered by the request's selectors and shaped for the client:

- `resourceVersion` unset or "0", or `sendInitialEvents=true`: synthetic ADDED
  events for the objects that exist (read at one revision), then changes after
  that revision; with `sendInitialEvents` a BOOKMARK annotated
  `k8s.io/initial-events-end: "true"` marks the end of the initial state.
- a selector turns a MODIFIED that moves an object into (out of) the selection
  into ADDED (DELETED), as kube-apiserver does.
- a revision older than the compacted history is answered inside the 200
  stream with an ERROR event carrying a 410 Expired Status (kopf and client-go
  restart their list+watch only on that).
- `allowWatchBookmarks`: a BOOKMARK with the watch's progress revision when
  the stream has been idle for a while, so clients resume from a recent RV.
- the Accept header (negotiate.py) may turn every event's object into a Table
  or a PartialObjectMetadata (bookmarks too, as kube-apiserver's encoder does).

The serialized line of an event is cached on the store's Event object so a
fan-out to many plain watchers serializes each event once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from fleet.api import errors
from fleet.api.registry import KindInfo
from fleet.server import crd_conversion
from fleet.server.http import Req, Resp, dumps
from fleet.server.negotiate import (
    OBJECT,
    PARTIAL,
    TABLE,
    include_object,
    negotiate,
    partial,
    watch_target,
)
from fleet.server.request_params import parse_rv
from fleet.server.rest import ResourceAPI
from fleet.server.routes import Route
from fleet.server.tables import table
from fleet.store import ADDED, DELETED, MODIFIED, RevisionCompacted, StoreError

DEFAULT_TIMEOUT = 1800.0
BOOKMARK_INTERVAL = 10.0
MAX_BATCH = 256  # events coalesced into one write for a watcher that fell behind
MAX_INT64 = 2**63 - 1  # query integers are Go int64s in Kubernetes


class WatchCounter:
    """Open watches, for the metrics endpoint."""

    def __init__(self) -> None:
        self.open = 0


def _event_line(type_: str, obj: dict[str, Any]) -> bytes:
    return b'{"type":"' + type_.encode() + b'","object":' + dumps(obj) + b"}\n"


def _sse_line(type_: str, obj: dict[str, Any], rv: str) -> bytes:
    return b"event: " + type_.encode() + b"\nid: " + rv.encode() + b"\ndata: " + dumps(obj) + b"\n\n"


async def watch(api: ResourceAPI, info: KindInfo, route: Route, req: Req, counter: WatchCounter,
                *, sse: bool = False) -> Resp:
    ls, fs = api.selectors(info, req)
    # GET .../{plural}/{name}?watch=1 (the old form) watches one object.
    name_pin = route.name or fs.exact_value("metadata.name")
    rv = parse_rv(req.query.get("resourceVersion"))
    if sse and rv is None:
        rv = parse_rv(req.headers.get("last-event-id"))
    if rv is not None and rv > MAX_INT64:  # Go's ParseUint(64); the store binds no larger
        raise errors.BadRequest(f'invalid resourceVersion: "{rv}" is not a valid resource version')
    match = req.query.get("resourceVersionMatch", "")
    if match not in ("", "NotOlderThan"):
        # kube-apiserver's validateWatchOptions: 422 Invalid on ListOptions.meta.k8s.io.
        raise errors.Invalid.for_object("ListOptions", "meta.k8s.io", "", [errors.cause(
            "resourceVersionMatch", f'Unsupported value: "{match}": supported values: "NotOlderThan"',
            "FieldValueNotSupported")])
    send_initial = req.query.get("sendInitialEvents", "").lower() == "true"
    bookmarks = req.flag("allowWatchBookmarks") or sse
    if send_initial and not req.flag("allowWatchBookmarks"):
        raise errors.Invalid("sendInitialEvents is forbidden for watch unless allowWatchBookmarks is true",
                             causes=[errors.cause("allowWatchBookmarks",
                                                  "Forbidden: sendInitialEvents requires allowWatchBookmarks")])
    timeout_s = req.query.get("timeoutSeconds") or ""
    # An int64 of seconds, as kube-apiserver's ListOptions decodes it: float()
    # took "nan" (a NaN deadline broke the stream after its 200) and "inf".
    digits = timeout_s[1:] if timeout_s[:1] in ("+", "-") else timeout_s
    if timeout_s and not (digits.isascii() and digits.isdigit() and len(digits) <= 19
                          and abs(int(timeout_s)) <= MAX_INT64):  # 19 digits first: int() refuses 4301
        raise errors.BadRequest(f'timeoutSeconds: invalid value "{timeout_s}": must be a 64-bit integer')
    timeout = float(int(timeout_s)) if timeout_s else DEFAULT_TIMEOUT
    if timeout <= 0:
        timeout = DEFAULT_TIMEOUT
    # Fleet's SSE watch is asked for as text/event-stream: its events take a conversion
    # the Accept header names, and otherwise carry the object.
    try:
        target = watch_target(negotiate(req.headers.get("accept", ""), stream=True))
    except errors.NotAcceptable:
        if not sse:
            raise
        target = OBJECT
    include = include_object(target, req.query)
    prefix = info.key(route.namespace)
    if name_pin and (route.namespace or not info.namespaced):
        prefix = info.key(route.namespace, name_pin)  # exact key; filtered below for longer names

    def match(obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        md = obj.get("metadata", {})
        if name_pin is not None and md.get("name") != name_pin:
            return False
        return ls.matches(md.get("labels")) and fs.matches(obj)

    filtered = not (ls.empty() and fs.empty()) or name_pin is not None
    initial: list[dict[str, Any]] = []
    if send_initial or not rv:
        res = await api.store.list(prefix)
        start = res.revision
        initial = await crd_conversion.to_version(info, [o for o in res.items if match(o)])
    else:
        start = rv
    try:
        store_watch = await api.store.watch(prefix, from_revision=start)
    except RevisionCompacted as e:
        return Resp(200, _expired_stream(e, sse), content_type=_ctype(sse))

    first_table = [True]

    def encode(type_: str, obj: dict[str, Any]) -> bytes:
        rv_s = obj.get("metadata", {}).get("resourceVersion", "")
        if target.kind == TABLE and type_ not in ("BOOKMARK", "ERROR"):
            payload = table(info, [obj], include=include, with_columns=first_table[0],
                            api_version=target.api_version)
            first_table[0] = False
            obj = payload
        elif target.kind == PARTIAL and type_ != "ERROR":
            obj = partial(obj, target)
        if sse:
            return _sse_line(type_, obj, rv_s)
        return _event_line(type_, obj)

    def bookmark(revision: int, initial_end: bool = False) -> bytes:
        md: dict[str, Any] = {"resourceVersion": str(revision)}
        if initial_end:
            md["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": info.kind, "apiVersion": info.api_version, "metadata": md}
        if target.kind == PARTIAL:
            obj = partial(obj, target)
        return _sse_line("BOOKMARK", obj, str(revision)) if sse else _event_line("BOOKMARK", obj)

    cache_key = ("sse" if sse else "nd", target, info.api_version)

    async def stream() -> AsyncIterator[bytes]:
        # No `yield` may sit inside a cancel scope in an async generator (the
        # consumer runs between yields), so the deadline is checked by hand and
        # only the wait for the next event is wrapped in a timeout.
        counter.open += 1
        deadline = trio.current_time() + timeout
        try:
            for obj in initial:
                yield encode(ADDED, obj)
            if send_initial:
                yield bookmark(start, initial_end=True)
            last_sent = trio.current_time()
            it = store_watch.__aiter__()
            while True:
                now = trio.current_time()
                if now >= deadline:
                    return
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(0.0, last_sent + BOOKMARK_INTERVAL - now))
                ev = None
                with trio.move_on_after(wait):
                    ev = await it.__anext__()
                if ev is None:
                    if bookmarks and trio.current_time() - last_sent >= BOOKMARK_INTERVAL:
                        yield bookmark(store_watch.progress)
                        last_sent = trio.current_time()
                    continue
                # Whatever else is already queued goes out in the same write: when
                # fan-out falls behind, a watcher catches up in one send instead
                # of one send per event.
                lines = []
                for e in (ev, *store_watch.take_ready(MAX_BATCH)):
                    out = _transform(e, match) if filtered else (e.type, e.obj)
                    if out is None:
                        continue
                    type_, obj = out
                    if obj.get("apiVersion") != info.api_version and info.convert is not None:
                        obj = await crd_conversion.one(info, obj)  # a custom resource at another version
                    if not filtered and target.kind != TABLE:
                        line = e.cache.get(cache_key)
                        if line is None:
                            line = encode(type_, obj)
                            e.cache[cache_key] = line
                    else:
                        line = encode(type_, obj)
                    lines.append(line)
                if not lines:
                    continue
                yield lines[0] if len(lines) == 1 else b"".join(lines)
                last_sent = trio.current_time()
        except StopAsyncIteration:
            return
        except RevisionCompacted as e:
            async for chunk in _expired_stream(e, sse):
                yield chunk
        except StoreError:
            # The store ended this watch (a slow consumer overflowed its buffer):
            # close the stream; the client re-watches from its last resourceVersion.
            return
        finally:
            counter.open -= 1
            with trio.CancelScope(shield=True):
                await store_watch.aclose()

    return Resp(200, stream(), content_type=_ctype(sse), headers={"Cache-Control": "no-cache"})


def _ctype(sse: bool) -> str:
    return "text/event-stream" if sse else "application/json"


def _transform(ev: Any, match: Callable[[dict[str, Any] | None], bool]) -> tuple[str, dict[str, Any]] | None:
    if ev.type == ADDED:
        return (ADDED, ev.obj) if match(ev.obj) else None
    if ev.type == DELETED:
        return (DELETED, ev.obj) if (match(ev.obj) or match(ev.prev)) else None
    now = match(ev.obj)
    before = match(ev.prev) if ev.prev is not None else now
    if now and before:
        return (MODIFIED, ev.obj)
    if now:
        return (ADDED, ev.obj)
    if before:
        return (DELETED, ev.obj)
    return None


async def _expired_stream(e: RevisionCompacted, sse: bool) -> AsyncIterator[bytes]:
    status = errors.Gone(f"too old resource version: {e.requested} ({e.compacted})").status()
    if sse:
        yield _sse_line("ERROR", status, "")
    else:
        yield _event_line("ERROR", status)
