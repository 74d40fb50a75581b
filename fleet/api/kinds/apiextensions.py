"""`apiextensions.k8s.io/v1` CustomResourceDefinition: the kind, its defaults and validation.

What apiextensions-apiserver's strategy does to a CRD write, as pure functions:

- `default_crd`: SetDefaults_CustomResourceDefinition(Spec) — `names.singular` (the
  lower-cased kind), `names.listKind` (`<Kind>List`), `conversion.strategy: None`, a
  webhook service's port 443.
- `validate_crd`: ValidateCustomResourceDefinition(Update) in kube's words and field
  paths — the name `<plural>.<group>`, group, scope, names, versions (unique names,
  exactly one storage version, schemas required), every version's schema through
  `fleet.api.crd.schema_violations` (structural rules, defaults, CEL compile and cost),
  printer columns, the scale subresource's JSON paths, conversion, storedVersions —
  ALL violations at once, so one 422 lists them.

The controller that accepts names and serves the kinds is fleet/server/crd_controller.py;
the per-version KindInfo of the custom resources is fleet/api/crd/resource.py.
"""

from __future__ import annotations

from typing import Any

from fleet.api import crd as crdlib
from fleet.api import validation as v
from fleet.api.kinds._common import d, dicts, lst, set_default
from fleet.api.kinds.core import is_dns1035_label
from fleet.api.registry import NAME_COLUMN, Column, KindInfo

Cause = dict[str, str]

GROUP = "apiextensions.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
PRINTER_COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
PRINTER_COLUMN_FORMATS = ("byte", "date", "date-time", "double", "float", "int32", "int64", "password")
SCOPES = ("Cluster", "Namespaced")
CONVERSION_STRATEGIES = ("None", "Webhook")
REVIEW_VERSIONS = ("v1", "v1beta1")
# With the status subresource, kube allows only these keywords at the root of a schema
# (allowedAtRootSchema, Go field names in its message, JSON names here).
ALLOWED_AT_ROOT = {
    "description": "Description", "type": "Type", "format": "Format", "title": "Title", "maximum": "Maximum",
    "exclusiveMaximum": "ExclusiveMaximum", "minimum": "Minimum", "exclusiveMinimum": "ExclusiveMinimum",
    "maxLength": "MaxLength", "minLength": "MinLength", "pattern": "Pattern", "maxItems": "MaxItems",
    "minItems": "MinItems", "uniqueItems": "UniqueItems", "multipleOf": "MultipleOf", "required": "Required",
    "items": "Items", "properties": "Properties", "externalDocs": "ExternalDocs", "example": "Example",
    "x-kubernetes-preserve-unknown-fields": "XPreserveUnknownFields",
    "x-kubernetes-validations": "XValidations",
}


def default_crd(obj: dict[str, Any]) -> None:
    """SetDefaults_CustomResourceDefinitionSpec (apiextensions/v1/defaults.go)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    names = spec.get("names")
    if isinstance(names, dict) and isinstance(names.get("kind"), str):
        if not names.get("singular"):
            names["singular"] = names["kind"].lower()
        if not names.get("listKind"):
            names["listKind"] = names["kind"] + "List"
    conv = spec.get("conversion")
    if conv is None:
        spec["conversion"] = conv = {}
    if isinstance(conv, dict):
        set_default(conv, "strategy", "None")
        svc = d(conv, "webhook", "clientConfig").get("service")
        if isinstance(svc, dict):
            set_default(svc, "port", 443)
    obj.setdefault("status", {})
    st = obj["status"]
    if isinstance(st, dict):
        st.setdefault("acceptedNames", {"kind": "", "plural": ""})
        st.setdefault("storedVersions", [])


def _dns1035(path: str, value: Any, prefix: str = "") -> list[Cause]:
    if not isinstance(value, str) or not value:
        return []
    errs = is_dns1035_label(value.lower() if prefix else value)
    return [v.invalid(path, value, prefix + ",".join(errs))] if errs else []


def _names(names: dict[str, Any], path: str) -> list[Cause]:
    """ValidateCustomResourceDefinitionNames."""
    out: list[Cause] = []
    out += _dns1035(f"{path}.plural", names.get("plural"))
    out += _dns1035(f"{path}.singular", names.get("singular"))
    mixed = "may have mixed case, but should otherwise match: "
    out += _dns1035(f"{path}.kind", names.get("kind"), mixed)
    out += _dns1035(f"{path}.listKind", names.get("listKind"), mixed)
    for i, s in enumerate(lst(names, "shortNames")):
        out += _dns1035(f"{path}.shortNames[{i}]", s)
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        out.append(v.invalid(f"{path}.listKind", names.get("listKind"), "kind and listKind may not be the same"))
    for i, c in enumerate(lst(names, "categories")):
        out += _dns1035(f"{path}.categories[{i}]", c)
    return out


def simple_json_path(s: Any, path: str) -> list[Cause]:
    """validateSimpleJSONPath."""
    if not isinstance(s, str) or not s:
        return [v.invalid(path, s if isinstance(s, str) else "", "must be non-empty")]
    if s[0] != ".":
        return [v.invalid(path, s, "must be a simple json path starting with .")]
    return []


def _columns(cols: list[Any], path: str) -> list[Cause]:
    """ValidateCustomResourceColumnDefinition for each column."""
    out: list[Cause] = []
    for i, c in enumerate(cols):
        p = f"{path}[{i}]"
        if not isinstance(c, dict):
            out.append(v.type_invalid(p, c, "object"))
            continue
        if not c.get("name"):
            out.append(v.required(f"{p}.name"))
        typ = c.get("type")
        if not typ:
            out.append(v.required(f"{p}.type", "must be one of " + ",".join(PRINTER_COLUMN_TYPES)))
        elif typ not in PRINTER_COLUMN_TYPES:
            out.append(v.not_supported(f"{p}.type", typ, PRINTER_COLUMN_TYPES))
        fmt = c.get("format")
        if fmt and fmt not in PRINTER_COLUMN_FORMATS:
            out.append(v.not_supported(f"{p}.format", fmt, PRINTER_COLUMN_FORMATS))
        jp = c.get("jsonPath")
        if not jp:
            out.append(v.required(f"{p}.JSONPath"))
        else:
            out += simple_json_path(jp, f"{p}.JSONPath")
    return out


def _scale(scale: dict[str, Any], path: str) -> list[Cause]:
    """ValidateCustomResourceDefinitionSubresources' scale part."""
    out: list[Cause] = []
    for field, under in (("specReplicasPath", ".spec"), ("statusReplicasPath", ".status")):
        p = scale.get(field)
        if not p:
            out.append(v.required(f"{path}.{field}"))
            continue
        errs = simple_json_path(p, f"{path}.{field}")
        if errs:
            out += errs
        elif not p.startswith(under + "."):
            out.append(v.invalid(f"{path}.{field}", p, f"should be a json path under {under}"))
    sel = scale.get("labelSelectorPath")
    if sel:
        errs = simple_json_path(sel, f"{path}.labelSelectorPath")
        if errs:
            out += errs
        elif not (sel.startswith(".spec.") or sel.startswith(".status.")):
            out.append(v.invalid(f"{path}.labelSelectorPath", sel,
                                 "should be a json path under either .spec or .status"))
    return out


def _conversion(conv: Any, path: str) -> list[Cause]:
    if not isinstance(conv, dict):
        return []
    out: list[Cause] = []
    strategy = conv.get("strategy")
    if not strategy:
        out.append(v.required(f"{path}.strategy"))
    elif strategy not in CONVERSION_STRATEGIES:
        out.append(v.not_supported(f"{path}.strategy", strategy, CONVERSION_STRATEGIES))
    webhook = conv.get("webhook")
    if strategy == "None" and webhook is not None:
        out.append(v.forbidden(f"{path}.webhook", "should not be set when strategy is not set to Webhook"))
    if strategy == "Webhook":
        if not isinstance(webhook, dict) or not isinstance(webhook.get("clientConfig"), dict):
            out.append(v.required(f"{path}.webhook", "required when strategy is set to Webhook"))
        else:
            cc = webhook["clientConfig"]
            url, svc = cc.get("url"), cc.get("service")
            if url is None and svc is None:
                out.append(v.required(f"{path}.webhook.clientConfig", "exactly one of url or service is required"))
            elif url is not None and svc is not None:
                out.append(v.required(f"{path}.webhook.clientConfig", "exactly one of url or service is required"))
            elif isinstance(url, str) and not url.startswith("https://"):
                out.append(v.invalid(f"{path}.webhook.clientConfig.url", url, "'https' is the only allowed URL scheme"))
            elif isinstance(svc, dict):
                if not svc.get("namespace"):
                    out.append(v.required(f"{path}.webhook.clientConfig.service.namespace",
                                          "service namespace is required"))
                if not svc.get("name"):
                    out.append(v.required(f"{path}.webhook.clientConfig.service.name", "service name is required"))
            reviews = lst(webhook, "conversionReviewVersions")
            if not any(r in REVIEW_VERSIONS for r in reviews):
                out.append(v.invalid(f"{path}.webhook.conversionReviewVersions", reviews,
                                     "must include at least one of v1, v1beta1"))
    return out


def _version(ver: dict[str, Any], i: int) -> list[Cause]:
    p = f"spec.versions[{i}]"
    out: list[Cause] = []
    if not ver.get("name"):
        out.append(v.required(f"{p}.name"))
    else:
        out += _dns1035(f"{p}.name", ver["name"])
    schema = d(ver, "schema").get("openAPIV3Schema")
    sp = f"{p}.schema.openAPIV3Schema"
    if schema is None:
        out.append(v.required(sp, "schemas are required"))
    else:
        out += crdlib.schema_violations(schema, sp)
        if isinstance(schema, dict) and "status" in d(ver, "subresources"):
            if any(k not in ALLOWED_AT_ROOT for k in schema):
                out.append(v.invalid(sp, "object", f"only [{' '.join(ALLOWED_AT_ROOT.values())}] fields are "
                                                   "allowed at the root of the schema if the status subresource "
                                                   "is enabled"))
    subs = d(ver, "subresources")
    if isinstance(subs.get("scale"), dict):
        out += _scale(subs["scale"], f"{p}.subresources.scale")
    out += _columns(lst(ver, "additionalPrinterColumns"), f"{p}.additionalPrinterColumns")
    if ver.get("deprecationWarning") is not None and not ver.get("deprecated"):
        out.append(v.invalid(f"{p}.deprecationWarning", ver["deprecationWarning"],
                             "can only be set for deprecated versions"))
    return out


def validate_crd(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """ValidateCustomResourceDefinition (and its Update form): every violation."""
    spec = d(obj, "spec")
    names = d(spec, "names")
    group = spec.get("group") if isinstance(spec.get("group"), str) else ""
    required_name = f"{names.get('plural') or ''}.{group}"

    def name_ok(name: str) -> list[str]:
        out = v.is_dns1123_subdomain(name)
        if name != required_name:
            out.append('must be spec.names.plural+"."+spec.group')
        return out

    out = v.validate_object_meta(obj.get("metadata"), namespaced=False, name_validator=name_ok)
    if not isinstance(obj.get("spec"), dict):
        out.append(v.required("spec"))
        return out
    if not group:
        out.append(v.required("spec.group"))
    else:
        errs = v.is_dns1123_subdomain(group)
        if errs:
            out.append(v.invalid("spec.group", group, ",".join(errs)))
        elif len(group.split(".")) < 2:
            out.append(v.invalid("spec.group", group, "should be a domain with at least one dot"))
    scope = spec.get("scope")
    if not scope:
        out.append(v.required("spec.scope"))
    elif scope not in SCOPES:
        out.append(v.not_supported("spec.scope", scope, SCOPES))
    for f in ("plural", "singular", "kind", "listKind"):
        if not names.get(f):
            out.append(v.required(f"spec.names.{f}"))
    out += _names(names, "spec.names")
    versions = lst(spec, "versions")
    if not versions:
        out.append(v.invalid("spec.versions", versions, "must have exactly one version marked as storage version"))
    seen: set[Any] = set()
    unique = True
    storage = 0
    for i, ver in enumerate(versions):
        if not isinstance(ver, dict):
            out.append(v.type_invalid(f"spec.versions[{i}]", ver, "object"))
            continue
        if ver.get("storage") is True:
            storage += 1
        if ver.get("name") in seen:
            unique = False
        seen.add(ver.get("name"))
        out += _version(ver, i)
    if versions and not unique:
        out.append(v.invalid("spec.versions", versions, "must contain unique version names"))
    if versions and storage != 1:
        out.append(v.invalid("spec.versions", versions, "must have exactly one version marked as storage version"))
    if versions and not any(isinstance(x, dict) and x.get("served") for x in versions):
        out.append(v.invalid("spec.versions", versions, "must have at least one version marked as served"))
    out += _conversion(spec.get("conversion"), "spec.conversion")
    if spec.get("preserveUnknownFields") is True:
        out.append(v.invalid("spec.preserveUnknownFields", True,
                             "must be false in order to use defaults in the schema"))
    if old is not None:
        out += _update(obj, old)
    out += _stored_versions(obj)
    return out


def _update(obj: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    for f in ("group", "scope"):
        new_v, old_v = d(obj, "spec").get(f), d(old, "spec").get(f)
        if new_v != old_v and old_v is not None and d(old, "status").get("storedVersions"):
            out.append(v.invalid(f"spec.{f}", new_v, "field is immutable"))
    return out


def _stored_versions(obj: dict[str, Any]) -> list[Cause]:
    names = {x.get("name") for x in dicts(lst(obj, "spec", "versions"))}
    out: list[Cause] = []
    for i, sv in enumerate(lst(obj, "status", "storedVersions")):
        if sv not in names:
            out.append(v.invalid(f"status.storedVersions[{i}]", sv, "must appear in spec.versions"))
    return out


def storage_version(crd: dict[str, Any]) -> str | None:
    for ver in dicts(lst(crd, "spec", "versions")):
        if ver.get("storage") is True:
            return ver.get("name")
    return None


def keep_status_on_update(new: dict[str, Any], old: dict[str, Any]) -> None:
    """PrepareForUpdate: a main-resource write keeps the stored status (done generically);
    the stored version joins `status.storedVersions` as kube's strategy does."""
    _add_stored_version(new)


def _add_stored_version(obj: dict[str, Any]) -> None:
    sv = storage_version(obj)
    st = obj.get("status")
    if sv is None or not isinstance(st, dict):
        return
    stored = st.get("storedVersions")
    if not isinstance(stored, list):
        st["storedVersions"] = stored = []
    if sv not in stored:
        stored.append(sv)


CREATED_AT_COLUMN = Column("Created At", lambda o: d(o, "metadata").get("creationTimestamp") or "",
                           type="date",
                           description="CreationTimestamp is a timestamp representing the server time when "
                                       "this object was created.")

CUSTOM_RESOURCE_DEFINITION = KindInfo(
    group=GROUP, version=VERSION, kind="CustomResourceDefinition", plural="customresourcedefinitions",
    singular="customresourcedefinition", namespaced=False, short_names=("crd", "crds"),
    categories=("api-extensions",), subresources=("status",),
    columns_override=(NAME_COLUMN, CREATED_AT_COLUMN),
    default=default_crd, validate=validate_crd,
    prepare_create=lambda obj, _user: _add_stored_version(obj), prepare_update=keep_status_on_update,
    patch_schema={},  # no patch-merge keys in apiextensions' types: lists replace
)

KINDS = (CUSTOM_RESOURCE_DEFINITION,)

__all__ = ["API_VERSION", "CUSTOM_RESOURCE_DEFINITION", "FINALIZER", "GROUP", "KINDS", "default_crd",
           "simple_json_path", "storage_version", "validate_crd"]
