"""`x-kubernetes-validations`: CEL rules on a CRD schema, compiled at CRD creation and
evaluated on every create and update of a custom resource.

The counterpart of apiextensions-apiserver `pkg/apiserver/schema/cel` (compilation.go,
validation.go) and of the CEL part of the CRD's own validation, on the shared engine
(`fleet.cel`: compile once, evaluate with a step budget).

At CRD creation (`rule_violations(schema, path)`):
- a rule that does not compile: `<path>.x-kubernetes-validations[0].rule: Invalid value:
  apiextensions.ValidationRule{Rule:"...", ...}: compilation failed: ERROR: <input>:1:5: ...`
  (the value is printed as Go's %#v of the rule, as kube does); likewise
  `messageExpression compilation failed: ...`;
- `oldSelf` where old and new values cannot be correlated (below a list that is not a
  `map` list, or below an atomic map): `oldSelf cannot be used on the uncorrelatable
  portion of the schema within <path>`; `optionalOldSelf` on a rule not using oldSelf;
- the cost guard (see `estimated_cost`): kube refuses a rule whose static cost estimate
  exceeds 10,000,000 (per rule, all invocations) or a schema whose rules total more
  than 100,000,000, with its words (`estimated rule cost exceeds budget by factor of
  ...x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where
  arrays, maps, and strings are declared)`).

At write time (`validate_rules(obj, schema, old)`): each rule runs with `self` bound to
the value at its schema node (skipped when the value is null or absent) and `oldSelf` to
the correlated old value; a *transition rule* (one using oldSelf) runs only on update
when an old value correlates.  A failure is `<path>: Invalid value: "<schema type>":
<message>` (kube 1.32 shows the schema type), its field from `fieldPath` when set, its
kind from `reason` (Forbidden, Required, Duplicate, else Invalid); the message is
messageExpression's string, else `message`, else `failed rule: <rule>`.  Evaluation
errors read `<error> evaluating rule: <rule>`; running out of budget stops every
further rule: `'operation cancelled: actual cost limit exceeded': no further validation
rules will be run due to call cost exceeds limit for rule: <rule>`.

The static estimate is Fleet's own, in the engine's unit (one step per expression node
visited): a rule costs its node count, a comprehension (`all`, `exists`, `map`,
`filter`, `exists_one`) costs its body times the size of the list or map it walks —
`maxItems`/`maxProperties` when declared, else as many of the smallest elements as fit
in a 3 MiB request — and the rule's cost is multiplied by how many times it can run
(the product of the sizes of the lists and maps above its node).  It does not weigh
string lengths (cel-go does), so a rule over unbounded strings is not refused here; the
runtime step budget still bounds it.

`optionalOldSelf: true` is accepted but the engine has no CEL optionals: such a rule,
like any transition rule, runs only when an old value correlates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import lark

from fleet import cel
from fleet.api.crd._util import child, index, key, properties, schema_dict
from fleet.api.crd.structural import resolve_field_path
from fleet.api.errors import cause
from fleet.api.validation import Cause, duplicate, forbidden, invalid, required

VARIABLES = frozenset({"self", "oldSelf"})
STATIC_RULE_COST_LIMIT = 10_000_000  # kube's StaticEstimatedCostLimit
STATIC_CRD_COST_LIMIT = 100_000_000  # kube's StaticEstimatedCRDCostLimit
MAX_REQUEST_BYTES = 3 * 1024 * 1024
_MIN_SIZE = {"string": 3, "integer": 2, "number": 2, "boolean": 2, "object": 3, "array": 3}
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


# --------------------------------------------------------------------------- the schema's rules

def _rules(s: dict[str, Any]) -> list[dict[str, Any]]:
    r = s.get("x-kubernetes-validations")
    return [x for x in r if isinstance(x, dict)] if isinstance(r, list) else []


def _nodes(s: dict[str, Any], path: str, card: int, uncorrelatable: str | None
           ) -> Iterator[tuple[dict[str, Any], str, int, str | None]]:
    """Every schema node: (schema, path, how many times it can occur, first uncorrelatable ancestor)."""
    yield s, path, card, uncorrelatable
    map_atomic = s.get("x-kubernetes-map-type") == "atomic"
    for k, v in sorted(properties(s).items()):
        if isinstance(v, dict):
            unc = uncorrelatable if uncorrelatable is not None or not map_atomic else path
            yield from _nodes(v, key(child(path, "properties"), k), card, unc)
    addl = schema_dict(s.get("additionalProperties"))
    if addl is not None:  # kube marks only the properties of an atomic map uncorrelatable
        yield from _nodes(addl, child(path, "additionalProperties"), card * _size(s), uncorrelatable)
    items = schema_dict(s.get("items"))
    if items is not None:
        unc = uncorrelatable
        if unc is None and s.get("x-kubernetes-list-type") != "map":
            unc = path
        yield from _nodes(items, child(path, "items"), card * _size(s), unc)


def _size(s: dict[str, Any] | None) -> int:
    """How many elements a list or map may hold (declared, else what fits in a request)."""
    if s is None:
        return MAX_REQUEST_BYTES
    if s.get("type") == "array" or "items" in s:
        bound = s.get("maxItems")
        elem = schema_dict(s.get("items")) or {}
    else:
        if properties(s) and s.get("additionalProperties") is None:
            return len(properties(s))  # a struct: its fields
        bound = s.get("maxProperties")
        elem = schema_dict(s.get("additionalProperties")) or {}
    if isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0:
        return bound
    return MAX_REQUEST_BYTES // (_MIN_SIZE.get(str(elem.get("type")), 2) + 1)


def go_rule(rule: dict[str, Any]) -> str:
    """Go's %#v of an apiextensions.ValidationRule, as kube prints it in compile errors."""
    def q(k: str) -> str:
        v = rule.get(k)
        return json.dumps(v if isinstance(v, str) else "", ensure_ascii=False)

    reason = rule.get("reason")
    opt = rule.get("optionalOldSelf")
    reason_s = (f"(*apiextensions.FieldValueErrorReason)({json.dumps(reason)})" if isinstance(reason, str)
                else "(*apiextensions.FieldValueErrorReason)(nil)")
    opt_s = f"(*bool)({'true' if opt else 'false'})" if isinstance(opt, bool) else "(*bool)(nil)"
    return (f"apiextensions.ValidationRule{{Rule:{q('rule')}, Message:{q('message')}, "
            f"MessageExpression:{q('messageExpression')}, Reason:{reason_s}, FieldPath:{q('fieldPath')}, "
            f"OptionalOldSelf:{opt_s}}}")


def _go_invalid(path: str, go_value: str, detail: str) -> Cause:
    return cause(path, f"Invalid value: {go_value}: {detail}", "FieldValueInvalid")


_OLD_SELF: dict[str, bool] = {}


def uses_old_self(program: cel.Program) -> bool:
    """Whether the rule is a transition rule (cached by its text: asked on every write)."""
    found = _OLD_SELF.get(program.expression)
    if found is None:
        found = any(t.data == "ident" and str(t.children[0]) == "oldSelf" for t in program.ast.iter_subtrees())
        if len(_OLD_SELF) < 4096:
            _OLD_SELF[program.expression] = found
    return found


def rule_violations(schema: Any, path: str = "spec.validation.openAPIV3Schema") -> list[Cause]:
    """Compile every rule of `schema`; the causes kube-apiserver refuses a CRD with."""
    if not isinstance(schema, dict):
        return []
    out: list[Cause] = []
    costs: list[tuple[int, str]] = []
    for s, spath, card, unc in _nodes(schema, path, 1, None):
        for i, rule in enumerate(_rules(s)):
            rp = index(child(spath, "x-kubernetes-validations"), i)
            text = rule.get("rule")
            if not isinstance(text, str) or not text.strip():
                continue  # structural.py reports it
            try:
                program = cel.compile(text, VARIABLES)
            except cel.CompileError as e:
                out.append(_go_invalid(child(rp, "rule"), go_rule(rule), f"compilation failed: {e}"))
                continue
            cost = estimated_cost(program, s) * card
            if cost > STATIC_RULE_COST_LIMIT:
                out.append(forbidden(child(rp, "rule"), cost_error("estimated rule cost", cost, STATIC_RULE_COST_LIMIT)))
            costs.append((cost, child(rp, "rule")))
            mexpr = rule.get("messageExpression")
            if isinstance(mexpr, str) and mexpr.strip():
                err = cel.compile_error(mexpr, VARIABLES)
                if err is not None:
                    out.append(_go_invalid(child(rp, "messageExpression"), go_rule(rule),
                                           f"messageExpression compilation failed: {err}"))
            if uses_old_self(program):
                if unc is not None:
                    out.append(invalid(child(rp, "rule"), text, "oldSelf cannot be used on the uncorrelatable portion "
                                                                f"of the schema within {unc}"))
            elif rule.get("optionalOldSelf") is not None:
                out.append(invalid(child(rp, "optionalOldSelf"), rule["optionalOldSelf"],
                                   "may not be set if oldSelf is not used in rule"))
    total = sum(c for c, _ in costs)
    if total > STATIC_CRD_COST_LIMIT:
        for _, p in sorted(costs, key=lambda cp: -cp[0])[:4]:
            out.append(forbidden(p, "contributed to estimated rule cost total exceeding cost limit for entire "
                                    "OpenAPIv3 schema"))
        out.append(forbidden(path, cost_error("x-kubernetes-validations estimated rule cost total for entire "
                                              "OpenAPIv3 schema", total, STATIC_CRD_COST_LIMIT)))
    return out


def cost_error(name: str, cost: int, limit: int) -> str:
    """kube's getCostErrorMessage."""
    factor = cost / limit
    if factor > 100.0:
        text = "more than 100x"
    elif factor < 1.5:
        text = f"{factor:f}x"
    else:
        text = f"{factor:.1f}x"
    return (f"{name} exceeds budget by factor of {text} (try simplifying the rule, or adding maxItems, "
            "maxProperties, and maxLength where arrays, maps, and strings are declared)")


# --------------------------------------------------------------------------- static cost

def estimated_cost(program: cel.Program, schema: dict[str, Any]) -> int:
    """Steps one evaluation of `program` at a node with `schema` may take (see the module docstring)."""
    return _cost(program.ast, {"self": schema, "oldSelf": schema})


def _schema_of(t: Any, env: dict[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    if not isinstance(t, lark.Tree):
        return None
    if t.data == "primary" and len(t.children) == 1:
        return _schema_of(t.children[0], env)
    if t.data == "ident":
        return env.get(str(t.children[0]))
    if t.data == "member_dot" and len(t.children) == 2:
        s = _schema_of(t.children[0], env)
        if s is None:
            return None
        name = str(t.children[1])
        props = properties(s)
        if name in props:
            return schema_dict(props[name])
        return schema_dict(s.get("additionalProperties"))
    return None


def _cost(t: Any, env: dict[str, dict[str, Any] | None]) -> int:
    if not isinstance(t, lark.Tree):
        return 0
    if t.data == "member_dot_arg" and len(t.children) > 2 and str(t.children[1]) in MACROS:
        target, args = t.children[0], t.children[2]
        parts = args.children if isinstance(args, lark.Tree) else []
        s = _schema_of(target, env)
        n = _size(s)
        var = _var(parts[0]) if parts else None
        elem: dict[str, Any] | None = None
        if s is not None:
            elem = schema_dict(s.get("items")) if (s.get("type") == "array" or "items" in s) else {"type": "string"}
        inner = dict(env)
        if var:
            inner[var] = elem
        body = sum(_cost(p, inner) for p in parts[1:])
        return 1 + _cost(target, env) + n * (body + 1)
    return 1 + sum(_cost(c, env) for c in t.children)


def _var(t: Any) -> str | None:
    while isinstance(t, lark.Tree):
        if t.data == "ident":
            return str(t.children[0])
        if len(t.children) != 1:
            return None
        t = t.children[0]
    return None


# --------------------------------------------------------------------------- evaluation

class _Stop(Exception):
    """The cost budget ran out: no further rule runs."""


def validate_rules(obj: Any, schema: dict[str, Any] | None, old: Any = None, path: str = "") -> list[Cause]:
    """Evaluate every rule of `schema` over `obj` (`old`: the stored object on update, else None)."""
    out: list[Cause] = []
    if not isinstance(schema, dict):
        return out
    try:
        _walk(obj, old, schema, path, out, correlated=old is not None, root=not path)
    except _Stop:
        pass
    return out


def _walk(x: Any, old: Any, s: dict[str, Any], path: str, out: list[Cause], *, correlated: bool,
          root: bool = False) -> None:
    if x is None:
        return
    if _rules(s):
        old_value = old if correlated else None
        if root:
            # At the resource root `self.metadata` holds only name and generateName (kube's
            # WithTypeAndObjectMeta): rules cannot read labels, uid, resourceVersion...
            x_cel, old_value = _root_view(x), _root_view(old_value)
        else:
            x_cel = x
        _run(x_cel, old_value, s, path, out, has_old=correlated and old is not None)
    if isinstance(x, dict):
        props = properties(s)
        addl = schema_dict(s.get("additionalProperties"))
        old_map = old if isinstance(old, dict) and correlated else None
        atomic = s.get("x-kubernetes-map-type") == "atomic"
        for k in sorted(x):
            sub = schema_dict(props[k]) if k in props else addl
            if sub is None:
                continue
            sub_path = child(path, k) if k in props else key(path, k)
            corr = old_map is not None and k in old_map and not (atomic and k in props)
            _walk(x[k], old_map.get(k) if corr and old_map else None, sub, sub_path, out, correlated=corr)
    elif isinstance(x, list):
        items = schema_dict(s.get("items"))
        if items is None:
            return
        keys = s.get("x-kubernetes-list-map-keys")
        olds: dict[str, Any] = {}
        if s.get("x-kubernetes-list-type") == "map" and isinstance(keys, list) and isinstance(old, list) and correlated:
            for o in old:
                if isinstance(o, dict):
                    olds[_map_key(o, keys)] = o
        for i, v in enumerate(x):
            k = _map_key(v, keys) if olds and isinstance(v, dict) else None
            _walk(v, olds.get(k) if k is not None else None, items, index(path, i), out,
                  correlated=k is not None and k in olds)


def _root_view(obj: Any) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return obj
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "generateName")}
    return {**obj, "metadata": meta}


def _map_key(item: dict[str, Any], keys: list[Any]) -> str:
    return json.dumps([item.get(k) for k in keys if isinstance(k, str)], sort_keys=True)


def _message(rule: dict[str, Any]) -> str:
    msg = rule.get("message")
    if isinstance(msg, str) and msg:
        return msg.strip()
    return f"failed rule: {_rule_string(rule)}"


def _rule_string(rule: dict[str, Any]) -> str:
    msg = rule.get("message")
    if isinstance(msg, str) and msg:
        return msg.strip()
    return str(rule.get("rule", "")).strip()


def _run(x: Any, old: Any, s: dict[str, Any], path: str, out: list[Cause], *, has_old: bool) -> None:
    value_type = s.get("type") if isinstance(s.get("type"), str) else ""
    where = path or "<nil>"  # kube validates the root with a nil path
    activation: dict[str, Any] | None = None
    for rule in _rules(s):
        text = rule.get("rule")
        if not isinstance(text, str) or not text.strip():
            continue
        try:
            program = cel.compile(text, VARIABLES)
        except cel.CompileError as e:
            out.append(invalid(where, value_type, f"rule compile error: {e}"))
            continue
        if uses_old_self(program) and not has_old:
            continue  # a transition rule: only on update, with a correlated old value
        if activation is None:
            activation = cel.to_activation({"self": x, "oldSelf": old})
        try:
            result = cel.evaluate(program, activation)
        except cel.EvalError as e:
            err = str(e)
            if err.startswith(cel.COST_EXCEEDED):
                out.append(invalid(where, value_type, f"'{err}': no further validation rules will be run due to call "
                                                     f"cost exceeds limit for rule: {_rule_string(rule)}"))
                raise _Stop from None
            if err.startswith("no such overload") or err.startswith("no matching overload"):
                out.append(invalid(where, value_type, f"'{err}': call arguments did not match a supported operator, "
                                                     f"function or macro signature for rule: {_rule_string(rule)}"))
            else:
                out.append(invalid(where, value_type, f"{err} evaluating rule: {_rule_string(rule)}"))
            continue
        if result is True or (type(result).__name__ == "BoolType" and bool(result)):
            continue
        detail = _message_expression(rule, activation) or _message(rule)
        fpath = where
        fp = rule.get("fieldPath")
        if isinstance(fp, str) and fp.strip():
            rel = resolve_field_path(fp.strip(), s)
            if rel:
                fpath = f"{path}.{rel}" if path and not rel.startswith("[") else f"{path}{rel}"
        out.append(_reason_error(rule.get("reason"), fpath, value_type, detail))


def _message_expression(rule: dict[str, Any], activation: dict[str, Any]) -> str | None:
    mexpr = rule.get("messageExpression")
    if not isinstance(mexpr, str) or not mexpr.strip():
        return None
    try:
        out = cel.evaluate(cel.compile(mexpr, VARIABLES), activation)
    except (cel.CompileError, cel.EvalError):
        return None
    if isinstance(out, str) and out.strip() and "\n" not in out.strip() and len(out) <= 5120:
        return str(out).strip()
    return None


def _reason_error(reason: Any, path: str, value: str, detail: str) -> Cause:
    if reason == "FieldValueForbidden":
        return forbidden(path, detail)
    if reason == "FieldValueRequired":
        return required(path, detail)
    if reason == "FieldValueDuplicate":
        return duplicate(path, value)
    return invalid(path, value, detail)


def rules_exist(schema: Any) -> bool:
    """Whether `schema` declares any rule (callers skip the walk otherwise)."""
    return isinstance(schema, dict) and any(_rules(s) for s, *_ in _nodes(schema, "", 1, None))


