"""Accept negotiation of get/list/watch: Table, PartialObjectMetadata(List), 406s
(kube-apiserver's negotiation.NegotiateMediaTypeOptions and handlers/response.go;
the cases follow test/integration/apiserver's TestTransform)."""

from __future__ import annotations

import json

import pytest
import trio

from fleet.api import errors
from fleet.server.negotiate import OBJECT, Target, negotiate, parse_accept
from fleet.testing.apiserver import open_api

POM = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
POML = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
NOT_ACCEPTABLE = ("only the following media types are accepted: application/json, application/yaml, "
                  "application/vnd.kubernetes.protobuf")
NOT_ACCEPTABLE_STREAM = ("only the following media types are accepted: application/json;stream=watch, "
                         "application/vnd.kubernetes.protobuf;stream=watch")


@pytest.mark.parametrize(("accept", "want"), [
    ("", OBJECT),
    ("application/json", OBJECT),
    ("*/*", OBJECT),
    ("application/*", OBJECT),
    ("application/vnd.kubernetes.protobuf,application/json", OBJECT),
    (TABLE + ",application/json", Target("Table", "v1")),
    ("application/json;as=Table;g=meta.k8s.io;v=v1beta1", Target("Table", "v1beta1")),
    ("application/yaml;as=Table;g=meta.k8s.io;v=v1", Target("Table", "v1")),
    (POM, Target("PartialObjectMetadata", "v1")),
    ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1", Target("PartialObjectMetadata", "v1beta1")),
    (POML + ",application/json", Target("PartialObjectMetadataList", "v1")),
    # client-go's metadata client: protobuf first, then JSON, then plain JSON.
    ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1," + POML
     + ",application/json", Target("PartialObjectMetadataList", "v1")),
    # A Table exists only in JSON and YAML: the protobuf range is skipped.
    ("application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1," + TABLE, Target("Table", "v1")),
    # Alternatives: an unservable conversion falls through to the next range.
    ("application/json;as=Table;g=meta.k8s.io;v=v2,application/json", OBJECT),
    ("application/json;as=PartialObject;g=meta.k8s.io;v=v1," + POM, Target("PartialObjectMetadata", "v1")),
    # q orders the ranges; the client's order is kept between equals.
    ("application/json;q=0.5," + POM + ";q=0.9", Target("PartialObjectMetadata", "v1")),
    ("text/html,application/json;q=0.9", OBJECT),
    # Parameters do not make a range more specific: the client's order decides.
    ("application/json," + TABLE, OBJECT),
    ("*/*," + POM, Target("PartialObjectMetadata", "v1")),
])
def test_negotiate(accept: str, want: Target) -> None:
    assert negotiate(accept) == want


@pytest.mark.parametrize("accept", [
    "text/html",
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1alpha1",  # bad version
    "application/json;as=PartialObjectMetadata;g=k8s.io;v=v1beta1",  # bad group
    "application/json;as=PartialObject;g=meta.k8s.io;v=v1beta1",  # bad kind
    "application/json;g=meta.k8s.io;v=v1beta1",  # no kind
    "application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1beta1",  # no Table in protobuf
    "application/yaml;stream=watch",  # YAML has no stream serializer
])
def test_not_acceptable(accept: str) -> None:
    with pytest.raises(errors.NotAcceptable) as e:
        negotiate(accept)
    assert e.value.code == 406 and e.value.message == NOT_ACCEPTABLE


def test_watch_is_served_in_stream_media_types_only() -> None:
    assert negotiate("application/json;stream=watch;as=Table;g=meta.k8s.io;v=v1", stream=True) == Target("Table")
    with pytest.raises(errors.NotAcceptable) as e:
        negotiate("application/yaml;as=Table;g=meta.k8s.io;v=v1", stream=True)
    assert e.value.message == NOT_ACCEPTABLE_STREAM


def test_parse_accept_orders_by_q_then_specificity() -> None:
    got = parse_accept("*/*;q=0.8, application/*, application/json;as=Table, text/plain;q=0.9")
    assert [(c.type, c.subtype, c.q) for c in got] == [
        ("application", "json", 1.0), ("application", "*", 1.0), ("text", "plain", 0.9), ("*", "*", 0.8)]
    assert got[0].params == {"as": "Table"}


# -- through the API -----------------------------------------------------------------------

CM = "/api/v1/namespaces/default/configmaps"


def cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app": name}, "annotations": {"a": "1"}}, "data": {"k": "v"}}


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def test_get_as_partial_object_metadata(api):
    _, made = await api.json("POST", CM, cm("one"))
    code, body = await api.json("GET", f"{CM}/one", headers={"accept": POM + ",application/json"})
    assert code == 200
    assert body == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": made["metadata"]}
    code, body = await api.json("GET", f"{CM}/one", headers={
        "accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1"})
    assert body["apiVersion"] == "meta.k8s.io/v1beta1" and "data" not in body


async def test_list_as_partial_object_metadata_list(api):
    for n in ("a", "b", "c"):
        await api.json("POST", CM, cm(n))
    code, body = await api.json("GET", CM, query={"limit": "2"}, headers={"accept": POML})
    assert code == 200 and body["kind"] == "PartialObjectMetadataList"
    assert body["apiVersion"] == "meta.k8s.io/v1"
    assert body["metadata"]["resourceVersion"] and body["metadata"]["continue"]
    assert body["metadata"]["remainingItemCount"] == 1
    assert [i["metadata"]["name"] for i in body["items"]] == ["a", "b"]
    assert all(i["kind"] == "PartialObjectMetadata" and i["apiVersion"] == "meta.k8s.io/v1"
               and set(i) == {"kind", "apiVersion", "metadata"} for i in body["items"])
    code, body = await api.json("GET", "/api/v1/namespaces/empty-ns-none/configmaps", headers={"accept": POML})
    assert code == 200 and body["items"] == []


async def test_conversion_that_does_not_fit_the_result_is_406(api):
    await api.json("POST", CM, cm("one"))
    code, body = await api.json("GET", CM, headers={"accept": POM})
    assert code == 406 and body["reason"] == "NotAcceptable"
    assert body["message"] == ("you requested PartialObjectMetadata, but the requested object is a list "
                               "(*core.ConfigMapList)")
    code, body = await api.json("GET", f"{CM}/one", headers={"accept": POML})
    assert code == 406 and body["message"] == ("you requested PartialObjectMetadataList, but the requested "
                                               "object is not a list (*core.ConfigMap)")
    code, body = await api.json("GET", f"{CM}/one", headers={"accept": "text/html"})
    assert (code, body["reason"], body["message"]) == (406, "NotAcceptable", NOT_ACCEPTABLE)


async def test_table_version_and_include_object(api):
    await api.json("POST", CM, cm("one"))
    code, body = await api.json("GET", CM, headers={"accept": "application/json;as=Table;g=meta.k8s.io;v=v1beta1"})
    assert code == 200 and body["apiVersion"] == "meta.k8s.io/v1beta1"
    assert body["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"
    code, body = await api.json("GET", f"{CM}/one", query={"includeObject": "Object"}, headers={"accept": TABLE})
    assert body["rows"][0]["object"]["data"] == {"k": "v"}
    code, body = await api.json("GET", CM, query={"includeObject": "None"}, headers={"accept": TABLE})
    assert "object" not in body["rows"][0]
    code, body = await api.json("GET", CM, query={"includeObject": "unrecognized"}, headers={"accept": TABLE})
    assert code == 400 and body["message"] == ('Unable to convert to Table as requested: includeObject: Invalid '
                                               'value: "unrecognized": must be \'Metadata\', \'Object\', '
                                               '\'None\', or empty')


class Lines:
    def __init__(self, resp):
        assert resp.status == 200, resp.body
        self.it = resp.body.__aiter__()
        self.buf = b""

    async def next(self) -> dict:
        with trio.fail_after(5):
            while b"\n" not in self.buf:
                self.buf += await self.it.__anext__()
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


async def test_watch_events_carry_partial_object_metadata(api):
    _, made = await api.json("POST", CM, cm("one"))
    resp = await api.call("GET", CM, query={"watch": "1", "resourceVersion": "0", "sendInitialEvents": "true",
                                            "allowWatchBookmarks": "true", "resourceVersionMatch": "NotOlderThan"},
                          headers={"accept": POM})
    s = Lines(resp)
    ev = await s.next()
    assert ev["type"] == "ADDED"
    assert ev["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                            "metadata": made["metadata"]}
    ev = await s.next()
    assert ev["type"] == "BOOKMARK" and ev["object"]["kind"] == "PartialObjectMetadata"
    assert ev["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    await api.json("PATCH", f"{CM}/one", {"data": {"k": "w"}}, content_type="application/merge-patch+json")
    ev = await s.next()
    assert ev["type"] == "MODIFIED" and set(ev["object"]) == {"kind", "apiVersion", "metadata"}
    await resp.body.aclose()


async def test_watch_asked_for_a_list_conversion_sends_objects(api):
    # kube-apiserver's watch encoder cannot make a PartialObjectMetadataList of one
    # object and sends the object itself.
    await api.json("POST", CM, cm("one"))
    resp = await api.call("GET", CM, query={"watch": "1"}, headers={"accept": POML})
    ev = await Lines(resp).next()
    assert ev["object"]["kind"] == "ConfigMap" and ev["object"]["data"] == {"k": "v"}
    await resp.body.aclose()
    code, body = await api.json("GET", CM, query={"watch": "1"}, headers={"accept": "application/yaml"})
    assert code == 406 and body["message"] == NOT_ACCEPTABLE_STREAM
