"""Request body decoding that cannot fail open (no I/O).

kube-apiserver decodes with Go's strict JSON reader and sigs.k8s.io/yaml, so
a body is either a well-formed JSON value or a 400.  Python's own readers are
more forgiving in ways that later crash or bloat the server: `NaN` and
`Infinity`, lone UTF-16 surrogates (`"\\ud800"`, legal JSON, unencodable
UTF-8), nesting deep enough to blow the recursion limit in whatever walks the
value next, integers of any size, YAML aliases that expand a few hundred
bytes into gigabytes (or into a cycle), YAML timestamps and binary turning
into non-JSON Python types, and silently kept duplicate keys.  This module
decodes JSON and YAML so that what comes out is plain JSON data within
bounds, or a `DecodeError` saying why not.

Bounds: `MAX_DEPTH` levels of nesting, integers within int64 (typed fields
are narrowed further by `fleet.api.typecheck`), finite numbers only, strict
UTF-8, and at most `max_bytes` of decoded JSON (the request limit applies to
the object, not only to the bytes that carried it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import yaml

MAX_DEPTH = 128
MAX_BYTES = 3 * 1024 * 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# A YAML document may not expand to more nodes than this (aliases included);
# a 3 MiB JSON body cannot hold many more values either.
MAX_YAML_NODES = 1_000_000


class DecodeError(ValueError):
    """The body is not acceptable JSON/YAML; the message says why (a 400)."""


class TooLarge(DecodeError):
    """The decoded object is over the size limit (a 413)."""


@dataclass
class Decoded:
    value: Any
    # Keys that appeared more than once in one object ("metadata.name"), for
    # fieldValidation: Strict refuses them, Warn reports them.
    duplicates: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise DecodeError(f"json: {name} is not a valid JSON number")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise DecodeError(f"json: number {text[:40]} overflows a 64-bit float")
    return v


def decode_json(body: bytes | str, *, max_bytes: int = MAX_BYTES) -> Decoded:
    if isinstance(body, bytes):
        if body.startswith(b"\xef\xbb\xbf"):
            body = body[3:]
        try:
            text = body.decode("utf-8")  # strict: invalid UTF-8 is refused, never guessed at
        except UnicodeDecodeError as e:
            raise DecodeError(f"invalid UTF-8 in the request body at byte {e.start}") from None
    else:
        text = body
    dups: list[tuple[str, ...]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                dups.append((k,))
            out[k] = v
        return out

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=_reject_constant,
                           parse_float=_finite_float)
    except RecursionError:
        raise DecodeError(f"json: the object is nested more than {MAX_DEPTH} levels deep") from None
    except DecodeError:
        raise
    except ValueError as e:  # JSONDecodeError, and int("9"*5000)'s digit limit
        raise DecodeError(f"json parse error: {e}") from None
    check_value(value, max_bytes=max_bytes)
    return Decoded(value, sorted({d[0] for d in dups}))


# ---------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps timestamps as strings (as sigs.k8s.io/yaml does)."""


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _expanded_size(root: yaml.Node) -> int:
    """Nodes the document expands to with every alias resolved; refuses cycles.

    Iterative, memoized per node object: an alias is the same node object as
    its anchor, so a billion-laughs document costs its real node count here,
    not its expansion.
    """
    size: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            on_stack.discard(nid)
            total = 1 + sum(size[id(c)] for c in _children(node))
            size[nid] = min(total, MAX_YAML_NODES + 1)
            continue
        if nid in size:
            continue
        if nid in on_stack:
            raise DecodeError("yaml: the document refers to itself through an alias (a cycle)")
        on_stack.add(nid)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in on_stack:
                raise DecodeError("yaml: the document refers to itself through an alias (a cycle)")
            if id(c) not in size:
                stack.append((c, False))
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    return []


def decode_yaml(body: bytes | str, *, max_bytes: int = MAX_BYTES) -> Decoded:
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(f"invalid UTF-8 in the request body at byte {e.start}") from None
    try:
        loader = _Loader(body)
    except yaml.YAMLError as e:  # the reader refuses control characters up front
        raise DecodeError(f"error converting YAML to JSON: {e}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return Decoded(None)
        if _expanded_size(node) > MAX_YAML_NODES:
            raise DecodeError("yaml: document contains excessive aliasing")
        value = loader.construct_document(node)
    except RecursionError:
        raise DecodeError(f"yaml: the document is nested more than {MAX_DEPTH} levels deep") from None
    except yaml.YAMLError as e:
        raise DecodeError(f"error converting YAML to JSON: {e}") from None
    finally:
        loader.dispose()
    value = _jsonify_keys(value)
    check_value(value, max_bytes=max_bytes)
    return Decoded(value)


def _jsonify_keys(value: Any) -> Any:
    """YAML allows non-string keys (`1: a`); JSON does not.  Convert them as
    sigs.k8s.io/yaml does (numbers and booleans become their text)."""
    stack = [value]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, dict):
            if any(not isinstance(k, str) for k in v):
                items = list(v.items())
                v.clear()
                for k, item in items:
                    v[_key_text(k)] = item
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return value


def _key_text(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, bool):
        return "true" if k else "false"
    if k is None:
        return "null"
    if isinstance(k, int | float):
        return str(k)
    raise DecodeError(f"yaml: a mapping key of type {type(k).__name__} cannot be converted to JSON")


# ---------------------------------------------------------------------------
# Bounds on any decoded value (JSON, YAML or protobuf)
# ---------------------------------------------------------------------------


def check_value(value: Any, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> None:
    """Refuse a decoded value that is not plain, bounded JSON data.

    One iterative pass: depth, types (only dict/list/str/int/float/bool/None),
    integers within int64, finite floats, strings and keys encodable as UTF-8,
    and the size of its compact JSON encoding.
    """
    size = 0
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        v, depth, path = stack.pop()
        if depth > max_depth:
            raise DecodeError(f"the object is nested more than {max_depth} levels deep (at {path or '<root>'})")
        if isinstance(v, str):
            size += len(v) + 2
            _utf8(v, path)
        elif isinstance(v, bool) or v is None:
            size += 5
        elif isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                raise DecodeError(f"{path or '<root>'}: the number {str(v)[:40]}... does not fit in a "
                                  "64-bit integer" if len(str(v)) > 40 else
                                  f"{path or '<root>'}: the number {v} does not fit in a 64-bit integer")
            size += 20
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise DecodeError(f"{path or '<root>'}: {v} is not a valid JSON number")
            size += 24
        elif isinstance(v, dict):
            size += 2
            for k, item in v.items():
                if not isinstance(k, str):
                    raise DecodeError(f"{path or '<root>'}: object keys must be strings")
                _utf8(k, path)
                size += len(k) + 4
                stack.append((item, depth + 1, f"{path}.{k}" if path else k))
        elif isinstance(v, list):
            size += 2
            for i, item in enumerate(v):
                size += 1
                stack.append((item, depth + 1, f"{path}[{i}]"))
        else:
            raise DecodeError(f"{path or '<root>'}: a value of type {type(v).__name__} is not JSON")
        if size > max_bytes:
            raise TooLarge(f"the decoded object is too large (limit {max_bytes} bytes)")


def _utf8(s: str, path: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise DecodeError(f"{path or '<root>'}: invalid UTF-8 (a lone surrogate) in a string") from None


__all__ = ["Decoded", "DecodeError", "TooLarge", "decode_json", "decode_yaml", "check_value", "MAX_DEPTH"]
