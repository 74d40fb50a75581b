"""/healthz, /livez, /readyz as kube-apiserver's healthz package answers them (fleet/server/health.py)."""

from __future__ import annotations

import pytest

from fleet.server.health import plan_report
from fleet.server.http import Req
from fleet.testing.apiserver import TOKEN, open_api


@pytest.mark.parametrize(("results", "excluded", "verbose", "want"), [
    ([("ping", None), ("etcd", None)], [], False, (200, "ok")),
    ([("ping", None), ("etcd", None)], [], True, (200, "[+]ping ok\n[+]etcd ok\nreadyz check passed\n")),
    ([("ping", None), ("etcd", "down")], [], False,
     (500, "[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed\n")),
    ([("ping", None), ("etcd", "down")], ["etcd"], True,
     (200, "[+]ping ok\n[+]etcd excluded: ok\nreadyz check passed\n")),
    ([("ping", None)], ["nope", "bad"], True,
     (200, '[+]ping ok\nwarn: some health checks cannot be excluded: no matches for "bad","nope"\n'
           "readyz check passed\n")),
])
def test_plan_report(results, excluded, verbose, want) -> None:  # type: ignore[no-untyped-def]
    assert plan_report("readyz", results, excluded, verbose) == want


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def get(api, path: str, query: str = "") -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    from urllib.parse import parse_qsl
    req = Req("GET", path, dict(parse_qsl(query, keep_blank_values=True)),
              {"authorization": f"Bearer {TOKEN}"}, raw_query=query)
    resp, _, _ = await api.server.handle(req)
    return resp.status, resp.content_type, resp.body.decode()


async def test_every_spelling(api) -> None:  # type: ignore[no-untyped-def]
    for path in ("/healthz", "/healthz/", "/livez", "/readyz", "/readyz/"):
        assert await get(api, path) == (200, "text/plain; charset=utf-8", "ok"), path
    for path in ("/healthz/ping", "/livez/ping", "/readyz/ping", "/readyz/etcd", "/readyz/informer-sync",
                 "/readyz/shutdown", "/livez/etcd"):
        assert (await get(api, path))[::2] == (200, "ok"), path
    assert await get(api, "/livez", "verbose") == (200, "text/plain; charset=utf-8",
                                                   "[+]ping ok\n[+]etcd ok\nlivez check passed\n")
    code, _, body = await get(api, "/readyz", "verbose=1&exclude=etcd&exclude=nope")
    assert code == 200 and body == ("[+]ping ok\n[+]etcd excluded: ok\n[+]informer-sync ok\n[+]shutdown ok\n"
                                    'warn: some health checks cannot be excluded: no matches for "nope"\n'
                                    "readyz check passed\n")
    for path in ("/readyz/nope", "/livez/shutdown", "/healthz/ping/x"):
        code, ctype, _ = await get(api, path)
        assert (code, ctype) == (404, "application/json"), path


async def test_a_draining_server_is_live_but_not_ready(api) -> None:  # type: ignore[no-untyped-def]
    api.server.ready = False
    assert await get(api, "/readyz") == (500, "text/plain; charset=utf-8", (
        "[+]ping ok\n[+]etcd ok\n[+]informer-sync ok\n[-]shutdown failed: reason withheld\nreadyz check failed\n"))
    assert await get(api, "/readyz/shutdown") == (500, "text/plain; charset=utf-8",
                                                  "internal server error: the server is shutting down\n")
    assert (await get(api, "/livez"))[::2] == (200, "ok")
    assert (await get(api, "/readyz", "exclude=shutdown"))[::2] == (200, "ok")
