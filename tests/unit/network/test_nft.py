"""The nftables helper, against the real `nft` in a namespace the test owns."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from fleet.network import nft

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft installed"),
]

BODY_V1 = "chain postrouting {\n  type nat hook postrouting priority 100; policy accept;\n" \
          "  ip saddr 10.244.1.0/24 ip daddr != 10.244.0.0/16 masquerade\n}\n"
BODY_V2 = "chain postrouting {\n  type nat hook postrouting priority 100; policy accept;\n" \
          "  ip saddr 10.244.2.0/24 masquerade\n}\n"


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"flt-nft-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_replace_script_is_one_atomic_transaction() -> None:
    script = nft.replace_table_script("ip", "fleet", BODY_V1)
    assert script.splitlines()[:3] == ["table ip fleet", "delete table ip fleet", "table ip fleet {"]
    with pytest.raises(ValueError):
        nft.replace_table_script("ip", "bad name;", BODY_V1)
    with pytest.raises(ValueError):
        nft.replace_table_script("nope", "fleet", BODY_V1)


async def test_replace_list_delete(ns: str) -> None:
    assert not await nft.table_exists("ip", "fleet", netns=ns)
    await nft.replace_table("ip", "fleet", BODY_V1, netns=ns)
    assert await nft.table_exists("ip", "fleet", netns=ns)
    assert "10.244.1.0/24" in await nft.list_table("ip", "fleet", netns=ns)
    # Replacing swaps the contents; nothing of the old version stays.
    await nft.replace_table("ip", "fleet", BODY_V2, netns=ns)
    listing = await nft.list_table("ip", "fleet", netns=ns)
    assert "10.244.2.0/24" in listing and "10.244.1.0/24" not in listing
    assert await nft.delete_table("ip", "fleet", netns=ns) is True
    assert await nft.delete_table("ip", "fleet", netns=ns) is False
    assert not await nft.table_exists("ip", "fleet", netns=ns)


async def test_a_rejected_ruleset_changes_nothing(ns: str) -> None:
    await nft.replace_table("ip", "fleet", BODY_V1, netns=ns)
    with pytest.raises(nft.NftError, match="exit"):
        await nft.replace_table("ip", "fleet", BODY_V2 + "chain broken { this is not nft }\n", netns=ns)
    # The transaction (including its `delete table`) was rolled back whole.
    assert "10.244.1.0/24" in await nft.list_table("ip", "fleet", netns=ns)


async def test_json_rulesets_and_other_tables_are_left_alone(ns: str) -> None:
    await nft.apply({"nftables": [{"add": {"table": {"family": "inet", "name": "someone_else"}}}]},
                    netns=ns)
    await nft.replace_table("ip", "fleet", BODY_V1, netns=ns)
    await nft.delete_table("ip", "fleet", netns=ns)
    assert await nft.table_exists("inet", "someone_else", netns=ns)
    assert not await nft.table_exists("ip", "someone_else", netns=ns)


async def test_the_namespace_is_respected(ns: str) -> None:
    await nft.replace_table("ip", "fleet_ns_probe", BODY_V1, netns=ns)
    # Only the test namespace has it, not the machine's own ruleset.
    assert not await nft.table_exists("ip", "fleet_ns_probe")
