"""The `world` fixture: a running `RemoteProvider` between two fake API servers (`worlds`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.vkprovider.remote.worlds import World, world_of


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with world_of() as w:
        yield w
