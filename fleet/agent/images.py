"""The pod worker's view of images: `ImageProvider` and the image store behind it.

Split from `fleet.agent.worker` (which re-exports these names): the worker asks for
an image by reference, pull policy and pull secrets and gets its layers and config;
`StoreImages` answers from the node's image store (`fleet.runtime.images`), pulling
through the registry client when the policy says so, one pull per image at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio


@dataclass
class ImageInfo:
    ref: str
    image_id: str
    layers: list[Path]  # bottom layer first, as the image store gives them
    config: dict[str, Any]


class ImageProvider(Protocol):
    async def ensure(self, image: str, policy: str | None,
                     pull_secrets: Sequence[Mapping[str, Any]]) -> ImageInfo: ...


class StoreImages:
    """`ImageProvider` over the node's image store and registry pulls."""

    def __init__(self, store: Any, insecure_registries: Sequence[str] = (),
                 registries: Any = None) -> None:
        self.store = store
        self.insecure = list(insecure_registries)
        # fleet.runtime.images.mirrors.RegistriesConfig (mirrors, per-host auth/TLS) or None.
        self.registries = registries
        self._locks: dict[str, trio.Lock] = {}

    def will_pull(self, image: str, policy: str | None) -> bool:
        """Whether `ensure` goes to the registry (for the Pulling/Pulled events)."""
        from fleet.runtime.images import ImagePullError
        from fleet.runtime.images.policy import should_pull

        try:
            return should_pull(policy, self.store.get(image) is not None, image=image)
        except (ImagePullError, ValueError):
            return False

    async def ensure(self, image: str, policy: str | None,
                     pull_secrets: Sequence[Mapping[str, Any]]) -> ImageInfo:
        from fleet.runtime.images import credentials_for, parse_reference, pull

        # One pull per image at a time: two pods of one image share the download.
        lock = self._locks.setdefault(image, trio.Lock())
        async with lock:
            auth = None
            if pull_secrets:
                auth = credentials_for(parse_reference(image).domain, pull_secrets)
            rec = await pull(self.store, image, policy=policy, auth=auth,
                             insecure_registries=self.insecure, registries=self.registries)
        layers = await self.store.layers_for(image)
        config = await self.store.image_config(image)
        digest = getattr(rec, "digest", "") or getattr(rec, "id", "")
        return ImageInfo(ref=image, image_id=str(digest), layers=layers, config=config)


__all__ = ["ImageInfo", "ImageProvider", "StoreImages"]
