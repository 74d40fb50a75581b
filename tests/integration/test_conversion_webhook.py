"""CRD conversion webhooks over real HTTPS (fleet/server/conversion_webhook.py).

A ConversionReview webhook runs in the test on 127.0.0.1 (fleet.testing.webhook's
threaded HTTPS server, its certificate from a CA made with `cryptography` by
fleet.testing.oidc.loopback_tls); `convert_by_webhook` calls it by `url` and through a
`service` reference resolved from a real store's Service and Endpoints, trusting the
`caBundle`.  The failures — a CA that did not sign the certificate, a certificate not
for `<service>.<namespace>.svc`, a timeout, garbage, a wrong uid, a webhook error status
— each end as one `ConversionError` with kube's message.
"""

from __future__ import annotations

import base64
import copy
import functools
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.admission.webhook_client import resolve_service
from fleet.api import meta
from fleet.server.conversion_webhook import ConversionError, WebhookConverter, convert_by_webhook
from fleet.store import open_store
from fleet.testing.oidc import loopback_tls
from fleet.testing.webhook import WebhookServer

V1, V2 = "stable.example.com/v1", "stable.example.com/v2"
GVK = "stable.example.com/v1, Kind=Name"


def cr(name: str, api_version: str = V1) -> dict[str, Any]:
    spec = {"name": f"{name} smith"} if api_version == V1 else {"first": name, "last": "smith"}
    return {"apiVersion": api_version, "kind": "Name",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": spec}


def split_names(_path: str, review: dict[str, Any]) -> dict[str, Any]:
    """The conversion webhook: v1 `spec.name` <-> v2 `spec.first` + `spec.last`."""
    req = review["request"]
    out = []
    for o in req["objects"]:
        o = copy.deepcopy(o)
        spec = o.get("spec") or {}
        if req["desiredAPIVersion"] == V2:
            first, _, last = spec.pop("name", "").partition(" ")
            spec.update(first=first, last=last)
        else:
            spec["name"] = f"{spec.pop('first', '')} {spec.pop('last', '')}".strip()
        o["apiVersion"] = req["desiredAPIVersion"]
        out.append(o)
    return {"apiVersion": review["apiVersion"], "kind": "ConversionReview",
            "response": {"uid": req["uid"], "convertedObjects": out, "result": {"status": "Success"}}}


def bundle(ca: Path) -> str:
    return base64.b64encode(ca.read_bytes()).decode()


def by_url(srv: WebhookServer, ca: Path, versions: list[str] | None = None) -> dict[str, Any]:
    return {"clientConfig": {"url": srv.url("/convert"), "caBundle": bundle(ca)},
            "conversionReviewVersions": versions or ["v1"]}


async def test_converts_by_url_only_what_needs_it(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv")
    with WebhookServer(cert, key, split_names) as srv:
        objs = [cr("ann"), cr("bob", V2), cr("cy")]
        got = await convert_by_webhook(by_url(srv, ca), objs, V2)
        assert [o["spec"] for o in got] == [{"first": "ann", "last": "smith"}, {"first": "bob", "last": "smith"},
                                             {"first": "cy", "last": "smith"}]
        assert all(o["apiVersion"] == V2 for o in got)
        [review] = srv.reviews
        assert review["path"] == "/convert"
        assert review["apiVersion"] == "apiextensions.k8s.io/v1" and review["kind"] == "ConversionReview"
        assert review["request"]["desiredAPIVersion"] == V2
        assert [o["metadata"]["name"] for o in review["request"]["objects"]] == ["ann", "cy"]
        # And back.
        back = await convert_by_webhook(by_url(srv, ca), got, V1)
        assert [o["spec"] for o in back] == [cr(n)["spec"] for n in ("ann", "bob", "cy")]
        # Nothing to convert: no call.
        assert await convert_by_webhook(by_url(srv, ca), back, V1) == back
        assert await convert_by_webhook(by_url(srv, ca), [], V2) == []
        assert len(srv.reviews) == 2


async def test_v1beta1_reviews_when_only_v1beta1_is_listed(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv")
    with WebhookServer(cert, key, split_names) as srv:
        got = await convert_by_webhook(by_url(srv, ca, ["v1beta1"]), [cr("ann")], V2)
        assert got[0]["spec"] == {"first": "ann", "last": "smith"}
        assert srv.reviews[0]["apiVersion"] == "apiextensions.k8s.io/v1beta1"
        with pytest.raises(ConversionError, match="^no supported conversion review versions$"):
            await convert_by_webhook(by_url(srv, ca, ["v2"]), [cr("ann")], V2)
        assert len(srv.reviews) == 1


async def test_service_reference_resolved_from_the_store(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv", dns_names=("conv.hooks.svc",))
    with WebhookServer(cert, key, split_names) as srv:
        async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
            await store.create(meta.store_key("", "services", "hooks", "conv"), {
                "metadata": {"name": "conv", "namespace": "hooks"},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": srv.port}]}})
            await store.create(meta.store_key("", "endpoints", "hooks", "conv"), {
                "metadata": {"name": "conv", "namespace": "hooks"},
                "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "https", "port": srv.port}]}]})
            hook = {"clientConfig": {"service": {"namespace": "hooks", "name": "conv", "path": "/to", "port": 443},
                                     "caBundle": bundle(ca)},
                    "conversionReviewVersions": ["v1"]}
            converter = WebhookConverter(store)  # the server's: pooled clients, services from its store
            try:
                for name in ("ann", "bob"):
                    got = await converter.convert(hook, [cr(name)], V2)
                    assert got[0]["spec"] == {"first": name, "last": "smith"}
                # A Service with no such port: the clean error.
                bad = copy.deepcopy(hook)
                bad["clientConfig"]["service"]["port"] = 444
                with pytest.raises(ConversionError) as e:
                    await convert_by_webhook(bad, [cr("cy")], V2,
                                             resolve_service=functools.partial(resolve_service, store))
                assert e.value.message == f'conversion webhook for {GVK} failed: service "conv" has no port 444'
            finally:
                await converter.aclose()
        assert [r["path"] for r in srv.reviews] == ["/to", "/to"]
        # The pooled client kept its connection for the second call.
        assert len(set(srv.peers)) == 1, srv.peers


async def test_certificate_not_for_the_service_name_is_refused(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv")  # for 127.0.0.1 only
    with WebhookServer(cert, key, split_names) as srv:
        hook = {"clientConfig": {"service": {"namespace": "hooks", "name": "conv", "port": 443},
                                 "caBundle": bundle(ca)},
                "conversionReviewVersions": ["v1"]}

        async def resolve(_svc: dict[str, Any]) -> tuple[str, int]:
            return "127.0.0.1", srv.port
        with pytest.raises(ConversionError) as e:
            await convert_by_webhook(hook, [cr("ann")], V2, resolve_service=resolve)
        assert e.value.message.startswith(f'conversion webhook for {GVK} failed: Post "https://127.0.0.1:{srv.port}": '
                                          "tls: failed to verify certificate: "), e.value.message
        assert "conv.hooks.svc" in e.value.message
        assert srv.reviews == []


async def test_wrong_ca(tmp_path: Path) -> None:
    _, cert, key = loopback_tls(tmp_path, "conv")
    other_ca, _, _ = loopback_tls(tmp_path, "other")
    with WebhookServer(cert, key, split_names) as srv:
        with pytest.raises(ConversionError) as e:
            await convert_by_webhook(by_url(srv, other_ca), [cr("ann")], V2)
        assert e.value.message.startswith(f'conversion webhook for {GVK} failed: Post "{srv.url("/convert")}": '
                                          "tls: failed to verify certificate: "), e.value.message
        assert e.value.status()["code"] == 500 and "reason" not in e.value.status()


async def test_timeout(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv")

    def slow(path: str, review: dict[str, Any]) -> dict[str, Any]:
        time.sleep(2)
        return split_names(path, review)
    with WebhookServer(cert, key, slow) as srv:
        with pytest.raises(ConversionError) as e:
            await convert_by_webhook(by_url(srv, ca), [cr("ann")], V2, timeout=0.3)
        assert e.value.message == f"conversion webhook for {GVK} failed: context deadline exceeded"


def _uid(path: str, review: dict[str, Any]) -> dict[str, Any]:
    out = split_names(path, review)
    out["response"]["uid"] = "not-yours"
    return out


@pytest.mark.parametrize(("answer", "why"), [
    (lambda p, r: b"\x00garbage", "couldn't get version/kind; json parse error: Expecting value: line 1 column 1 "
                                  "(char 0)"),
    (_uid, 'expected response.uid="{uid}", got "not-yours"'),
    (lambda p, r: (500, b"boom"), 'an error on the server ("boom") has prevented the request from succeeding'),
    (lambda p, r: (400, b"nope"), "the server rejected our request for an unknown reason"),
    (lambda p, r: (403, {"kind": "Status", "apiVersion": "v1", "message": "go away"}), "go away"),
    (lambda p, r: {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                   "response": {"uid": r["request"]["uid"], "result": {"status": "Failure",
                                                                       "message": "cannot convert ann"}}},
     "cannot convert ann"),
])
async def test_bad_answers_fail_cleanly(tmp_path: Path, answer: Any, why: str) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv")
    with WebhookServer(cert, key, answer) as srv:
        with pytest.raises(ConversionError) as e:
            await convert_by_webhook(by_url(srv, ca), [cr("ann")], V2)
        uid = srv.reviews[0]["request"]["uid"]
        assert e.value.message == f"conversion webhook for {GVK} failed: {why.format(uid=uid)}"


async def test_metadata_changes_other_than_labels_and_annotations_are_undone(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv")

    def meddle(path: str, review: dict[str, Any]) -> dict[str, Any]:
        out = split_names(path, review)
        for o in out["response"]["convertedObjects"]:
            o["metadata"].update(labels={"converted": "true"}, finalizers=["x"], generation=9)
        return out
    with WebhookServer(cert, key, meddle) as srv:
        [got] = await convert_by_webhook(by_url(srv, ca), [cr("ann")], V2)
    assert got["metadata"] == {**cr("ann")["metadata"], "labels": {"converted": "true"}}


async def test_connection_refused(tmp_path: Path) -> None:
    ca, cert, key = loopback_tls(tmp_path, "conv")
    srv = WebhookServer(cert, key, split_names)
    url = srv.url("/convert")
    srv.close()
    hook = {"clientConfig": {"url": url, "caBundle": bundle(ca)}, "conversionReviewVersions": ["v1"]}
    with pytest.raises(ConversionError) as e:
        await convert_by_webhook(hook, [cr("ann")], V2)
    port = url.split(":")[2].split("/")[0]
    assert e.value.message == (f'conversion webhook for {GVK} failed: Post "{url}": dial tcp 127.0.0.1:{port}: '
                               "connect: connection refused")
