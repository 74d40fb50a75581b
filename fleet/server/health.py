"""The health endpoints `/healthz`, `/livez` and `/readyz`, answered as
kube-apiserver's healthz package does (apiserver/pkg/server/healthz).

Each endpoint runs a list of named checks:

- `GET /readyz` → 200 `ok` when every check passes; `?verbose` lists them
  (`[+]ping ok` … `readyz check passed`); `?exclude=<name>` (repeatable) skips
  one (`[+]<name> excluded: ok`, and a `warn:` line for names that match none);
- a failing check → 500 with the list (`[-]etcd failed: reason withheld`) and
  `readyz check failed` — the reason stays in the server's log, the endpoint
  being public;
- `GET /readyz/<name>` runs one check: `ok`, or 500 `internal server error: …`;
  a name that is no check is 404.

The checks Fleet has: `ping` (the server answers), `etcd` (a read of the store
completes in time), and for readiness `informer-sync` (the namespace cache
has listed) and `shutdown` (the server is not draining).  `plan_report` is the
pure part; `HealthChecks` runs the checks against the server's pieces.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

import trio

from fleet.server.http import Req, Resp

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"
HEADERS = {"X-Content-Type-Options": "nosniff"}
ENDPOINTS = ("healthz", "livez", "readyz")
STORE_TIMEOUT = 2.0

Check = Callable[[], Awaitable[str | None]]  # an error message, or None when healthy


def _quoted(names: list[str]) -> str:
    return ",".join(f'"{n}"' for n in names)


def plan_report(endpoint: str, results: list[tuple[str, str | None]], excluded: list[str],
                verbose: bool) -> tuple[int, str]:
    """(status, body) of `GET /<endpoint>` from the checks' results in order (an error
    message or None); `excluded`: the names the request skipped (their result unused)."""
    skip = set(excluded)
    out, failed = [], []
    for name, err in results:
        if name in skip:
            skip.discard(name)
            out.append(f"[+]{name} excluded: ok\n")
        elif err is not None:
            out.append(f"[-]{name} failed: reason withheld\n")
            failed.append(name)
        else:
            out.append(f"[+]{name} ok\n")
    if skip:
        out.append(f"warn: some health checks cannot be excluded: no matches for {_quoted(sorted(skip))}\n")
    if failed:
        # Go's http.Error: the message and a newline, always verbose.
        return 500, "".join(out) + f"{endpoint} check failed\n"
    if not verbose:
        return 200, "ok"
    return 200, "".join(out) + f"{endpoint} check passed\n"


class HealthChecks:
    """The named checks of each endpoint, and the handler that runs them."""

    def __init__(self, checks: dict[str, dict[str, Check]]) -> None:
        # endpoint -> {check name -> check}, in the order they are reported
        self.checks = checks

    async def _run(self, name: str, check: Check) -> str | None:
        try:
            err = await check()
        except Exception as e:  # a check that breaks is a failing check, never a 500 traceback
            err = f"{type(e).__name__}: {e}"
        if err is not None:
            log.info("health check %s failed: %s", name, err)
        return err

    def has(self, endpoint: str, name: str) -> bool:
        return name in self.checks.get(endpoint, {})

    async def serve(self, req: Req, segs: list[str]) -> Resp:
        """`segs`: the path's segments, the endpoint first (and a check's name after)."""
        endpoint = segs[0]
        checks = self.checks.get(endpoint, {})
        if len(segs) == 2:
            err = await self._run(segs[1], checks[segs[1]])
            if err is not None:
                return Resp(500, f"internal server error: {err}\n".encode(), TEXT, dict(HEADERS))
            return Resp(200, b"ok", TEXT, dict(HEADERS))
        query = parse_qs(req.raw_query, keep_blank_values=True) if req.raw_query is not None else {
            k: [v] for k, v in req.query.items()}
        excluded = query.get("exclude", [])
        results = [(name, None if name in excluded else await self._run(name, check))
                   for name, check in checks.items()]
        status, body = plan_report(endpoint, results, excluded, "verbose" in query)
        return Resp(status, body.encode(), TEXT, dict(HEADERS))


def store_check(store: object) -> Check:
    """`etcd`: a read of the store completes within STORE_TIMEOUT."""
    async def check() -> str | None:
        with trio.move_on_after(STORE_TIMEOUT):
            await store.list("/healthz/", limit=1)  # type: ignore[attr-defined]
            return None
        return f"the store did not answer a read within {STORE_TIMEOUT:g}s"
    return check


async def ping() -> str | None:
    return None


__all__ = ["ENDPOINTS", "HealthChecks", "plan_report", "ping", "store_check"]
