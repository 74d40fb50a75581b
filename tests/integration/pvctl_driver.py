"""A storage driver registered from outside fleet/ (`--storage-plugin
tests.integration.pvctl_driver`), for the PV controller's server-level tests: it only
declares capabilities — node-local with capacity tracking — and refuses every call
(nothing in those tests provisions or mounts)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet.storage import registry
from fleet.storage.driver import (
    Capabilities,
    Code,
    CreateVolumeRequest,
    DriverEnv,
    DriverError,
    Volume,
    VolumeStats,
)

NAME = "node-local.pvctl.test"


class NodeLocalTestDriver:
    name = NAME
    capabilities = Capabilities(node_local=True, topology_keys=("kubernetes.io/hostname",),
                                capacity_tracking=True)

    def __init__(self, env: DriverEnv) -> None:
        self.env = env

    def _no(self, *_: Any, **__: Any) -> Any:
        raise DriverError(Code.UNIMPLEMENTED, f"{NAME} only declares capabilities")

    async def create_volume(self, req: CreateVolumeRequest) -> Volume:
        return self._no()

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None:
        self._no()

    async def controller_publish(self, volume_id: str, node: str, context: Mapping[str, str]) -> Mapping[str, str]:
        return self._no()

    async def controller_unpublish(self, volume_id: str, node: str) -> None:
        self._no()

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        return self._no()

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        return None

    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: Any, publish_context: Mapping[str, str]) -> None:
        self._no()

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None:
        self._no()

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *, read_only: bool,
                           volume_mode: Any, context: Mapping[str, str]) -> None:
        self._no()

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None:
        self._no()

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        return self._no()

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        return self._no()


registry.register(NAME, NodeLocalTestDriver)
