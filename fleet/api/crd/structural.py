"""Is a CRD's openAPIV3Schema acceptable?  Kubernetes' structural-schema rules.

kube-apiserver refuses a CustomResourceDefinition whose schema is not
*structural* (apiextensions-apiserver `pkg/apiserver/schema/validation.go`
ValidateStructural and `complete.go`) or breaks the CRD schema rules of
`pkg/apis/apiextensions/validation` (ValidateCustomResourceDefinitionOpenAPISchema:
unsupported JSON-Schema keywords, list and map types, list-map keys,
x-kubernetes-validations' static checks) or carries defaults that do not
validate or are not pruned (`schema/defaulting/validation.go`).  This module
answers with the same causes, field paths and words, over the schema as JSON
(no typed model: the schema is untrusted input).

`structural_violations(schema, path)` is the whole static check except the CEL
rules (rules.py compiles those and estimates their cost).  `path` is where the
schema sits in the CRD: `spec.versions[0].schema.openAPIV3Schema` for v1 CRDs.

Ordering follows kube where kube is deterministic: the structural errors are
sorted by their text (kube sorts them, its maps iterate randomly); the other
checks walk properties in sorted order.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import re2

from fleet.api.crd._util import SCHEMA_TYPES, child, index, is_true, key, properties, schema_dict
from fleet.api.validation import Cause, forbidden, invalid, not_supported, required

ROOT, ITEM, FIELD = 0, 1, 2
META_FIELDS = ("apiVersion", "kind", "metadata")
VALIDATION_REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
JUNCTORS = ("allOf", "anyOf", "oneOf")
_INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]


def _message(c: Cause) -> str:
    return f"{c['field']}: {c['message']}"


def structural_violations(schema: Any, path: str = "spec.validation.openAPIV3Schema") -> list[Cause]:
    """Every reason kube-apiserver would refuse this openAPIV3Schema (CEL rules aside)."""
    if not isinstance(schema, dict):
        return [required(path, "")] if schema is None else [invalid(path, schema, "must be an object")]
    out: list[Cause] = []
    if schema.get("nullable") is True:
        out.append(forbidden(child(path, "nullable"), "nullable cannot be true at the root"))
    structural = _invariants(schema, ROOT, path) + _completeness(schema, path)
    structural.sort(key=_message)
    out.extend(structural)
    if not structural:
        out.extend(default_violations(schema, path))
    out.extend(_openapi(schema, path, _Ctx(), is_root=True))
    return out


# --------------------------------------------------------------------------- structural invariants


def _invariants(s: dict[str, Any] | None, lvl: int, path: str) -> list[Cause]:
    if s is None:
        return []
    out: list[Cause] = []
    typ = s.get("type") if isinstance(s.get("type"), str) else ""
    items = schema_dict(s.get("items"))
    if typ == "array" and s.get("items") is None:
        out.append(required(child(path, "items"), "must be specified"))
    out.extend(_invariants(items, ITEM, child(path, "items")))
    for k, v in sorted(properties(s).items()):
        if isinstance(v, dict):
            out.extend(_invariants(v, FIELD, key(child(path, "properties"), k)))
    addl = s.get("additionalProperties")
    if addl is not None:
        if lvl == ROOT:
            out.append(forbidden(child(path, "additionalProperties"), "must not be used at the root"))
        if isinstance(addl, dict):
            out.extend(_invariants(addl, FIELD, child(path, "additionalProperties")))
    ios = is_true(s, "x-kubernetes-int-or-string")
    preserve = is_true(s, "x-kubernetes-preserve-unknown-fields")
    embedded = is_true(s, "x-kubernetes-embedded-resource")
    if ios and preserve:
        out.append(invalid(child(path, "x-kubernetes-preserve-unknown-fields"), True,
                           "must be false if x-kubernetes-int-or-string is true"))
    if ios and embedded:
        out.append(invalid(child(path, "x-kubernetes-embedded-resource"), True,
                           "must be false if x-kubernetes-int-or-string is true"))
    out.extend(_value_validation(s, _any_of_pattern(s), _all_of_pattern(s), lvl, path))
    check_meta = lvl == ROOT or embedded
    if embedded and typ != "object":
        if not typ:
            out.append(required(child(path, "type"), "must be object if x-kubernetes-embedded-resource is true"))
        else:
            out.append(invalid(child(path, "type"), typ, "must be object if x-kubernetes-embedded-resource is true"))
    elif not typ and not ios and not preserve:
        detail = {ROOT: "must not be empty at the root", ITEM: "must not be empty for specified array items",
                  FIELD: "must not be empty for specified object fields"}[lvl]
        out.append(required(child(path, "type"), detail))
    if embedded and addl is not None:
        out.append(forbidden(child(path, "additionalProperties"), "must not be used if x-kubernetes-embedded-resource is set"))
    if lvl == ROOT and typ and typ != "object":
        out.append(invalid(child(path, "type"), typ, "must be object at the root"))
    props = properties(s)
    for name in ("kind", "apiVersion"):
        if name in props and check_meta:
            t = (props[name] or {}).get("type", "") if isinstance(props[name], dict) else ""
            if t != "string":
                out.append(invalid(child(key(child(path, "properties"), name), "type"), t, "must be string"))
    if isinstance(props.get("metadata"), dict):
        out.extend(_metadata(props["metadata"], check_meta, lvl, key(child(path, "properties"), "metadata")))
    if embedded and not preserve and not props:
        out.append(required(child(path, "properties"), "must not be empty if x-kubernetes-embedded-resource is true "
                                                       "without x-kubernetes-preserve-unknown-fields"))
    return out


def _metadata(s: dict[str, Any], check_meta: bool, lvl: int, path: str) -> list[Cause]:
    out: list[Cause] = []
    if check_meta and s.get("type", "") != "object":
        out.append(invalid(child(path, "type"), s.get("type", ""), "must be object"))
    if lvl == ROOT:
        # Only name and generateName may be restricted (the default is checked by the openAPI checks).
        rest = {k: v for k, v in s.items() if k not in ("type", "default")}
        props = rest.pop("properties", None)
        if props and not (isinstance(props, dict) and set(props) <= {"name", "generateName"}):
            rest["properties"] = props
        if any(v not in (None, False, "", [], {}) for v in rest.values()):
            out.append(forbidden(path, "must not specify anything other than name and generateName, but metadata "
                                       "is implicitly specified"))
    return out


def _any_of_pattern(s: dict[str, Any]) -> bool:
    return s.get("anyOf") == _INT_OR_STRING_ANY_OF


def _all_of_pattern(s: dict[str, Any]) -> bool:
    all_of = s.get("allOf")
    return (isinstance(all_of, list) and len(all_of) >= 1 and isinstance(all_of[0], dict)
            and all_of[0].get("anyOf") == _INT_OR_STRING_ANY_OF)


def _value_validation(v: dict[str, Any], skip_any_of: bool, skip_first_all_of_any_of: bool, lvl: int,
                      path: str) -> list[Cause]:
    out: list[Cause] = []
    if not skip_any_of:
        for i, n in enumerate(_list(v.get("anyOf"))):
            out.extend(_nested(n, False, lvl, index(child(path, "anyOf"), i)))
    for i, n in enumerate(_list(v.get("allOf"))):
        out.extend(_nested(n, skip_first_all_of_any_of and i == 0, lvl, index(child(path, "allOf"), i)))
    for i, n in enumerate(_list(v.get("oneOf"))):
        out.extend(_nested(n, False, lvl, index(child(path, "oneOf"), i)))
    if isinstance(v.get("not"), dict):
        out.extend(_nested(v["not"], False, lvl, child(path, "not")))
    pattern = v.get("pattern")
    if isinstance(pattern, str) and pattern:
        err = pattern_error(pattern)
        if err:
            out.append(invalid(child(path, "pattern"), pattern, f"must be a valid regular expression, but isn't: {err}"))
    return out


def pattern_error(pattern: str) -> str | None:
    """RE2's complaint about `pattern`, or None when it compiles (kube uses Go's regexp, also RE2)."""
    try:
        re2.compile(pattern)
    except re2.error as e:
        text = e.args[0] if e.args else str(e)
        return text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    return None


def _list(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _present(v: Any) -> bool:
    return v is not None and v is not False and v != "" and v != [] and v != {}


# What a schema under a junctor may not carry (kube's ForbiddenGenerics/ForbiddenExtensions).
_NESTED_FORBIDDEN = (
    ("type", "must be empty to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("externalDocs", "must be undefined to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
    ("x-kubernetes-map-type", "must be undefined to be structural"),
    ("x-kubernetes-validations", "must be empty to be structural"),
)


def _nested(v: dict[str, Any], skip_any_of: bool, lvl: int, path: str) -> list[Cause]:
    """A schema under anyOf/allOf/oneOf/not: value validations only."""
    out = _value_validation(v, skip_any_of, False, lvl, path)
    if isinstance(v.get("items"), dict):
        out.extend(_nested(v["items"], False, lvl, child(path, "items")))
    for k, f in sorted(properties(v).items()):
        if isinstance(f, dict):
            out.extend(_nested(f, False, FIELD, key(child(path, "properties"), k)))
    if v.get("additionalProperties") is not None:
        out.append(forbidden(child(path, "additionalProperties"), "must be undefined to be structural"))
    for name, detail in _NESTED_FORBIDDEN:
        if (v.get(name) is not None) if name == "default" else _present(v.get(name)):
            out.append(forbidden(child(path, name), detail))
    if "metadata" in properties(v):
        out.append(forbidden(key(child(path, "properties"), "metadata"), "must not be specified in a nested context"))
    return out


# --------------------------------------------------------------------------- completeness


def _completeness(s: dict[str, Any], path: str) -> list[Cause]:
    return _vv_complete(s, s, path, path)


def _vv_complete(v: dict[str, Any], s: dict[str, Any] | None, s_path: str, v_path: str) -> list[Cause]:
    if s is None:
        return [required(s_path, f"because it is defined in {v_path}")]
    out: list[Cause] = []
    if isinstance(v.get("not"), dict):
        out.extend(_nested_complete(v["not"], s, s_path, child(v_path, "not")))
    for name in ("allOf", "anyOf", "oneOf"):
        for i, n in enumerate(_list(v.get(name))):
            out.extend(_nested_complete(n, s, s_path, index(child(v_path, name), i)))
    return out


def _nested_complete(v: dict[str, Any], s: dict[str, Any] | None, s_path: str, v_path: str) -> list[Cause]:
    if s is None:
        return [required(s_path, f"because it is defined in {v_path}")]
    out = _vv_complete(v, s, s_path, v_path)
    if isinstance(v.get("items"), dict):
        out.extend(_nested_complete(v["items"], schema_dict(s.get("items")), child(s_path, "items"),
                                    child(v_path, "items")))
    s_props = properties(s)
    for k, f in sorted(properties(v).items()):
        if not isinstance(f, dict):
            continue
        sp, vp = key(child(s_path, "properties"), k), key(child(v_path, "properties"), k)
        if k not in s_props:
            out.append(required(sp, f"because it is defined in {vp}"))
        else:
            out.extend(_nested_complete(f, schema_dict(s_props[k]), sp, vp))
    return out


# --------------------------------------------------------------------------- CRD openAPI schema rules


class _Ctx:
    """What the walk knows about where it is (kube's specStandardValidator)."""

    def __init__(self, defaults: str | None = "", inside_meta: bool = False) -> None:
        self.defaults = defaults  # None: defaults allowed; else the reason they are not ("" = allowed)
        self.inside_meta = inside_meta

    def forbid_defaults(self, reason: str) -> _Ctx:
        return _Ctx(reason, self.inside_meta)

    def meta(self) -> _Ctx:
        return _Ctx(self.defaults, True)


def _standard(s: dict[str, Any], path: str, ctx: _Ctx) -> list[Cause]:
    out: list[Cause] = []
    typ = s.get("type")
    if typ is not None and not isinstance(typ, str):
        out.append(invalid(child(path, "type"), typ, "must be a string"))  # kube: a decoding error
    if isinstance(typ, str) and typ and typ not in SCHEMA_TYPES:  # "null" too: nullable is the way
        out.append(not_supported(child(path, "type"), typ, SCHEMA_TYPES))
    if "default" in s and s["default"] is not None and ctx.defaults:
        out.append(forbidden(child(path, "default"), "must not be set " + ctx.defaults))
    for name, what in (("id", "id"), ("additionalItems", "additionalItems"), ("patternProperties", "patternProperties"),
                       ("definitions", "definitions"), ("dependencies", "dependencies"), ("$ref", "$ref")):
        if s.get(name) not in (None, "", {}, []):
            out.append(forbidden(child(path, name), f"{what} is not supported"))
    if typ == "null":
        out.append(forbidden(child(path, "type"), "type cannot be set to null, use nullable as an alternative"))
    if isinstance(s.get("items"), list):
        out.append(forbidden(child(path, "items"), "items must be a schema object and not an array"))
    if ctx.inside_meta and is_true(s, "x-kubernetes-embedded-resource"):
        out.append(forbidden(child(path, "x-kubernetes-embedded-resource"), "must not be used inside of resource meta"))
    return out


def _openapi(s: dict[str, Any], path: str, ctx: _Ctx, *, is_root: bool = False) -> list[Cause]:
    out = _standard(s, path, ctx)
    if s.get("uniqueItems") is True:
        out.append(forbidden(child(path, "uniqueItems"),
                             "uniqueItems cannot be set to true since the runtime complexity becomes quadratic"))
    addl = s.get("additionalProperties")
    if addl is not None:
        if properties(s) and (addl is False or isinstance(addl, dict)):
            out.append(forbidden(child(path, "additionalProperties"), "additionalProperties and properties are mutual exclusive"))
        if isinstance(addl, dict):
            sub = ctx.forbid_defaults("inside additionalProperties applying to object metadata") if ctx.inside_meta else ctx
            out.extend(_openapi(addl, child(path, "additionalProperties"), sub))
    embedded = is_true(s, "x-kubernetes-embedded-resource")
    for k, v in sorted(properties(s).items()):
        if not isinstance(v, dict):
            continue
        sub = ctx
        if (is_root or embedded) and k in META_FIELDS:
            sub = sub.meta()
            if is_root:
                sub = sub.forbid_defaults(f"in top-level {k}")
        out.extend(_openapi(v, key(child(path, "properties"), k), sub))
    if isinstance(s.get("not"), dict):
        out.extend(_openapi(s["not"], child(path, "not"), ctx))
    for name in ("allOf", "oneOf", "anyOf"):
        for i, n in enumerate(_list(s.get(name))):
            out.extend(_openapi(n, index(child(path, name), i), ctx))
    if isinstance(s.get("items"), dict):
        out.extend(_openapi(s["items"], child(path, "items"), ctx))
    out.extend(_list_and_map_types(s, path))
    out.extend(_rule_fields(s, path))
    return out


def _list_and_map_types(s: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    typ = s.get("type") if isinstance(s.get("type"), str) else ""
    if s.get("x-kubernetes-preserve-unknown-fields") is False:
        out.append(invalid(child(path, "x-kubernetes-preserve-unknown-fields"), False, "must be true or undefined"))
    map_type = s.get("x-kubernetes-map-type")
    if map_type is not None:
        if typ != "object":
            if not typ:
                out.append(required(child(path, "type"), "must be object if x-kubernetes-map-type is specified"))
            else:
                out.append(invalid(child(path, "type"), typ, "must be object if x-kubernetes-map-type is specified"))
        if map_type not in ("atomic", "granular"):
            out.append(not_supported(child(path, "x-kubernetes-map-type"), map_type, ("atomic", "granular")))
    list_type = s.get("x-kubernetes-list-type")
    items = schema_dict(s.get("items"))
    if list_type is not None and typ != "array":
        if not typ:
            out.append(required(child(path, "type"), "must be array if x-kubernetes-list-type is specified"))
        else:
            out.append(invalid(child(path, "type"), typ, "must be array if x-kubernetes-list-type is specified"))
    elif list_type == "set" and items is not None:
        if items.get("type") == "array":
            if items.get("x-kubernetes-list-type") not in (None, "atomic"):
                out.append(invalid(child(child(path, "items"), "x-kubernetes-list-type"), items["x-kubernetes-list-type"],
                                   "must be atomic as item of a list with x-kubernetes-list-type=set"))
        elif items.get("type") == "object" and items.get("x-kubernetes-map-type") != "atomic":
            # kube shows the item's list type here (a nil pointer prints "null" in 1.32)
            shown = items.get("x-kubernetes-list-type")
            out.append(invalid(child(child(path, "items"), "x-kubernetes-map-type"), "null" if shown is None else shown,
                               "must be atomic as item of a list with x-kubernetes-list-type=set"))
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        out.append(not_supported(child(path, "x-kubernetes-list-type"), list_type, ("atomic", "set", "map")))
    raw_keys = s.get("x-kubernetes-list-map-keys")
    raw_keys = raw_keys if isinstance(raw_keys, list) else []
    # Keys that are not strings cannot name properties (kube would not decode them at all).
    keys = [k if isinstance(k, str) else json.dumps(k) for k in raw_keys]
    if keys:
        if list_type is None:
            out.append(required(child(path, "x-kubernetes-list-type"), "must be map if x-kubernetes-list-map-keys is non-empty"))
        elif list_type != "map":
            out.append(invalid(child(path, "x-kubernetes-list-type"), list_type,
                               "must be map if x-kubernetes-list-map-keys is non-empty"))
    if list_type == "map":
        if not keys:
            out.append(required(child(path, "x-kubernetes-list-map-keys"), "must not be empty if x-kubernetes-list-type is map"))
        if s.get("items") is None:
            out.append(required(child(path, "items"), "must have a schema if x-kubernetes-list-type is map"))
        if items is not None and items.get("type", "") != "object":
            out.append(invalid(child(child(path, "items"), "type"), items.get("type", ""),
                               "must be object if parent array's x-kubernetes-list-type is map"))
        if items is not None and items.get("type") == "object":
            item_props = properties(items)
            seen: set[str] = set()
            for k in keys:
                if k in item_props:
                    if isinstance(item_props[k], dict) and item_props[k].get("type") in ("array", "object"):
                        out.append(invalid(child(key(child(child(path, "items"), "properties"), str(k)), "type"),
                                           items.get("type"), "must be a scalar type if parent array's "
                                                              "x-kubernetes-list-type is map"))
                else:
                    out.append(invalid(child(path, "x-kubernetes-list-map-keys"), raw_keys,
                                       "entries must all be names of item properties"))
                if k in seen:
                    out.append(invalid(child(path, "x-kubernetes-list-map-keys"), raw_keys,
                                       "must not contain duplicate entries"))
                seen.add(k)
    out.extend(_map_set_keys(s, path, list_type, items, keys))
    return out


def _map_set_keys(s: dict[str, Any], path: str, list_type: Any, items: dict[str, Any] | None,
                  keys: list[Any]) -> list[Cause]:
    """Items of sets and maps are never null; map keys are required or defaulted, never null."""
    if items is None or list_type not in ("set", "map"):
        return []
    out: list[Cause] = []
    ipath = child(path, "items")
    if items.get("nullable") is True:
        out.append(forbidden(child(ipath, "nullable"), f"cannot be nullable when x-kubernetes-list-type is {list_type}"))
    if list_type == "map":
        req = {r for r in items["required"] if isinstance(r, str)} if isinstance(items.get("required"), list) else set()
        item_props = properties(items)
        for k in keys:
            prop = item_props.get(k)
            if not isinstance(prop, dict):
                continue
            kpath = key(child(ipath, "properties"), str(k))
            if k not in req and prop.get("default") is None:
                out.append(required(child(kpath, "default"), "this property is in x-kubernetes-list-map-keys, so it "
                                                             "must have a default or be a required property"))
            if prop.get("nullable") is True:
                out.append(forbidden(child(kpath, "nullable"), "this property is in x-kubernetes-list-map-keys, so it "
                                                               "cannot be nullable"))
    return out


def _rule_fields(s: dict[str, Any], path: str) -> list[Cause]:
    """x-kubernetes-validations' static checks (compiling the rules is rules.py's job)."""
    out: list[Cause] = []
    rules = s.get("x-kubernetes-validations")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        if not isinstance(rule, dict):
            continue
        rp = index(child(path, "x-kubernetes-validations"), i)
        text = rule.get("rule") if isinstance(rule.get("rule"), str) else ""
        msg = rule.get("message") if isinstance(rule.get("message"), str) else ""
        mexpr = rule.get("messageExpression") if isinstance(rule.get("messageExpression"), str) else ""
        if not text.strip():
            out.append(required(child(rp, "rule"), "rule is not specified"))
        elif msg and not msg.strip():
            out.append(invalid(child(rp, "message"), msg, "message must be non-empty if specified"))
        elif _newlines(msg.strip()):
            out.append(invalid(child(rp, "message"), msg, "message must not contain line breaks"))
        elif _newlines(text.strip()) and not msg.strip():
            out.append(required(child(rp, "message"), "message must be specified if rule contains line breaks"))
        if mexpr and not mexpr.strip():
            out.append(required(child(rp, "messageExpression"), "messageExpression must be non-empty if specified"))
        reason = rule.get("reason")
        if reason is not None and reason not in VALIDATION_REASONS:
            out.append(not_supported(child(rp, "reason"), reason, VALIDATION_REASONS))
        fp = rule.get("fieldPath") if isinstance(rule.get("fieldPath"), str) else ""
        if fp and not fp.strip():
            out.append(invalid(child(rp, "fieldPath"), fp, "fieldPath must be non-empty if specified"))
        if _newlines(fp):
            out.append(invalid(child(rp, "fieldPath"), fp, "fieldPath must not contain line breaks"))
        if fp and fp.strip() and resolve_field_path(fp, s) is None:
            out.append(invalid(child(rp, "fieldPath"), fp, "fieldPath must be a valid path"))
    return out


def _newlines(text: str) -> bool:
    return "\n" in text or "\r" in text


def resolve_field_path(json_path: str, schema: dict[str, Any]) -> str | None:
    """A rule's `fieldPath` (`.spec.x`, `.m['key']`) checked against `schema`: the field path it names
    relative to the rule's node (`spec.x`, `m[key]`), or None when it names no field."""
    out = ""
    s: dict[str, Any] | None = schema
    i, n = 0, len(json_path)
    while i < n:
        if s is None:
            return None
        c = json_path[i]
        if c == ".":
            j = i + 1
            while j < n and json_path[j] not in ".[":
                j += 1
            name = json_path[i + 1:j]
            if not name or name not in properties(s):
                return None
            out, s, i = child(out, name), schema_dict(properties(s)[name]), j
        elif c == "[":
            end = json_path.find("']", i)
            if not json_path.startswith("['", i) or end < 0:
                return None
            name = json_path[i + 2:end].replace("\\'", "'").replace("\\\\", "\\")
            if properties(s):
                if name not in properties(s):
                    return None
                out, s = child(out, name), schema_dict(properties(s)[name])
            elif s.get("additionalProperties") is not None:
                out, s = key(out, name), schema_dict(s.get("additionalProperties"))
            else:
                return None
            i = end + 2
        else:
            return None
    return out


# --------------------------------------------------------------------------- defaults


def default_violations(schema: dict[str, Any], path: str) -> list[Cause]:
    """Every `default` must validate against its schema and survive pruning unchanged
    (kube's ValidateDefaults).  Not followed into additionalProperties (defaults are
    forbidden there under metadata, and kube does not look there)."""
    root = dict(schema)
    root["x-kubernetes-embedded-resource"] = True  # the resource root is validated as an embedded resource
    return _defaults(root, path, inside_meta=False)


def _defaults(s: dict[str, Any], path: str, *, inside_meta: bool) -> list[Cause]:
    from fleet.api.crd.objectmeta import validate_embedded
    from fleet.api.crd.prune import prune
    from fleet.api.crd.rules import validate_rules
    from fleet.api.crd.validate import validate

    out: list[Cause] = []
    embedded = is_true(s, "x-kubernetes-embedded-resource")
    if embedded:
        inside_meta = False
    if "default" in s and s["default"] is not None:
        dpath = child(path, "default")
        value = s["default"]
        if not inside_meta:
            pruned = copy.deepcopy(value)
            prune(pruned, s, is_resource_root=embedded)
            if pruned != value:
                out.append(invalid(dpath, value, "must not have unknown fields"))
            errs = validate_embedded(value, s, dpath) if embedded and isinstance(value, dict) else []
        else:
            errs = []
        errs = errs or validate(value, s, dpath)
        if not errs:
            # kube runs the CEL rules over defaults too (uncompilable rules are reported by rules.py)
            errs = [c for c in validate_rules(value, s, None, dpath) if "rule compile error" not in c["message"]]
        out.extend(errs)
    if isinstance(s.get("items"), dict):
        out.extend(_defaults(s["items"], child(path, "items"), inside_meta=inside_meta))
    for k, v in sorted(properties(s).items()):
        if isinstance(v, dict):
            sub_meta = inside_meta or (embedded and k in META_FIELDS)
            out.extend(_defaults(v, key(child(path, "properties"), k), inside_meta=sub_meta))
    return out
