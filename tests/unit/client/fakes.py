"""A small fake discovery document shared by the client unit tests."""

from __future__ import annotations

from typing import Any

from fleet.client.discovery import APIResource, parse_resource_list

CORE_V1: dict[str, Any] = {
    "kind": "APIResourceList", "groupVersion": "v1",
    "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
         "shortNames": ["po"], "categories": ["all"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod",
         "verbs": ["get"]},
        {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod",
         "verbs": ["get", "patch", "update"]},
        {"name": "services", "singularName": "service", "namespaced": True, "kind": "Service",
         "verbs": ["get", "list"], "shortNames": ["svc"], "categories": ["all"]},
        {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
         "verbs": ["get", "list"], "shortNames": ["ev"]},
        {"name": "namespaces", "singularName": "namespace", "namespaced": False,
         "kind": "Namespace", "verbs": ["get", "list"], "shortNames": ["ns"]},
        {"name": "configmaps", "singularName": "configmap", "namespaced": True,
         "kind": "ConfigMap", "verbs": ["get", "list"], "shortNames": ["cm"]},
    ],
}
APPS_V1: dict[str, Any] = {
    "kind": "APIResourceList", "groupVersion": "apps/v1",
    "resources": [
        {"name": "deployments", "singularName": "deployment", "namespaced": True,
         "kind": "Deployment", "verbs": ["get", "list"], "shortNames": ["deploy"],
         "categories": ["all"]},
        {"name": "deployments/scale", "singularName": "", "namespaced": True, "kind": "Scale",
         "group": "autoscaling", "version": "v1", "verbs": ["get", "patch"]},
    ],
}
EVENTS_V1: dict[str, Any] = {
    "kind": "APIResourceList", "groupVersion": "events.k8s.io/v1",
    "resources": [{"name": "events", "singularName": "event", "namespaced": True,
                   "kind": "Event", "verbs": ["get", "list"], "shortNames": ["ev"]}],
}
NETWORKING_V1: dict[str, Any] = {
    "kind": "APIResourceList", "groupVersion": "networking.k8s.io/v1",
    "resources": [{"name": "ingresses", "singularName": "ingress", "namespaced": True,
                   "kind": "Ingress", "verbs": ["get", "list"], "shortNames": ["ing"]}],
}
WIDGETS_V1: dict[str, Any] = {
    "kind": "APIResourceList", "groupVersion": "example.com/v1",
    "resources": [{"name": "widgets", "singularName": "widget", "namespaced": True,
                   "kind": "Widget", "verbs": ["get", "list"], "categories": ["all"]}],
}
WIDGETS_V2: dict[str, Any] = {
    "kind": "APIResourceList", "groupVersion": "example.com/v2",
    "resources": [{"name": "widgets", "singularName": "widget", "namespaced": True,
                   "kind": "Widget", "verbs": ["get", "list"], "categories": ["all"]}],
}

API: dict[str, Any] = {"kind": "APIVersions", "versions": ["v1"]}
APIS: dict[str, Any] = {
    "kind": "APIGroupList", "apiVersion": "v1",
    "groups": [
        {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}},
        {"name": "events.k8s.io",
         "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"}},
        {"name": "networking.k8s.io",
         "versions": [{"groupVersion": "networking.k8s.io/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "networking.k8s.io/v1", "version": "v1"}},
        {"name": "example.com",
         "versions": [{"groupVersion": "example.com/v1", "version": "v1"},
                      {"groupVersion": "example.com/v2", "version": "v2"}],
         "preferredVersion": {"groupVersion": "example.com/v2", "version": "v2"}},
    ],
}

DOCUMENTS: dict[str, dict[str, Any]] = {
    "/api": API, "/apis": APIS, "/api/v1": CORE_V1, "/apis/apps/v1": APPS_V1,
    "/apis/events.k8s.io/v1": EVENTS_V1, "/apis/networking.k8s.io/v1": NETWORKING_V1,
    "/apis/example.com/v1": WIDGETS_V1, "/apis/example.com/v2": WIDGETS_V2,
}


def fake_resources() -> list[APIResource]:
    """What `Client.discover` returns for DOCUMENTS (same order, same preferred flags)."""
    out: list[APIResource] = []
    out += parse_resource_list(CORE_V1)
    out += parse_resource_list(APPS_V1)
    out += parse_resource_list(EVENTS_V1)
    out += parse_resource_list(NETWORKING_V1)
    out += parse_resource_list(WIDGETS_V1, preferred=False)
    out += parse_resource_list(WIDGETS_V2)
    return out
