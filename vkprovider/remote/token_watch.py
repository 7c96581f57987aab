"""`TokenSecretWatch`: watches of this consumer's token Secrets in the twin namespaces, so that a
Secret the provider writes or edits can be judged at once rather than at the next listing.

Owns: one list+watch (`gpufed.kube.watch`) per followed twin namespace, selecting the token Secrets
this consumer labels (`forge.tokens.TOKEN_FOR_POD_LABEL`, `ORIGIN_CLUSTER_LABEL`), started and
stopped as `follow` is told the namespaces; every event (listed, added, modified, deleted) handed
to `on_secret`, without the Secret's `data` (the tokens: neither held in the watch's cache nor
handed on, so a watched Secret costs its metadata only); a watch that fails (the namespace is gone,
the provider refuses) is logged and started again after `retry_s`, while its namespace is still
followed; `close` stops them all.

Does not: judge a Secret, issue tokens or keep a schedule (`vkprovider.remote.tokens.PodTokens`,
whose periodic listing stays the safety net), or decide which namespaces are twins (its caller).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from vkprovider.forge.tokens import TOKEN_FOR_POD_LABEL

#: Seconds before a failed watch of one namespace is started again.
RETRY_S = 5.0

OnSecret = Callable[[str, dict[str, Any]], None]


class TokenSecretWatch:
    def __init__(self, api: Any, consumer: str, on_secret: OnSecret, *, retry_s: float = RETRY_S) -> None:
        self.api = api
        self.consumer = consumer
        self.on_secret = on_secret
        self.retry_s = retry_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._log = structlog.get_logger().bind(component="pod-tokens", consumer=consumer)

    @property
    def namespaces(self) -> frozenset[str]:
        return frozenset(self._tasks)

    def follow(self, namespaces: Iterable[str]) -> None:
        """Watch exactly `namespaces` from now on (in the running event loop)."""
        wanted = set(namespaces)
        for namespace in [n for n in self._tasks if n not in wanted]:
            self._tasks.pop(namespace).cancel()
        for namespace in wanted - self._tasks.keys():
            self._tasks[namespace] = asyncio.get_running_loop().create_task(self._watch(namespace))

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _watch(self, namespace: str) -> None:
        selector = f"{TOKEN_FOR_POD_LABEL},{ORIGIN_CLUSTER_LABEL}={self.consumer}"
        while True:
            try:
                await watch(
                    self.api,
                    rest.path("v1", "secrets", namespace=namespace),
                    self.on_secret,
                    what=f"token secrets in {namespace}",
                    params={"labelSelector": selector},
                    drop=("data",),  # the tokens themselves: judged by metadata, never held here
                )
            except KubeError as e:
                self._log.warning("cannot watch token secrets; retrying", namespace=namespace, error=str(e))
            except Exception as e:  # a handler's bug must not end the others' watches; logged, retried
                self._log.error("token secret watch failed; retrying", namespace=namespace, error=repr(e))
            await asyncio.sleep(self.retry_s)
