"""Kubernetes quantity parsing and formatting."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpufed.apis.quantity import QuantityError, format_quantity, parse


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("81559Mi", Decimal(81559 * 2**20)),
        ("1k", Decimal(1000)),
        ("1e3", Decimal(1000)),
        ("2E", Decimal("2e18")),
        ("1E2", Decimal(100)),
        ("100n", Decimal("1e-7")),
        (".5", Decimal("0.5")),
        ("+3", Decimal(3)),
        ("-1", Decimal(-1)),
        (7, Decimal(7)),
        (" 4 ", Decimal(4)),
    ],
)
def test_parse(text: str | int, value: Decimal) -> None:
    assert parse(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "5 Gi", "Gi", "1KiB", "1e", "0x10", "--1", "1ki"])
def test_parse_refuses_garbage(text: str) -> None:
    with pytest.raises(QuantityError, match="not a quantity"):
        parse(text)


@pytest.mark.parametrize(
    ("value", "binary", "text"),
    [
        (Decimal(8), False, "8"),
        (Decimal("0.5"), False, "500m"),
        (Decimal(64 * 2**30), True, "64Gi"),
        (Decimal(1536 * 2**20), True, "1536Mi"),
        (Decimal(1000), True, "1000"),
        (Decimal("0.0001"), False, "0.0001"),
        (Decimal(0), True, "0"),
    ],
)
def test_format_round_trips(value: Decimal, binary: bool, text: str) -> None:
    assert format_quantity(value, binary=binary) == text
    assert parse(text) == value
