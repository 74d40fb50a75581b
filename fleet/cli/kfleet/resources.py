"""kfleet's resource arguments: `TYPE[,TYPE] NAME...` and `TYPE/NAME` parsed and
resolved through discovery (`all` expanded to its category), the namespace a
resource takes, kubectl's "No resources found" wording, and the NAME/AGE table
built client-side for servers that ignore the Table Accept header.  Shared by
get, describe and delete.
"""

from __future__ import annotations

from typing import Any

from fleet.cli.kfleet.base import Session
from fleet.client.discovery import APIResource, in_category
from fleet.client.rest import Client

# -- argument helpers ---------------------------------------------------------


def _split_type_args(args: list[str]) -> tuple[list[tuple[str, list[str]]], str | None]:
    """[(typed resource, [names])] from `TYPE[,TYPE] NAME...` or `TYPE/NAME ...`."""
    if not args:
        return [], "you must specify the type of resource to get"
    if "/" in args[0]:
        out: list[tuple[str, list[str]]] = []
        for a in args:
            typ, sep, name = a.partition("/")
            if not sep or not typ or not name:
                return [], f"there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (got {a!r})"
            for entry in out:
                if entry[0] == typ:
                    entry[1].append(name)
                    break
            else:
                out.append((typ, [name]))
        return out, None
    types = [t for t in args[0].split(",") if t]
    return [(t, list(args[1:])) for t in types], None


async def _expand_types(client: Client, pairs: list[tuple[str, list[str]]]
                        ) -> list[tuple[APIResource, list[str]]]:
    out: list[tuple[APIResource, list[str]]] = []
    for typed, names in pairs:
        if typed.lower() == "all" and not names:
            for res in in_category(await client.discover(), "all"):
                out.append((res, []))
            continue
        out.append((await client.resolve(typed), names))
    return out


def _ns_for(res: APIResource, namespace: str | None) -> str | None:
    return namespace if res.namespaced else None


def _no_resources(session: Session, all_namespaces: bool, any_namespaced: bool) -> str:
    if all_namespaces or not any_namespaced:
        return "No resources found"
    return f"No resources found in {session.namespace} namespace."


def _fallback_table(res: APIResource, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A NAME/AGE table built client-side, for servers that ignore the Table Accept."""
    from fleet.api import meta

    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "priority": 0},
        ],
        "rows": [{"cells": [(o.get("metadata") or {}).get("name"), meta.age(o)],
                  "object": {"kind": "PartialObjectMetadata",
                             "apiVersion": "meta.k8s.io/v1",
                             "metadata": o.get("metadata") or {}}} for o in items],
    }


def _as_table(res: APIResource, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("kind") == "Table":
        return body
    if "items" in body:
        return _fallback_table(res, body.get("items") or [])
    return _fallback_table(res, [body])


def _with_type(res: APIResource, obj: dict[str, Any]) -> dict[str, Any]:
    out = {"apiVersion": res.api_version, "kind": res.kind}
    out.update(obj)
    return out
