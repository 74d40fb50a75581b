"""The Kubernetes CEL libraries Fleet provides, and JSON ↔ CEL values.

kube-apiserver's CEL environment adds to standard CEL the cel-go `ext.Strings`
library and Kubernetes' own (k8s.io/apiserver/pkg/cel/library): lists, regex,
quantity, URLs.  This module implements the functions users write most, with
cel-go's semantics and error words:

- strings: `lowerAscii`, `upperAscii`, `trim`, `split(sep[, n])`, `join([sep])`
  (on a list), `replace(old, new[, n])`, `substring(start[, end])`,
  `indexOf(s[, from])`, `lastIndexOf(s[, from])`, `charAt(i)`;
- lists: `isSorted()`, `sum()`, `min()`, `max()`, `indexOf(x)`, `lastIndexOf(x)`;
- regex: `find(re)`, `findAll(re[, n])` (`matches` is standard CEL);
- quantity: `quantity(s)`, `isQuantity(s)`, and on a quantity `isInteger()`,
  `asInteger()`, `asApproximateFloat()`, `sign()`, `add(q|int)`, `sub(q|int)`,
  `isGreaterThan(q)`, `isLessThan(q)`, `compareTo(q)`; `==` compares amounts;
- URLs: `url(s)`, `isURL(s)`, and `getScheme()`, `getHost()`, `getHostname()`,
  `getPort()`, `getEscapedPath()`, `getQuery()`;
- the authorizer (authz.py): `path`, `group`, `resource`, `subresource`,
  `namespace`, `name`, `serviceAccount`, `check`, `allowed`, `reason`, `errored`, `error`.

Not provided: the `format` string function, `ip`/`cidr`, sets
(`sets.contains`...), `base64`, `strings.quote`, two-variable comprehensions.

Functions return `CELEvalError` values for errors (celpy's convention, which keeps
`||`/`&&` short-circuiting over errors) and never raise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

import celpy
import re2
from celpy import celtypes
from celpy.evaluation import CELEvalError

from fleet.api.quantity import QuantityError, parse_quantity
from fleet.cel.authz import AUTHZ_FUNCTIONS

_Fn = Callable[..., Any]


def to_cel(value: Any) -> Any:
    """A JSON value as a CEL value (None stays null)."""
    return celpy.json_to_cel(value)


def to_json(value: Any) -> Any:
    """A CEL value as plain JSON-able Python (quantities and URLs as their strings)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, (celtypes.IntType, celtypes.UintType)):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, (Quantity, URL)):
        return str(value)
    return str(value)


def _err(message: str, cls: type = ValueError) -> CELEvalError:
    return CELEvalError(message, cls, ())


def _no_overload(name: str) -> CELEvalError:
    return CELEvalError(f"no such overload: {name}", TypeError, ())


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, (bool, celtypes.BoolType))


def _guard(name: str, fn: _Fn) -> _Fn:
    """Wrap `fn` so a wrong argument type is `no such overload`, not a Python error."""
    def call(*args: Any) -> Any:
        for a in args:
            if isinstance(a, CELEvalError):
                return a
        try:
            return fn(*args)
        except (TypeError, AttributeError, IndexError, ValueError):
            return _no_overload(name)
    call.__name__ = name
    return call


# --------------------------------------------------------------------------- strings

def _lower_ascii(s: Any) -> Any:
    if not _is_str(s):
        return _no_overload("lowerAscii")
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in s))


def _upper_ascii(s: Any) -> Any:
    if not _is_str(s):
        return _no_overload("upperAscii")
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in s))


def _trim(s: Any) -> Any:
    if not _is_str(s):
        return _no_overload("trim")
    return celtypes.StringType(s.strip())


def _split(s: Any, sep: Any, n: Any = None) -> Any:
    if not (_is_str(s) and _is_str(sep)) or (n is not None and not _is_int(n)):
        return _no_overload("split")
    if n is not None and n == 0:
        return celtypes.ListType()
    if sep == "":
        parts = list(s)
        if n is not None and n > 0 and len(parts) > n:
            parts = parts[:n - 1] + ["".join(parts[n - 1:])]
    else:
        parts = s.split(sep, n - 1) if n is not None and n > 0 else s.split(sep)
    return celtypes.ListType(celtypes.StringType(p) for p in parts)


def _join(lst: Any, sep: Any = "") -> Any:
    if not isinstance(lst, list) or not _is_str(sep) or not all(_is_str(x) for x in lst):
        return _no_overload("join")
    return celtypes.StringType(sep.join(lst))


def _replace(s: Any, old: Any, new: Any, n: Any = None) -> Any:
    if not (_is_str(s) and _is_str(old) and _is_str(new)) or (n is not None and not _is_int(n)):
        return _no_overload("replace")
    return celtypes.StringType(s.replace(old, new, -1 if n is None or n < 0 else int(n)))


def _substring(s: Any, start: Any, end: Any = None) -> Any:
    if not _is_str(s) or not _is_int(start) or (end is not None and not _is_int(end)):
        return _no_overload("substring")
    stop = len(s) if end is None else int(end)
    if start < 0 or start > len(s):
        return _err(f"index out of range: {start}", IndexError)
    if stop < 0 or stop > len(s):
        return _err(f"index out of range: {stop}", IndexError)
    if start > stop:
        return _err(f"invalid substring range. start: {start}, end: {stop}", IndexError)
    return celtypes.StringType(s[start:stop])


def _char_at(s: Any, i: Any) -> Any:
    if not _is_str(s) or not _is_int(i):
        return _no_overload("charAt")
    if i < 0 or i > len(s):
        return _err(f"index out of range: {i}", IndexError)
    return celtypes.StringType(s[i:i + 1])


def _index_of(x: Any, item: Any, offset: Any = None) -> Any:
    if isinstance(x, list):
        for i, e in enumerate(x):
            if type(e) is type(item) and e == item:
                return celtypes.IntType(i)
        return celtypes.IntType(-1)
    if not _is_str(x) or not _is_str(item) or (offset is not None and not _is_int(offset)):
        return _no_overload("indexOf")
    start = 0 if offset is None else int(offset)
    if start < 0 or start > len(x):
        return _err(f"index out of range: {start}", IndexError)
    return celtypes.IntType(x.find(item, start))


def _last_index_of(x: Any, item: Any, offset: Any = None) -> Any:
    if isinstance(x, list):
        for i in range(len(x) - 1, -1, -1):
            if type(x[i]) is type(item) and x[i] == item:
                return celtypes.IntType(i)
        return celtypes.IntType(-1)
    if not _is_str(x) or not _is_str(item) or (offset is not None and not _is_int(offset)):
        return _no_overload("lastIndexOf")
    if offset is None:
        return celtypes.IntType(x.rfind(item))
    if offset < 0 or offset >= max(len(x), 1):
        return _err(f"index out of range: {offset}", IndexError)
    return celtypes.IntType(x.rfind(item, 0, int(offset) + len(item)))


# --------------------------------------------------------------------------- lists

def _comparable(lst: list[Any]) -> bool:
    return bool(lst) and all(type(e) is type(lst[0]) for e in lst) and \
        isinstance(lst[0], (int, float, str, Quantity))


def _is_sorted(lst: Any) -> Any:
    if not isinstance(lst, list) or (lst and not _comparable(lst)):
        return _no_overload("isSorted")
    return celtypes.BoolType(all(lst[i] <= lst[i + 1] for i in range(len(lst) - 1)))


def _sum(lst: Any) -> Any:
    if not isinstance(lst, list) or (lst and not _comparable(lst)) or any(_is_str(e) for e in lst):
        return _no_overload("sum")
    if not lst:
        return celtypes.IntType(0)
    total = lst[0]
    for e in lst[1:]:
        total = total + e
    return total


def _max(lst: Any) -> Any:
    if not isinstance(lst, list) or (lst and not _comparable(lst)):
        return _no_overload("max")
    if not lst:
        return _err("max(list) argument must not be empty")
    return max(lst)


# --------------------------------------------------------------------------- regex

@functools.lru_cache(maxsize=512)
def _regex(pattern: str) -> Any:
    """RE2 (google-re2, which celpy's `matches` uses too): cel-go's syntax, linear time."""
    try:
        return re2.compile(pattern)
    except re2.error as e:
        return f"error parsing regexp: {e}"


def _find(s: Any, pattern: Any) -> Any:
    if not (_is_str(s) and _is_str(pattern)):
        return _no_overload("find")
    rx = _regex(str(pattern))
    if isinstance(rx, str):
        return _err(rx)
    m = rx.search(s)
    return celtypes.StringType(m.group(0) if m else "")


def _find_all(s: Any, pattern: Any, n: Any = None) -> Any:
    if not (_is_str(s) and _is_str(pattern)) or (n is not None and not _is_int(n)):
        return _no_overload("findAll")
    rx = _regex(str(pattern))
    if isinstance(rx, str):
        return _err(rx)
    out = []
    for m in rx.finditer(s):
        if n is not None and 0 <= n <= len(out):
            break
        out.append(celtypes.StringType(m.group(0)))
    return celtypes.ListType(out)


# --------------------------------------------------------------------------- quantity

class Quantity:
    """A Kubernetes quantity (`quantity('1.5Gi')`); compared by amount."""

    __slots__ = ("text", "amount")

    def __init__(self, text: str, amount: Decimal) -> None:
        self.text, self.amount = text, amount

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Quantity({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    # Ordering and + only between quantities (anything else: Python's TypeError, which
    # celpy reports as no such overload).
    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.amount < other.amount

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.amount <= other.amount

    def __add__(self, other: object) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        return _q(self.amount + other.amount)


def _q(amount: Decimal) -> Quantity:
    text = str(amount.normalize()) if amount == amount.to_integral_value() else str(amount)
    if "E" in text:
        text = format(amount, "f")
    return Quantity(text, amount)


def _quantity(s: Any) -> Any:
    if not _is_str(s):
        return _no_overload("quantity")
    try:
        return Quantity(str(s), parse_quantity(str(s)))
    except QuantityError:
        return _err("quantities must match the regular expression "
                    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


def _is_quantity(s: Any) -> Any:
    if not _is_str(s):
        return _no_overload("isQuantity")
    try:
        parse_quantity(str(s))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _qarg(x: Any, name: str) -> Quantity | CELEvalError:
    if isinstance(x, Quantity):
        return x
    if _is_int(x):
        return Quantity(str(int(x)), Decimal(int(x)))
    return _no_overload(name)


def _qmethod(name: str, fn: Callable[[Quantity, Quantity], Any]) -> _Fn:
    def call(q: Any, other: Any) -> Any:
        if not isinstance(q, Quantity):
            return _no_overload(name)
        o = _qarg(other, name)
        if isinstance(o, CELEvalError):
            return o
        return fn(q, o)
    return call


def _as_integer(q: Any) -> Any:
    if not isinstance(q, Quantity):
        return _no_overload("asInteger")
    if q.amount != q.amount.to_integral_value() or abs(q.amount) >= 2 ** 63:
        return _err("cannot convert value to integer")
    return celtypes.IntType(int(q.amount))


def _quantity_unary(name: str, fn: Callable[[Quantity], Any]) -> _Fn:
    def call(q: Any) -> Any:
        if not isinstance(q, Quantity):
            return _no_overload(name)
        try:
            return fn(q)
        except (InvalidOperation, OverflowError):
            return _err(f"{name}: value out of range")
    return call


def _sign(q: Quantity) -> Any:
    return celtypes.IntType((q.amount > 0) - (q.amount < 0))


# --------------------------------------------------------------------------- URLs

class URL:
    """A parsed absolute URL or absolute path (`url('https://x/y')`)."""

    __slots__ = ("text", "parts")

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts = urlsplit(text)

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URL) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)


def _parse_url(s: str) -> URL | None:
    try:
        u = URL(s)
        _ = u.parts.port
    except ValueError:
        return None
    if not (u.parts.scheme and u.parts.netloc) and not s.startswith("/"):
        return None
    return u


def _url(s: Any) -> Any:
    if not _is_str(s):
        return _no_overload("url")
    u = _parse_url(str(s))
    return u if u is not None else _err(f"URL parse error during conversion from string: {s}")


def _is_url(s: Any) -> Any:
    if not _is_str(s):
        return _no_overload("isURL")
    return celtypes.BoolType(_parse_url(str(s)) is not None)


def _url_part(name: str, fn: Callable[[URL], str]) -> _Fn:
    def call(u: Any) -> Any:
        if not isinstance(u, URL):
            return _no_overload(name)
        return celtypes.StringType(fn(u))
    return call


def _host(u: URL) -> str:
    return u.parts.netloc.rpartition("@")[2]


def _hostname(u: URL) -> str:
    h = _host(u)
    if h.startswith("["):
        return h[1:h.index("]")] if "]" in h else h
    return h.rpartition(":")[0] if ":" in h else h


def _port(u: URL) -> str:
    h = _host(u)
    if h.startswith("["):
        rest = h[h.index("]") + 1:] if "]" in h else ""
        return rest[1:] if rest.startswith(":") else ""
    return h.rpartition(":")[2] if ":" in h else ""


def _get_query(u: Any) -> Any:
    if not isinstance(u, URL):
        return _no_overload("getQuery")
    from urllib.parse import parse_qs
    q = parse_qs(u.parts.query, keep_blank_values=True)
    return celtypes.MapType({celtypes.StringType(k): celtypes.ListType(celtypes.StringType(x) for x in v)
                             for k, v in q.items()})


FUNCTIONS: dict[str, _Fn] = {name: _guard(name, fn) for name, fn in {
    # authorizer (k8s library.Authz), fleet/cel/authz.py
    **AUTHZ_FUNCTIONS,
    # strings (cel-go ext.Strings)
    "lowerAscii": _lower_ascii, "upperAscii": _upper_ascii, "trim": _trim, "split": _split,
    "join": _join, "replace": _replace, "substring": _substring, "charAt": _char_at,
    "indexOf": _index_of, "lastIndexOf": _last_index_of,
    # lists (k8s library.Lists; `min` is celpy's own macro)
    "isSorted": _is_sorted, "sum": _sum, "max": _max,
    # regex (k8s library.Regex)
    "find": _find, "findAll": _find_all,
    # quantity (k8s library.Quantity)
    "quantity": _quantity, "isQuantity": _is_quantity,
    "isInteger": _quantity_unary("isInteger", lambda q: celtypes.BoolType(q.amount == q.amount.to_integral_value())),
    "asInteger": _as_integer,
    "asApproximateFloat": _quantity_unary("asApproximateFloat", lambda q: celtypes.DoubleType(float(q.amount))),
    "sign": _quantity_unary("sign", _sign),
    "add": _qmethod("add", lambda a, b: _q(a.amount + b.amount)),
    "sub": _qmethod("sub", lambda a, b: _q(a.amount - b.amount)),
    "isGreaterThan": _qmethod("isGreaterThan", lambda a, b: celtypes.BoolType(a.amount > b.amount)),
    "isLessThan": _qmethod("isLessThan", lambda a, b: celtypes.BoolType(a.amount < b.amount)),
    "compareTo": _qmethod("compareTo", lambda a, b: celtypes.IntType((a.amount > b.amount) - (a.amount < b.amount))),
    # URLs (k8s library.URLs)
    "url": _url, "isURL": _is_url,
    "getScheme": _url_part("getScheme", lambda u: u.parts.scheme),
    "getHost": _url_part("getHost", _host),
    "getHostname": _url_part("getHostname", _hostname),
    "getPort": _url_part("getPort", _port),
    "getEscapedPath": _url_part("getEscapedPath", lambda u: u.parts.path),
    "getQuery": _get_query,
}.items()}
