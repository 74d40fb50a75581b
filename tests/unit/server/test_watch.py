"""Watch streams: initial events, ordering, selectors, bookmarks, 410 Expired, SSE."""

from __future__ import annotations

import json

import pytest
import trio

from fleet.testing.apiserver import open_api

CM = "/api/v1/namespaces/default/configmaps"


def cm(name: str, labels: dict | None = None, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels or {}}, "data": dict(data)}


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, retention=5, compact_interval=3600) as a:
        yield a


class Stream:
    """Reads events (one JSON object per line, or SSE blocks) from a streaming Resp."""

    def __init__(self, resp):
        assert resp.status == 200, resp.body
        self.it = resp.body.__aiter__()
        self.buf = b""

    async def next(self, timeout: float = 5.0) -> dict:
        with trio.fail_after(timeout):
            while b"\n" not in self.buf:
                self.buf += await self.it.__anext__()
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    async def close(self):
        await self.it.aclose()


async def test_watch_from_revision_in_order(api):
    _, first = await api.json("POST", CM, cm("a"))
    rv = first["metadata"]["resourceVersion"]
    s = Stream(await api.call("GET", CM, query={"watch": "1", "resourceVersion": rv}))
    await api.json("PUT", f"{CM}/a", {**first, "data": {"x": "1"}})
    await api.json("POST", CM, cm("b"))
    await api.json("DELETE", f"{CM}/a")
    got = [await s.next() for _ in range(3)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
        ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3
    await s.close()


async def test_watch_without_rv_sends_initial_state(api):
    await api.json("POST", CM, cm("a"))
    await api.json("POST", CM, cm("b"))
    s = Stream(await api.call("GET", CM, query={"watch": "true"}))
    got = {(await s.next())["object"]["metadata"]["name"] for _ in range(2)}
    assert got == {"a", "b"}
    await api.json("POST", CM, cm("c"))
    e = await s.next()
    assert e["type"] == "ADDED" and e["object"]["metadata"]["name"] == "c"
    await s.close()


async def test_send_initial_events_ends_with_bookmark(api):
    await api.json("POST", CM, cm("a"))
    s = Stream(await api.call("GET", CM, query={
        "watch": "1", "sendInitialEvents": "true", "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan"}))
    e = await s.next()
    assert e["type"] == "ADDED"
    b = await s.next()
    assert b["type"] == "BOOKMARK"
    assert b["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    await s.close()
    # sendInitialEvents without bookmarks is refused, so clients fall back to list+watch.
    code, st = await api.json("GET", CM, query={"watch": "1", "sendInitialEvents": "true"})
    assert code == 422


async def test_label_selector_turns_modified_into_added_and_deleted(api):
    _, obj = await api.json("POST", CM, cm("a", {"tier": "x"}))
    s = Stream(await api.call("GET", CM, query={
        "watch": "1", "labelSelector": "tier=y", "resourceVersion": obj["metadata"]["resourceVersion"]}))
    _, obj = await api.json("PATCH", f"{CM}/a", {"metadata": {"labels": {"tier": "y"}}},
                            content_type="application/merge-patch+json")
    _, obj = await api.json("PATCH", f"{CM}/a", {"data": {"k": "v"}},
                            content_type="application/merge-patch+json")
    _, obj = await api.json("PATCH", f"{CM}/a", {"metadata": {"labels": {"tier": "z"}}},
                            content_type="application/merge-patch+json")
    types = [(await s.next())["type"] for _ in range(3)]
    assert types == ["ADDED", "MODIFIED", "DELETED"]
    await s.close()


async def test_too_old_revision_is_an_in_stream_410(api):
    for i in range(30):
        await api.json("POST", CM, cm(f"x{i}"))
    await api.store.compact(api.store.current_revision() - 2)
    s = Stream(await api.call("GET", CM, query={"watch": "1", "resourceVersion": "2"}))
    e = await s.next()
    assert e["type"] == "ERROR"
    assert e["object"]["code"] == 410 and e["object"]["reason"] == "Expired"
    await s.close()


async def test_timeout_seconds_ends_the_stream(api):
    resp = await api.call("GET", CM, query={"watch": "1", "timeoutSeconds": "1"})
    chunks = []
    with trio.fail_after(5):
        async for c in resp.body:
            chunks.append(c)
    # the stream closed by itself after ~1 s


async def test_sse_watch(api):
    _, obj = await api.json("POST", CM, cm("a"))
    resp = await api.call("GET", "/api/v1/watch/namespaces/default/configmaps",
                          query={"resourceVersion": obj["metadata"]["resourceVersion"]})
    assert resp.content_type == "text/event-stream"
    it = resp.body.__aiter__()
    await api.json("POST", CM, cm("b"))
    with trio.fail_after(5):
        block = await it.__anext__()
    text = block.decode()
    assert text.startswith("event: ADDED\n")
    assert "\nid: " in text and '"name":"b"' in text
    await it.aclose()


async def test_watch_count_metric(api):
    resp = await api.call("GET", CM, query={"watch": "1", "resourceVersion": "0"})
    it = resp.body.__aiter__()
    await api.json("POST", CM, cm("m"))
    with trio.fail_after(5):
        await it.__anext__()
    assert api.server.watches.open == 1
    await it.aclose()
    assert api.server.watches.open == 0
