"""The storage admission plugins: DefaultStorageClass, StorageObjectInUseProtection and
PersistentVolumeClaimResize — first the plugins alone (over a store, with and without the
watch-fed StorageClassCache), then through the in-process API so their place in the
pipeline (mutating admission, validation, validating admission) is covered too, with
the status writes the storage controllers make."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import trio

from fleet.admission.defaultstorageclass import (
    DefaultStorageClass,
    StorageClassCache,
    claim_has_class,
)
from fleet.admission.pvcresize import (
    NOT_BOUND,
    NOT_EXPANDABLE,
    PersistentVolumeClaimResize,
    resize_refusal,
)
from fleet.admission.storageprotection import StorageObjectInUseProtection
from fleet.api import errors, meta
from fleet.auth import ADMIN, Attributes
from fleet.store import open_store
from fleet.testing.apiserver import open_api

SCS = "/apis/storage.k8s.io/v1/storageclasses"
PVS = "/api/v1/persistentvolumes"
PVCS = "/api/v1/namespaces/default/persistentvolumeclaims"


def sc(name: str, *, default: bool = False, created: str = "2026-01-01T00:00:00Z",
       expand: bool | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                           "metadata": {"name": name, "creationTimestamp": created},
                           "provisioner": "local.fleet.dev"}
    if default:
        obj["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    if expand is not None:
        obj["allowVolumeExpansion"] = expand
    return obj


def claim(name: str = "data", size: str = "1Gi", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec}}


def volume(name: str = "pv1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": f"/tmp/{name}"}, **spec}}


def attrs(verb: str = "create", resource: str = "persistentvolumeclaims", subresource: str = "") -> Attributes:
    return Attributes(verb, "", "v1", resource, subresource, "default", "data")


@pytest.fixture(params=["store", "cache"])
async def store_and_cache(request, tmp_path):
    """A store holding classes `old-default` (default, older), `new-default` (default, newer),
    `plain` and `grows` (allowVolumeExpansion); read from the store, or through a running cache."""
    async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
        for obj in (sc("old-default", default=True, created="2026-01-01T00:00:00Z"),
                    sc("new-default", default=True, created="2026-01-02T00:00:00Z"),
                    sc("plain"), sc("grows", expand=True)):
            await store.create(meta.store_key("storage.k8s.io", "storageclasses", None, obj["metadata"]["name"]), obj)
        async with trio.open_nursery() as nursery:
            cache = StorageClassCache()
            if request.param == "cache":
                await nursery.start(cache.run, store)
            yield store, cache
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("spec", "annotations", "want"), [
    ({}, None, "new-default"),  # the newest default class
    ({"storageClassName": "plain"}, None, "plain"),
    ({"storageClassName": ""}, None, ""),  # "" is a class: no class at all
    ({}, {"volume.beta.kubernetes.io/storage-class": "legacy"}, None),  # the annotation counts as a class
])
async def test_default_storage_class(store_and_cache, spec, annotations, want):
    store, cache = store_and_cache
    obj = claim(**spec)
    if annotations:
        obj["metadata"]["annotations"] = annotations
    got = await DefaultStorageClass(store, cache).mutate(attrs(), ADMIN, obj, None)
    assert got["spec"].get("storageClassName") == want


async def test_default_storage_class_only_on_create(store_and_cache):
    store, cache = store_and_cache
    plugin = DefaultStorageClass(store, cache)
    for a in (attrs("update"), attrs("create", subresource="status"), attrs("create", resource="pods")):
        got = await plugin.mutate(a, ADMIN, claim(), None)
        assert "storageClassName" not in got["spec"]


async def test_no_default_class_leaves_the_claim_alone(tmp_path):
    async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
        got = await DefaultStorageClass(store).mutate(attrs(), ADMIN, claim(), None)
        assert "storageClassName" not in got["spec"]


def test_claim_has_class():
    assert not claim_has_class(claim())
    assert claim_has_class(claim(storageClassName=""))
    assert not claim_has_class({"metadata": {}, "spec": "junk"})


@pytest.mark.parametrize(("resource", "verb", "finalizers", "want"), [
    ("persistentvolumeclaims", "create", None, ["kubernetes.io/pvc-protection"]),
    ("persistentvolumeclaims", "create", ["a/b"], ["a/b", "kubernetes.io/pvc-protection"]),
    ("persistentvolumeclaims", "create", ["kubernetes.io/pvc-protection"], ["kubernetes.io/pvc-protection"]),
    ("persistentvolumes", "create", None, ["kubernetes.io/pv-protection"]),
    ("persistentvolumeclaims", "update", None, None),
    ("configmaps", "create", None, None),
])
async def test_storage_object_in_use_protection(resource, verb, finalizers, want):
    obj = claim()
    if finalizers is not None:
        obj["metadata"]["finalizers"] = list(finalizers)
    got = await StorageObjectInUseProtection().mutate(attrs(verb, resource), ADMIN, obj, None)
    assert got["metadata"].get("finalizers") == want


def bound(obj: dict[str, Any], cls: str, size: str = "1Gi") -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["spec"]["storageClassName"] = cls
    obj["spec"]["volumeName"] = "pv1"
    obj["status"] = {"phase": "Bound", "capacity": {"storage": size}}
    return obj


def grown(obj: dict[str, Any], size: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["spec"]["resources"]["requests"]["storage"] = size
    return obj


CLASSES = {"grows": sc("grows", expand=True), "plain": sc("plain"), "off": sc("off", expand=False)}


@pytest.mark.parametrize(("old", "new", "want"), [
    (bound(claim(), "grows"), grown(bound(claim(), "grows"), "2Gi"), None),
    (bound(claim(), "plain"), grown(bound(claim(), "plain"), "2Gi"), NOT_EXPANDABLE),
    (bound(claim(), "off"), grown(bound(claim(), "off"), "2Gi"), NOT_EXPANDABLE),
    (bound(claim(), "gone"), grown(bound(claim(), "gone"), "2Gi"), NOT_EXPANDABLE),
    (bound(claim(), ""), grown(bound(claim(), ""), "2Gi"), NOT_EXPANDABLE),
    (claim(storageClassName="grows"), grown(claim(storageClassName="grows"), "2Gi"), NOT_BOUND),
    # Not a growth: nothing to say (validation judges shrinking).
    (bound(claim(), "plain"), bound(claim(), "plain"), None),
    (bound(claim(size="2Gi"), "plain"), grown(bound(claim(size="2Gi"), "plain"), "1Gi"), None),
])
def test_resize_refusal(old, new, want):
    assert resize_refusal(new, old, CLASSES) == want


async def test_resize_plugin_is_403(store_and_cache):
    store, cache = store_and_cache
    plugin = PersistentVolumeClaimResize(store, cache)
    old = bound(claim(), "plain")
    with pytest.raises(errors.Forbidden) as exc:
        await plugin.validate(attrs("patch"), ADMIN, grown(old, "2Gi"), old)
    assert exc.value.code == 403
    assert exc.value.message == f'persistentvolumeclaims "data" is forbidden: {NOT_EXPANDABLE}'
    old = bound(claim(), "grows")
    await plugin.validate(attrs("update"), ADMIN, grown(old, "2Gi"), old)
    # The status subresource is the resizer's, never judged here.
    await plugin.validate(attrs("update", subresource="status"), ADMIN, grown(bound(claim(), "plain"), "9Gi"),
                          bound(claim(), "plain"))


# ---------------------------------------------------------------------------
# Through the API: admission order, validation, and the controllers' status writes.
# ---------------------------------------------------------------------------


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True) as a:
        yield a


async def test_pipeline_claim_default_class_finalizer_and_resize(api):
    assert (await api.json("POST", SCS, sc("fixed", default=True)))[0] == 201
    code, got = await api.json("POST", PVCS, claim())
    assert code == 201, got
    assert got["spec"]["storageClassName"] == "fixed"
    assert got["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"]
    assert got["status"] == {"phase": "Pending"}
    # A pending claim cannot change its request at all (422, validation).
    code, err = await api.json("PUT", f"{PVCS}/data", grown(got, "2Gi"))
    assert code == 422 and err["details"]["causes"][0]["field"] == "spec", err
    # The binder: volumeName once, then the status (phase, capacity, access modes).
    got["spec"]["volumeName"] = "pv1"
    code, got = await api.json("PUT", f"{PVCS}/data", got)
    assert code == 200, got
    got["status"] = {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}
    code, got = await api.json("PUT", f"{PVCS}/data/status", got)
    assert code == 200, got
    # Growing: the class does not allow expansion → 403 with Kubernetes' words.
    code, err = await api.json("PUT", f"{PVCS}/data", grown(got, "2Gi"))
    assert code == 403, err
    assert err["message"] == f'persistentvolumeclaims "data" is forbidden: {NOT_EXPANDABLE}'
    # Shrinking is 422 (validation runs before the validating plugins).
    code, err = await api.json("PUT", f"{PVCS}/data", grown(got, "500Mi"))
    assert code == 422, err
    assert err["details"]["causes"] == [{"reason": "FieldValueForbidden", "field": "spec.resources.requests.storage",
                                         "message": "Forbidden: field can not be less than status.capacity"}]
    # The resizers' status fields.
    got["status"].update(allocatedResources={"storage": "1Gi"}, allocatedResourceStatuses={
        "storage": "ControllerResizeInProgress"}, conditions=[{"type": "Resizing", "status": "True"}])
    code, after = await api.json("PUT", f"{PVCS}/data/status", got)
    assert code == 200, after
    assert after["status"]["allocatedResourceStatuses"] == {"storage": "ControllerResizeInProgress"}
    got = after
    got["status"]["allocatedResourceStatuses"] = {"storage": "Bigger"}
    code, err = await api.json("PUT", f"{PVCS}/data/status", got)
    assert code == 422 and err["details"]["causes"][0]["field"] == "status.allocatedResourceStatus", err


async def test_pipeline_expandable_class_grows(api):
    assert (await api.json("POST", SCS, sc("elastic", expand=True)))[0] == 201
    code, got = await api.json("POST", PVCS, claim(storageClassName="elastic"))
    assert code == 201, got
    got["spec"]["volumeName"] = "pv1"
    code, got = await api.json("PUT", f"{PVCS}/data", got)
    got["status"] = {"phase": "Bound", "capacity": {"storage": "1Gi"}}
    code, got = await api.json("PUT", f"{PVCS}/data/status", got)
    assert code == 200, got
    code, got = await api.json("PUT", f"{PVCS}/data", grown(got, "3Gi"))
    assert code == 200, got
    assert got["spec"]["resources"]["requests"]["storage"] == "3Gi"


async def test_pipeline_volume(api):
    code, got = await api.json("POST", PVS, volume())
    assert code == 201, got
    assert got["metadata"]["finalizers"] == ["kubernetes.io/pv-protection"]
    assert got["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert got["status"]["phase"] == "Pending"
    created = got["status"]["lastPhaseTransitionTime"]
    # A client's status on create is dropped; the controller writes it through /status.
    body = volume("pv2")
    body["status"] = {"phase": "Bound"}
    code, other = await api.json("POST", PVS, body)
    assert code == 201 and other["status"]["phase"] == "Pending", other
    got["status"] = {"phase": "Available"}
    code, got = await api.json("PUT", f"{PVS}/pv1/status", got)
    assert code == 200, got
    assert got["status"]["phase"] == "Available" and got["status"]["lastPhaseTransitionTime"] >= created
    # A main-resource update keeps the status and may not swap the source.
    got["status"] = {"phase": "Failed"}
    got["spec"]["hostPath"]["path"] = "/elsewhere"
    code, err = await api.json("PUT", f"{PVS}/pv1", got)
    assert code == 422, err
    assert err["details"]["causes"][0]["field"] == "spec.persistentvolumesource"
    code, err = await api.json("POST", PVS, volume("bad", hostPath=None))
    assert code == 422 and err["details"]["causes"][0]["message"] == "Required value: must specify a volume type"


async def test_pipeline_storage_class_is_immutable_where_kube_says(api):
    code, got = await api.json("POST", SCS, sc("fixed"))
    assert code == 201 and got["reclaimPolicy"] == "Delete" and got["volumeBindingMode"] == "Immediate", got
    got["allowVolumeExpansion"] = True
    code, got = await api.json("PUT", f"{SCS}/fixed", got)
    assert code == 200, got
    got["parameters"] = {"type": "fast"}
    code, err = await api.json("PUT", f"{SCS}/fixed", got)
    assert code == 422, err
    assert err["details"]["causes"] == [{"reason": "FieldValueForbidden", "field": "parameters",
                                         "message": "Forbidden: updates to parameters are forbidden."}]
