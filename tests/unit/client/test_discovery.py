"""Path building and resolving what a user typed to a served resource."""

from __future__ import annotations

import pytest

from fleet.client.discovery import ResourceNotFound, in_category, resolve_resource, resource_path

from .fakes import fake_resources


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (("v1", "pods"), "/api/v1/pods"),
        (("v1", "pods", "default"), "/api/v1/namespaces/default/pods"),
        (("v1", "pods", "ns1", "web"), "/api/v1/namespaces/ns1/pods/web"),
        (("v1", "pods", "ns1", "web", "log"), "/api/v1/namespaces/ns1/pods/web/log"),
        (("v1", "namespaces", None, "kube-system"), "/api/v1/namespaces/kube-system"),
        (("v1", "namespaces", None, "x", "status"), "/api/v1/namespaces/x/status"),
        (("apps/v1", "deployments"), "/apis/apps/v1/deployments"),
        (("apps/v1", "deployments", "ns", "web", "scale"),
         "/apis/apps/v1/namespaces/ns/deployments/web/scale"),
        (("rbac.authorization.k8s.io/v1", "clusterroles", None, "system:basic"),
         "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:basic"),
    ],
)
def test_resource_path(args: tuple, path: str) -> None:
    assert resource_path(*args) == path


def test_subresource_needs_name() -> None:
    with pytest.raises(ValueError):
        resource_path("v1", "pods", "ns", None, "log")


def test_parse_folds_subresources_and_keeps_fields() -> None:
    res = {r.name: r for r in fake_resources()}
    pods = res["pods"]
    assert pods.subresources == ("log", "status")
    assert (pods.kind, pods.singular_name, pods.short_names) == ("Pod", "pod", ("po",))
    assert pods.namespaced and pods.api_version == "v1" and pods.kind_prefix == "pod"
    assert "pods/log" not in res
    deploy = res["deployments"]
    assert deploy.subresources == ("scale",)
    assert deploy.api_version == "apps/v1" and deploy.kind_prefix == "deployment.apps"
    assert deploy.group_resource == "deployments.apps"
    assert not res["namespaces"].namespaced


@pytest.mark.parametrize(
    ("typed", "group", "name", "version"),
    [
        ("pods", "", "pods", "v1"),
        ("pod", "", "pods", "v1"),
        ("po", "", "pods", "v1"),
        ("Pod", "", "pods", "v1"),
        ("PODS", "", "pods", "v1"),
        ("deploy", "apps", "deployments", "v1"),
        ("Deployment", "apps", "deployments", "v1"),
        ("deployments.apps", "apps", "deployments", "v1"),
        ("deployment.apps", "apps", "deployments", "v1"),
        ("deployments.v1.apps", "apps", "deployments", "v1"),
        # the core group wins over events.k8s.io, like kubectl
        ("events", "", "events", "v1"),
        ("ev", "", "events", "v1"),
        ("events.events.k8s.io", "events.k8s.io", "events", "v1"),
        # a leading part of the group is enough
        ("ingresses.networking", "networking.k8s.io", "ingresses", "v1"),
        ("ing", "networking.k8s.io", "ingresses", "v1"),
        # the preferred version wins; an explicit version picks the other
        ("widgets", "example.com", "widgets", "v2"),
        ("widget.example.com", "example.com", "widgets", "v2"),
        ("widgets.v1.example.com", "example.com", "widgets", "v1"),
        ("ns", "", "namespaces", "v1"),
    ],
)
def test_resolve(typed: str, group: str, name: str, version: str) -> None:
    res = resolve_resource(fake_resources(), typed)
    assert (res.group, res.name, res.version) == (group, name, version)


@pytest.mark.parametrize("typed", ["foo", "pods.apps", "deployments.v2.apps", "scale", "log"])
def test_resolve_unknown(typed: str) -> None:
    with pytest.raises(ResourceNotFound, match=f'resource type "{typed}"'):
        resolve_resource(fake_resources(), typed)


def test_in_category_all_uses_preferred_versions_in_order() -> None:
    got = [(r.group, r.name, r.version) for r in in_category(fake_resources(), "all")]
    assert got == [("", "pods", "v1"), ("", "services", "v1"), ("apps", "deployments", "v1"),
                   ("example.com", "widgets", "v2")]


def test_missing_singular_name_falls_back_to_kind() -> None:
    from fleet.client.discovery import parse_resource_list

    doc = {"groupVersion": "v1", "resources": [
        {"name": "things", "singularName": "", "namespaced": False, "kind": "Thing",
         "verbs": []}]}
    (thing,) = parse_resource_list(doc)
    assert thing.singular_name == "thing"
    assert resolve_resource([thing], "thing").name == "things"
