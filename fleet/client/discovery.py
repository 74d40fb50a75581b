"""What the server serves, and turning what a user typed into one resource.

Discovery documents (`/api/v1`, `/apis/{group}/{version}`) list resources with
their plural, singular, kind, short names, scope, verbs and categories.  This
module holds the parsed form (`APIResource`) and the pure lookup rules kubectl
users rely on: `deploy`, `deployment`, `deployments`, `Deployment`,
`deployments.apps`, `deployments.v1.apps` all name the same thing, and when a
name exists in several groups (`events`) the core group wins, then a group's
preferred version.  No I/O here: `fleet.client.Client.discover` fetches the
documents and calls into this module, so the rules are unit-testable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class ResourceNotFound(LookupError):
    """No served resource matches the name the user typed."""

    def __init__(self, name: str) -> None:
        super().__init__(f'the server doesn\'t have a resource type "{name}"')
        self.name = name


@dataclass(frozen=True)
class APIResource:
    """One served resource (not a subresource) at one group/version."""

    name: str  # the plural, e.g. "deployments"
    singular_name: str
    namespaced: bool
    kind: str
    group: str  # "" for the core group
    version: str
    verbs: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    preferred: bool = True  # is `version` the group's preferred version
    subresources: tuple[str, ...] = field(default=(), compare=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`deployments.apps` (or `pods` for the core group), as kubectl prints it."""
        return f"{self.name}.{self.group}" if self.group else self.name

    @property
    def kind_prefix(self) -> str:
        """`deployment.apps` (or `pod`): the prefix kubectl uses for `-o name`."""
        k = self.kind.lower()
        return f"{k}.{self.group}" if self.group else k

    def has_verb(self, verb: str) -> bool:
        return not self.verbs or verb in self.verbs


def parse_resource_list(doc: dict[str, Any], *, preferred: bool = True) -> list[APIResource]:
    """Read an `APIResourceList`; subresources (`pods/log`) are folded into their parent."""
    gv = doc.get("groupVersion") or "v1"
    group, _, version = gv.rpartition("/")
    subs: dict[str, list[str]] = {}
    tops: list[dict[str, Any]] = []
    for r in doc.get("resources") or []:
        name = r.get("name") or ""
        if "/" in name:
            parent, _, sub = name.partition("/")
            subs.setdefault(parent, []).append(sub)
        elif name:
            tops.append(r)
    out = []
    for r in tops:
        kind = r.get("kind") or ""
        out.append(APIResource(
            name=r["name"],
            singular_name=r.get("singularName") or kind.lower(),
            namespaced=bool(r.get("namespaced")),
            kind=kind,
            group=r.get("group") or group,
            version=r.get("version") or version,
            verbs=tuple(r.get("verbs") or ()),
            short_names=tuple(r.get("shortNames") or ()),
            categories=tuple(r.get("categories") or ()),
            preferred=preferred,
            subresources=tuple(subs.get(r["name"], ())),
        ))
    return out


def _split_typed(name: str) -> list[tuple[str, str | None, str | None]]:
    """Possible (resource, version, group) readings of what the user typed.

    `deployments.v1.apps` can be resource.version.group; `deployments.apps` and
    `ingresses.networking.k8s.io` are resource.group.  Both readings are tried,
    the fully-qualified one first (as kubectl does).
    """
    lower = name.lower()
    if "." not in lower:
        return [(lower, None, None)]
    resource, _, rest = lower.partition(".")
    readings: list[tuple[str, str | None, str | None]] = []
    version, _, group = rest.partition(".")
    if group and version.startswith("v") and version[1:2].isdigit():
        readings.append((resource, version, group))
    readings.append((resource, None, rest))
    return readings


def _group_matches(actual: str, typed: str) -> bool:
    # kubectl accepts a group's leading labels: `ingresses.networking` finds
    # networking.k8s.io.  "core" names the legacy group some people type.
    if typed in ("core", ""):
        return actual == ""
    return actual == typed or actual.startswith(typed + ".")


def _name_matches(res: APIResource, typed: str) -> bool:
    return typed in (res.name, res.singular_name, res.kind.lower()) or typed in res.short_names


def resolve_resource(resources: Iterable[APIResource], typed: str) -> APIResource:
    """The resource a user means by `typed`; `ResourceNotFound` if none.

    Among several matches: the core group first, then a preferred version, then
    discovery order (which is the server's group order).
    """
    pool = list(resources)
    for resource, version, group in _split_typed(typed):
        matches = []
        for idx, res in enumerate(pool):
            if not _name_matches(res, resource):
                continue
            if group is not None and not _group_matches(res.group, group):
                continue
            if version is not None and res.version != version:
                continue
            matches.append((res.group != "", not res.preferred, idx, res))
        if matches:
            matches.sort(key=lambda m: m[:3])
            return matches[0][3]
    raise ResourceNotFound(typed)


def in_category(resources: Iterable[APIResource], category: str) -> list[APIResource]:
    """Preferred-version resources in a category (`all`), in discovery order."""
    seen: set[tuple[str, str]] = set()
    out = []
    for res in resources:
        if category in res.categories and res.preferred and (res.group, res.name) not in seen:
            seen.add((res.group, res.name))
            out.append(res)
    return out


def resource_path(api_version: str, plural: str, namespace: str | None = None,
                  name: str | None = None, subresource: str | None = None) -> str:
    """The REST path of a collection, object or subresource.

    `/api/v1[/namespaces/{ns}]/{plural}[/{name}[/{sub}]]` for the core group,
    `/apis/{group}/{version}/...` for the others.  `namespace=None` gives the
    cluster-scoped (or all-namespaces) path.
    """
    if subresource and not name:
        raise ValueError("a subresource needs an object name")
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
        if subresource:
            parts.append(subresource)
    return "/".join(parts)
