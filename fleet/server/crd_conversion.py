"""The conversion seam of custom resources: objects between a CRD's versions.

A CRD's objects are stored once, at its storage version; a request at another served
version reads and writes them converted.  Everything that converts goes through
`convert(crd, objects, desired_api_version)` — the one async seam, so a strategy
that needs I/O (`Webhook`: a ConversionReview to the CRD's webhook) plugs in here
without touching the REST or watch code:

- `None`: only `apiVersion` is rewritten (kube's nopConverter);
- `Webhook`: `WebhookConversionUnavailable` until the ConversionReview client is
  connected here (it is built separately).

The generic REST and watch code call `to_version(info, objects, api_version)`, which
uses the kind's `convert` strategy (`KindInfo.convert`, set by the CRD registrar,
fleet/server/crd_controller.py) only for objects not already at the wanted version —
built-in kinds have none and are returned as they are.
"""

from __future__ import annotations

from typing import Any

from fleet.api import errors
from fleet.api.registry import KindInfo


class WebhookConversionUnavailable(errors.APIError):
    """A CRD asks for webhook conversion, which this seam does not do yet."""

    def __init__(self, name: str) -> None:
        super().__init__(f'conversion webhook for {name} failed: webhook conversion is not available in this '
                         "server", code=500, reason="InternalError")


async def convert(crd: dict[str, Any], objects: list[dict[str, Any]], desired_api_version: str
                  ) -> list[dict[str, Any]]:
    """`objects` (any served versions of `crd`'s kind) at `desired_api_version`."""
    strategy = ((crd.get("spec") or {}).get("conversion") or {}).get("strategy") or "None"
    todo = [o for o in objects if o.get("apiVersion") != desired_api_version]
    if not todo:
        return objects
    if strategy == "Webhook":
        raise WebhookConversionUnavailable(str((crd.get("metadata") or {}).get("name") or ""))
    return [o if o.get("apiVersion") == desired_api_version else {**o, "apiVersion": desired_api_version}
            for o in objects]


async def to_version(info: KindInfo, objects: list[dict[str, Any]], api_version: str | None = None
                     ) -> list[dict[str, Any]]:
    """`objects` at `api_version` (default: the kind's own) through the kind's convert strategy."""
    want = api_version or info.api_version
    if info.convert is None or all(o.get("apiVersion") == want for o in objects):
        return objects
    return await info.convert(objects, want)


async def one(info: KindInfo, obj: dict[str, Any], api_version: str | None = None) -> dict[str, Any]:
    return (await to_version(info, [obj], api_version))[0]


async def to_storage(info: KindInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` at the version its kind is stored at."""
    return await one(info, obj, info.storage_api_version)


__all__ = ["WebhookConversionUnavailable", "convert", "one", "to_storage", "to_version"]
