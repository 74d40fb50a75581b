"""The one owner-reference module: read, build, claim, and the guarded adopt/release patches.

The patches are applied with the API server's own JSON patch (`fleet.api.patch.json_patch`),
so "a concurrent change makes the write fail" is checked against what the server does.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.errors import Invalid
from fleet.api.owners import (
    AlreadyControlled,
    adopt_patch,
    claim,
    controller_of,
    controller_ref,
    orphan_namespace,
    release_patch,
)
from fleet.api.patch import json_patch

RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
      "metadata": {"name": "web", "namespace": "ns", "uid": "u-rs", "resourceVersion": "7"}}
OTHER = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
         "metadata": {"name": "other", "namespace": "ns", "uid": "u-other", "resourceVersion": "3"}}


def ref_to(owner: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    md = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": md["name"],
            "uid": md["uid"], "controller": controller, "blockOwnerDeletion": True}


def pod(name: str = "p", *refs: dict[str, Any], rv: str = "10", labels: dict[str, str] | None = None,
        deleting: bool = False, finalizers: list[str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv,
                          "labels": labels if labels is not None else {"app": "web"}}
    if refs:
        md["ownerReferences"] = list(refs)
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if finalizers is not None:
        md["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md}


# ---------------------------------------------------------------------------------------
# Reading and building


@pytest.mark.parametrize(("desc", "obj", "want"), [
    ("no references", pod(), None),
    ("only a plain owner", pod("p", ref_to(OTHER, controller=False)), None),
    ("the controller among others", pod("p", ref_to(OTHER, controller=False), ref_to(RS)), "u-rs"),
    ("controller must be the boolean true", pod("p", {**ref_to(RS), "controller": "true"}), None),
    ("malformed references are skipped", pod("p", "junk", ref_to(RS)), "u-rs"),  # type: ignore[arg-type]
    ("ownerReferences not a list", {"metadata": {"ownerReferences": {"uid": "x"}}}, None),
])
def test_controller_of(desc: str, obj: dict[str, Any], want: str | None) -> None:
    ref = controller_of(obj)
    assert (ref["uid"] if ref else None) == want, desc


def test_controller_ref_builds_new_controller_ref() -> None:
    assert controller_ref(RS) == ref_to(RS)
    assert controller_ref(RS, block_owner_deletion=False)["blockOwnerDeletion"] is False
    bare = {"metadata": {"name": "d", "uid": "u-d"}}  # as listed, without apiVersion/kind
    assert controller_ref(bare, api_version="apps/v1", kind="Deployment") == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u-d",
        "controller": True, "blockOwnerDeletion": True}
    with pytest.raises(ValueError):
        controller_ref(bare)


def test_orphan_namespace_index() -> None:
    assert orphan_namespace(pod()) == ["ns"]
    assert orphan_namespace(pod("p", ref_to(OTHER, controller=False))) == ["ns"]
    assert orphan_namespace(pod("p", ref_to(RS))) == []


# ---------------------------------------------------------------------------------------
# Claim: ControllerRefManager.ClaimObject


def _deleting(owner: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(owner)
    out["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return out


@pytest.mark.parametrize(("desc", "owner", "obj", "want"), [
    ("owned and matching: kept", RS, pod("p", ref_to(RS)), "owned"),
    ("owned, no longer matching: released", RS, pod("p", ref_to(RS), labels={"app": "x"}), "release"),
    ("owned, not matching, owner deleting: neither", _deleting(RS),
     pod("p", ref_to(RS), labels={"app": "x"}), None),
    ("owned and matching, owner deleting: still owned", _deleting(RS), pod("p", ref_to(RS)), "owned"),
    ("matching orphan: adopted", RS, pod(), "adopt"),
    ("orphan with a plain owner reference: adopted", RS, pod("p", ref_to(OTHER, controller=False)), "adopt"),
    ("orphan not matching: ignored", RS, pod(labels={"app": "x"}), None),
    ("orphan being deleted: never adopted", RS, pod(deleting=True), None),
    ("owner being deleted adopts nothing", _deleting(RS), pod(), None),
    ("another controller's: none of our business", RS, pod("p", ref_to(OTHER)), None),
])
def test_claim(desc: str, owner: dict[str, Any], obj: dict[str, Any], want: str | None) -> None:
    owned, adopt, release = claim(owner, [obj], lambda o: o["metadata"]["labels"].get("app") == "web")
    got = {"owned": owned, "adopt": adopt, "release": release}
    for k, v in got.items():
        assert v == ([obj] if k == want else []), f"{desc}: {k}"


# ---------------------------------------------------------------------------------------
# The guarded patches, applied as the API server applies them


def _apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return json_patch(copy.deepcopy(obj), ops)


@pytest.mark.parametrize(("desc", "obj", "want_refs"), [
    ("orphan without references", pod(), [ref_to(RS)]),
    ("orphan with a plain owner keeps it", pod("p", ref_to(OTHER, controller=False)),
     [ref_to(OTHER, controller=False), ref_to(RS)]),
    ("a plain reference to the adopter becomes the controller reference",
     pod("p", ref_to(RS, controller=False)), [ref_to(RS)]),
])
def test_adopt_patch_adopts(desc: str, obj: dict[str, Any], want_refs: list[dict[str, Any]]) -> None:
    ops = adopt_patch(obj, RS)
    assert ops[:2] == [{"op": "test", "path": "/metadata/uid", "value": obj["metadata"]["uid"]},
                       {"op": "test", "path": "/metadata/resourceVersion", "value": "10"}], desc
    assert _apply(obj, ops)["metadata"]["ownerReferences"] == want_refs, desc


def test_adopt_patch_refuses_an_object_another_controller_owns() -> None:
    with pytest.raises(AlreadyControlled) as e:
        adopt_patch(pod("p", ref_to(OTHER)), RS)
    assert e.value.controller["uid"] == "u-other"
    assert "ReplicaSet other" in str(e.value)


def test_adopt_patch_adds_finalizers_once() -> None:
    got = _apply(pod(finalizers=["a", "f"]), adopt_patch(pod(finalizers=["a", "f"]), RS, finalizers=["f", "g"]))
    assert got["metadata"]["finalizers"] == ["a", "f", "g"]
    got = _apply(pod(), adopt_patch(pod(), RS, finalizers=["g"]))
    assert got["metadata"]["finalizers"] == ["g"]


@pytest.mark.parametrize(("desc", "obj", "want_refs"), [
    ("the only reference: the field goes", pod("p", ref_to(RS)), None),
    ("other references stay", pod("p", ref_to(OTHER, controller=False), ref_to(RS)),
     [ref_to(OTHER, controller=False)]),
    ("nothing of ours: unchanged", pod("p", ref_to(OTHER)), [ref_to(OTHER)]),
])
def test_release_patch(desc: str, obj: dict[str, Any], want_refs: list[dict[str, Any]] | None) -> None:
    got = _apply(obj, release_patch(obj, RS))
    assert got["metadata"].get("ownerReferences") == want_refs, desc


def _changed(obj: dict[str, Any], **md: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].update(md)
    return out


@pytest.mark.parametrize(("desc", "seen", "current"), [
    # The copy we decided on is stale: another writer got in between.
    ("adopted meanwhile by another controller", pod(),
     _changed(pod("p", ref_to(OTHER)), resourceVersion="11")),
    ("relabelled meanwhile", pod(), _changed(pod(labels={"app": "x"}), resourceVersion="11")),
    ("deleted and re-created under the same name", pod(), _changed(pod(), uid="u-p2", resourceVersion="1")),
])
def test_adoption_under_a_concurrent_change_fails(desc: str, seen: dict[str, Any],
                                                  current: dict[str, Any]) -> None:
    with pytest.raises(Invalid, match="test failed"):
        _apply(current, adopt_patch(seen, RS))


def test_release_under_a_concurrent_change_fails() -> None:
    seen = pod("p", ref_to(RS), labels={"app": "x"})
    relabelled_back = _changed(pod("p", ref_to(RS)), resourceVersion="11")
    with pytest.raises(Invalid, match="test failed"):
        _apply(relabelled_back, release_patch(seen, RS))


def test_patches_need_an_object_read_from_the_server() -> None:
    unsaved = pod()
    del unsaved["metadata"]["resourceVersion"]
    with pytest.raises(ValueError):
        adopt_patch(unsaved, RS)
    with pytest.raises(ValueError):
        release_patch(unsaved, RS)
