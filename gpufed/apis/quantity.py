"""Kubernetes resource quantities (`resource.Quantity`) as exact numbers.

Owns: parsing the canonical quantity grammar ("500m", "1.5", "64Gi", "1e3", "2k") into `Decimal`,
and formatting a number back into a compact, round-tripping quantity string. kubernetes-asyncio
ships no parser, so this small one is written by hand; it follows the grammar of
k8s.io/apimachinery/pkg/api/resource (decimal SI suffixes, binary suffixes, decimal exponents).

Pure: no I/O.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

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
_GRAMMAR = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


#: Resources counted in bytes (beside `hugepages-*`); cpu is in cores, everything else in items.
_BYTE_RESOURCES = frozenset({"memory", "ephemeral-storage", "storage", "requests.storage"})


def resource_unit(resource: str) -> str:
    """The unit a resource's base amount counts, as kube-state-metrics names it: `core` (cpu), `byte`
    (memory, storage, huge pages) or `integer` (pods, GPUs, other devices)."""
    name = resource.removeprefix("requests.").removeprefix("limits.")
    if name == "cpu":
        return "core"
    if name in _BYTE_RESOURCES or name.startswith("hugepages-"):
        return "byte"
    return "integer"


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse(text: str | int) -> Decimal:
    """Parse a quantity: `parse("500m") == Decimal("0.5")`, `parse("1Gi") == 1073741824`."""
    if isinstance(text, int):
        return Decimal(text)
    if not isinstance(text, str):  # e.g. null or a float in a hand-written map: unreadable, not a crash
        raise QuantityError(f"{text!r} is not a quantity (a string such as 2, 500m, 64Gi or 1e3)")
    s = text.strip()
    m = _GRAMMAR.match(s)
    if not m:
        raise QuantityError(f"{text!r} is not a quantity (examples: 2, 500m, 64Gi, 1e3)")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as e:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"{text!r} is not a quantity") from e
    suffix = m.group(2) or ""
    try:
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix in _DECIMAL:
            return number * _DECIMAL[suffix]
        return number * (Decimal(10) ** int(suffix[1:]))
    except (ArithmeticError, ValueError):  # decimal.Overflow (e.g. "1e999999999"), or an exponent too long for int()
        raise QuantityError(f"{text!r} is out of range for a quantity") from None


def format_quantity(value: Decimal | int, *, binary: bool = False) -> str:
    """A compact quantity for `value`: integers as-is (or with the largest exact binary suffix
    when `binary`), fractions in milli-units when exact, else as a plain decimal."""
    v = Decimal(value)
    if v == v.to_integral_value():
        n = int(v)
        if binary and n:
            for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
                if n % factor == 0:
                    return f"{n // factor}{suffix}"
        return str(n)
    milli = v * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return format(v.normalize(), "f")
