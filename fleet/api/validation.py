"""Shared validators for built-in kinds, worded the way kube-apiserver words them.

Kind modules (`fleet.api.kinds.*`) compose these into `validate(obj, old)`
functions that return a list of Status causes.  What every kind needs lives
here (causes, name and label formats, object metadata, label selectors,
quantities and resources, a few shared enumerations); the pod spec's own
validation (containers, volumes, affinity, tolerations, templates) is
`fleet.api.kinds.pod_validation`, beside the pod kind.  The messages are
apimachinery's (`field.Error.ErrorBody()` plus the `validation.Is*` texts) so
that `kubectl` users see what they would see against Kubernetes, and so that
tooling which matches on those strings keeps working.

Every validator here takes *untrusted* JSON: any field may have the wrong
type.  A wrong type is reported as a cause instead of raising, so one bad
field never hides the others and never becomes a 500.

Field paths use Kubernetes notation: `spec.containers[0].ports[1].containerPort`,
`metadata.labels`, `data[key]`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from fleet.api.errors import cause
from fleet.api.quantity import QUANTITY_ERROR, QuantityError, parse_quantity

Cause = dict[str, str]

# ---------------------------------------------------------------------------
# field.Error equivalents: the cause message is what ErrorBody() renders.
# ---------------------------------------------------------------------------


def go_value(value: Any) -> str:
    """Render a bad value like Go's `%#v` does for the common cases (strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float | Decimal):
        return str(value)
    if value is None:
        return "null"
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def required(path: str, detail: str = "") -> Cause:
    return cause(path, "Required value" + (f": {detail}" if detail else ""), "FieldValueRequired")


def invalid(path: str, value: Any, detail: str) -> Cause:
    return cause(path, f"Invalid value: {go_value(value)}: {detail}", "FieldValueInvalid")


def duplicate(path: str, value: Any) -> Cause:
    return cause(path, f"Duplicate value: {go_value(value)}", "FieldValueDuplicate")


def not_supported(path: str, value: Any, supported: Iterable[str]) -> Cause:
    quoted = ", ".join(json.dumps(s) for s in supported)
    return cause(path, f"Unsupported value: {go_value(value)}: supported values: {quoted}",
                 "FieldValueNotSupported")


def not_found(path: str, value: Any) -> Cause:
    return cause(path, f"Not found: {go_value(value)}", "FieldValueNotFound")


def forbidden(path: str, detail: str) -> Cause:
    return cause(path, f"Forbidden: {detail}", "FieldValueForbidden")


def too_long(path: str, max_bytes: int) -> Cause:
    unit = "byte" if max_bytes == 1 else "bytes"
    return cause(path, f"Too long: may not be more than {max_bytes} {unit}", "FieldValueTooLong")


def too_many(path: str, actual: int, limit: int) -> Cause:
    """field.TooMany: a list longer than its limit."""
    return cause(path, f"Too many: {actual}: must have at most {limit} items", "FieldValueTooMany")


def type_invalid(path: str, value: Any, expected: str) -> Cause:
    """A field of the wrong JSON type (Kubernetes rejects these while decoding)."""
    return invalid(path, value, f"must be of type {expected}")


# ---------------------------------------------------------------------------
# Name and string format checks (apimachinery/pkg/util/validation).  Each
# returns a list of messages, empty when valid.
# ---------------------------------------------------------------------------


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # Mirrors validation.RegexError, including its doubled space before "or".
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    out = msg + " (e.g. "
    for i, ex in enumerate(examples):
        if i > 0:
            out += " or "
        out += f"'{ex}', "
    return out + f"regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_MAX = 63
DNS1123_LABEL_ERR = _regex_error(
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character", DNS1123_LABEL_FMT, "my-name", "123-abc")
_DNS1123_LABEL_RE = re.compile(DNS1123_LABEL_FMT)

DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + r"(\." + DNS1123_LABEL_FMT + ")*"
DNS1123_SUBDOMAIN_MAX = 253
DNS1123_SUBDOMAIN_ERR = _regex_error(
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character", DNS1123_SUBDOMAIN_FMT, "example.com")
_DNS1123_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN_FMT)

QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_MAX = 63
_QUALIFIED_NAME_RE = re.compile(QUALIFIED_NAME_FMT)
_QUALIFIED_NAME_ERR = ("must consist of alphanumeric characters, '-', '_' or '.', and must start "
                       "and end with an alphanumeric character")

LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
LABEL_VALUE_MAX = 63
_LABEL_VALUE_RE = re.compile(LABEL_VALUE_FMT)
LABEL_VALUE_ERR = _regex_error(
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character", LABEL_VALUE_FMT,
    "MyValue", "my_value", "12345")

ENV_VAR_NAME_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"
_ENV_VAR_NAME_RE = re.compile(ENV_VAR_NAME_FMT)
ENV_VAR_NAME_ERR = _regex_error(
    "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', "
    "or '.', and must not start with a digit", ENV_VAR_NAME_FMT,
    "my.env-name", "MY_ENV.NAME", "MyEnvName1")

CONFIG_KEY_FMT = "[-._a-zA-Z0-9]+"
_CONFIG_KEY_RE = re.compile(CONFIG_KEY_FMT)
CONFIG_KEY_ERR = _regex_error(
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
    CONFIG_KEY_FMT, "key.name", "KEY_NAME", "key-name")

_PORT_NAME_CHARS_RE = re.compile("[-a-z0-9]+")
_PORT_NAME_LETTER_RE = re.compile("[a-z]")


def is_dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(max_len_error(DNS1123_LABEL_MAX))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        errs.append(DNS1123_LABEL_ERR)
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errs.append(DNS1123_SUBDOMAIN_ERR)
    return errs


def is_qualified_name(value: str) -> list[str]:
    """Label and annotation keys: `[prefix/]name`, prefix a DNS subdomain."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        errs: list[str] = []
    elif len(parts) == 2:
        prefix, name = parts
        errs = []
        if not prefix:
            errs.append("prefix part " + "must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return ["a qualified name " + _regex_error(_QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT,
                                                   "MyName", "my.name", "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append("name part " + max_len_error(QUALIFIED_NAME_MAX))
    # Also for an empty name: apimachinery reports both problems ("must be
    # non-empty" and the regex), and people paste those messages into searches.
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errs.append("name part " + _regex_error(_QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT,
                                                "MyName", "my.name", "123-abc"))
    return errs


def is_valid_label_value(value: str) -> list[str]:
    errs = []
    if len(value) > LABEL_VALUE_MAX:
        errs.append(max_len_error(LABEL_VALUE_MAX))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errs.append(LABEL_VALUE_ERR)
    return errs


def validate_label_key(key: str) -> str | None:
    """First problem with a label key, or None (same contract as fleet.api.selectors)."""
    errs = is_qualified_name(key) if isinstance(key, str) else ["must be a string"]
    return "; ".join(errs) or None


def validate_label_value(value: str) -> str | None:
    errs = is_valid_label_value(value) if isinstance(value, str) else ["must be a string"]
    return "; ".join(errs) or None


def is_env_var_name(value: str) -> list[str]:
    return [] if _ENV_VAR_NAME_RE.fullmatch(value) else [ENV_VAR_NAME_ERR]


def is_config_map_key(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _CONFIG_KEY_RE.fullmatch(value):
        errs.append(CONFIG_KEY_ERR)
    if value == ".":
        errs.append("must not be '.'")
    elif value == "..":
        errs.append("must not be '..'")
    elif value.startswith(".."):
        errs.append("must not start with '..'")
    return errs


def is_valid_port_num(port: Any) -> list[str]:
    if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
        return []
    return ["must be between 1 and 65535, inclusive"]


def is_valid_port_name(name: str) -> list[str]:
    """IANA_SVC_NAME: <=15 chars of [-a-z0-9], at least one letter, no '--', no edge '-'."""
    errs = []
    if len(name) > 15:
        errs.append(max_len_error(15))
    if not _PORT_NAME_CHARS_RE.fullmatch(name):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in name:
        errs.append("must not contain consecutive hyphens")
    if not _PORT_NAME_LETTER_RE.search(name):
        errs.append("must contain at least one letter (a-z)")
    if name.startswith("-") or name.endswith("-"):
        errs.append("must not begin or end with a hyphen")
    return errs


# ---------------------------------------------------------------------------
# Typed access to untrusted JSON.
# ---------------------------------------------------------------------------


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def nonnegative(obj: dict[str, Any], key: str, path: str, out: list[Cause]) -> None:
    v = obj.get(key)
    if v is None:
        return
    if as_int(v) is None:
        out.append(type_invalid(path, v, "integer"))
    elif v < 0:
        out.append(invalid(path, v, "must be greater than or equal to 0"))


def positive(obj: dict[str, Any], key: str, path: str, out: list[Cause]) -> None:
    v = obj.get(key)
    if v is None:
        return
    if as_int(v) is None:
        out.append(type_invalid(path, v, "integer"))
    elif v <= 0:
        out.append(invalid(path, v, "must be greater than 0"))


def immutable(new: Any, old: Any, path: str) -> list[Cause]:
    """`field is immutable` when a value changed between old and new."""
    if new != old:
        return [invalid(path, new, "field is immutable")]
    return []


# ---------------------------------------------------------------------------
# Object metadata.
# ---------------------------------------------------------------------------

TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024

NameValidator = Callable[[str], list[str]]


def _name_prefix_check(validator: NameValidator, prefix: str) -> list[str]:
    # generateName prefixes may end in '-': apimachinery validates them with the
    # trailing dash masked (replaced by 'a') so "web-" is a good prefix.
    if prefix.endswith("-"):
        prefix = prefix[:-1] + "a"
    return validator(prefix)


def validate_labels(labels: Any, path: str = "metadata.labels") -> list[Cause]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [type_invalid(path, labels, "object")]
    out: list[Cause] = []
    for k, v in labels.items():
        for msg in is_qualified_name(k):
            out.append(invalid(path, k, msg))
        if not isinstance(v, str):
            out.append(type_invalid(path, v, "string"))
            continue
        for msg in is_valid_label_value(v):
            out.append(invalid(path, v, msg))
    return out


def validate_label_name(key: Any, path: str) -> list[Cause]:
    """unversionedvalidation.ValidateLabelName: a qualified name; absent counts as ""."""
    if key is None:
        key = ""
    if not isinstance(key, str):
        return [type_invalid(path, key, "string")]
    return [invalid(path, key, msg) for msg in is_qualified_name(key)]


def validate_annotations(annotations: Any, path: str = "metadata.annotations") -> list[Cause]:
    if annotations is None:
        return []
    if not isinstance(annotations, dict):
        return [type_invalid(path, annotations, "object")]
    out: list[Cause] = []
    total = 0
    for k, v in annotations.items():
        for msg in is_qualified_name(k.lower()):
            out.append(invalid(path, k, msg))
        if not isinstance(v, str):
            out.append(type_invalid(path, v, "string"))
            continue
        total += len(k.encode()) + len(v.encode())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        out.append(too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))
    return out


def validate_object_meta(meta: Any, *, namespaced: bool,
                         name_validator: NameValidator = is_dns1123_subdomain,
                         path: str = "metadata") -> list[Cause]:
    """Name (or generateName), namespace, labels, annotations, finalizers."""
    if not isinstance(meta, dict):
        return [required(path)] if meta is None else [type_invalid(path, meta, "object")]
    out: list[Cause] = []
    name = meta.get("name")
    gen = meta.get("generateName")
    if gen is not None:
        if not isinstance(gen, str):
            out.append(type_invalid(f"{path}.generateName", gen, "string"))
        elif gen:
            for msg in _name_prefix_check(name_validator, gen):
                out.append(invalid(f"{path}.generateName", gen, msg))
    if name is None or name == "":
        if not gen:
            out.append(required(f"{path}.name", "name or generateName is required"))
    elif not isinstance(name, str):
        out.append(type_invalid(f"{path}.name", name, "string"))
    else:
        for msg in name_validator(name):
            out.append(invalid(f"{path}.name", name, msg))
    ns = meta.get("namespace")
    if ns:
        if not namespaced:
            out.append(forbidden(f"{path}.namespace", "not allowed on this type"))
        elif not isinstance(ns, str):
            out.append(type_invalid(f"{path}.namespace", ns, "string"))
        else:
            for msg in is_dns1123_label(ns):
                out.append(invalid(f"{path}.namespace", ns, msg))
    out.extend(validate_labels(meta.get("labels"), f"{path}.labels"))
    out.extend(validate_annotations(meta.get("annotations"), f"{path}.annotations"))
    fins = meta.get("finalizers")
    if fins is not None:
        if not isinstance(fins, list):
            out.append(type_invalid(f"{path}.finalizers", fins, "array"))
        else:
            seen: set[str] = set()
            for i, f in enumerate(fins):
                fp = f"{path}.finalizers[{i}]"
                if not isinstance(f, str):
                    out.append(type_invalid(fp, f, "string"))
                    continue
                for msg in is_qualified_name(f):
                    out.append(invalid(fp, f, msg))
                if f in seen:
                    out.append(duplicate(fp, f))
                seen.add(f)
    return out


# ---------------------------------------------------------------------------
# Label selectors (metav1.LabelSelector): their validation, worded as
# kube-apiserver's.  Matching is fleet.api.selectors' (selector_dict_matches).
# ---------------------------------------------------------------------------

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def validate_label_selector(sel: Any, path: str, *, allow_invalid_values: bool = False) -> list[Cause]:
    """metav1 ValidateLabelSelector; `allow_invalid_values` is its AllowInvalidLabelValueInSelector
    (expression values are not checked: kinds whose stored selectors predate the check use it on update)."""
    if sel is None:
        return []
    if not isinstance(sel, dict):
        return [type_invalid(path, sel, "object")]
    out = validate_labels(sel.get("matchLabels"), f"{path}.matchLabels")
    exprs = sel.get("matchExpressions")
    if exprs is None:
        return out
    if not isinstance(exprs, list):
        return out + [type_invalid(f"{path}.matchExpressions", exprs, "array")]
    for i, expr in enumerate(exprs):
        ep = f"{path}.matchExpressions[{i}]"
        if not isinstance(expr, dict):
            out.append(type_invalid(ep, expr, "object"))
            continue
        op = expr.get("operator")
        values = expr.get("values") or []
        if not isinstance(values, list):
            out.append(type_invalid(f"{ep}.values", values, "array"))
            values = []
        if op in ("In", "NotIn"):
            if not values:
                out.append(required(f"{ep}.values",
                                    "must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist"):
            if values:
                out.append(forbidden(f"{ep}.values",
                                     "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
        else:
            out.append(invalid(f"{ep}.operator", op, "not a valid selector operator"))
        out.extend(validate_label_name(expr.get("key"), f"{ep}.key"))
        for j, v in enumerate(values):
            if not isinstance(v, str):
                out.append(type_invalid(f"{ep}.values[{j}]", v, "string"))
                continue
            if allow_invalid_values:
                continue
            for msg in is_valid_label_value(v):
                out.append(invalid(f"{ep}.values[{j}]", v, msg))
    return out


def selector_is_empty(sel: dict[str, Any]) -> bool:
    return not sel.get("matchLabels") and not sel.get("matchExpressions")


# ---------------------------------------------------------------------------
# Resources.
# ---------------------------------------------------------------------------


def validate_quantity(value: Any, path: str) -> tuple[Decimal | None, list[Cause]]:
    try:
        q = parse_quantity(value)
    except QuantityError:
        return None, [invalid(path, value, QUANTITY_ERROR)]
    if q < 0:
        return None, [invalid(path, value, "must be greater than or equal to 0")]
    return q, []


def _resource_list(rl: Any, path: str, out: list[Cause]) -> dict[str, Decimal]:
    if rl is None:
        return {}
    if not isinstance(rl, dict):
        out.append(type_invalid(path, rl, "object"))
        return {}
    parsed: dict[str, Decimal] = {}
    for name, value in rl.items():
        rp = f"{path}[{name}]"
        for msg in is_qualified_name(name):
            out.append(invalid(rp, name, msg))
        q, errs = validate_quantity(value, rp)
        out.extend(errs)
        if q is not None:
            parsed[name] = q
    return parsed


def validate_resources(res: Any, path: str) -> list[Cause]:
    """requests/limits parse as quantities and every request is <= its limit."""
    if res is None:
        return []
    if not isinstance(res, dict):
        return [type_invalid(path, res, "object")]
    out: list[Cause] = []
    limits = _resource_list(res.get("limits"), f"{path}.limits", out)
    requests = _resource_list(res.get("requests"), f"{path}.requests", out)
    for name, req in requests.items():
        lim = limits.get(name)
        if lim is not None and req > lim:
            out.append(invalid(f"{path}.requests[{name}]", res["requests"][name],
                               f"must be less than or equal to {name} limit of {res['limits'][name]}"))
    return out


# ---------------------------------------------------------------------------
# Values more than one kind validates: Service and container ports, Node
# taints and pod tolerations, PriorityClass and pod preemptionPolicy.
# ---------------------------------------------------------------------------

PROTOCOLS = ("SCTP", "TCP", "UDP")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")


def validate_preemption_policy(policy: Any, path: str) -> list[Cause]:
    """ValidatePreemptionPolicy (a PriorityClass's and a pod's preemptionPolicy)."""
    if policy is None:
        return []
    if policy == "":
        return [required(path)]
    if policy not in PREEMPTION_POLICIES:
        return [not_supported(path, policy, PREEMPTION_POLICIES)]
    return []
