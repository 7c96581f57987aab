"""Unit-test isolation: a test that configures logging (the CLI's tests do) must not leave structlog
writing to a stream pytest has closed since."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()
