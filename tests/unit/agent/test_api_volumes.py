"""The agent API's volume stats: /stats/summary `volume` entries and kubelet_volume_stats_*
on /metrics, from a locator that knows the pods' claimed volumes (PodSync does)."""

from __future__ import annotations

from typing import Any

from fleet.agent.api import create_app
from fleet.agent.csiplan import metric_samples, summary_entry
from fleet.storage.driver import VolumeStats

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STATS = VolumeStats(capacity_bytes=1000, available_bytes=700, used_bytes=300, inodes=50,
                    inodes_free=40, inodes_used=10)


class PodsWithVolumes:
    def find(self, namespace: str, pod: str, container: str | None) -> None:
        return None

    def all(self) -> list[Any]:
        return [("ns", "web-0", "u1", []), ("ns", "plain", "u2", [])]

    async def volume_entries(self, uid: str) -> list[dict[str, Any]]:
        return [summary_entry("data", STATS, "data-web-0", "ns", "T")] if uid == "u1" else []

    async def volume_metrics(self) -> str:
        return metric_samples([("ns", "data-web-0", STATS)])


async def test_summary_has_volume_entries_with_pvc_ref() -> None:
    c = create_app(PodsWithVolumes(), token=TOKEN, node_name="n1").test_client()
    resp = await c.get("/stats/summary", headers=AUTH)
    assert resp.status_code == 200
    doc = await resp.get_json()
    pods = {p["podRef"]["name"]: p for p in doc["pods"]}
    [vol] = pods["web-0"]["volume"]
    assert vol["pvcRef"] == {"name": "data-web-0", "namespace": "ns"}
    assert (vol["capacityBytes"], vol["availableBytes"], vol["usedBytes"]) == (1000, 700, 300)
    assert (vol["inodes"], vol["inodesFree"], vol["inodesUsed"]) == (50, 40, 10)
    assert "volume" not in pods["plain"]


async def test_metrics_expose_kubelet_volume_stats() -> None:
    c = create_app(PodsWithVolumes(), token=TOKEN, node_name="n1").test_client()
    text = (await (await c.get("/metrics", headers=AUTH)).get_data()).decode()
    for metric, value in (("capacity_bytes", 1000), ("available_bytes", 700),
                          ("used_bytes", 300), ("inodes", 50), ("inodes_free", 40),
                          ("inodes_used", 10)):
        assert (f'kubelet_volume_stats_{metric}{{namespace="ns",persistentvolumeclaim='
                f'"data-web-0"}} {float(value)}') in text
