"""Label and field selectors, and the label key/value syntax rules.

Label selectors come in two spellings that must mean the same thing: the
query-string form (`?labelSelector=app=web,tier in (a,b),!canary`) parsed by
`parse_label_selector`, and the API form inside objects
(`{matchLabels, matchExpressions}`) read by `label_selector_from_dict`.  Both
produce a `LabelSelector`, whose `str()` is the canonical string form
(requirements sorted by key, set values sorted) that kube-apiserver prints,
e.g. in a Scale subresource's `status.selector`.

Field selectors (`?fieldSelector=spec.nodeName=n1,status.phase!=Failed`)
compare the string form of the value at a dotted path; which paths a kind
accepts is the kind's business, so the parser takes an `allowed` predicate.

Error messages follow kube-apiserver's wording because kubectl shows them to
the user verbatim.  Everything here is pure.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.api.errors import BadRequest

# --------------------------------------------------------------------------
# Label key / value syntax
# --------------------------------------------------------------------------

_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_NAME_RE = re.compile(f"^{_NAME_FMT}$")
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_DNS1123_SUBDOMAIN_RE = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}$")
_VALUE_RE = re.compile(f"^({_NAME_FMT})?$")

_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
    "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    f"validation is '{_NAME_FMT}')"
)
_PREFIX_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    f"used for validation is '{_DNS1123_SUBDOMAIN_FMT}')"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    f"'my_value',  or '12345', regex used for validation is '({_NAME_FMT})?')"
)


def validate_label_key(key: str) -> str | None:
    """Why `key` is not a valid label key (a qualified name), or None if it is."""
    if not isinstance(key, str):
        return "label key must be a string"
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "prefix part must be non-empty"
        if len(prefix) > 253:
            return "prefix part must be no more than 253 characters"
        if not _DNS1123_SUBDOMAIN_RE.match(prefix):
            return "prefix part " + _PREFIX_MSG
    else:
        return ("a qualified name " + _NAME_MSG
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')")
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _NAME_RE.match(name):
        return "name part " + _NAME_MSG
    return None


def validate_label_value(value: str) -> str | None:
    """Why `value` is not a valid label value, or None if it is."""
    if not isinstance(value, str):
        return "label value must be a string"
    if len(value) > 63:
        return "must be no more than 63 characters"
    if not _VALUE_RE.match(value):
        return _VALUE_MSG
    return None


# --------------------------------------------------------------------------
# Label selectors
# --------------------------------------------------------------------------

# Operator spellings are those of k8s.io/apimachinery/pkg/selection.
EQUALS, DOUBLE_EQUALS, NOT_EQUALS = "=", "==", "!="
IN, NOT_IN = "in", "notin"
EXISTS, DOES_NOT_EXIST = "exists", "!"
GREATER_THAN, LESS_THAN = "gt", "lt"

_SET_OPS = (IN, NOT_IN)
_EXPRESSION_OPS = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}


@dataclass(frozen=True)
class Requirement:
    """One `key op values` term; `values` is sorted and de-duplicated for set operators."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        op = self.operator
        present = self.key in labels
        value = labels.get(self.key)
        if op in (EQUALS, DOUBLE_EQUALS, IN):
            return present and value in self.values
        if op in (NOT_EQUALS, NOT_IN):
            # Kubernetes: an object without the key satisfies `!=` and `notin`.
            return not present or value not in self.values
        if op == EXISTS:
            return present
        if op == DOES_NOT_EXIST:
            return not present
        if op in (GREATER_THAN, LESS_THAN):
            try:
                have = int(value) if present else None
            except ValueError:
                return False
            if have is None:
                return False
            bound = int(self.values[0])
            return have > bound if op == GREATER_THAN else have < bound
        raise ValueError(f"unknown operator {op!r}")

    def __str__(self) -> str:
        op = self.operator
        if op == EXISTS:
            return self.key
        if op == DOES_NOT_EXIST:
            return "!" + self.key
        if op in _SET_OPS:
            return f"{self.key} {op} ({','.join(self.values)})"
        symbol = {GREATER_THAN: ">", LESS_THAN: "<"}.get(op, op)
        return f"{self.key}{symbol}{self.values[0]}"


def _requirement(key: str, operator: str, values: Iterable[str]) -> Requirement:
    """Build a validated requirement (kube's `labels.NewRequirement`)."""
    vals = list(values)
    problem = validate_label_key(key)
    if problem:
        raise BadRequest(f'unable to parse requirement: key: Invalid value: "{key}": {problem}')
    if operator in _SET_OPS:
        if not vals:
            raise BadRequest("unable to parse requirement: values: Invalid value: null: "
                             "for 'in', 'notin' operators, values set can't be empty")
    elif operator in (EQUALS, DOUBLE_EQUALS, NOT_EQUALS):
        if len(vals) != 1:
            raise BadRequest("unable to parse requirement: values: Invalid value: "
                             f"{vals!r}: exact-match compatibility requires one single value")
    elif operator in (EXISTS, DOES_NOT_EXIST):
        if vals:
            raise BadRequest("unable to parse requirement: values: Invalid value: "
                             f"{vals!r}: values set must be empty for exists and does not exist")
    elif operator in (GREATER_THAN, LESS_THAN):
        if len(vals) != 1 or not re.fullmatch(r"-?\d+", vals[0]):
            raise BadRequest("unable to parse requirement: values: Invalid value: "
                             f"{vals!r}: for 'Gt', 'Lt' operators, the value must be an integer")
        return Requirement(key, operator, tuple(vals))
    else:
        raise BadRequest(f'unable to parse requirement: operator: Unsupported value: "{operator}"')
    for i, v in enumerate(vals):
        problem = validate_label_value(v)
        if problem:
            raise BadRequest(f'unable to parse requirement: values[{i}][{key}]: '
                             f'Invalid value: "{v}": {problem}')
    if operator in _SET_OPS:
        vals = sorted(set(vals))
    return Requirement(key, operator, tuple(vals))


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements; `nothing` is the selector that matches no object.

    The empty selector matches everything; `nothing` exists because a nil
    `LabelSelector` in an API object means "select nothing" upstream.
    """

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    @classmethod
    def of(cls, requirements: Iterable[Requirement]) -> LabelSelector:
        # Sorted by key (stable) like upstream, so equal selectors compare and print equal.
        return cls(tuple(sorted(requirements, key=lambda r: r.key)))

    def matches(self, labels: dict[str, str] | None) -> bool:
        if self.nothing:
            return False
        # A stored object may predate typed validation: labels that are not a
        # map match as no labels, never as an error.
        labels = labels if isinstance(labels, dict) else {}
        return all(r.matches(labels) for r in self.requirements)

    def empty(self) -> bool:
        """True when the selector matches every object."""
        return not self.nothing and not self.requirements

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


# Tokens of the string syntax.  Identifiers are maximal runs of anything that
# is not whitespace or one of the operator characters, as in kube's lexer.
_TOKEN_RE = re.compile(r"\s*(!=|==|=|!|,|\(|\)|>|<|[^\s!=,()<>]+)")
_OPERATOR_TOKENS = {"=": EQUALS, "==": DOUBLE_EQUALS, "!=": NOT_EQUALS, "in": IN,
                    "notin": NOT_IN, ">": GREATER_THAN, "<": LESS_THAN}
_SPECIAL = {"!=", "==", "=", "!", ",", "(", ")", ">", "<"}


class _Lexer:
    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN_RE.match(text, pos)
            if m is None:  # only trailing whitespace is left
                break
            self.tokens.append(m.group(1))
            pos = m.end()
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def next(self) -> str | None:
        tok = self.peek()
        self.pos += 1
        return tok


def _syntax_error(found: str | None, expected: str) -> BadRequest:
    shown = "" if found is None else found
    return BadRequest(f"unable to parse requirement: found '{shown}', expected: {expected}")


def _is_identifier(tok: str | None) -> bool:
    return tok is not None and tok not in _SPECIAL


def parse_label_selector(text: str) -> LabelSelector:
    """Parse the string form (`a=b,c!=d,e in (f,g),h,!i`); "" selects everything."""
    lex = _Lexer(text or "")
    reqs: list[Requirement] = []
    if lex.peek() is None:
        return LabelSelector()
    while True:
        reqs.append(_parse_requirement(lex))
        tok = lex.next()
        if tok is None:
            break
        if tok != ",":
            raise _syntax_error(tok, "',' or 'end of string'")
        if lex.peek() is None:
            raise _syntax_error(None, "identifier after ','")
    return LabelSelector.of(reqs)


def _parse_requirement(lex: _Lexer) -> Requirement:
    negated = False
    if lex.peek() == "!":
        lex.next()
        negated = True
    key = lex.next()
    if not _is_identifier(key) or key in (IN, NOT_IN):
        raise _syntax_error(key, "identifier")
    assert key is not None
    if lex.peek() in (None, ","):
        return _requirement(key, DOES_NOT_EXIST if negated else EXISTS, [])
    if negated:
        raise _syntax_error(lex.peek(), "',' or 'end of string'")
    tok = lex.next()
    operator = _OPERATOR_TOKENS.get(tok or "")
    if operator is None:
        raise _syntax_error(tok, "[!=, <, =, ==, >, in, notin]")
    if operator in _SET_OPS:
        return _requirement(key, operator, _parse_value_set(lex))
    # A missing value (`a=` at the end or before a comma) is the empty string.
    if lex.peek() in (None, ","):
        return _requirement(key, operator, [""])
    value = lex.next()
    if not _is_identifier(value):
        raise _syntax_error(value, "identifier")
    assert value is not None
    return _requirement(key, operator, [value])


def _parse_value_set(lex: _Lexer) -> list[str]:
    tok = lex.next()
    if tok != "(":
        raise _syntax_error(tok, "'('")
    values: list[str] = []
    expect_value = True
    while True:
        tok = lex.next()
        if tok == ")":
            # "()" and "(a,)" carry an empty value, as upstream: `k in ()`
            # is how the set {""} prints, so it must parse back to it.
            if expect_value:
                values.append("")
            return values
        if tok == ",":
            if expect_value:
                values.append("")  # "(,a)" or "(a,,b)"
            expect_value = True
        elif _is_identifier(tok) and expect_value:
            assert tok is not None
            values.append(tok)
            expect_value = False
        else:
            raise _syntax_error(tok, "',' or ')'")


def label_selector_from_dict(sel: dict[str, Any] | None) -> LabelSelector:
    """The API form (`matchLabels` + `matchExpressions`); None selects nothing, {} everything."""
    if sel is None:
        return LabelSelector(nothing=True)
    if not isinstance(sel, dict):
        raise BadRequest(f"invalid label selector: {sel!r}")
    reqs: list[Requirement] = []
    match_labels = sel.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        raise BadRequest("invalid label selector: matchLabels must be a map")
    for key, value in match_labels.items():
        reqs.append(_requirement(key, EQUALS, [value]))
    exprs = sel.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise BadRequest("invalid label selector: matchExpressions must be a list")
    for expr in exprs:
        if not isinstance(expr, dict):
            raise BadRequest(f"invalid label selector: bad matchExpressions entry {expr!r}")
        op = expr.get("operator", "")
        operator = _EXPRESSION_OPS.get(op) if isinstance(op, str) else None
        if operator is None:
            raise BadRequest(f'"{expr.get("operator")}" is not a valid label selector operator')
        values = expr.get("values") or []
        if not isinstance(values, list):
            raise BadRequest(f"invalid label selector: values of {expr.get('key', '')!r} must be a list")
        reqs.append(_requirement(expr.get("key", ""), operator, values))
    return LabelSelector.of(reqs)


def label_selector_to_string(sel: dict[str, Any]) -> str:
    """Canonical string form of an API label selector (`app=web,tier in (a,b)`)."""
    return str(label_selector_from_dict(sel))


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> LabelSelector:
    return label_selector_from_dict(json.loads(text))


def parsed_label_selector(sel: Any) -> LabelSelector:
    """`label_selector_from_dict`, memoized on the selector's JSON: controllers and
    admission test the same few selectors against every pod event."""
    if sel is None:
        return LabelSelector(nothing=True)
    try:
        text = json.dumps(sel, sort_keys=True)
    except (TypeError, ValueError):
        raise BadRequest(f"invalid label selector: {sel!r}") from None
    return _parsed(text)


def selector_dict_matches(sel: Any, labels: Mapping[str, str] | None) -> bool:
    """Whether the API LabelSelector `sel` (matchLabels + matchExpressions) selects `labels`.

    None selects nothing and {} everything (metav1.LabelSelectorAsSelector).  A
    selector that does not parse selects nothing, as Kubernetes' controllers and
    eviction skip a selector LabelSelectorAsSelector refuses.
    """
    try:
        parsed = parsed_label_selector(sel)
    except BadRequest:
        return False
    return parsed.matches(dict(labels) if isinstance(labels, Mapping) else None)


def set_selector_matches(sel: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    """labels.SelectorFromSet(sel).Matches(labels): every key of the map selector `sel`
    (a Service's or ReplicationController's `spec.selector`) has its value in `labels`.
    An empty map selects everything; callers decide what a missing selector means."""
    labels = labels if isinstance(labels, Mapping) else {}
    return all(labels.get(k) == v for k, v in sel.items())


# --------------------------------------------------------------------------
# Field selectors
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    operator: str  # "=", "==" or "!="
    value: str

    def matches(self, obj: dict[str, Any]) -> bool:
        equal = field_value_string(obj, self.path) == self.value
        return not equal if self.operator == NOT_EQUALS else equal

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
        return f"{self.path}{self.operator}{escaped}"


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: dict[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    def empty(self) -> bool:
        return not self.requirements

    def exact_value(self, path: str) -> str | None:
        """The value `path` must equal, if the selector pins it with `=`/`==`."""
        for r in self.requirements:
            if r.path == path and r.operator != NOT_EQUALS:
                return r.value
        return None

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def field_value_string(obj: dict[str, Any], path: str) -> str:
    """The string a field selector compares: missing → "", booleans as true/false."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return ""
        cur = cur[part]
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, buf, escaped = [], [], False
    for ch in text:
        if escaped:
            buf.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    if escaped:
        buf.append("\\")
    parts.append("".join(buf))
    return parts


def _unescape_value(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise BadRequest(f"invalid field selector: invalid escape sequence in {value!r}")
            out.append(value[i + 1])
            i += 2
            continue
        if ch in ",=":
            raise BadRequest(
                f"invalid field selector: unescaped {ch!r} in value {value!r}")
        out.append(ch)
        i += 1
    return "".join(out)


def parse_field_selector(text: str, allowed: Callable[[str], bool]) -> FieldSelector:
    """Parse `path=value,path!=value`; paths must satisfy `allowed`."""
    if not text:
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for term in _split_unescaped(text, ","):
        # As upstream, the first operator occurrence splits the term; the left
        # side has no escaping, the right side may escape `\`, `,` and `=`.
        for i in range(len(term)):
            op = next((o for o in ("!=", "==", "=") if term.startswith(o, i)), None)
            if op is not None:
                path, raw = term[:i].strip(), term[i + len(op):]
                break
        else:
            raise BadRequest(f"invalid selector: '{text}'; can't understand '{term}'")
        if not path:
            raise BadRequest(f"invalid selector: '{text}'; can't understand '{term}'")
        if not allowed(path):
            raise BadRequest(f'"{path}" is not a known field selector: '
                             'only "metadata.name", "metadata.namespace"')
        reqs.append(FieldRequirement(path, op, _unescape_value(raw)))
    return FieldSelector(tuple(reqs))
