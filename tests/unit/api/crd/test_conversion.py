"""ConversionReview requests and what answers mean (fleet/api/crd/conversion.py), with kube's
messages (apiextensions-apiserver pkg/apiserver/conversion/webhook_converter.go)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.api.crd import conversion as c
from fleet.api.crd.conversion import ConversionError

V1, V2 = "stable.example.com/v1", "stable.example.com/v2"


def cr(name: str, api_version: str = V1, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "CronTab",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7",
                         "generation": 1, "labels": {"app": name}, "finalizers": ["keep"]},
            "spec": dict(spec)}


def answer_body(review: dict[str, Any], objs: list[Any], *, uid: str | None = None,
                result: dict[str, Any] | None = None, api_version: str | None = None) -> bytes:
    version = review["apiVersion"]
    resp = {"uid": review["request"]["uid"] if uid is None else uid, "convertedObjects": objs,
            "result": {"status": "Success"} if result is None else result}
    return json.dumps({"apiVersion": api_version or version, "kind": "ConversionReview",
                       "response": resp}).encode()


def to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["apiVersion"] = V2
    return out


def run(objects: list[dict[str, Any]], convert: Any, *, desired: str = V2, version: str = "v1") -> list[dict[str, Any]]:
    """One conversion with `convert(review) -> body` standing in for the webhook."""
    indexes = c.objects_to_convert(objects, desired)
    review = c.build_review(version, "u-1", desired, [objects[i] for i in indexes])
    return c.answer(objects, indexes, desired, version, "u-1", convert(review))


# --------------------------------------------------------------------------- the request


def test_only_objects_not_at_the_desired_version_are_sent() -> None:
    objs = [cr("a"), cr("b", V2), {"apiVersion": V1, "kind": "CronTab"}, cr("c")]
    assert c.objects_to_convert(objs, V2) == [0, 3]
    assert c.objects_to_convert([cr("b", V2)], V2) == []
    # The empty object (apiVersion and kind only) is converted without the webhook.
    assert c.nop_converted(objs, V2)[2] == {"apiVersion": V2, "kind": "CronTab"}


@pytest.mark.parametrize(("versions", "chosen"), [
    (["v1"], "v1"), (["v1beta1"], "v1beta1"), (["v1", "v1beta1"], "v1"),
    (["v1beta1", "v1"], "v1beta1"),  # the CRD's order, as kube takes it
    (["v2", "v1"], "v1"),
])
def test_review_version(versions: list[str], chosen: str) -> None:
    assert c.review_version({"conversionReviewVersions": versions}) == chosen


@pytest.mark.parametrize("webhook", [{"conversionReviewVersions": ["v2"]}, {"conversionReviewVersions": []},
                                     {}, None, {"conversionReviewVersions": "v1"}])
def test_no_supported_review_version(webhook: Any) -> None:
    with pytest.raises(ConversionError) as e:
        c.review_version(webhook)
    assert e.value.message == "no supported conversion review versions"


def test_build_review() -> None:
    assert c.build_review("v1", "u", V2, [cr("a")]) == {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "u", "desiredAPIVersion": V2, "objects": [cr("a")]}}
    assert c.build_review("v1beta1", "u", V2, [])["apiVersion"] == "apiextensions.k8s.io/v1beta1"


# --------------------------------------------------------------------------- the answer


def test_converted_objects_in_place_with_metadata_restored() -> None:
    objs = [cr("a"), cr("b", V2), cr("c")]

    def webhook(review: dict[str, Any]) -> bytes:
        out = []
        for o in review["request"]["objects"]:
            o = to_v2(o)
            o["spec"] = {"fullName": o["metadata"]["name"]}
            o["metadata"]["labels"] = {"converted": "yes"}  # may change
            o["metadata"]["annotations"] = {"from": V1}  # may be added
            o["metadata"]["finalizers"] = []  # restored
            o["metadata"]["generation"] = 42  # restored
            o["metadata"]["garbage"] = "x"  # dropped
            out.append(o)
        return answer_body(review, out)

    got = run(objs, webhook)
    assert [o["metadata"]["name"] for o in got] == ["a", "b", "c"]
    assert got[1] is objs[1]  # not sent, not touched
    for o in (got[0], got[2]):
        assert o["apiVersion"] == V2 and o["spec"] == {"fullName": o["metadata"]["name"]}
        md = o["metadata"]
        assert md["labels"] == {"converted": "yes"} and md["annotations"] == {"from": V1}
        assert md["finalizers"] == ["keep"] and md["generation"] == 1 and "garbage" not in md
        assert md["resourceVersion"] == "7" and md["uid"] == f"uid-{md['name']}"


def test_labels_dropped_by_the_webhook_are_dropped() -> None:
    def webhook(review: dict[str, Any]) -> bytes:
        out = [to_v2(o) for o in review["request"]["objects"]]
        for o in out:
            del o["metadata"]["labels"]
        return answer_body(review, out)

    assert "labels" not in run([cr("a")], webhook)[0]["metadata"]


GVK = "stable.example.com/v1, Kind=CronTab"
LIST_GVK = "stable.example.com/v1, Kind=CronTabList"


def _respond(review: dict[str, Any], edit: Any) -> bytes:
    out = [to_v2(o) for o in review["request"]["objects"]]
    for o in out:
        edit(o)
    return answer_body(review, out)


@pytest.mark.parametrize(("webhook", "message"), [
    (lambda r: answer_body(r, [to_v2(o) for o in r["request"]["objects"]], uid="other"),
     f'conversion webhook for {GVK} failed: expected response.uid="u-1", got "other"'),
    (lambda r: answer_body(r, [], result={"status": "Failure", "message": "custom webhook conversion error"}),
     f"conversion webhook for {GVK} failed: custom webhook conversion error"),
    (lambda r: answer_body(r, [], result={"status": "Failure"}),
     f"conversion webhook for {GVK} failed: response.result.status was 'Failure', not 'Success'"),
    (lambda r: answer_body(r, [], result={}),
     f"conversion webhook for {GVK} failed: response.result.status was '', not 'Success'"),
    (lambda r: answer_body(r, []), f"conversion webhook for {GVK} returned 0 objects, expected 1"),
    (lambda r: answer_body(r, [], api_version="apiextensions.k8s.io/v1beta1"),
     f"conversion webhook for {GVK} failed: expected webhook response of apiextensions.k8s.io/v1, "
     "Kind=ConversionReview, got apiextensions.k8s.io/v1beta1, Kind=ConversionReview"),
    (lambda r: b'{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"}',
     f"conversion webhook for {GVK} failed: no response provided"),
    (lambda r: b"<html>oops</html>",
     f"conversion webhook for {GVK} failed: couldn't get version/kind; json parse error: "
     "Expecting value: line 1 column 1 (char 0)"),
    (lambda r: b'{"response": {}}', f"conversion webhook for {GVK} failed: Object 'Kind' is missing in "
                                    """'{"response": {}}'"""),
    (lambda r: _respond(r, lambda o: o.update(apiVersion="stable.example.com/v3")),
     f"conversion webhook for {GVK} returned invalid object at index 0: invalid groupVersion "
     "(expected stable.example.com/v2, received stable.example.com/v3)"),
    (lambda r: _respond(r, lambda o: o.update(kind="Other")),
     f"conversion webhook for {GVK} returned invalid object at index 0: invalid kind (expected CronTab, "
     "received Other)"),
    (lambda r: _respond(r, lambda o: o["metadata"].update(name="b")),
     f"conversion webhook for {GVK} returned invalid object: must have the same name: a != b"),
    (lambda r: _respond(r, lambda o: o["metadata"].update(namespace="x")),
     f"conversion webhook for {GVK} returned invalid object: must have the same namespace: ns != x"),
    (lambda r: _respond(r, lambda o: o["metadata"].update(uid="x")),
     f"conversion webhook for {GVK} returned invalid object: must have the same UID: uid-a != x"),
    (lambda r: _respond(r, lambda o: o.pop("metadata")),
     f"conversion webhook for {GVK} returned invalid object: must have the same name: a != "),
    (lambda r: _respond(r, lambda o: o["metadata"].update(labels={"a": 1})),
     f"conversion webhook for {GVK} returned invalid metadata: metadata.labels[a] must be a string, "
     "but is int64 in converted object"),
    (lambda r: _respond(r, lambda o: o["metadata"].update(labels=["x"])),
     f"conversion webhook for {GVK} returned invalid metadata: invalid metadata.labels of type "
     "[]interface {} in converted object"),
    (lambda r: _respond(r, lambda o: o["metadata"].update(labels={"a": "b c"})),
     f'conversion webhook for {GVK} returned invalid metadata: metadata.labels: Invalid value: "b c": '
     "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
     "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
     "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
    (lambda r: answer_body(r, [7]),
     "json: cannot unmarshal number into Go value of type map[string]interface {}"),
])
def test_bad_answers_for_one_object(webhook: Any, message: str) -> None:
    with pytest.raises(ConversionError) as e:
        run([cr("a")], webhook)
    assert e.value.message == message


def test_metadata_missing_in_a_converted_object() -> None:
    # Name, namespace and uid all empty on both sides: the metadata check is the one to fail.
    obj = {"apiVersion": V1, "kind": "CronTab", "spec": {}}

    def webhook(r: dict[str, Any]) -> bytes:
        return answer_body(r, [{"apiVersion": V2, "kind": "CronTab"}])
    with pytest.raises(ConversionError) as e:
        run([obj], webhook)
    assert e.value.message == f"conversion webhook for {GVK} returned invalid metadata: missing metadata in converted object"


@pytest.mark.parametrize(("webhook", "message"), [
    (lambda r: answer_body(r, [to_v2(o) for o in r["request"]["objects"]][:1]),
     f"conversion webhook for {LIST_GVK} returned 1 objects, expected 2"),
    (lambda r: answer_body(r, [to_v2(r["request"]["objects"][0]), "x"]),
     f"conversion webhook for {LIST_GVK} returned invalid converted object at index 1: json: cannot "
     "unmarshal string into Go value of type map[string]interface {}"),
    # kube counts the index up before these checks, so they name the next index.
    (lambda r: answer_body(r, [to_v2(r["request"]["objects"][0]), r["request"]["objects"][1]]),
     f"conversion webhook for {LIST_GVK} returned invalid converted object at index 2: invalid groupVersion "
     "(expected stable.example.com/v2, received stable.example.com/v1)"),
    (lambda r: _respond(r, lambda o: o["metadata"].update(uid="x")),
     f"conversion webhook for {LIST_GVK} returned invalid converted object at index 1: must have the same "
     "UID: uid-a != x"),
    (lambda r: _respond(r, lambda o: o["metadata"].update(annotations={"a": 1})),
     f"conversion webhook for {LIST_GVK} returned invalid metadata in object at index 1: "
     "metadata.annotations[a] must be a string, but is int64 in converted object"),
])
def test_bad_answers_for_a_list(webhook: Any, message: str) -> None:
    with pytest.raises(ConversionError) as e:
        run([cr("a"), cr("skip", V2), cr("b")], webhook)
    assert e.value.message == message


def test_v1beta1_answers_are_not_checked_for_uid_or_kind() -> None:
    objs = [cr("a")]

    def webhook(r: dict[str, Any]) -> bytes:
        return answer_body(r, [to_v2(objs[0])], uid="whatever", api_version="apiextensions.k8s.io/v1beta1")
    assert run(objs, webhook, version="v1beta1")[0]["apiVersion"] == V2


def test_error_is_a_500_without_reason() -> None:
    status = c.failed(GVK, "x").status()
    assert status["code"] == 500 and "reason" not in status
    assert status["message"] == f"conversion webhook for {GVK} failed: x"


def test_gvk_string_of_the_core_group() -> None:
    assert c.gvk_string("v1", "Pod") == "/v1, Kind=Pod"
    assert c.gvk_string("a/b/c", "X") == "/, Kind=X"


# --------------------------------------------------------------------------- properties

names = st.text("abcdefgh", min_size=1, max_size=6)
versions = st.sampled_from([V1, V2, "stable.example.com/v3"])


@st.composite
def object_lists(draw: Any) -> list[dict[str, Any]]:
    picked = draw(st.lists(st.tuples(names, versions), max_size=8, unique_by=lambda t: t[0]))
    return [cr(n, v, n=i) for i, (n, v) in enumerate(picked)]


@given(object_lists())
@settings(max_examples=150, deadline=None)
def test_a_faithful_webhook_converts_every_object_in_order(objs: list[dict[str, Any]]) -> None:
    before = copy.deepcopy(objs)
    sent: list[list[dict[str, Any]]] = []

    def webhook(review: dict[str, Any]) -> bytes:
        sent.append(review["request"]["objects"])
        return answer_body(review, [to_v2(o) for o in review["request"]["objects"]])

    indexes = c.objects_to_convert(objs, V2)
    if not indexes:
        # Nothing to convert: no call.
        assert c.nop_converted(objs, V2) == objs
        return
    got = run(objs, webhook)
    assert objs == before  # the inputs are not changed
    assert [o["metadata"]["name"] for o in got] == [o["metadata"]["name"] for o in objs]
    assert all(o["apiVersion"] == V2 for o in got)
    assert [o["spec"] for o in got] == [o["spec"] for o in objs]
    assert [o["apiVersion"] for o in sent[0]] and all(o["apiVersion"] != V2 for o in sent[0])


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3),
                           max_leaves=12)


@st.composite
def hostile_answers(draw: Any) -> Any:
    """An answer built from a good one with random parts replaced, or random bytes."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return lambda r: draw(st.binary(max_size=40))
    if kind == 1:
        junk = draw(json_values)
        return lambda r: json.dumps(junk).encode()
    where = draw(st.sampled_from(["apiVersion", "kind", "response", "uid", "convertedObjects", "result",
                                  "item", "metadata", "labels", "annotations", "name"]))
    junk = draw(json_values)

    def webhook(r: dict[str, Any]) -> bytes:
        review = json.loads(answer_body(r, [to_v2(o) for o in r["request"]["objects"]]))
        resp = review["response"]
        items = resp["convertedObjects"]
        if where in ("apiVersion", "kind", "response"):
            review[where] = junk
        elif where in ("uid", "convertedObjects", "result"):
            resp[where] = junk
        elif items and where == "item":
            items[0] = junk
        elif items and where == "metadata":
            items[0]["metadata"] = junk
        elif items:
            items[0]["metadata"][where] = junk
        return json.dumps(review).encode()
    return webhook


@given(object_lists(), hostile_answers(), st.sampled_from(["v1", "v1beta1"]))
@settings(max_examples=300, deadline=None)
def test_any_answer_converts_or_fails_cleanly(objs: list[dict[str, Any]], webhook: Any, version: str) -> None:
    if not c.objects_to_convert(objs, V2):
        return
    try:
        got = run(objs, webhook, version=version)
    except ConversionError as e:
        assert e.message and e.code == 500
        return
    assert len(got) == len(objs) and all(o["apiVersion"] == V2 for o in got)
    for before, after in zip(objs, got, strict=True):
        assert after["metadata"]["name"] == before["metadata"]["name"]
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
