"""A CRD's served versions as `KindInfo`s: the custom-resource strategy (pure).

`kinds_for(crd)` gives one `KindInfo` per served version; the server adds them to its
live registry when the CRD is Established (fleet/server/crd_controller.py), so the one
generic REST, watch, discovery, table, patch, GC and OpenAPI code serves them.  What
differs from a built-in kind is only the strategy set here:

- `prune_unknown`: kube's pruning at decode (the pruned paths feed fieldValidation);
- `default`: the schema's defaults (`apply_defaults`);
- `validate`: ObjectMeta (names are DNS subdomains) then `validate_custom_resource`,
  the CEL rules only when the schema has any (`rules_exist`, decided once per version);
- `columns_override`: kube's CR table convertor (columns.py);
- `scale`, `subresources`, short names, categories, scope from the CRD version;
- `strategic_merge=False` (kube answers 415), `openapi_schema` = the version's schema
  (OpenAPI v2/v3, SSA types);
- objects are stored once, at the storage version: every version's key is the same
  (`storage_group` + plural), `storage_version` names the version objects are stored
  at, and the server converts between the two (fleet/server/crd_conversion.py).
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api import validation as v
from fleet.api.crd import columns
from fleet.api.crd.defaults import apply_defaults, needs_defaults
from fleet.api.crd.listtype import list_violations
from fleet.api.crd.objectmeta import embedded_violations
from fleet.api.crd.prune import prune
from fleet.api.crd.rules import rules_exist, validate_rules
from fleet.api.crd.validate import validate
from fleet.api.errors import cause
from fleet.api.registry import ALL_VERBS, KindInfo, ScaleInfo

Cause = dict[str, str]
BLOCKING_REASONS = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong",
                              "FieldValueTooMany", "FieldValueTypeInvalid"})
NOT_CHECKED = ('Invalid value: "null": some validation rules were not checked because the object was invalid; '
               'correct the existing errors to complete validation')


def _dicts(x: Any) -> list[dict[str, Any]]:
    return [i for i in x if isinstance(i, dict)] if isinstance(x, list) else []


def _strs(x: Any) -> tuple[str, ...]:
    return tuple(i for i in x if isinstance(i, str)) if isinstance(x, list) else ()


def storage_version(crd: dict[str, Any]) -> str | None:
    for ver in _dicts((crd.get("spec") or {}).get("versions")):
        if ver.get("storage") is True:
            return ver.get("name")
    return None


def _validator(schema: dict[str, Any], namespaced: bool) -> Any:
    has_rules = rules_exist(schema)

    def validate_cr(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
        out = v.validate_object_meta(obj.get("metadata"), namespaced=namespaced)
        out += validate(obj, schema, "")
        out += embedded_violations(obj, schema)
        out += list_violations(obj, schema)
        if has_rules:
            if any(c.get("reason") in BLOCKING_REASONS for c in out):
                out.append(cause("<nil>", NOT_CHECKED))
            else:
                out += validate_rules(obj, schema, old)
        return out

    return validate_cr


def has_defaults(schema: Any) -> bool:
    """Whether any node of `schema` declares a `default` (read-time defaulting is skipped otherwise)."""
    if isinstance(schema, dict):
        return "default" in schema or any(has_defaults(v) for k, v in schema.items()
                                          if k not in ("enum", "example", "x-kubernetes-validations"))
    if isinstance(schema, list):
        return any(has_defaults(v) for v in schema)
    return False


def _path(json_path: Any) -> str:
    return json_path[1:] if isinstance(json_path, str) and json_path.startswith(".") else str(json_path or "")


def kinds_for(crd: dict[str, Any]) -> list[KindInfo]:
    """One KindInfo per served version of `crd` (its accepted names)."""
    spec = crd.get("spec") or {}
    names = (crd.get("status") or {}).get("acceptedNames") or spec.get("names") or {}
    group = str(spec.get("group") or "")
    namespaced = spec.get("scope") != "Cluster"
    storage = storage_version(crd)
    out: list[KindInfo] = []
    for ver in _dicts(spec.get("versions")):
        if not ver.get("served"):
            continue
        schema = copy.deepcopy((ver.get("schema") or {}).get("openAPIV3Schema") or {})
        subs = ver.get("subresources") or {}
        subresources = tuple(s for s in ("status", "scale") if isinstance(subs.get(s), dict))
        scale = None
        if isinstance(subs.get("scale"), dict):
            sc = subs["scale"]
            scale = ScaleInfo(spec_replicas=_path(sc.get("specReplicasPath")),
                              status_replicas=_path(sc.get("statusReplicasPath")),
                              label_selector=_path(sc.get("labelSelectorPath")))

        def prune_unknown(obj: dict[str, Any], schema: dict[str, Any] = schema) -> list[str]:
            return prune(obj, schema)

        def default(obj: dict[str, Any], schema: dict[str, Any] = schema) -> None:
            apply_defaults(obj, schema)

        def read_defaults(obj: dict[str, Any], schema: dict[str, Any] = schema) -> dict[str, Any]:
            if not needs_defaults(obj, schema):  # a read-only walk: the usual case costs no copy
                return obj
            out = copy.deepcopy(obj)  # stored objects are shared (watch cache): never mutated
            apply_defaults(out, schema)
            return out

        info = KindInfo(
            group=group, version=str(ver.get("name")), kind=str(names.get("kind") or ""),
            plural=str(names.get("plural") or ""), singular=str(names.get("singular") or ""),
            namespaced=namespaced, short_names=_strs(names.get("shortNames")),
            categories=_strs(names.get("categories")), verbs=ALL_VERBS, subresources=subresources,
            columns_override=columns.table_columns(_dicts(ver.get("additionalPrinterColumns"))),
            default=default, validate=_validator(schema, namespaced), scale=scale,
            patch_schema={}, strategic_merge=False,
            # Without the status subresource a status change is a spec change (kube bumps generation).
            non_spec_fields=("metadata", "status") if "status" in subresources else ("metadata",),
            openapi_schema=schema, prune_unknown=prune_unknown,
            read_defaults=read_defaults if has_defaults(schema) else None,
            storage_version=storage if storage != ver.get("name") else None,
            list_kind_name=str(names.get("listKind") or "") or None,
        )
        out.append(info)
    return out
