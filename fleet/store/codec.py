"""The store's one encode/decode seam: every value goes through a `ValueCodec`
between its JSON text and the database row, on every write (the writer's
`_append`) and every read (get, list, history for watches, the writer's own
read of the current value).  Objects above the store — the REST layer, the
watch cache, watchers — only ever see plaintext; the file holds what `seal`
returned.  The default is the identity; fleet/store/encryption.py supplies the
EncryptionConfiguration one.  Codecs run in the store's worker threads, so
they may block (a KMS call on a cache miss).
"""

from __future__ import annotations

from typing import Protocol


class ValueCodec(Protocol):
    def seal(self, key: str, text: str) -> str:
        """The stored form of `text` (an object's JSON) under storage key `key`."""
        ...

    def open(self, key: str, stored: str) -> str:
        """The JSON text `stored` (as written by `seal` under `key`) stands for."""
        ...


class PlainCodec:
    """Values stored as their JSON text (no encryption config)."""

    def seal(self, key: str, text: str) -> str:
        return text

    def open(self, key: str, stored: str) -> str:
        return stored


PLAIN = PlainCodec()
