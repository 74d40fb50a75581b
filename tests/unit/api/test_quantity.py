"""Quantity parsing: the apimachinery grammar, exact values, and rejections."""

from decimal import Decimal

import pytest

from fleet.api.quantity import QuantityError, int_value, is_quantity, milli_value, parse_quantity

VALID = [
    ("0", Decimal(0)),
    ("1", Decimal(1)),
    ("100m", Decimal("0.1")),
    ("1.5", Decimal("1.5")),
    ("0.5", Decimal("0.5")),
    (".5", Decimal("0.5")),
    ("1.", Decimal(1)),
    ("128Mi", Decimal(128 * 2**20)),
    ("1Ki", Decimal(1024)),
    ("1.5Gi", Decimal(3 * 2**29)),
    ("2Ti", Decimal(2 * 2**40)),
    ("1Pi", Decimal(2**50)),
    ("1Ei", Decimal(2**60)),
    ("1G", Decimal(10**9)),
    ("1k", Decimal(1000)),
    ("1M", Decimal(10**6)),
    ("1T", Decimal(10**12)),
    ("1P", Decimal(10**15)),
    ("1E", Decimal(10**18)),
    ("5n", Decimal("5e-9")),
    ("5u", Decimal("5e-6")),
    ("1e3", Decimal(1000)),
    ("1E3", Decimal(1000)),
    ("1e-3", Decimal("0.001")),
    ("1.5e+2", Decimal(150)),
    ("-1", Decimal(-1)),
    ("+2m", Decimal("0.002")),
    (3, Decimal(3)),
    (0.25, Decimal("0.25")),
]

INVALID = ["", " 1", "1 ", ".", "1.2.3", "1K", "1KB", "1Mb", "1e", "1.5e", "1i", "abc", "Mi", "1Gi1",
           "--1", "1e1000", "0x10", True, None, [1], float("nan")]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_parse_valid(text, expected):
    assert parse_quantity(text) == expected
    assert is_quantity(text)


@pytest.mark.parametrize("text", INVALID)
def test_parse_invalid(text):
    with pytest.raises(QuantityError, match="quantities must match the regular expression"):
        parse_quantity(text)
    assert not is_quantity(text)


def test_binary_float_arithmetic_stays_exact():
    # Decimal, not float: 100m + 200m is exactly 300m.
    assert parse_quantity("100m") + parse_quantity("200m") == parse_quantity("300m")


@pytest.mark.parametrize(("text", "millis", "units"), [
    ("100m", 100, 1), ("1", 1000, 1), ("1.5", 1500, 2), ("1n", 1, 1), ("1.5Ki", 1536000, 1536),
    ("0", 0, 0),
])
def test_milli_and_int_value_round_up(text, millis, units):
    assert milli_value(text) == millis
    assert int_value(text) == units
