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
