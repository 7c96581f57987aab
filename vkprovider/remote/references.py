"""`ReferenceCopier`: the ConfigMaps and Secrets a pod needs, copied into its twin namespace before
its twin is created.

Owns: per reference of a pod (`forge.pods.references`), reading it from the consumer (from
reflection's watch when it holds the object, so a burst of pods naming the same ConfigMap reads
nothing), refusing it
when the reflection policy would remove the copy again (`gpufed.io/skip-reflection`, a namespace in
allow-list mode), and applying the same copy the ConfigMap/Secret reflector makes
(`forge.reflection`) — never over an object gpufed did not create — at most once per resourceVersion
of the local object, and not at all when reflection's watch of the copies holds one with the same
contents. A missing required reference, an unreadable one or a refused copy is a
`ProviderError` with a message for the user; a missing optional one is skipped.

Does not: keep copies up to date afterwards or delete them (the reflector does), or create twins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.contention import retry_contended
from vkprovider.forge import reflection
from vkprovider.forge.meta import Target, owned_by
from vkprovider.forge.pods import Reference
from vkprovider.node.provider import ProviderError
from vkprovider.remote.reflection_reports import LOCAL, REMOTE
from vkprovider.remote.refusals import refusal


class ReferenceCopier:
    """Copies of one consumer's ConfigMaps and Secrets at one provider."""

    def __init__(
        self,
        local_api: Any,
        remote_api: Any,
        consumer: str,
        provider: str,
        namespace_annotations: Callable[[str], Mapping[str, str]],
        held: Callable[[str, str, str, str], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.local = local_api
        self.remote = remote_api
        self.consumer = consumer
        self.provider = provider
        #: A local namespace's annotations (the reflection policy's allow-list mode).
        self.namespace_annotations = namespace_annotations
        #: (side, kind, local namespace, name) -> the object reflection's watches hold (None: read it).
        self.held = held or (lambda _side, _kind, _ns, _name: None)
        #: (twin namespace, kind, name) -> resourceVersion of the local object last copied there.
        self._copied: dict[tuple[str, str, str], str] = {}

    async def get_remote(self, url: str) -> dict[str, Any] | None:
        """The provider's object at `url` (None: there is none); errors as `ProviderError`."""
        try:
            return await rest.get(self.remote, url)
        except KubeError as e:
            raise refusal(e, f"cannot read from provider {self.provider}") from e

    async def copy(self, namespace: str, ref: Reference, target: Target) -> bool:
        """Make the copy of `ref` (of local `namespace`) exist in `target.namespace`; False when an
        optional reference names nothing (the pod starts without it, as on a kubelet).

        ProviderError with the kubelet's conventional reasons for what is missing
        (`MandatoryConfigMapNotFound`, `MandatorySecretNotFound`), `ReferenceUnreadable`,
        `ReferenceNotReflected`, `NameCollision`, or the provider's refusal."""
        plural = "configmaps" if ref.kind == "ConfigMap" else "secrets"
        local = self.held(LOCAL, ref.kind, namespace, ref.name)
        if local is None:  # not held: absent, or not seen yet (created a moment ago)
            try:
                local = await rest.get(self.local, rest.path("v1", plural, ref.name, namespace=namespace))
            except KubeError as e:
                raise ProviderError(
                    f"cannot read {ref.kind} {namespace}/{ref.name}: {e}", reason="ReferenceUnreadable"
                ) from e
        if local is None:
            if ref.optional:
                return False
            raise ProviderError(
                f'{ref.kind} "{ref.name}" not found in namespace {namespace}: the pod cannot start on '
                f"{self.provider} until it exists",
                reason=f"Mandatory{ref.kind}NotFound",
            )
        decision = reflection.policy(local, self.namespace_annotations(namespace))
        if decision.reason in ("Skipped", "NotAllowed"):  # the reflector would remove the copy again
            raise ProviderError(
                f"{ref.kind} {namespace}/{ref.name} is not reflected ({decision.message}): the pod needs it on "
                f"{self.provider} and cannot be offloaded without it",
                reason="ReferenceNotReflected",
            )
        rv = str(local["metadata"].get("resourceVersion"))
        cache_key = (target.namespace, ref.kind, ref.name)
        if self._copied.get(cache_key) == rv:
            return True
        # The same copy the Secret/ConfigMap reflector makes (the pod cannot wait for it).
        twin = (reflection.remote_config_map if ref.kind == "ConfigMap" else reflection.remote_secret)(local, target)
        if twin is None:
            return True
        url = rest.path("v1", plural, ref.name, namespace=target.namespace)
        held_copy = self.held(REMOTE, ref.kind, namespace, ref.name)
        if held_copy is not None and owned_by(held_copy, self.consumer) and _same_contents(held_copy, twin):
            self._copied[cache_key] = rv  # the reflector made this copy already
            return True
        existing = held_copy if held_copy is not None else await self.get_remote(url)
        if existing is not None and not owned_by(existing, self.consumer):
            raise ProviderError(
                f"{ref.kind} {target.namespace}/{ref.name} on {self.provider} was not created by gpufed; "
                "it is left alone",
                reason="NameCollision",
            )
        try:
            await retry_contended(lambda: rest.apply(self.remote, url, twin, what=f"copy {ref.kind} {ref.name}"))
        except KubeError as e:
            raise refusal(e, f"cannot copy {ref.kind} {ref.name} to {self.provider}") from e
        self._copied[cache_key] = rv
        return True


def _same_contents(copy: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether the provider's `copy` holds what the copy `want` would (what a pod mounts or reads)."""
    return all(copy.get(k) == want.get(k) for k in ("data", "binaryData", "type", "immutable"))
