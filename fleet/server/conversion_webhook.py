"""CRD conversion webhooks: the HTTPS call of `spec.conversion.strategy: Webhook`.

The decisions are pure, in fleet/api/crd/conversion.py (which objects to send, the
ConversionReview, what the answer means, kube's messages); the HTTPS client is the one
admission webhooks use (fleet/admission/webhook_client.py: pooled clients per caBundle,
`service` references resolved to a ready endpoint and verified as
`<service>.<namespace>.svc`).  This module only joins them:

    convert_by_webhook(crd["spec"]["conversion"]["webhook"], objects, "group/v2",
                       resolve_service=functools.partial(resolve_service, store),
                       clients=pool)

(or, in the server, `WebhookConverter(store).convert(webhook_spec, objects, desired)`,
which holds the pool and the store) returns the objects at the desired apiVersion (in their order; those already there are
not sent, and nothing to convert makes no call), or raises `ConversionError` with the
message kube-apiserver answers (a 500 Status without a reason).

The conversion webhook has no `timeoutSeconds`: kube-apiserver's webhook client gives
each call 30 seconds (apiserver/pkg/util/webhook's defaultRequestTimeout), as here.
A non-2xx answer is worded as client-go's rest client words it, since kube decodes the
answer with one (`the server rejected our request for an unknown reason`, ...).
"""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from fleet.admission.webhook_client import ServiceResolver, WebhookClients, post, resolve_service
from fleet.admission.webhook_review import CallError
from fleet.api.crd import conversion
from fleet.api.crd.conversion import ConversionError
from fleet.store import Store

__all__ = ["DEFAULT_TIMEOUT", "ConversionError", "WebhookConverter", "convert_by_webhook", "response_error"]

DEFAULT_TIMEOUT = 30.0

# client-go's NewGenericServerResponse, by status code (the messages kube's rest client
# reports for a webhook answering something other than 2xx).
_GENERIC: dict[int, str] = {
    400: "the server rejected our request for an unknown reason",
    401: "the server has asked for the client to provide credentials",
    403: "the server does not allow access to the requested resource",
    404: "the server could not find the requested resource",
    405: "the server does not allow this method on the requested resource",
    406: "the server was unable to respond with a content type that the client supports",
    409: "the server reported a conflict",
    415: "the server was unable to respond with a content type that the client supports",
    422: "the server rejected our request due to an error in our request",
    429: "the server has received too many requests and has asked us to try again later",
    503: "the server is currently unable to handle the request",
    504: "the server was unable to return a response in the time allotted, but may still be processing the request",
}


def response_error(status_code: int, body: bytes) -> str:
    """Why a non-2xx answer failed, as client-go's rest client says it: the Status the
    webhook sent if it sent one, else the generic message for the code."""
    try:
        status = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        status = None
    if (isinstance(status, dict) and status.get("kind") == "Status"
            and isinstance(status.get("message"), str) and status["message"]):
        return status["message"]
    if status_code in _GENERIC:
        return _GENERIC[status_code]
    if status_code >= 500:
        text = body.decode("utf-8", errors="replace").strip()
        return f"an error on the server ({json.dumps(text, ensure_ascii=False)}) has prevented the request from succeeding"
    return f"the server responded with the status code {status_code} but did not return more information"


async def convert_by_webhook(webhook_spec: dict[str, Any], objects: list[dict[str, Any]],
                             desired_api_version: str, *,
                             resolve_service: ServiceResolver | None = None,
                             clients: WebhookClients | None = None,
                             timeout: float = DEFAULT_TIMEOUT) -> list[dict[str, Any]]:
    """`objects` at `desired_api_version`, converted by the CRD's conversion webhook
    (`spec.conversion.webhook`: clientConfig, conversionReviewVersions).

    `resolve_service`: async (service reference) -> (ip, port), for a `service`
    clientConfig (e.g. `functools.partial(fleet.admission.webhook_client.resolve_service,
    store)`); `clients`: the server's pool, so calls reuse connections."""
    indexes = conversion.objects_to_convert(objects, desired_api_version)
    if not indexes:
        return conversion.nop_converted(objects, desired_api_version)
    version = conversion.review_version(webhook_spec)
    uid = str(uuid.uuid4())
    review = conversion.build_review(version, uid, desired_api_version, [objects[i] for i in indexes])
    gvk = conversion.source_gvk(objects, indexes)
    try:
        resp = await post((webhook_spec or {}).get("clientConfig") or {}, review, timeout=timeout,
                          resolve=resolve_service, clients=clients)
    except (CallError, AttributeError, TypeError, ValueError) as e:
        # (The latter three: a malformed clientConfig in a stored CRD.)
        raise conversion.failed(gvk, str(e)) from None
    if resp.status_code < 200 or resp.status_code >= 300:
        raise conversion.failed(gvk, response_error(resp.status_code, resp.content))
    return conversion.answer(objects, indexes, desired_api_version, version, uid, resp.content)


class WebhookConverter:
    """The server's conversion webhook caller: one pool of clients for its life and Service
    references resolved from its store.  `await converter.convert(webhook_spec, objects,
    desired_api_version)`; `await converter.aclose()` when the server stops (connections
    belong to the Trio run that opened them)."""

    def __init__(self, store: Store, *, clients: WebhookClients | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.store = store
        self.clients = clients if clients is not None else WebhookClients()
        self.timeout = timeout

    async def convert(self, webhook_spec: dict[str, Any], objects: list[dict[str, Any]],
                      desired_api_version: str) -> list[dict[str, Any]]:
        return await convert_by_webhook(webhook_spec, objects, desired_api_version,
                                        resolve_service=functools.partial(resolve_service, self.store),
                                        clients=self.clients, timeout=self.timeout)

    async def aclose(self) -> None:
        await self.clients.aclose()
