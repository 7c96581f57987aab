"""An API client whose credentials can be replaced while it is in use.

Owns: `ReloadableClient`, which stands in for the current kubernetes-asyncio ApiClient (every
attribute it does not define itself, `call_api` and `configuration` among them, is the current
client's), and `swap`, which puts a new client in its place. Requests started after a swap use the
new client; the old one is closed once none of its connections is in use any more (requests and
streams that were in flight finish on it), and at the latest at its `retire_by` deadline (e.g. when
its certificate expires, after which the API server refuses it anyway). Attributes set on the
stand-in (the request budget of `gpufed.kube.budget`) stay with it across swaps.

Invariant: only the current client serves new requests; a retired client is closed exactly once.

Does not: read or watch credentials, or decide when to swap (the caller builds the new client with
`gpufed.kube.client.client_from_dict` and calls `swap`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

#: Seconds between checks whether a retired client still has connections in use.
DEFAULT_RETIRE_POLL_S = 1.0
#: Longest a retired client is kept for its in-flight requests when the caller names no deadline.
DEFAULT_RETIRE_MAX_S = 3600.0


def connections_in_use(api: Any) -> int:
    """Connections of `api`'s HTTP pool that are checked out (requests or streams in flight)."""
    session = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    connector = getattr(session, "connector", None)
    # aiohttp exposes no public count; `_acquired` is the set of connections handed to requests.
    acquired = getattr(connector, "_acquired", None)
    return len(acquired) if acquired is not None else 0


class ReloadableClient:
    """The current ApiClient of one set of credentials; `swap` replaces it without a restart."""

    def __init__(self, inner: Any, *, retire_poll_s: float = DEFAULT_RETIRE_POLL_S) -> None:
        self._inner = inner
        self._retire_poll_s = retire_poll_s
        self._retiring: dict[asyncio.Task[None], Any] = {}
        self._closed = False
        #: Number of swaps so far.
        self.generation = 0
        self._log = structlog.get_logger().bind(component="reloadable-client")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_inner") or name == "__setstate__":
            raise AttributeError(name)
        return getattr(self._inner, name)

    @property
    def current(self) -> Any:
        """The client new requests use."""
        return self._inner

    @property
    def retiring(self) -> int:
        """Old clients not closed yet (waiting for their in-flight requests)."""
        return len(self._retiring)

    def swap(self, new: Any, *, retire_by: float | None = None) -> None:
        """Make `new` the current client; close the old one when its connections are all released,
        at the latest at `retire_by` (a `time.time()` value; default: an hour from now)."""
        if self._closed:
            raise RuntimeError("swap on a closed client")
        old, self._inner = self._inner, new
        self.generation += 1
        deadline = retire_by if retire_by is not None else time.time() + DEFAULT_RETIRE_MAX_S
        task = asyncio.get_running_loop().create_task(self._retire(old, deadline))
        self._retiring[task] = old
        task.add_done_callback(lambda t: self._retiring.pop(t, None))

    async def _retire(self, old: Any, deadline: float) -> None:
        try:
            # aiohttp signals no release of a connection: the pool is looked at every `retire_poll_s`.
            while connections_in_use(old) > 0 and time.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(self._retire_poll_s)
        finally:
            await asyncio.shield(self._close_one(old))

    async def _close_one(self, api: Any) -> None:
        try:
            await api.close()
        except Exception as e:  # a client that fails to close is dropped all the same
            self._log.warning("old client did not close cleanly", error=type(e).__name__)

    async def close(self) -> None:
        """Close the current client and every retired one (in-flight requests on them end)."""
        self._closed = True
        tasks = list(self._retiring)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._close_one(self._inner)


__all__ = ["DEFAULT_RETIRE_MAX_S", "ReloadableClient", "connections_in_use"]
