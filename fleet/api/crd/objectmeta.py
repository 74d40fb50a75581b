"""TypeMeta and ObjectMeta inside custom resources (kube's pkg/apiserver/schema/objectmeta).

The root's metadata is the API server's ordinary object metadata (validated by
`fleet.api.validation.validate_object_meta`, restricted further only by the schema's
`metadata.name`/`generateName` rules, which `validate` checks).  Every
`x-kubernetes-embedded-resource` below the root is a resource of its own and must carry
a non-empty `apiVersion` and `kind` and, when present, valid metadata:

- `spec.template.apiVersion: Required value: must not be empty`
- `spec.template.kind: Invalid value: "a b": may have mixed case, but should otherwise match: ...`
- `spec.template.metadata.name: Invalid value: "a/b": may not contain '/'`
"""

from __future__ import annotations

from typing import Any

from fleet.api.crd._util import child, index, is_true, properties, schema_dict
from fleet.api.validation import Cause, invalid, required, type_invalid, validate_object_meta

_DNS1035_LABEL = r"[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1035_ERR = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
                f"regex used for validation is '{_DNS1035_LABEL}')")


def path_segment_name(name: str) -> list[str]:
    """apimachinery's path.IsValidPathSegmentName: what a name may not be to sit in a URL path."""
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def _is_dns1035(value: str) -> list[str]:
    import re

    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not re.fullmatch(_DNS1035_LABEL, value):
        errs.append(_DNS1035_ERR)
    return errs


def _group_version_error(api_version: str) -> str | None:
    parts = api_version.split("/")
    if len(parts) > 2 or any(not p for p in parts):
        return f"unexpected GroupVersion string: {api_version}"
    return None


def validate_embedded(obj: dict[str, Any], schema: dict[str, Any], path: str) -> list[Cause]:
    """One embedded resource: apiVersion, kind, metadata (kube's validateEmbeddedResource)."""
    out: list[Cause] = []
    if "apiVersion" not in obj:
        out.append(required(child(path, "apiVersion"), "must not be empty"))
    if "kind" not in obj:
        out.append(required(child(path, "kind"), "must not be empty"))
    for k in sorted(obj):
        v = obj[k]
        kp = child(path, k)
        if k == "apiVersion":
            if not isinstance(v, str):
                out.append(invalid(kp, v, "must be a string"))
            elif not v:
                out.append(invalid(kp, v, "must not be empty"))
            elif (err := _group_version_error(v)) is not None:
                out.append(invalid(kp, v, err))
        elif k == "kind":
            if not isinstance(v, str):
                out.append(invalid(kp, v, "must be a string"))
            elif not v:
                out.append(invalid(kp, v, "must not be empty"))
            elif errs := _is_dns1035(v.lower()):
                out.append(invalid(kp, v, "may have mixed case, but should otherwise match: " + ",".join(errs)))
        elif k == "metadata":
            if not isinstance(v, dict):
                out.append(type_invalid(kp, v, "object"))
                continue
            meta = dict(v)
            if not meta.get("name"):
                meta["name"] = "fakename"  # kube: a name is not required here
            out.extend(validate_object_meta(meta, namespaced=bool(meta.get("namespace")),
                                            name_validator=path_segment_name, path=kp))
    return out


def embedded_violations(obj: Any, schema: dict[str, Any] | None, path: str = "") -> list[Cause]:
    """validate_embedded for every embedded resource below the root of a custom resource."""
    out: list[Cause] = []
    _walk(obj, schema, path, out, root=True)
    return out


def _walk(x: Any, s: dict[str, Any] | None, path: str, out: list[Cause], *, root: bool = False) -> None:
    if s is None:
        return
    if isinstance(x, dict):
        if not root and is_true(s, "x-kubernetes-embedded-resource"):
            out.extend(validate_embedded(x, s, path))
        props = properties(s)
        addl = schema_dict(s.get("additionalProperties"))
        for k in sorted(x):
            if root and k == "metadata":
                continue
            sub = schema_dict(props[k]) if k in props else addl
            _walk(x[k], sub, child(path, k), out)
    elif isinstance(x, list):
        items = schema_dict(s.get("items"))
        for i, v in enumerate(x):
            _walk(v, items, index(path, i), out)
