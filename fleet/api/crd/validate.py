"""Validate a custom resource's value against its OpenAPI v3 schema, in kube's words.

kube-apiserver runs kube-openapi's schema validator (`pkg/validation/validate`)
over a custom resource and turns each error into a field error
(apiextensions-apiserver `pkg/apiserver/validation`, kubeOpenAPIResultToFieldErrors):

- a wrong type: `spec.replicas: Invalid value: "string": spec.replicas in body must be
  of type integer: "string"` (the bad value shown is the *type* found);
- a missing required field: `spec.cronSpec: Required value`;
- enum: `Unsupported value: "x": supported values: "a", "b"`;
- maxLength: `Too long: may not be more than 5 bytes`; maxItems and maxProperties:
  `Too many: 3: must have at most 2 items`;
- the other keywords: `Invalid value: <value>: <name> in body should be ...`
  (minLength, pattern, minimum/maximum/exclusive, multipleOf, minItems, uniqueItems,
  minProperties, a format: `must be of type date-time: "x"`);
- anyOf/oneOf/allOf/not are not field errors in kube-openapi: they come out at the
  field `<nil>` (kube passes no base path) as `Invalid value: "": "spec.x" must
  validate at least one schema (anyOf)`, beside the failing branch's own errors.

Names in messages are kube-openapi's: `spec.items[0].name`, map keys joined with
dots (`spec.labels.foo`).  Patterns are RE2 (google-re2), as Go's regexp.
Unknown formats are accepted, as kube does; int32/int64 bound nothing (as kube).
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import ipaddress
import json
import re
from collections.abc import Callable
from typing import Any

import re2

from fleet.api.crd._util import child, index, is_true, json_type, properties, schema_dict
from fleet.api.errors import cause
from fleet.api.patch import json_equal
from fleet.api.validation import Cause, invalid, not_supported, required, too_long, too_many

IN = "body"
TYPE_INVALID = "FieldValueTypeInvalid"  # field.TypeInvalid's cause type (metav1.CauseTypeTypeInvalid)


def gofmt(v: Any) -> str:
    """Go's %v of a JSON number (float64 bounds print as integers when whole)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e21:
            return str(int(v))
        return repr(v)
    return str(v)


def _gostr(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def validate(obj: Any, schema: dict[str, Any] | None, path: str = "") -> list[Cause]:
    """Every way `obj` breaks `schema`; `path` prefixes names and field paths ("" for a whole object)."""
    if not isinstance(schema, dict):
        return []
    return _Validator(path).node(obj, schema, "")


class _Validator:
    """kube-openapi's validator rooted at `base`: names are relative to it (a validator rooted
    at a default or at status says `in body must be of type ...` for its root value)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def f(self, name: str) -> str:
        """The field path of `name` (kube: fldPath.Child(name); a nil path prints `<nil>`)."""
        if self.base and name:
            return f"{self.base}.{name}"
        return self.base or name or "<nil>"

    @staticmethod
    def n(name: str) -> str:
        return f"{name} " if name else ""

    # -- one schema node over one value
    def node(self, data: Any, s: dict[str, Any], name: str) -> list[Cause]:
        if data is None:
            return self._type(data, s, name)
        out = self._type(data, s, name)
        out.extend(self._junctors(data, s, name))
        if isinstance(data, str):
            out.extend(self._string(data, s, name))
            out.extend(self._format(data, s, name))
        elif isinstance(data, (int, float)) and not isinstance(data, bool):
            out.extend(self._number(data, s, name))
        elif isinstance(data, list):
            out.extend(self._slice(data, s, name))
        out.extend(self._enum(data, s, name))
        if isinstance(data, dict):
            out.extend(self._object(data, s, name))
        return out

    def _types(self, s: dict[str, Any]) -> list[str]:
        if is_true(s, "x-kubernetes-int-or-string"):
            return ["integer", "string"]
        t = s.get("type")
        return [t] if isinstance(t, str) and t else []

    def _invalid_type(self, name: str, type_name: str, found: str) -> Cause:
        msg = f"{self.n(name)}in {IN} must be of type {type_name}: {_gostr(found)}"
        return cause(self.f(name), f"Invalid value: {_gostr(found)}: {msg}", TYPE_INVALID)

    def _type(self, data: Any, s: dict[str, Any], name: str) -> list[Cause]:
        types = self._types(s)
        if data is None:
            if types and "null" not in types and s.get("nullable") is not True:
                return [self._invalid_type(name, ",".join(types), "null")]
            return []
        if not types and not s.get("format"):
            return []
        found = json_type(data)
        fmt_found = {"integer": "int64", "number": "double"}.get(found, "")
        is_float_int = found == "number" and float(data).is_integer() and "integer" in types
        is_int_float = found == "integer" and "number" in types
        fmt = s.get("format") if isinstance(s.get("format"), str) else ""
        if found not in ("string", "array") and fmt and not (
                found in types or fmt_found == fmt or is_float_int or is_int_float
                or (fmt == "int64" and fmt_found == "int32") or (fmt == "double" and fmt_found == "float")):
            return [self._invalid_type(name, fmt, fmt_found)]
        if not ("number" in types or "integer" in types) and fmt and found in ("string", "array"):
            return []
        if types and not (found in types or is_float_int or is_int_float):
            return [self._invalid_type(name, ",".join(types), found)]
        return []

    # -- anyOf / oneOf / allOf / not
    def _composite(self, msg: str) -> Cause:
        return invalid(self.base or "<nil>", "", msg)

    def _sub(self, data: Any, s: Any, name: str) -> list[Cause]:
        return self.node(data, s, name) if isinstance(s, dict) else []

    def _junctors(self, data: Any, s: dict[str, Any], name: str) -> list[Cause]:
        out: list[Cause] = []
        any_of = [x for x in s.get("anyOf") or [] if isinstance(x, dict)] if isinstance(s.get("anyOf"), list) else []
        if any_of:
            results = [self._sub(data, x, name) for x in any_of]
            if not any(not r for r in results):
                out.append(self._composite(f"{_gostr(name)} must validate at least one schema (anyOf)"))
                out.extend(min(results, key=len))
        one_of = [x for x in s.get("oneOf") or [] if isinstance(x, dict)] if isinstance(s.get("oneOf"), list) else []
        if one_of:
            results = [self._sub(data, x, name) for x in one_of]
            valid = sum(1 for r in results if not r)
            if valid != 1:
                extra = "Found none valid" if valid == 0 else f"Found {valid} valid alternatives"
                out.append(self._composite(f"{_gostr(name)} must validate one and only one schema (oneOf). {extra}"))
                if valid == 0:
                    out.extend(min(results, key=len))
        all_of = [x for x in s.get("allOf") or [] if isinstance(x, dict)] if isinstance(s.get("allOf"), list) else []
        if all_of:
            results = [self._sub(data, x, name) for x in all_of]
            valid = sum(1 for r in results if not r)
            for r in results:
                out.extend(r)
            if valid != len(all_of):
                extra = ". None validated" if valid == 0 else ""
                out.append(self._composite(f"{_gostr(name)} must validate all the schemas (allOf){extra}"))
        if isinstance(s.get("not"), dict) and not self.node(data, s["not"], name):
            out.append(self._composite(f"{_gostr(name)} must not validate the schema (not)"))
        return out

    # -- strings
    def _string(self, data: str, s: dict[str, Any], name: str) -> list[Cause]:
        out: list[Cause] = []
        n = len(data)  # code points, as kube-openapi's utf8.RuneCountInString
        mx, mn = _int(s.get("maxLength")), _int(s.get("minLength"))
        if mx is not None and n > mx:
            out.append(too_long(self.f(name), mx))
        if mn is not None and n < mn:
            out.append(invalid(self.f(name), data, f"{self.n(name)}in {IN} should be at least {mn} chars long"))
        pattern = s.get("pattern")
        if isinstance(pattern, str) and pattern and not _search(pattern, data):
            out.append(invalid(self.f(name), data, f"{self.n(name)}in {IN} should match '{pattern}'"))
        return out

    def _format(self, data: str, s: dict[str, Any], name: str) -> list[Cause]:
        fmt = s.get("format")
        types = self._types(s)
        if not isinstance(fmt, str) or not fmt or "number" in types or "integer" in types:
            return []
        check = FORMATS.get(fmt)
        if check is None or check(data):
            return []
        msg = f"{self.n(name)}in {IN} must be of type {fmt}: {_gostr(data)}"
        return [cause(self.f(name), f"Invalid value: {_gostr(data)}: {msg}", TYPE_INVALID)]

    # -- numbers
    def _number(self, data: float, s: dict[str, Any], name: str) -> list[Cause]:
        out: list[Cause] = []
        mult = s.get("multipleOf")
        if _num(mult) and mult > 0:
            q = data / mult
            if not float(q).is_integer():
                out.append(invalid(self.f(name), data, f"{self.n(name)}in {IN} should be a multiple of {gofmt(mult)}"))
        mx = s.get("maximum")
        if _num(mx):
            exc = s.get("exclusiveMaximum") is True
            if data > mx or (exc and data >= mx):
                word = "less than" if exc else "less than or equal to"
                out.append(invalid(self.f(name), data, f"{self.n(name)}in {IN} should be {word} {gofmt(mx)}"))
        mn = s.get("minimum")
        if _num(mn):
            exc = s.get("exclusiveMinimum") is True
            if data < mn or (exc and data <= mn):
                word = "greater than" if exc else "greater than or equal to"
                out.append(invalid(self.f(name), data, f"{self.n(name)}in {IN} should be {word} {gofmt(mn)}"))
        return out

    # -- arrays
    def _slice(self, data: list[Any], s: dict[str, Any], name: str) -> list[Cause]:
        out: list[Cause] = []
        items = schema_dict(s.get("items"))
        if items is not None:
            for i, v in enumerate(data):
                out.extend(self.node(v, items, index(name, i)))
        mn, mx = _int(s.get("minItems")), _int(s.get("maxItems"))
        if mn is not None and len(data) < mn:
            out.append(invalid(self.f(name), len(data), f"{self.n(name)}in {IN} should have at least {mn} items"))
        if mx is not None and len(data) > mx:
            out.append(too_many(self.f(name), len(data), mx))
        if s.get("uniqueItems") is True:
            seen = [json.dumps(v, sort_keys=True) for v in data]
            if len(set(seen)) != len(seen):
                out.append(invalid(self.f(name), "", f"{self.n(name)}in {IN} shouldn't contain duplicates"))
        return out

    def _enum(self, data: Any, s: dict[str, Any], name: str) -> list[Cause]:
        enum = s.get("enum")
        if not isinstance(enum, list) or not enum:
            return []
        if any(json_equal(data, e) for e in enum):
            return []
        values = [e if isinstance(e, str) else json.dumps(e, separators=(",", ":")) for e in enum]
        return [not_supported(self.f(name), data, values)]

    # -- objects
    def _object(self, data: dict[str, Any], s: dict[str, Any], name: str) -> list[Cause]:
        n = len(data)
        mn, mx = _int(s.get("minProperties")), _int(s.get("maxProperties"))
        if mn is not None and n < mn:
            return [invalid(self.f(name), n, f"{self.n(name)}in {IN} should have at least {mn} properties")]
        if mx is not None and n > mx:
            return [too_many(self.f(name), n, mx)]
        out: list[Cause] = []
        props = properties(s)
        addl = s.get("additionalProperties")
        for k in sorted(data):
            if k in props:
                continue
            if addl is False:
                out.append(invalid(self.f(name), k, f"{self.n(child(name, k))}in {IN} is a forbidden property"))
            elif isinstance(addl, dict):
                out.extend(self.node(data[k], addl, child(name, k)))
        for k in sorted(props):
            if k in data and isinstance(props[k], dict):
                out.extend(self.node(data[k], props[k], child(name, k)))
        req = s.get("required")
        for k in req if isinstance(req, list) else []:
            if isinstance(k, str) and k not in data:
                out.append(required(self.f(child(name, k))))
        return out


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_PATTERNS: dict[str, Any] = {}


def _search(pattern: str, text: str) -> bool:
    """Go's regexp.MatchString: unanchored search, RE2 syntax.  A pattern that does not
    compile matches nothing (the CRD's own validation refuses it at creation)."""
    rx = _PATTERNS.get(pattern)
    if rx is None:
        try:
            rx = re2.compile(pattern)
        except re2.error:
            return False
        if len(_PATTERNS) < 4096:
            _PATTERNS[pattern] = rx
    return rx.search(text) is not None


# --------------------------------------------------------------------------- formats (kube-openapi strfmt)

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_UUID_V = {v: re.compile(rf"^[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{v}[0-9a-fA-F]{{3}}-[89abAB][0-9a-fA-F]{{3}}-"
                         r"[0-9a-fA-F]{12}$") for v in "345"}
_DATE_TIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_HOSTNAME = re.compile(r"^(?=.{1,255}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_MAC = re.compile(r"^(?:[0-9a-fA-F]{2}(?P<s>[:-])[0-9a-fA-F]{2}(?:(?P=s)[0-9a-fA-F]{2}){4}"
                  r"(?:(?:(?P=s)[0-9a-fA-F]{2}){2})?(?:(?:(?P=s)[0-9a-fA-F]{2}){12})?|"
                  r"[0-9a-fA-F]{4}\.[0-9a-fA-F]{4}\.[0-9a-fA-F]{4})$")
_DURATION = re.compile(r"^(?:\s*-?\d+(?:\.\d+)?\s*(?:ns|us|µs|ms|s|m|h|d|w|"
                       r"nanoseconds?|microseconds?|milliseconds?|seconds?|minutes?|hours?|days?|weeks?)\s*)+$")


def _date_time(s: str) -> bool:
    m = _DATE_TIME.match(s)
    if not m:
        return False
    try:
        _dt.datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), min(int(m[6]), 59))
    except ValueError:
        return False
    return int(m[6]) <= 60


def _date(s: str) -> bool:
    try:
        _dt.date.fromisoformat(s)
    except ValueError:
        return False
    return len(s) == 10


def _byte(s: str) -> bool:
    try:
        base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _ip(version: int) -> Callable[[str], bool]:
    def check(s: str) -> bool:
        try:
            return ipaddress.ip_address(s).version == version
        except ValueError:
            return False
    return check


def _cidr(s: str) -> bool:
    try:
        ipaddress.ip_network(s, strict=False)
    except ValueError:
        return False
    return "/" in s


FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": _date_time, "datetime": _date_time, "date": _date, "byte": _byte,
    "uuid": lambda s: bool(_UUID.match(s)), "uuid3": lambda s: bool(_UUID_V["3"].match(s)),
    "uuid4": lambda s: bool(_UUID_V["4"].match(s)), "uuid5": lambda s: bool(_UUID_V["5"].match(s)),
    "ipv4": _ip(4), "ipv6": _ip(6), "cidr": _cidr, "mac": lambda s: bool(_MAC.match(s)),
    "hostname": lambda s: bool(_HOSTNAME.match(s)), "email": lambda s: bool(_EMAIL.match(s)),
    "duration": lambda s: bool(_DURATION.match(s)),
    "bsonobjectid": lambda s: bool(re.fullmatch(r"[0-9a-fA-F]{24}", s)),
    "hexcolor": lambda s: bool(re.fullmatch(r"#?(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})", s)),
    "rgbcolor": lambda s: bool(re.fullmatch(r"rgb\(\s*\d{1,3}%?\s*,\s*\d{1,3}%?\s*,\s*\d{1,3}%?\s*\)", s)),
}

