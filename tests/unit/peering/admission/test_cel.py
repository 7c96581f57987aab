"""The CEL building blocks both admission policies share (peering.admission.cel)."""

from __future__ import annotations

from peering.admission.cel import literal


def test_cel_string_literals_are_escaped() -> None:
    assert literal("the provider's") == "'the provider\\'s'"
    assert literal("a\\b") == "'a\\\\b'"
