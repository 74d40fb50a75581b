"""The three patch formats the API server accepts, plus the patch generators clients need.

* `json_merge_patch` — RFC 7386 (`application/merge-patch+json`).
* `json_patch` — RFC 6902 (`application/json-patch+json`).
* `strategic_merge_patch` — Kubernetes' strategic merge patch
  (`application/strategic-merge-patch+json`), driven by the schema tree of
  `fleet.api.smp_schema`.
* `create_merge_patch` / `three_way_merge_patch` — the inverse direction: the
  patch a client sends (`kfleet patch`/`apply`), mirroring kubectl's
  client-side apply.

Everything here is pure: inputs are never mutated (we deep-copy the document
and only ever read the patch), and failures are `fleet.api.errors.APIError`s
so the HTTP layer can render them without translation: a patch that is not
even shaped like a patch is 400 BadRequest, a well-formed JSON patch that
cannot be applied (missing path, failed `test`) is 422 Invalid, as in
kube-apiserver.

Strategic merge follows k8s.io/apimachinery `strategicpatch` closely,
including its list ordering rules: after a keyed merge the items named in the
patch come out in patch order, interleaved with the server-only items at
their former relative positions (which is why `kubectl patch` adding a
container lists the new container *first*, as the kubectl-patch task page
shows).  Unlike upstream, directives are also stripped from values that are
copied in wholesale (an item appended to a list, a field the object did not
have), so no `$patch`-style key can ever be stored.
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api.errors import BadRequest, Invalid
from fleet.api.smp_schema import ListSchema

DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
SET_ELEMENT_ORDER = "$setElementOrder/"
DELETE_FROM_PRIMITIVE_LIST = "$deleteFromPrimitiveList/"

_MISSING: Any = object()


# --------------------------------------------------------------------------
# JSON equality
# --------------------------------------------------------------------------


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values.

    Python's `==` says `True == 1` and `1 == 1.0`; JSON says a boolean is never
    a number but 1 and 1.0 are the same number.  Merge keys, set-merged
    primitives and `test` operations all need the JSON answer.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _index_of(items: list[Any], value: Any) -> int:
    for i, item in enumerate(items):
        if json_equal(item, value):
            return i
    return -1


# --------------------------------------------------------------------------
# RFC 7386 JSON merge patch
# --------------------------------------------------------------------------


def json_merge_patch(doc: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch; returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    target = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = json_merge_patch(target.get(key), value)
    return target


def create_merge_patch(original: Any, modified: Any) -> Any:
    """The RFC 7386 patch turning `original` into `modified` (a dict when both are dicts).

    A merge patch cannot express "set this key to null", so `modified` values
    that are None come out as deletions.
    """
    if not isinstance(original, dict) or not isinstance(modified, dict):
        return copy.deepcopy(modified)
    patch: dict[str, Any] = {}
    for key in original:
        if key not in modified:
            patch[key] = None
    for key, value in modified.items():
        old = original.get(key, _MISSING)
        if old is _MISSING:
            patch[key] = copy.deepcopy(value)
        elif isinstance(old, dict) and isinstance(value, dict):
            sub = create_merge_patch(old, value)
            if sub:
                patch[key] = sub
        elif not json_equal(old, value):
            patch[key] = copy.deepcopy(value)
    return patch


# --------------------------------------------------------------------------
# RFC 6902 JSON patch
# --------------------------------------------------------------------------


def _parse_pointer(pointer: Any) -> list[str]:
    if not isinstance(pointer, str):
        raise BadRequest(f"json patch: path must be a string, got {pointer!r}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise Invalid(f'json patch: invalid JSON pointer "{pointer}": must start with "/"')
    tokens = []
    for raw in pointer[1:].split("/"):
        # Only ~0 and ~1 are escapes; decode ~1 before ~0 so "~01" means "~1".
        i = raw.find("~")
        while i != -1:
            if i + 1 >= len(raw) or raw[i + 1] not in "01":
                raise Invalid(f'json patch: invalid escape in JSON pointer "{pointer}"')
            i = raw.find("~", i + 2)
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tokens


def _array_index(token: str, length: int, pointer: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not token.isdigit() or (len(token) > 1 and token[0] == "0") or not token.isascii():
        raise Invalid(f'json patch: invalid array index "{token}" in path "{pointer}"')
    index = int(token)
    limit = length if allow_end else length - 1
    if index > limit:
        raise Invalid(f'json patch: array index {index} out of bounds in path "{pointer}"')
    return index


def _walk(doc: Any, tokens: list[str], pointer: str) -> Any:
    """The value `tokens` lead to (every step must exist); callers pass all but the
    last token to get the container to change."""
    cur = doc
    for token in tokens:
        if isinstance(cur, dict):
            if token not in cur:
                raise Invalid(f'json patch: doc is missing path: "{pointer}"')
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_array_index(token, len(cur), pointer, allow_end=False)]
        else:
            raise Invalid(f'json patch: doc is missing path: "{pointer}"')
    return cur


def _get(doc: Any, pointer: str) -> Any:
    # Reading a value is walking every token: _walk already refuses missing keys
    # and out-of-range indexes with the same errors.
    return _walk(doc, _parse_pointer(pointer), pointer)


def _add(doc: Any, pointer: str, value: Any) -> Any:
    tokens = _parse_pointer(pointer)
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(last, len(parent), pointer, allow_end=True), value)
    else:
        raise Invalid(f'json patch: doc is missing path: "{pointer}"')
    return doc


def _remove(doc: Any, pointer: str) -> Any:
    tokens = _parse_pointer(pointer)
    if not tokens:
        raise Invalid("json patch: cannot remove the whole document")
    parent = _walk(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise Invalid(f'json patch: doc is missing path: "{pointer}"')
        del parent[last]
    elif isinstance(parent, list):
        del parent[_array_index(last, len(parent), pointer, allow_end=False)]
    else:
        raise Invalid(f'json patch: doc is missing path: "{pointer}"')
    return doc


def _replace(doc: Any, pointer: str, value: Any) -> Any:
    tokens = _parse_pointer(pointer)
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise Invalid(f'json patch: doc is missing path: "{pointer}"')
        parent[last] = value
    elif isinstance(parent, list):
        parent[_array_index(last, len(parent), pointer, allow_end=False)] = value
    else:
        raise Invalid(f'json patch: doc is missing path: "{pointer}"')
    return doc


def _member(op: dict[str, Any], name: str, index: int) -> Any:
    if name not in op:
        raise BadRequest(f'json patch: operation {index} ("{op.get("op")}") is missing "{name}"')
    return op[name]


def json_patch(doc: Any, ops: Any) -> Any:
    """Apply an RFC 6902 JSON patch; returns a new value (the input is untouched)."""
    if not isinstance(ops, list):
        raise BadRequest("json patch: the patch must be a JSON array of operations")
    for index, op in enumerate(ops):
        if not isinstance(op, dict):
            raise BadRequest(f"json patch: operation {index} is not an object")
        if "op" not in op:
            raise BadRequest(f'json patch: operation {index} is missing "op"')
    result = copy.deepcopy(doc)
    for index, op in enumerate(ops):
        kind = op["op"]
        path = _member(op, "path", index)
        if kind == "add":
            result = _add(result, path, copy.deepcopy(_member(op, "value", index)))
        elif kind == "remove":
            result = _remove(result, path)
        elif kind == "replace":
            result = _replace(result, path, copy.deepcopy(_member(op, "value", index)))
        elif kind == "move":
            source = _member(op, "from", index)
            if not isinstance(source, str):
                raise BadRequest(f"json patch: operation {index}: from must be a string")
            if path == source:
                _get(result, source)  # still must exist
                continue
            if path.startswith(source + "/"):
                raise Invalid(f'json patch: cannot move "{source}" into its own child "{path}"')
            value = _get(result, source)
            result = _remove(result, source)
            result = _add(result, path, value)
        elif kind == "copy":
            source = _member(op, "from", index)
            if not isinstance(source, str):
                raise BadRequest(f"json patch: operation {index}: from must be a string")
            result = _add(result, path, copy.deepcopy(_get(result, source)))
        elif kind == "test":
            expected = _member(op, "value", index)
            try:
                actual = _get(result, path)
            except Invalid:
                actual = _MISSING
            if actual is _MISSING or not json_equal(actual, expected):
                raise Invalid(f"json patch: testing value {path} failed: test failed")
        else:
            raise Invalid(f'json patch: unexpected operation "{kind}" at index {index}')
    return result


# --------------------------------------------------------------------------
# Strategic merge patch: applying
# --------------------------------------------------------------------------


def strategic_merge_patch(doc: dict[str, Any], patch: dict[str, Any],
                          schema: dict[str, Any]) -> dict[str, Any]:
    """Apply a Kubernetes strategic merge patch to `doc` under `schema`; returns a new dict."""
    if not isinstance(patch, dict):
        raise BadRequest("strategic merge patch: the patch must be a JSON object")
    base = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    return _merge_map(base, patch, schema)


def _map_node(node: Any) -> dict[str, Any] | None:
    return node if isinstance(node, dict) else None


def _merge_map(original: dict[str, Any], patch: dict[str, Any],
               schema: dict[str, Any] | None) -> dict[str, Any]:
    """Merge `patch` into `original` (which we own and may mutate)."""
    if DIRECTIVE in patch:
        directive = patch[DIRECTIVE]
        rest = {k: v for k, v in patch.items() if k != DIRECTIVE}
        if directive == "replace":
            # Upstream returns the patch verbatim; merging it into {} gives the
            # same object minus nulls and nested directives.
            return _merge_map({}, rest, schema)
        if directive == "delete":
            return {}
        if directive != "merge":
            raise BadRequest(f"Unknown patch type: {directive!r} in map: {patch!r}")
        patch = rest

    if RETAIN_KEYS in patch:
        retain = patch[RETAIN_KEYS]
        if not isinstance(retain, list) or not all(isinstance(k, str) for k in retain):
            raise BadRequest(f"$retainKeys must be a list of field names, got {retain!r}")
        for key in list(original):
            if key not in retain:
                del original[key]

    # Deletions from primitive lists go first: a generated patch never names
    # the same value in both the deletion list and the list itself, and
    # running them first leaves the ordering pass below a settled list.
    for key, value in patch.items():
        if not key.startswith(DELETE_FROM_PRIMITIVE_LIST):
            continue
        field = key[len(DELETE_FROM_PRIMITIVE_LIST):]
        if not isinstance(value, list):
            raise BadRequest(f"{key} must be a list, got {value!r}")
        current = original.get(field)
        if isinstance(current, list):
            original[field] = [x for x in current if _index_of(value, x) < 0]

    before: dict[str, Any] = {}
    for key, value in patch.items():
        if key in (DIRECTIVE, RETAIN_KEYS) or key.startswith(
                (SET_ELEMENT_ORDER, DELETE_FROM_PRIMITIVE_LIST)):
            continue
        before[key] = original.get(key, _MISSING)
        if value is None:
            original.pop(key, None)
            continue
        original[key] = _merge_value(before[key], value, schema.get(key) if schema else None)

    for key, order in patch.items():
        if not key.startswith(SET_ELEMENT_ORDER):
            continue
        field = key[len(SET_ELEMENT_ORDER):]
        if not isinstance(order, list):
            raise BadRequest(f"{key} must be a list, got {order!r}")
        merged = original.get(field)
        if not isinstance(merged, list):
            continue
        server = before.get(field, merged)
        node = schema.get(field) if schema else None
        merge_key = node.merge_key if isinstance(node, ListSchema) else None
        _check_element_order(patch.get(field), order, merge_key, key)
        original[field] = _apply_element_order(
            merged, order, server if isinstance(server, list) else [], merge_key)
    return original


def _merge_value(old: Any, value: Any, node: Any) -> Any:
    if isinstance(value, dict):
        return _merge_map(old if isinstance(old, dict) else {}, value, _map_node(node))
    if isinstance(value, list):
        if isinstance(node, ListSchema) and node.strategy == "merge":
            return _merge_list(old if isinstance(old, list) else [], value, node)
        return copy.deepcopy(value)
    return value


def _item_key(item: Any, merge_key: str) -> Any:
    if not isinstance(item, dict) or merge_key not in item:
        raise BadRequest(f"map: {item!r} does not contain declared merge key: {merge_key}")
    return item[merge_key]


def _key_index(items: list[Any], merge_key: str | None, probe: Any) -> int:
    """Position of `probe` in `items`: by merge key for maps, by value for primitives."""
    if merge_key is None:
        return _index_of(items, probe)
    want = probe.get(merge_key, _MISSING) if isinstance(probe, dict) else _MISSING
    if want is _MISSING:
        return -1
    for i, item in enumerate(items):
        if isinstance(item, dict) and merge_key in item and json_equal(item[merge_key], want):
            return i
    return -1


def _merge_list(original: list[Any], patch: list[Any], node: ListSchema) -> list[Any]:
    if not patch and not original:
        return []
    key = node.merge_key
    if key is None:
        if any(isinstance(x, dict | list) for x in patch):
            raise BadRequest("cannot merge lists without merge key")
        merged: list[Any] = []
        for x in original + patch:
            if _index_of(merged, x) < 0:
                merged.append(copy.deepcopy(x))
        return _normalize_order(merged, patch, original, None)

    plain: list[dict[str, Any]] = []
    replace = False
    for item in patch:
        if not isinstance(item, dict):
            raise BadRequest(f"strategic merge patch: list item {item!r} is not an object")
        if DIRECTIVE not in item:
            plain.append(item)
            continue
        directive = item[DIRECTIVE]
        if directive == "delete":
            value = _item_key(item, key)
            original = [x for x in original
                        if not (isinstance(x, dict) and json_equal(x.get(key, _MISSING), value))]
        elif directive == "replace":
            # Keep scanning so the other directives are still validated.
            replace = True
        elif directive == "merge":
            raise BadRequest("merging lists cannot yet be specified in the patch")
        else:
            raise BadRequest(f"Unknown patch type: {directive!r} in list item: {item!r}")
    if replace:
        return [_merge_map({}, item, node.item) for item in plain]

    server_order = list(original)
    merged = list(original)
    for item in plain:
        i = _key_index(merged, key, {key: _item_key(item, key)})
        if i >= 0:
            merged[i] = _merge_map(merged[i], item, node.item)
        else:
            merged.append(_merge_map({}, item, node.item))
    return _normalize_order(merged, plain, server_order, key)


def _normalize_order(merged: list[Any], patch_order: list[Any], server_order: list[Any],
                     merge_key: str | None) -> list[Any]:
    """Upstream's ordering rule for merged lists.

    Items named in `patch_order` come out in that order; the server-only ones
    keep their relative order and are slotted in front of the first patch
    item that followed them on the server.
    """
    patch_items = [x for x in merged if _key_index(patch_order, merge_key, x) >= 0]
    server_only = [x for x in merged if _key_index(patch_order, merge_key, x) < 0]
    patch_items.sort(key=lambda x: _key_index(patch_order, merge_key, x))
    server_only.sort(key=lambda x: _key_index(server_order, merge_key, x))

    def server_before(left: Any, right: Any) -> bool:
        li = _key_index(server_order, merge_key, left)
        ri = _key_index(server_order, merge_key, right)
        return li >= 0 and ri >= 0 and li < ri

    out: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(patch_items):
        if j >= len(patch_items):
            out.append(server_only[i])
            i += 1
        elif i >= len(server_only):
            out.append(patch_items[j])
            j += 1
        elif server_before(server_only[i], patch_items[j]):
            out.append(server_only[i])
            i += 1
        else:
            out.append(patch_items[j])
            j += 1
    return out


def _check_element_order(items: Any, order: list[Any], merge_key: str | None, name: str) -> None:
    """Upstream's consistency rule: the patch list must follow the order list.

    Every item the patch names (other than deletions) must appear in the
    order list, in the same relative order; otherwise the requested order is
    ambiguous and the patch is refused.
    """
    if not isinstance(items, list):
        return
    last = -1
    for item in items:
        if isinstance(item, dict) and item.get(DIRECTIVE) is not None:
            continue
        i = _key_index(order, merge_key, item)
        if i < last or i < 0:
            raise BadRequest(f"the order in the patch list doesn't match the {name} list")
        last = i


def _apply_element_order(merged: list[Any], order: list[Any], server: list[Any],
                         merge_key: str | None) -> list[Any]:
    """Honour `$setElementOrder/<field>` (the order kubectl apply wants)."""
    if merge_key is not None:
        keep: list[Any] = []
        for entry in order:
            if not isinstance(entry, dict):
                raise BadRequest(f"$setElementOrder entries must be objects, got {entry!r}")
            value = _item_key(entry, merge_key)
            if entry.get(DIRECTIVE) == "delete":
                merged = [x for x in merged
                          if not (isinstance(x, dict) and json_equal(x.get(merge_key), value))]
            else:
                keep.append({merge_key: value})
        order = keep
    return _normalize_order(merged, order, server, merge_key)


# --------------------------------------------------------------------------
# Strategic merge patch: generating (kubectl's client-side apply)
# --------------------------------------------------------------------------


def three_way_merge_patch(original: dict[str, Any] | None, modified: dict[str, Any],
                          current: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The patch client-side apply sends.

    `original` is the last-applied configuration (None on first apply),
    `modified` the new configuration and `current` the live object.  Fields
    that were in `original` but are gone from `modified` are deleted; fields
    of `modified` that differ from `current` are set; everything else the
    server or other writers own (present in `current` only) is left alone.
    With `schema == {}` the result is a plain JSON merge patch.
    """
    return _three_way_map(original or {}, modified, current if isinstance(current, dict) else {},
                          schema)


def _three_way_map(original: dict[str, Any], modified: dict[str, Any], current: dict[str, Any],
                   schema: dict[str, Any] | None) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key in original:
        if key not in modified:
            patch[key] = None
    for key, want in modified.items():
        node = schema.get(key) if schema else None
        have = current.get(key, _MISSING)
        was = original.get(key, _MISSING)
        if want is None:
            if have is not _MISSING:
                patch[key] = None
            continue
        if isinstance(want, dict):
            if isinstance(have, dict):
                sub = _three_way_map(was if isinstance(was, dict) else {}, want, have,
                                     _map_node(node))
                if sub:
                    patch[key] = sub
            else:
                patch[key] = copy.deepcopy(want)
        elif (isinstance(want, list) and isinstance(have, list)
              and isinstance(node, ListSchema) and node.strategy == "merge"):
            _three_way_list(patch, key, was if isinstance(was, list) else [], want, have, node)
        elif have is _MISSING or not json_equal(have, want):
            patch[key] = copy.deepcopy(want)
    return patch


def _three_way_list(patch: dict[str, Any], key: str, original: list[Any], modified: list[Any],
                    current: list[Any], node: ListSchema) -> None:
    merge_key = node.merge_key
    if merge_key is None:
        additions = [copy.deepcopy(x) for x in modified if _index_of(current, x) < 0]
        deletions = [copy.deepcopy(x) for x in original if _index_of(modified, x) < 0]
        if additions:
            patch[key] = additions
        if deletions:
            patch[DELETE_FROM_PRIMITIVE_LIST + key] = deletions
        if additions or deletions:
            patch[SET_ELEMENT_ORDER + key] = copy.deepcopy(modified)
        return

    wanted_keys = [_item_key(item, merge_key) for item in modified]
    items: list[dict[str, Any]] = []
    for item, value in zip(modified, wanted_keys, strict=True):
        probe = {merge_key: value}
        i = _key_index(current, merge_key, probe)
        if i < 0:
            items.append(copy.deepcopy(item))
            continue
        j = _key_index(original, merge_key, probe)
        sub = _three_way_map(original[j] if j >= 0 and isinstance(original[j], dict) else {},
                             item, current[i], node.item)
        if sub:
            items.append({merge_key: copy.deepcopy(value), **sub})
    for item in original:
        if isinstance(item, dict) and merge_key in item \
                and _index_of(wanted_keys, item[merge_key]) < 0:
            items.append({DIRECTIVE: "delete", merge_key: copy.deepcopy(item[merge_key])})
    if items:
        patch[key] = items
        patch[SET_ELEMENT_ORDER + key] = [{merge_key: copy.deepcopy(v)} for v in wanted_keys]
