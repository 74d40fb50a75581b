"""API discovery documents (legacy shapes), built from the kind registry.

kubectl reads `/api`, `/apis` and then `/api/v1` and every `/apis/{g}/{v}`;
the Python client and kopf read the same.  We answer the legacy JSON forms
(kubectl falls back to them whenever the response is plain application/json),
listing subresources only where the server really serves them.
"""

from __future__ import annotations

from typing import Any

from fleet.api.registry import KindInfo, Registry
from fleet.server.apiservices import ordered_group_versions
from fleet.server.drain_plan import DRAIN_KIND
from fleet.server.proxy import STREAM_SUBRESOURCES
from fleet.server.routes import SUBRESOURCE_VERBS as REST_SUBRESOURCE_VERBS
from fleet.server.routes import SUPPORTED_SUBRESOURCES

SUBRESOURCE_VERBS = {
    **{sub: list(verbs) for sub, verbs in REST_SUBRESOURCE_VERBS.items()},
    **{sub: list(verbs) for sub, (verbs, _kind) in STREAM_SUBRESOURCES.items()},
}

# The (group, version, kind) a subresource takes or returns, when it is not the
# parent's.  Clients read these: `kubectl drain` posts evictions only if
# pods/eviction says policy/v1 Eviction (drain.CheckEvictionSupport).
SUBRESOURCE_KINDS: dict[str, tuple[str, str, str]] = {
    "scale": ("autoscaling", "v1", "Scale"),
    "eviction": ("policy", "v1", "Eviction"),
    "signal": ("fleet.dev", "v1", "PodSignal"),  # Fleet's pods/signal body
    "drain": (DRAIN_KIND["group"], DRAIN_KIND["version"], DRAIN_KIND["kind"]),
    "token": ("authentication.k8s.io", "v1", "TokenRequest"),
}


def _subresource_kind(info: KindInfo, sub: str) -> tuple[str, str, str]:
    if sub in SUBRESOURCE_KINDS:
        return SUBRESOURCE_KINDS[sub]
    if sub == "binding":
        return info.group, info.version, "Binding"
    return info.group, info.version, info.kind


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def api_group_list(registry: Registry) -> dict[str, Any]:
    """Groups in the aggregator's order (APIService priorities, fleet/server/apiservices.py)."""
    groups = []
    for group, versions in ordered_group_versions(registry).items():
        if not group:
            continue
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        groups.append({"name": group, "versions": gvs, "preferredVersion": gvs[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = ordered_group_versions(registry).get(group)
    if not versions or not group:
        return None
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs, "preferredVersion": gvs[0]}


def _resource(info: KindInfo) -> dict[str, Any]:
    r: dict[str, Any] = {
        "name": info.plural,
        "singularName": info.singular,
        "namespaced": info.namespaced,
        "kind": info.kind,
        "verbs": list(info.verbs),
    }
    if info.short_names:
        r["shortNames"] = list(info.short_names)
    if info.categories:
        r["categories"] = list(info.categories)
    return r


def api_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    kinds = registry.in_group_version(group, version)
    if not kinds:
        return None
    resources = []
    for info in kinds:
        resources.append(_resource(info))
        for sub in info.subresources:
            if sub not in SUPPORTED_SUBRESOURCES and sub not in STREAM_SUBRESOURCES:
                continue
            entry: dict[str, Any] = {
                "name": f"{info.plural}/{sub}",
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": info.kind,
                "verbs": SUBRESOURCE_VERBS[sub],
            }
            sub_group, sub_version, kind = _subresource_kind(info, sub)
            if (sub_group, sub_version) != (info.group, info.version):
                entry.update(group=sub_group, version=sub_version)
            entry["kind"] = kind
            resources.append(entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


# ---------------------------------------------------------------- aggregated
AGGREGATED_VERSIONS = ("v2", "v2beta1")


def aggregated_ctype(version: str = "v2") -> str:
    return f"application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"


AGGREGATED_CTYPE = aggregated_ctype()


def aggregated_version(accept: str) -> str | None:
    """The apidiscovery.k8s.io version the client asks for first (kubectl 1.32 and
    client-go ask v2, then v2beta1; kubectl 1.26-1.27 v2beta1 only), or None: legacy."""
    for part in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in part.split(";")[1:] if "=" in p)
        if (params.get("as") == "APIGroupDiscoveryList" and params.get("g") == "apidiscovery.k8s.io"
                and params.get("v") in AGGREGATED_VERSIONS):
            return params["v"]
    return None


def wants_aggregated(accept: str) -> bool:
    """True when the client asks for aggregated discovery (kubectl, client-go do)."""
    return aggregated_version(accept) is not None


def _scope(info: KindInfo) -> str:
    return "Namespaced" if info.namespaced else "Cluster"


def _aggregated_resource(info: KindInfo) -> dict[str, Any]:
    r: dict[str, Any] = {
        "resource": info.plural,
        "responseKind": {"group": info.group, "version": info.version, "kind": info.kind},
        "scope": _scope(info),
        "singularResource": info.singular,
        "verbs": list(info.verbs),
    }
    if info.short_names:
        r["shortNames"] = list(info.short_names)
    if info.categories:
        r["categories"] = list(info.categories)
    subs = []
    for sub in info.subresources:
        if sub not in SUPPORTED_SUBRESOURCES and sub not in STREAM_SUBRESOURCES:
            continue
        group, version, kind = _subresource_kind(info, sub)
        subs.append({"subresource": sub, "responseKind": {"group": group, "version": version, "kind": kind},
                     "verbs": SUBRESOURCE_VERBS[sub]})
    if subs:
        r["subresources"] = subs
    return r


def aggregated(registry: Registry, *, core: bool, version: str = "v2") -> dict[str, Any]:
    """APIGroupDiscoveryList for /api (core=True) or /apis (every named group), at
    apidiscovery.k8s.io `version` (v2 and v2beta1 have the same shape)."""
    items = []
    for group, versions in ordered_group_versions(registry).items():
        if (group == "") != core:
            continue
        items.append({
            "metadata": {"name": group},
            "versions": [{
                "version": v,
                "resources": [_aggregated_resource(i) for i in registry.in_group_version(group, v)],
                "freshness": "Current",
            } for v in versions],
        })
    return {"kind": "APIGroupDiscoveryList", "apiVersion": f"apidiscovery.k8s.io/{version}", "metadata": {},
            "items": items}
