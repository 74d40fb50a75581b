"""Load-generator process: `python -m bench.loadgen '<json spec>'`.

Runs in its own process (never the server's) on plain asyncio with httpx, and prints its
result as one JSON line on stdout (progress lines for the watch mode come before it).
Every mode is bounded both in count and in wall time, and stops by itself.

Modes (spec["mode"]):

- ``closed``: `concurrency` tasks, each sending its next request as soon as the previous one
  answered, until `count` requests were sent or `duration` seconds passed.  Measures
  throughput.  `op` is ``create`` (POST a small ConfigMap with a distinct name) or ``get``
  of a fixed `path` (e.g. /healthz: what the client alone can push).
- ``paced``: open loop at `rate` requests/s for `duration` s: request i is *scheduled* at
  start + i/rate and launched then whether or not earlier ones finished; its latency is
  measured from the scheduled time, so a stalled server shows up as latency instead of
  silently lowering the offered load (no coordinated omission).
- ``watch``: `watchers` concurrent streaming watch connections from `resource_version`;
  prints ``CONNECTED ok failed`` once every stream has its response headers, ``WARM n``
  once every stream received the warm-up event, then records time.time() at which each
  expected event line arrived on each stream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import resource
import ssl
import sys
import time
from typing import Any

import httpx

from bench.common import tls_verify

_SSL: dict[str, ssl.SSLContext] = {}


def _verify(ca_pem: str | None, cert_pem: str | None = None,
            key_pem: str | None = None) -> ssl.SSLContext | bool:
    # One context per process: building one per client (per connection) costs ~1 ms each.
    if not ca_pem:
        return False
    key = f"{ca_pem}|{cert_pem or ''}"
    if key not in _SSL:
        ctx = tls_verify(ca_pem, cert_pem, key_pem)
        assert isinstance(ctx, ssl.SSLContext)
        _SSL[key] = ctx
    return _SSL[key]


def _client(spec: dict[str, Any]) -> httpx.AsyncClient:
    """One client per connection.

    httpcore's connection pool rescans every connection on each request, so one shared
    pool of 50 connections spends most of its CPU there (measured: 150 req/s instead of
    1,400 req/s against a stub server).  A client holding a single connection avoids it.
    """
    headers = {"Authorization": f"Bearer {spec['token']}"} if spec.get("token") else {}
    return httpx.AsyncClient(
        base_url=spec["base_url"],
        headers=headers,
        verify=_verify(spec.get("ca_pem"), spec.get("client_cert_pem"), spec.get("client_key_pem")),
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=httpx.Timeout(spec.get("request_timeout", 30.0)),
    )


class ClientPool:
    """Up to `size` single-connection clients, handed out one request at a time."""

    def __init__(self, spec: dict[str, Any], size: int) -> None:
        self.spec = spec
        self.gate = asyncio.Semaphore(size)
        self.idle: list[httpx.AsyncClient] = []
        self.all: list[httpx.AsyncClient] = []

    async def acquire(self) -> httpx.AsyncClient:
        await self.gate.acquire()
        if self.idle:
            return self.idle.pop()
        c = _client(self.spec)
        self.all.append(c)
        return c

    def release(self, c: httpx.AsyncClient) -> None:
        self.idle.append(c)
        self.gate.release()

    async def aclose(self) -> None:
        for c in self.all:
            await c.aclose()


def _cm(name: str, namespace: str, payload: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "fleet"}},
        "data": {"payload": payload},
    }


async def _apply(client: httpx.AsyncClient, ns: str, name: str, body: dict[str, Any]) -> httpx.Response:
    return await client.patch(f"/api/v1/namespaces/{ns}/configmaps/{name}",
                              params={"fieldManager": "bench", "force": "true"},
                              content=json.dumps(body).encode(),
                              headers={"Content-Type": "application/apply-patch+yaml"})


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _wait_until(t_wall: float | None) -> None:
    if t_wall is not None:
        await asyncio.sleep(max(0.0, t_wall - time.time()))


# --------------------------------------------------------------------------- closed loop


async def closed(spec: dict[str, Any]) -> dict[str, Any]:
    ns = spec.get("namespace", "default")
    conc = int(spec["concurrency"])
    count = int(spec["count"])
    duration = float(spec["duration"])
    op = spec["op"]
    prefix = spec.get("name_prefix", f"b{os.getpid()}-")
    payload = "x" * int(spec.get("payload_bytes", 64))
    counter = itertools.count()
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    sample_errors: list[str] = []
    ok = failed = 0

    clients = [_client(spec) for _ in range(conc)]
    try:
        await _wait_until(spec.get("start_at"))
        cpu0 = _cpu_s()
        t_start = time.time()
        deadline = time.monotonic() + duration

        async def worker(client: httpx.AsyncClient) -> None:
            nonlocal ok, failed
            while time.monotonic() < deadline:
                i = next(counter)
                if i >= count:
                    return
                t0 = time.perf_counter()
                try:
                    if op == "create":
                        r = await client.post(
                            f"/api/v1/namespaces/{ns}/configmaps",
                            json=_cm(f"{prefix}{i}", ns, payload),
                        )
                    else:
                        r = await client.get(spec["path"])
                    code = str(r.status_code)
                except httpx.HTTPError as e:
                    code = type(e).__name__
                    r = None
                dt = time.perf_counter() - t0
                statuses[code] = statuses.get(code, 0) + 1
                if r is not None and r.status_code < 300:
                    ok += 1
                    latencies.append(dt)
                else:
                    failed += 1
                    if len(sample_errors) < 5:
                        sample_errors.append(f"{code}: {r.text[:200] if r is not None else ''}")

        await asyncio.gather(*(worker(c) for c in clients))
        t_end = time.time()
        cpu = _cpu_s() - cpu0
    finally:
        for c in clients:
            await c.aclose()
    return {
        "ok": ok,
        "failed": failed,
        "statuses": statuses,
        "latencies": latencies,
        "t_start": t_start,
        "t_end": t_end,
        "cpu_s": cpu,
        "sample_errors": sample_errors,
    }


# --------------------------------------------------------------------------- open loop


async def paced(spec: dict[str, Any]) -> dict[str, Any]:
    ns = spec.get("namespace", "default")
    op = spec["op"]
    rate = float(spec["rate"])
    duration = float(spec["duration"])
    n = int(rate * duration)
    prefix = spec.get("name_prefix", f"p{os.getpid()}-")
    names: list[str] = spec.get("names", [])
    rvs: dict[str, str] = dict(spec.get("resource_versions", {}))
    payload = "x" * int(spec.get("payload_bytes", 64))
    list_ns = spec.get("list_namespace", ns)
    # Another resource than ConfigMaps (bench_crd: custom resources): `collection` is the
    # collection's path in the objects' namespace, `list_collection` the one listed,
    # `template` the object created (its metadata.name and namespace are filled in).
    collection = spec.get("collection", f"/api/v1/namespaces/{ns}/configmaps")
    list_collection = spec.get("list_collection", f"/api/v1/namespaces/{list_ns}/configmaps")
    template: dict[str, Any] | None = spec.get("template")

    def new_object(name: str) -> dict[str, Any]:
        if template is None:
            return _cm(name, ns, payload)
        return {**template, "metadata": {**template.get("metadata", {}), "name": name, "namespace": ns}}
    latencies: list[float] = []  # from scheduled time to response
    service: list[float] = []  # from actual send to response
    statuses: dict[str, int] = {}
    sample_errors: list[str] = []
    launch_lag: list[float] = []
    list_sizes: list[int] = []
    free: asyncio.Queue[str] = asyncio.Queue()
    for name in names:
        free.put_nowait(name)

    async def one(pool: ClientPool, i: int, scheduled: float) -> None:
        client = await pool.acquire()  # waiting for a free connection counts as latency
        sent = time.perf_counter()
        try:
            if op == "create":
                r = await client.post(collection, json=new_object(f"{prefix}{i}"))
            elif op == "get":
                r = await client.get(f"{collection}/{names[i % len(names)]}")
            elif op == "list":
                r = await client.get(list_collection)
            elif op == "update":
                # Objects not being updated right now: an update never races another on
                # the same object, so a 409 here would be a server bug, not the bench.
                name = await free.get()
                try:
                    body = _cm(name, ns, payload)
                    body["data"]["seq"] = str(i)
                    body["metadata"]["resourceVersion"] = rvs[name]
                    r = await client.put(f"/api/v1/namespaces/{ns}/configmaps/{name}", json=body)
                    if r.status_code < 300:
                        rvs[name] = r.json()["metadata"]["resourceVersion"]
                finally:
                    free.put_nowait(name)
            elif op in ("apply", "patch"):
                # Server-side apply (new names: creates; `names`: updates) and, beside it,
                # the strategic merge patch client-side `kubectl apply` sends.
                if op == "apply" and not names:
                    name = f"{prefix}{i}"
                    r = await _apply(client, ns, name, _cm(name, ns, payload))
                else:
                    name = await free.get()
                    try:
                        if op == "apply":
                            body = _cm(name, ns, payload)
                            body["data"]["seq"] = str(i)
                            r = await _apply(client, ns, name, body)
                        else:
                            r = await client.patch(
                                f"/api/v1/namespaces/{ns}/configmaps/{name}",
                                params={"fieldManager": "kubectl-client-side-apply"},
                                content=json.dumps({"data": {"seq": str(i)}}).encode(),
                                headers={"Content-Type": "application/strategic-merge-patch+json"})
                    finally:
                        free.put_nowait(name)
            else:
                r = await client.get(spec.get("path", "/healthz"))
            code = str(r.status_code)
        except httpx.HTTPError as e:
            code, r = type(e).__name__, None
        finally:
            pool.release(client)
        done = time.perf_counter()
        statuses[code] = statuses.get(code, 0) + 1
        if r is not None and r.status_code < 300:
            latencies.append(done - scheduled)
            service.append(done - sent)
            if op == "list" and len(list_sizes) < 5:
                list_sizes.append(len(r.json().get("items") or []))
        elif len(sample_errors) < 5:
            sample_errors.append(f"{code}: {r.text[:200] if r is not None else ''}")

    pool = ClientPool(spec, int(spec.get("connections", 256)))
    try:
        # Open connections (TLS handshakes) before the clock starts, as a long-lived client
        # would have them; more are opened on demand if the server falls behind.
        warm = [await pool.acquire() for _ in range(int(spec.get("prewarm", 16)))]
        await asyncio.gather(*(c.get("/healthz") for c in warm))
        for c in warm:
            pool.release(c)
        await _wait_until(spec.get("start_at"))
        cpu0 = _cpu_s()
        tasks: set[asyncio.Task] = set()
        t0 = time.perf_counter() + 0.05
        hard_stop = t0 + duration + float(spec.get("drain_timeout", 30.0))
        for i in range(n):
            scheduled = t0 + i / rate
            now = time.perf_counter()
            if scheduled > now:
                await asyncio.sleep(scheduled - now)
            launch_lag.append(time.perf_counter() - scheduled)
            t = asyncio.create_task(one(pool, i, scheduled))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        unfinished = 0
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=max(0.0, hard_stop - time.perf_counter()))
            unfinished = len(pending)
            for t in pending:
                t.cancel()
        cpu = _cpu_s() - cpu0
    finally:
        await pool.aclose()
    ok = len(latencies)
    return {
        "op": op,
        "rate": rate,
        "scheduled": n,
        "ok": ok,
        "unfinished": unfinished,
        "statuses": statuses,
        "latencies": latencies,
        "service_times": service,
        "launch_lag_p99_ms": round(sorted(launch_lag)[int(0.99 * (len(launch_lag) - 1))] * 1000, 3)
        if launch_lag
        else None,
        "list_sizes": list_sizes,
        "connections_opened": len(pool.all),
        "cpu_s": cpu,
        "sample_errors": sample_errors,
    }


# --------------------------------------------------------------------------- watch fan-out


async def watch(spec: dict[str, Any]) -> dict[str, Any]:
    ns = spec["namespace"]
    n_watchers = int(spec["watchers"])
    prefix = spec["name_prefix"]
    expected = set(spec["expected_names"])
    warm = spec["warm_name"]
    deadline = time.monotonic() + float(spec["duration"])
    connect_timeout = float(spec.get("connect_timeout", 60.0))
    params = {
        "watch": "1",
        "resourceVersion": str(spec["resource_version"]),
        "timeoutSeconds": str(int(spec["duration"]) + 5),
    }
    received: list[dict[str, float]] = [{} for _ in range(n_watchers)]
    connected = asyncio.Event()
    warmed = asyncio.Event()
    n_connected = n_failed = n_warm = 0
    errors: list[str] = []
    connect_gate = asyncio.Semaphore(int(spec.get("connect_concurrency", 50)))
    url = f"/api/v1/namespaces/{ns}/configmaps"
    lines_seen = 0

    def check_connected() -> None:
        if n_connected + n_failed == n_watchers and not connected.is_set():
            connected.set()
            print(f"CONNECTED {n_connected} {n_failed}", flush=True)

    async def one(idx: int) -> None:
        async with _client(spec) as client:
            client.timeout = httpx.Timeout(connect_timeout, read=float(spec["duration"]) + 10)
            await watch_one(idx, client)

    async def watch_one(idx: int, client: httpx.AsyncClient) -> None:
        nonlocal n_connected, n_failed, n_warm, lines_seen
        got = received[idx]
        is_warm = False
        counted = False
        try:
            await connect_gate.acquire()
            released = False
            try:
                async with client.stream("GET", url, params=params) as resp:
                    connect_gate.release()
                    released = True
                    if resp.status_code != 200:
                        raise RuntimeError(f"watch status {resp.status_code}")
                    n_connected += 1
                    counted = True
                    check_connected()
                    async for line in resp.aiter_lines():
                        t = time.time()
                        if not line or prefix not in line:
                            continue
                        lines_seen += 1
                        ev = json.loads(line)
                        name = ((ev.get("object") or {}).get("metadata") or {}).get("name")
                        if name == warm and not is_warm:
                            is_warm = True
                            n_warm += 1
                            if n_warm == n_watchers:
                                warmed.set()
                                print(f"WARM {n_warm}", flush=True)
                        elif name in expected and name not in got:
                            got[name] = t
                            if len(got) == len(expected):
                                return
                        if time.monotonic() > deadline:
                            return
            finally:
                if not released:
                    connect_gate.release()
        except Exception as e:  # noqa: BLE001 - record and carry on; reported as missing events
            if len(errors) < 10:
                errors.append(f"watcher {idx}: {type(e).__name__}: {e}")
            if not counted:
                n_failed += 1
                check_connected()

    async def stop_when_told() -> None:
        # The coordinator creates `stop_file` once every event had time to arrive.
        stop_file = spec.get("stop_file")
        while stop_file and time.monotonic() < deadline:
            if os.path.exists(stop_file):
                return
            await asyncio.sleep(0.2)
        if not stop_file:
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    tasks = [asyncio.create_task(one(i)) for i in range(n_watchers)]
    stopper = asyncio.create_task(stop_when_told())
    everyone = asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.wait([everyone, stopper], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    for t in tasks:
        t.cancel()
    await asyncio.wait([everyone, stopper], timeout=10)
    if not connected.is_set():
        print(f"CONNECTED {n_connected} {n_failed}", flush=True)
    return {
        "watchers": n_watchers,
        "connected": n_connected,
        "connect_failed": n_failed,
        "warm": n_warm,
        "received": received,
        "lines_seen": lines_seen,
        "errors": errors,
        "cpu_s": _cpu_s(),
    }


MODES = {"closed": closed, "paced": paced, "watch": watch}


def main() -> None:
    spec = json.loads(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = asyncio.run(MODES[spec["mode"]](spec))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
