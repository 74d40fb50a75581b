"""Kubernetes resource quantities (`100m`, `1.5`, `128Mi`, `1G`, `1e3`) as exact Decimals.

Quantities appear in container requests/limits, node capacity, quota and
limit ranges.  Validation needs to know whether a string is a quantity and
compare two of them; the scheduler and the agent need the number of
milli-CPUs or bytes.  Binary floating point would make `0.1 + 0.2 > 0.3`
style comparisons lie about fit, so everything is a `decimal.Decimal` with
enough precision that no valid Kubernetes quantity is ever rounded.

The grammar is apimachinery's `resource.ParseQuantity`:

    <quantity>  ::= <signedNumber><suffix>
    <suffix>    ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>  ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI> ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

JSON numbers (`cpu: 1`, `cpu: 0.5`) are accepted too, because the wire form of
an unquoted YAML number is a JSON number and Kubernetes accepts it.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, localcontext

# Kubernetes' own error text for an unparseable quantity (what kubectl shows).
QUANTITY_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# A number is digits with at most one '.', and at least one digit somewhere
# ("1.", ".5" and "1.5" are fine, "." and "1.2.3" are not).
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)")
_EXPONENT = re.compile(r"[eE][+-]?[0-9]+")
# Exponents beyond this are not quantities anyone means; bounding them keeps a
# hostile "1e999999999" from turning into a huge Decimal computation.
_MAX_EXPONENT = 100
_PRECISION = 80


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a quantity exactly; raise `QuantityError` when it is not one."""
    if isinstance(value, bool):
        raise QuantityError(QUANTITY_ERROR)
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(QUANTITY_ERROR)
        # str() gives the shortest repr, so 0.1 is Decimal("0.1"), not its binary expansion.
        return Decimal(str(value))
    if not isinstance(value, str):
        raise QuantityError(QUANTITY_ERROR)
    m = _NUMBER.match(value)
    if m is None:
        raise QuantityError(QUANTITY_ERROR)
    number = Decimal(m.group(0))
    suffix = value[m.end():]
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix in _DECIMAL:
            return number * _DECIMAL[suffix]
        if _EXPONENT.fullmatch(suffix):
            exp = int(suffix[1:])
            if abs(exp) > _MAX_EXPONENT:
                raise QuantityError(QUANTITY_ERROR)
            return number.scaleb(exp)
    raise QuantityError(QUANTITY_ERROR)


def is_quantity(value: object) -> bool:
    try:
        parse_quantity(value)  # type: ignore[arg-type]
    except QuantityError:
        return False
    return True


def milli_value(value: str | int | float | Decimal) -> int:
    """The quantity in thousandths, rounded up (apimachinery's MilliValue): `100m` -> 100."""
    q = value if isinstance(value, Decimal) else parse_quantity(value)
    return math.ceil(q * 1000)


def int_value(value: str | int | float | Decimal) -> int:
    """The quantity as an integer, rounded up (apimachinery's Value): `1.5Ki` -> 1536."""
    q = value if isinstance(value, Decimal) else parse_quantity(value)
    return math.ceil(q)
