"""Nothing the server acknowledged is lost when it is killed with SIGKILL mid-write.

Several writer threads create ConfigMaps over HTTP as fast as the server takes them and
record every create it acknowledged (201 with the stored object).  The server is killed
with SIGKILL while they write, restarted on the same data dir, and every acknowledged
object must be there, with the data it was written with.  The database file must pass
SQLite's integrity check both as the crash left it and after the restart.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import FleetServer, ServerFactory, create_namespace
from tests.e2e.helpers import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WRITERS = 8
NS = "durable"


def integrity_check(db: Path, *, read_only: bool) -> str:
    uri = f"file:{db}?mode=ro" if read_only else f"file:{db}"
    conn = sqlite3.connect(uri, uri=True, timeout=5)
    try:
        return "\n".join(r[0] for r in conn.execute("PRAGMA integrity_check").fetchall())
    finally:
        conn.close()


def copy_db(db: Path, dest_dir: Path) -> Path:
    """Copy the database with its WAL and shm files, as the crash left them."""
    dest_dir.mkdir()
    for suffix in ("", "-wal", "-shm", "-journal"):
        src = Path(str(db) + suffix)
        if src.exists():
            shutil.copy2(src, dest_dir / (db.name + suffix))
    return dest_dir / db.name


class Writer(threading.Thread):
    """Creates ConfigMaps until told to stop or the server goes away."""

    def __init__(self, srv: FleetServer, idx: int, stop: threading.Event) -> None:
        super().__init__(name=f"writer-{idx}", daemon=True)
        self.srv, self.idx, self.stop_event = srv, idx, stop
        self.acked: dict[str, dict[str, Any]] = {}  # name -> object the server returned
        self.unexpected: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + 60
        with self.srv.client(timeout=10) as c:
            for n in range(100_000):  # bounded; the stop event or a dead server ends it sooner
                if self.stop_event.is_set() or time.monotonic() > deadline:
                    return
                name = f"w{self.idx}-{n:05d}"
                body = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "labels": {"writer": str(self.idx)}},
                        "data": {"n": str(n), "payload": f"{self.idx}:{n}:" + "x" * 200}}
                try:
                    r = c.post(f"/api/v1/namespaces/{NS}/configmaps", json=body)
                except httpx.HTTPError:
                    return  # the server died: this create's outcome is unknown
                if r.status_code == 201:
                    obj = r.json()
                    if obj.get("metadata", {}).get("name") != name:
                        self.unexpected.append(f"201 with wrong body: {r.text[:200]}")
                    self.acked[name] = obj
                elif r.status_code in (429, 503):
                    continue  # back-pressure is allowed; nothing was acknowledged
                else:
                    self.unexpected.append(f"{r.status_code}: {r.text[:300]}")
                    return


def list_all(srv: FleetServer, ns: str) -> tuple[dict[str, dict[str, Any]], str]:
    with srv.client(timeout=30) as c:
        r = c.get(f"/api/v1/namespaces/{ns}/configmaps")
    assert r.status_code == 200, r.text
    body = r.json()
    return {o["metadata"]["name"]: o for o in body["items"]}, body["metadata"]["resourceVersion"]


def test_acknowledged_writes_survive_sigkill(fleet_server_factory: ServerFactory, tmp_path: Path) -> None:
    srv = fleet_server_factory.start()
    create_namespace(srv, NS)
    _, rv_before = list_all(srv, NS)

    stop = threading.Event()
    writers = [Writer(srv, i, stop) for i in range(WRITERS)]
    for w in writers:
        w.start()
    try:
        # Let the writers run until the server has acknowledged a good number of creates
        # (at least ~1.5 s of traffic), then pull the plug.
        t0 = time.monotonic()
        wait_until(lambda: sum(len(w.acked) for w in writers) >= 200 and time.monotonic() - t0 >= 1.5,
                   timeout=30, what="writers to get 200 acknowledgements")
        assert all(w.is_alive() for w in writers), [w.unexpected for w in writers]
        srv.kill()
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=20)
    assert not any(w.is_alive() for w in writers)
    problems = [p for w in writers for p in w.unexpected]
    assert not problems, problems
    acked: dict[str, dict[str, Any]] = {}
    for w in writers:
        acked.update(w.acked)
    assert len(acked) >= 200

    # The files as the crash left them are a consistent SQLite database.
    crash_copy = copy_db(srv.db_path, tmp_path / "crash-copy")
    assert integrity_check(crash_copy, read_only=False) == "ok"

    # Restart on the same data dir; every acknowledged object is there, unchanged.
    srv.start()
    stored, rv_after = list_all(srv, NS)
    missing = sorted(set(acked) - set(stored))
    assert not missing, f"{len(missing)} acknowledged creates lost, e.g. {missing[:10]}"
    for name, obj in acked.items():
        got = stored[name]
        assert got["data"] == obj["data"], name
        assert got["metadata"]["uid"] == obj["metadata"]["uid"], name
        assert got["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"], name

    # Revisions never go backwards across the restart.
    max_acked = max(int(o["metadata"]["resourceVersion"]) for o in acked.values())
    assert int(rv_after) >= max_acked
    with srv.client() as c:
        r = c.post(f"/api/v1/namespaces/{NS}/configmaps",
                   json={"metadata": {"name": "after-restart"}, "data": {"a": "b"}})
        assert r.status_code == 201, r.text
        assert int(r.json()["metadata"]["resourceVersion"]) > int(rv_after)

    # A watch from a revision before the crash replays every acknowledged create.
    want = set(acked)
    seen: set[str] = set()
    with srv.client(timeout=httpx.Timeout(10, read=30)) as c, c.stream(
        "GET", f"/api/v1/namespaces/{NS}/configmaps",
        params={"watch": "true", "resourceVersion": rv_before, "timeoutSeconds": "20"},
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.strip():
                continue
            ev = json.loads(line)
            assert ev["type"] != "ERROR", ev
            if ev["type"] == "ADDED":
                seen.add(ev["object"]["metadata"]["name"])
            if want <= seen:
                break
    assert not (want - seen), f"watch after restart missed {sorted(want - seen)[:10]}"

    # Stopped cleanly, the database passes the integrity check opened read-only.
    rc = srv.stop()
    assert rc == 0, srv.output()[-3000:]
    assert integrity_check(srv.db_path, read_only=True) == "ok"


def test_repeated_crashes_keep_revisions_monotonic(fleet_server_factory: ServerFactory) -> None:
    """Three kill -9 / restart cycles: objects accumulate, revisions only grow."""
    srv = fleet_server_factory.start()
    create_namespace(srv, NS)
    last_rv = 0
    names: set[str] = set()
    for cycle in range(3):
        with srv.client() as c:
            for i in range(20):
                name = f"c{cycle}-{i}"
                r = c.post(f"/api/v1/namespaces/{NS}/configmaps",
                           json={"metadata": {"name": name}, "data": {"cycle": str(cycle)}})
                assert r.status_code == 201, r.text
                rv = int(r.json()["metadata"]["resourceVersion"])
                assert rv > last_rv
                last_rv = rv
                names.add(name)
            # An update and a delete are durable too.
            r = c.patch(f"/api/v1/namespaces/{NS}/configmaps/c{cycle}-0",
                        content=json.dumps({"data": {"cycle": "patched"}}),
                        headers={"Content-Type": "application/merge-patch+json"})
            assert r.status_code == 200, r.text
            last_rv = int(r.json()["metadata"]["resourceVersion"])
            r = c.delete(f"/api/v1/namespaces/{NS}/configmaps/c{cycle}-1")
            assert r.status_code == 200, r.text
            names.discard(f"c{cycle}-1")
        srv.kill()
        srv.start()
        stored, rv = list_all(srv, NS)
        assert set(stored) == names
        assert int(rv) >= last_rv
        for k in range(cycle + 1):
            assert stored[f"c{k}-0"]["data"] == {"cycle": "patched"}
