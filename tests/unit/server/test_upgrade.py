"""Which requests fleet/server/upgrade.py takes over as raw upgrades."""

from __future__ import annotations

import hypercorn.protocol
import pytest
from hypercorn.config import Config

from fleet.server import upgrade


@pytest.mark.parametrize("headers,want", [
    ([(b"Upgrade", b"SPDY/3.1"), (b"Connection", b"Upgrade")], "spdy/3.1"),
    ([(b"upgrade", b"SPDY/3.1"), (b"connection", b"keep-alive, Upgrade")], "spdy/3.1"),
    ([(b"upgrade", b"websocket"), (b"connection", b"upgrade")], "websocket"),
    ([(b"upgrade", b"SPDY/3.1")], None),                   # no Connection: upgrade
    ([(b"connection", b"upgrade")], None),                 # nothing to upgrade to
    ([(b"content-type", b"application/json")], None),
])
def test_upgrade_token(headers: list[tuple[bytes, bytes]], want: str | None) -> None:
    assert upgrade.upgrade_token(headers) == want


def test_enable_marks_only_the_listener_it_is_given() -> None:
    api, other = Config(), Config()
    upgrade.enable(api)
    assert getattr(api, upgrade.CONFIG_ATTR) == ("spdy/3.1",)
    assert not hasattr(other, upgrade.CONFIG_ATTR)  # agent/metrics listeners: plain hypercorn
    assert hypercorn.protocol.H11Protocol is upgrade.UpgradeH11Protocol


@pytest.mark.parametrize("path,token,offered,code,fragment", [
    ("pods/p/portforward", False, b"portforward.k8s.io", 401, "Unauthorized"),
    ("pods/nope/portforward", True, b"portforward.k8s.io", 404, 'pods "nope" not found'),
    ("pods/p/portforward", True, b"v9.example", 403, "unable to negotiate protocol"),
    ("pods/p/exec", True, b"v4.channel.k8s.io", 400, "over WebSocket only"),
])
async def test_refused_raw_upgrades_are_statuses(tmp_path, path: str, token: bool,  # type: ignore[no-untyped-def]
                                                 offered: bytes, code: int, fragment: str) -> None:
    import json

    from fleet.server.asgi import create_app
    from fleet.testing.apiserver import TOKEN, open_api
    from tests.unit.server.test_proxy import put_node, put_pod

    sent: list[dict] = []

    async def send(msg: dict) -> None:
        sent.append(msg)

    async def receive() -> dict:
        return {"type": "raw.disconnect"}

    headers = [(b"upgrade", b"SPDY/3.1"), (b"connection", b"Upgrade"),
               (b"x-stream-protocol-version", offered)]
    if token:
        headers.append((b"authorization", f"Bearer {TOKEN}".encode()))
    async with open_api(tmp_path) as api:
        await put_node(api, 9301)
        await put_pod(api, "p", "a")
        full = f"/api/v1/namespaces/default/{path}"
        scope = {"type": upgrade.SCOPE_TYPE, "method": "POST", "path": full,
                 "raw_path": full.encode(), "query_string": b"command=ls&stdout=1",
                 "headers": headers}
        await create_app(api.server)(scope, receive, send)
    assert [m["type"] for m in sent] == ["raw.response"]
    assert sent[0]["status"] == code
    assert fragment in json.loads(sent[0]["body"])["message"]
