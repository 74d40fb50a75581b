"""The official Python client's `DynamicClient` drives a custom resource through its life.

A CRD is created with the dynamic client itself; its kind is then discovered by kind and
by short name (the client's lazy discovery re-reads /apis on a miss), and an object of it
goes through create, get, list (namespaced, all namespaces, by label), a merge patch,
replace (and a 409 for a stale resourceVersion), server-side apply, the status subresource
(replace and patch, each leaving the other half alone), a bounded watch, delete, and
finally the deletion of its CRD — which removes the remaining objects first and takes the
kind out of discovery.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError, ResourceNotFoundError

from tests.conftest import FleetServer, create_namespace
from tests.e2e.helpers import wait_until

pytestmark = pytest.mark.e2e

GROUP = "dyn.fleet.example.com"
CRD_NAME = f"widgets.{GROUP}"
MERGE = "application/merge-patch+json"


def widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "shortNames": ["wdg"]},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "integer"}, "color": {"type": "string"},
                        "tags": {"type": "array", "items": {"type": "string"}}}},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"}, "observed": {"type": "integer"}}},
                }}},
            }],
        },
    }


def widget(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "dyn"}}, "spec": spec}


@pytest.fixture
def dynamic(fleet_server: FleetServer, tmp_path: Path) -> Iterator[DynamicClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(fleet_server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        # A private discovery cache file: nothing carried over from another run.
        yield DynamicClient(api, cache_file=str(tmp_path / "discovery.json"))


def test_dynamic_client_drives_a_custom_resource(fleet_server: FleetServer, dynamic: DynamicClient,
                                                 namespace: str) -> None:
    ns, other_ns = namespace, f"{namespace}-b"
    create_namespace(fleet_server, other_ns)
    crds = dynamic.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    crds.create(body=widget_crd())
    wait_until(lambda: any(c.type == "Established" and c.status == "True"
                           for c in (crds.get(name=CRD_NAME).status.conditions or [])),
               timeout=30, what="the CRD Established")

    # -- discovery: by kind (the lazy discoverer re-reads on a miss), and by short name ----
    widgets = dynamic.resources.get(api_version=f"{GROUP}/v1", kind="Widget")
    assert (widgets.name, widgets.namespaced, widgets.group, widgets.kind) == ("widgets", True, GROUP, "Widget")
    assert "status" in widgets.subresources
    assert dynamic.resources.get(short_names=["wdg"]).name == "widgets"
    assert {"create", "get", "list", "watch", "patch", "update", "delete", "deletecollection"} <= set(widgets.verbs)

    # -- create, get, list ---------------------------------------------------------------------
    created = widgets.create(body=widget("w1", ns, size=1, color="red"), namespace=ns)
    assert created.metadata.generation == 1 and created.spec.size == 1
    widgets.create(body=widget("w2", other_ns, size=2), namespace=other_ns)
    got = widgets.get(name="w1", namespace=ns)
    assert got.metadata.uid == created.metadata.uid and got.kind == "Widget"
    listed = widgets.get(namespace=ns)
    assert listed.kind == "WidgetList" and [i.metadata.name for i in listed.items] == ["w1"]
    every = widgets.get()
    assert {(i.metadata.namespace, i.metadata.name) for i in every.items} >= {(ns, "w1"), (other_ns, "w2")}
    assert len(widgets.get(namespace=ns, label_selector="app=dyn").items) == 1
    assert widgets.get(namespace=ns, label_selector="app=other").items == []

    # -- merge patch, replace (and a stale one), server-side apply -------------------------
    patched = widgets.patch(name="w1", namespace=ns, body={"spec": {"size": 3, "tags": ["a"]}},
                            content_type=MERGE)
    assert (patched.spec.size, patched.spec.color, patched.spec.tags) == (3, "red", ["a"])
    assert patched.metadata.generation == 2
    body = patched.to_dict()
    body["spec"]["color"] = "blue"
    replaced = widgets.replace(body=body, namespace=ns)
    assert replaced.spec.color == "blue" and replaced.metadata.generation == 3
    with pytest.raises(ConflictError):
        widgets.replace(body=body, namespace=ns)  # body still carries the old resourceVersion
    applied = widgets.server_side_apply(
        body={"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w1", "namespace": ns},
              "spec": {"color": "green"}},
        namespace=ns, field_manager="dyn-test", force_conflicts=True)
    assert applied.spec.color == "green" and applied.spec.size == 3
    assert ("dyn-test", "Apply") in {(m.manager, m.operation) for m in applied.metadata.managedFields}
    with pytest.raises(ApiException) as e:  # a field another manager owns, without force
        widgets.server_side_apply(
            body={"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w1", "namespace": ns},
                  "spec": {"color": "black"}},
            namespace=ns, field_manager="someone-else")
    assert e.value.status == 409

    # -- the status subresource ------------------------------------------------------------
    cur = widgets.get(name="w1", namespace=ns).to_dict()
    cur["status"] = {"phase": "Ready", "observed": cur["metadata"]["generation"]}
    cur["spec"]["size"] = 99  # ignored by the status subresource
    st = widgets.status.replace(body=cur, namespace=ns)
    assert st.status.phase == "Ready" and st.spec.size == 3
    st = widgets.status.patch(name="w1", namespace=ns, body={"status": {"phase": "Done"}}, content_type=MERGE)
    assert st.status.phase == "Done" and st.status.observed == cur["status"]["observed"]
    gen = st.metadata.generation
    # ... and the main resource ignores status: the two halves are written apart.
    main = widgets.patch(name="w1", namespace=ns, body={"status": {"phase": "Hacked"}, "spec": {"size": 4}},
                         content_type=MERGE)
    assert main.status.phase == "Done" and main.spec.size == 4 and main.metadata.generation == gen + 1
    assert widgets.status.get(name="w1", namespace=ns).status.phase == "Done"

    # -- a bounded watch from a known resourceVersion ----------------------------------------
    rv = widgets.get(namespace=ns).metadata.resourceVersion
    widgets.patch(name="w1", namespace=ns, body={"spec": {"size": 5}}, content_type=MERGE)
    widgets.create(body=widget("w3", ns, size=7), namespace=ns)
    widgets.delete(name="w3", namespace=ns)
    seen: list[tuple[str, str, Any]] = []
    w = watch.Watch()
    deadline = time.monotonic() + 20
    for ev in widgets.watch(namespace=ns, resource_version=rv, timeout=10, watcher=w):
        seen.append((ev["type"], ev["object"].metadata.name, ev["object"].spec.size))
        if len(seen) == 3 or time.monotonic() > deadline:
            w.stop()
    assert seen == [("MODIFIED", "w1", 5), ("ADDED", "w3", 7), ("DELETED", "w3", 7)], seen

    # -- delete ------------------------------------------------------------------------------
    gone = widgets.delete(name="w1", namespace=ns)
    assert gone.kind in ("Widget", "Status")
    wait_until(lambda: _absent(widgets, "w1", ns), timeout=30, what="w1 deleted")

    # -- deleting the CRD removes its remaining objects, then the kind leaves discovery ---------
    crds.delete(name=CRD_NAME)
    wait_until(lambda: _crd_absent(crds), timeout=60, what="the CRD removed")
    dynamic.resources.invalidate_cache()  # the client caches discovery; re-read it
    with pytest.raises(ResourceNotFoundError):
        dynamic.resources.get(api_version=f"{GROUP}/v1", kind="Widget")
    with fleet_server.client() as c:
        r = c.get(f"/apis/{GROUP}/v1/namespaces/{other_ns}/widgets/w2")
    assert r.status_code == 404, r.text


def _absent(widgets: Any, name: str, ns: str) -> bool:
    try:
        widgets.get(name=name, namespace=ns)
    except NotFoundError:
        return True
    return False


def _crd_absent(crds: Any) -> bool:
    try:
        crds.get(name=CRD_NAME)
    except NotFoundError:
        return True
    return False
