"""The protobuf form of `/openapi/v2`: a Swagger 2.0 document as gnostic's `openapi.v2.Document`.

kubectl (`explain --output=plaintext-openapiv2`, the `--validate` fallback when /openapi/v3 is
missing), client-go's `OpenAPISchema()` and Helm ask for `/openapi/v2` with
`Accept: application/com.github.proto-openapi.spec.v2[@.]v1.0+protobuf`.  kube-apiserver answers
with the JSON document parsed by gnostic (github.com/google/gnostic `openapiv2/OpenAPIv2.proto`)
and marshalled in the protobuf wire format; this module writes the same bytes from the JSON-shaped
dict that `fleet.server.openapi_v2` builds, so both forms come from one document.

Only the encoding direction, and only the messages a Kubernetes document uses: Document, Info,
Paths/NamedPathItem/PathItem, Operation, ParametersItem/Parameter (body, query, path, header),
Responses/ResponseValue/Response, Definitions/Properties/NamedSchema/Schema (with TypeItem,
ItemsItem, AdditionalPropertiesItem), SecurityDefinitions (apiKey) and SecurityRequirement.
Vendor extensions (`x-...`) are gnostic `NamedAny`s whose `Any.yaml` holds the value; it is
written as JSON text, which is YAML (kubectl reads it with a YAML parser).  Schema keywords
Swagger 2.0 lacks (`nullable`, `oneOf`, `anyOf`, `not`) have no field and are dropped, as
gnostic would reject them.

proto3 rules: a scalar equal to its zero value is not written; a present sub-message is, even
empty; fields are written in field-number order, as Go's marshaller does.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from typing import Any, Final

MEDIA_TYPE: Final = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
# The spelling with `@`, which clients still send; kube-openapi calls it deprecated and answers
# it with MEDIA_TYPE (an `@` is not allowed in a media type: Go's mime parser refuses it).
DEPRECATED_MEDIA_TYPE: Final = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"

_VARINT, _FIXED64, _LEN = 0, 1, 2


def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 two's complement: ten bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(num: int, wire: int) -> bytes:
    return varint(num << 3 | wire)


def message(num: int, body: bytes) -> bytes:
    """A length-delimited field: a sub-message (written even when empty), string or bytes."""
    return _key(num, _LEN) + varint(len(body)) + body


def string(num: int, s: str | None) -> bytes:
    return message(num, s.encode()) if s else b""


def strings(num: int, items: Iterable[str] | None) -> bytes:
    return b"".join(message(num, s.encode()) for s in items or ())


def boolean(num: int, b: Any) -> bytes:
    return _key(num, _VARINT) + b"\x01" if b else b""


def int64(num: int, n: Any) -> bytes:
    return _key(num, _VARINT) + varint(int(n)) if n else b""


def double(num: int, x: Any) -> bytes:
    return _key(num, _FIXED64) + struct.pack("<d", float(x)) if x else b""


def _any(value: Any) -> bytes:
    """gnostic `Any`: yaml=2 (the value as YAML text; JSON is YAML)."""
    return string(2, json.dumps(value, ensure_ascii=False) + "\n")


def _named(num: int, items: Iterable[tuple[str, bytes]]) -> bytes:
    """Repeated Named* entries: name=1, value=2."""
    return b"".join(message(num, string(1, k) + message(2, v)) for k, v in items)


def _ext(num: int, obj: dict[str, Any]) -> bytes:
    return _named(num, ((k, _any(v)) for k, v in obj.items() if k.startswith("x-")))


def schema(s: dict[str, Any]) -> bytes:
    """gnostic `Schema`."""
    out = [
        string(1, s.get("$ref")), string(2, s.get("format")), string(3, s.get("title")),
        string(4, s.get("description")),
        message(5, _any(s["default"])) if "default" in s else b"",
        double(6, s.get("multipleOf")), double(7, s.get("maximum")), boolean(8, s.get("exclusiveMaximum")),
        double(9, s.get("minimum")), boolean(10, s.get("exclusiveMinimum")),
        int64(11, s.get("maxLength")), int64(12, s.get("minLength")), string(13, s.get("pattern")),
        int64(14, s.get("maxItems")), int64(15, s.get("minItems")), boolean(16, s.get("uniqueItems")),
        int64(17, s.get("maxProperties")), int64(18, s.get("minProperties")),
        strings(19, s.get("required")),
        b"".join(message(20, _any(v)) for v in s.get("enum") or ()),
    ]
    ap = s.get("additionalProperties")
    if isinstance(ap, dict):
        out.append(message(21, message(1, schema(ap))))  # AdditionalPropertiesItem.schema
    elif isinstance(ap, bool):
        out.append(message(21, _key(2, _VARINT) + (b"\x01" if ap else b"\x00")))  # .boolean (a oneof)
    t = s.get("type")
    if t:
        out.append(message(22, strings(1, [t] if isinstance(t, str) else t)))  # TypeItem
    items = s.get("items")
    if isinstance(items, dict):
        out.append(message(23, message(1, schema(items))))  # ItemsItem
    elif isinstance(items, list):
        out.append(message(23, b"".join(message(1, schema(i)) for i in items)))
    out += [message(24, schema(a)) for a in s.get("allOf") or ()]
    if "properties" in s:
        out.append(message(25, _named(1, ((k, schema(v)) for k, v in s["properties"].items()))))
    out += [string(26, s.get("discriminator")), boolean(27, s.get("readOnly")),
            message(30, _any(s["example"])) if "example" in s else b"", _ext(31, s)]
    return b"".join(out)


def _non_body(p: dict[str, Any]) -> bytes:
    """Header/FormData/Query/PathParameterSubSchema: the shared fields, numbered per message."""
    where = p.get("in")
    # (oneof field in NonBodyParameter, number of `type`; later fields follow it in order)
    oneof, type_num = {"header": (1, 5), "formData": (2, 6), "query": (3, 6), "path": (4, 5)}[where]
    head = boolean(1, p.get("required")) + string(2, where) + string(3, p.get("description")) + \
        string(4, p.get("name"))
    if where in ("formData", "query"):
        head += boolean(5, p.get("allowEmptyValue"))
    n = type_num
    body = [string(n, p.get("type")), string(n + 1, p.get("format")),
            message(n + 2, _primitives(p["items"])) if "items" in p else b"",
            string(n + 3, p.get("collectionFormat")),
            message(n + 4, _any(p["default"])) if "default" in p else b"",
            double(n + 5, p.get("maximum")), boolean(n + 6, p.get("exclusiveMaximum")),
            double(n + 7, p.get("minimum")), boolean(n + 8, p.get("exclusiveMinimum")),
            int64(n + 9, p.get("maxLength")), int64(n + 10, p.get("minLength")), string(n + 11, p.get("pattern")),
            int64(n + 12, p.get("maxItems")), int64(n + 13, p.get("minItems")),
            boolean(n + 14, p.get("uniqueItems")),
            b"".join(message(n + 15, _any(v)) for v in p.get("enum") or ()),
            double(n + 16, p.get("multipleOf")), _ext(n + 17, p)]
    return message(oneof, head + b"".join(body))


def _primitives(p: dict[str, Any]) -> bytes:
    """PrimitivesItems (an `items` of a non-body parameter)."""
    return string(1, p.get("type")) + string(2, p.get("format")) + \
        (message(3, _primitives(p["items"])) if "items" in p else b"") + string(4, p.get("collectionFormat"))


def parameter(p: dict[str, Any]) -> bytes:
    """ParametersItem: a `$ref` (JsonReference) or a Parameter (body or non-body)."""
    if "$ref" in p:
        return message(2, string(1, p["$ref"]) + string(2, p.get("description")))
    if p.get("in") == "body":
        body = string(1, p.get("description")) + string(2, p.get("name")) + string(3, "body") + \
            boolean(4, p.get("required")) + (message(5, schema(p["schema"])) if "schema" in p else b"") + \
            _ext(6, p)
        return message(1, message(1, body))
    return message(1, message(2, _non_body(p)))


def _responses(r: dict[str, Any]) -> bytes:
    def value(v: dict[str, Any]) -> bytes:
        if "$ref" in v:
            return message(2, string(1, v["$ref"]))
        resp = string(1, v.get("description")) + \
            (message(2, message(1, schema(v["schema"]))) if "schema" in v else b"") + _ext(5, v)
        return message(1, resp)

    return _named(1, ((code, value(v)) for code, v in r.items() if not code.startswith("x-"))) + _ext(2, r)


def operation(op: dict[str, Any]) -> bytes:
    return b"".join([
        strings(1, op.get("tags")), string(2, op.get("summary")), string(3, op.get("description")),
        string(5, op.get("operationId")), strings(6, op.get("produces")), strings(7, op.get("consumes")),
        b"".join(message(8, parameter(p)) for p in op.get("parameters") or ()),
        message(9, _responses(op["responses"])) if "responses" in op else b"",
        strings(10, op.get("schemes")), boolean(11, op.get("deprecated")),
        b"".join(message(12, _security_requirement(s)) for s in op.get("security") or ()),
        _ext(13, op),
    ])


_METHODS: Final = (("get", 2), ("put", 3), ("post", 4), ("delete", 5), ("options", 6), ("head", 7), ("patch", 8))


def path_item(item: dict[str, Any]) -> bytes:
    out = [string(1, item.get("$ref"))]
    out += [message(num, operation(item[m])) for m, num in _METHODS if m in item]
    out += [message(9, parameter(p)) for p in item.get("parameters") or ()]
    out.append(_ext(10, item))
    return b"".join(out)


def _security_requirement(req: dict[str, list[str]]) -> bytes:
    return _named(1, ((k, strings(1, v)) for k, v in req.items()))


def _security_definition(d: dict[str, Any]) -> bytes:
    """SecurityDefinitionsItem: apiKey and basic, the kinds kube-apiserver declares."""
    if d.get("type") == "basic":
        return message(1, string(1, "basic") + string(2, d.get("description")) + _ext(3, d))
    return message(2, string(1, d.get("type")) + string(2, d.get("name")) + string(3, d.get("in")) +
                   string(4, d.get("description")) + _ext(5, d))


def _map(num: int, obj: dict[str, Any], enc: Callable[[Any], bytes]) -> bytes:
    return message(num, _named(1, ((k, enc(v)) for k, v in obj.items())))


def document(doc: dict[str, Any]) -> bytes:
    """The gnostic `openapi.v2.Document` encoding of a Swagger 2.0 document."""
    info = doc.get("info") or {}
    paths = doc.get("paths") or {}
    out = [
        string(1, doc.get("swagger")),
        message(2, string(1, info.get("title")) + string(2, info.get("version")) +
                string(3, info.get("description")) + _ext(7, info)) if "info" in doc else b"",
        string(3, doc.get("host")), string(4, doc.get("basePath")), strings(5, doc.get("schemes")),
        strings(6, doc.get("consumes")), strings(7, doc.get("produces")),
        message(8, _ext(1, paths) + _named(2, ((p, path_item(v)) for p, v in paths.items()
                                              if not p.startswith("x-")))) if "paths" in doc else b"",
        _map(9, doc["definitions"], schema) if "definitions" in doc else b"",
        b"".join(message(12, _security_requirement(s)) for s in doc.get("security") or ()),
        _map(13, doc["securityDefinitions"], _security_definition) if "securityDefinitions" in doc else b"",
        _ext(16, doc),
    ]
    return b"".join(out)
