"""The conversion seam of custom resources: objects between a CRD's versions.

A CRD's objects are stored once, at its storage version; a request at another served
version reads and writes them converted.  Everything that converts goes through
`convert(crd, objects, desired_api_version)` — the one async seam, so a strategy
that needs I/O (`Webhook`: a ConversionReview to the CRD's webhook) plugs in here
without touching the REST or watch code:

- `None`: only `apiVersion` is rewritten (kube's nopConverter);
- `Webhook`: a ConversionReview to `spec.conversion.webhook`
  (fleet/server/conversion_webhook.py; the decisions and kube's messages in
  fleet/api/crd/conversion.py).  `webhooks` is the server's `WebhookConverter` (its
  client pool, Service references resolved from its store), bound by the CRD registrar;
  without one a call still goes out by `url`, with a client of its own.  A failure is a
  `ConversionError`: 500, `conversion webhook for <gvk> failed: ...`.

The generic REST and watch code call `to_version(info, objects, api_version)`, which
uses the kind's `convert` strategy (`KindInfo.convert`, set by the CRD registrar,
fleet/server/crd_controller.py) only for objects not already at the wanted version, then
applies the schema's defaults as kube does on every read from storage
(`KindInfo.read_defaults`) — built-in kinds have neither and are returned as they are.
"""

from __future__ import annotations

from typing import Any

from fleet.api.registry import KindInfo
from fleet.server.conversion_webhook import ConversionError, WebhookConverter, convert_by_webhook


async def convert(crd: dict[str, Any], objects: list[dict[str, Any]], desired_api_version: str, *,
                  webhooks: WebhookConverter | None = None) -> list[dict[str, Any]]:
    """`objects` (any served versions of `crd`'s kind) at `desired_api_version`."""
    strategy = ((crd.get("spec") or {}).get("conversion") or {}).get("strategy") or "None"
    todo = [o for o in objects if o.get("apiVersion") != desired_api_version]
    if not todo:
        return objects
    if strategy == "Webhook":
        spec = ((crd.get("spec") or {}).get("conversion") or {}).get("webhook") or {}
        if webhooks is not None:
            return await webhooks.convert(spec, objects, desired_api_version)
        return await convert_by_webhook(spec, objects, desired_api_version)
    return [o if o.get("apiVersion") == desired_api_version else {**o, "apiVersion": desired_api_version}
            for o in objects]


async def to_version(info: KindInfo, objects: list[dict[str, Any]], api_version: str | None = None
                     ) -> list[dict[str, Any]]:
    """`objects` at `api_version` (default: the kind's own) through the kind's convert strategy."""
    want = api_version or info.api_version
    if info.convert is not None and any(o.get("apiVersion") != want for o in objects):
        objects = await info.convert(objects, want)
    if info.read_defaults is not None and api_version is None:
        objects = [info.read_defaults(o) for o in objects]
    return objects


async def one(info: KindInfo, obj: dict[str, Any], api_version: str | None = None) -> dict[str, Any]:
    return (await to_version(info, [obj], api_version))[0]


async def to_storage(info: KindInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` at the version its kind is stored at."""
    return await one(info, obj, info.storage_api_version)


__all__ = ["ConversionError", "convert", "one", "to_storage", "to_version"]
