"""`TokenIssuer`: the consumer-issued tokens of one pod's token Secret, and that Secret's writes at the provider.

Owns, for one consumer and one provider:
- per token source of a binding (vkprovider.forge.tokens) a TokenRequest to the CONSUMER's API
  server for the pod's service account, bound to the local pod (name and UID), so the consumer
  revokes the token when the pod goes; the requested lifetime bounds the refresh even if the
  server issues a longer-lived token;
- the consumer's CA from its `kube-root-ca.crt` ConfigMap: every namespace's holds the same cluster
  CA, so one read serves all pods for `CA_CACHE_S` (a rotated CA is picked up within it), one read
  at a time (the pods of a burst that all miss the cache share it);
- the token Secret's two writes in its twin namespace: `create` (one POST, never over an object
  that exists: None then) and `apply` (server-side apply, a refresh; the owners it must keep are
  named again);
- the errors these end in: `ProviderError` with the reason the pod controller reports
  (`TokenRequestFailed`, `ConsumerUnavailable`, `ReferenceNotFound`, `ReferenceUnreadable`,
  `ProviderUnavailable`, `ProviderFailed`), and `PodGoneError` when the consumer says the pod the
  tokens are bound to is gone.

Never logs, and never puts into an error message, a token: only names, namespaces and API messages.

Does not: decide when tokens are issued, what a token Secret on the provider may obtain, or keep
any schedule (vkprovider.remote.tokens); build the Secret's layout (vkprovider.forge.tokens).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.contention import contended, retry_contended
from gpufed.kube.times import time_or_none
from vkprovider.forge import meta
from vkprovider.forge import tokens as tf
from vkprovider.node.provider import ProviderError

#: Seconds the consumer's CA (from kube-root-ca.crt) is reused before it is read again.
CA_CACHE_S = 300.0


class PodGoneError(Exception):
    """The consumer says the pod the tokens are bound to no longer exists (or is another incarnation)."""


class TokenIssuer:
    """Issues tokens on the consumer (`local_api`) and writes token Secrets on the provider (`remote_api`)."""

    def __init__(self, local_api: Any, remote_api: Any, *, clock: Callable[[], datetime]) -> None:
        self.local = local_api
        self.remote = remote_api
        self.clock = clock
        #: (consumer CA PEM, monotonic time read) — see _consumer_ca.
        self._ca_cache: tuple[str, float] | None = None
        self._ca_lock = asyncio.Lock()

    async def secret(self, binding: tf.TokenBinding, fallback_ca: str | None) -> dict[str, Any]:
        """The token Secret of `binding` with fresh tokens (each requested) and the consumer's CA."""
        issued: dict[str, tf.IssuedToken] = {}
        for source in binding.sources:
            issued[source.key] = await self._request(binding, source)
        ca_pem = await self._consumer_ca(binding.pod_namespace, fallback_ca)
        return tf.secret_for(binding, issued, ca_pem)

    async def apply(
        self, binding: tf.TokenBinding, *, fallback_ca: str | None, owners: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Request every token of `binding`, read the consumer's CA, apply the Secret (owned by
        `owners`, which an apply must name again to keep them); the applied Secret."""
        body = tf.with_owners(await self.secret(binding, fallback_ca), owners)
        url = rest.path("v1", "secrets", binding.secret_name, namespace=binding.twin_namespace)
        try:
            return await retry_contended(
                lambda: rest.apply(
                    self.remote, url, body, what=f"apply token Secret {binding.twin_namespace}/{binding.secret_name}"
                )
            )
        except KubeError as e:
            raise provider_refusal(e, f"cannot write Secret {binding.twin_namespace}/{binding.secret_name}") from e

    async def create(
        self, binding: tf.TokenBinding, owners: list[dict[str, Any]], prepared: Mapping[str, Any] | None
    ) -> dict[str, Any] | None:
        """As `apply`, but the Secret is created (never written over an existing object, and with the
        field manager of the applies that refresh it later), from `prepared` when given: None when one
        exists already."""
        body = tf.with_owners(prepared if prepared is not None else await self.secret(binding, None), owners)
        where = f"{binding.twin_namespace}/{binding.secret_name}"
        try:
            return await retry_contended(
                lambda: rest.request(
                    self.remote,
                    "POST",
                    rest.path("v1", "secrets", namespace=binding.twin_namespace),
                    body=body,
                    params={"fieldManager": rest.FIELD_MANAGER},
                    what=f"create token Secret {where}",
                )
            )
        except KubeError as e:
            if e.conflict and not contended(e):  # AlreadyExists
                return None
            raise provider_refusal(e, f"cannot write Secret {where}") from e

    async def _request(self, binding: tf.TokenBinding, source: tf.TokenSource) -> tf.IssuedToken:
        url = rest.path("v1", "serviceaccounts", binding.service_account, namespace=binding.pod_namespace, sub="token")
        issued_at = self.clock()
        what = f"TokenRequest for pod {binding.pod_namespace}/{binding.pod_name} ({binding.service_account})"
        try:
            answer = await rest.request(self.local, "POST", url, body=tf.token_request(binding, source), what=what)
        except KubeError as e:
            if _pod_gone(e, binding):
                raise PodGoneError(str(e)) from e
            message = f"cannot get a service-account token from the consumer: {e}"
            reason = "ConsumerUnavailable" if e.transient else "TokenRequestFailed"
            raise ProviderError(message, reason=reason) from e
        status = answer.get("status") or {}
        token = status.get("token")
        if not isinstance(token, str) or not token:
            raise ProviderError(f"{what}: the consumer answered without a token", reason="TokenRequestFailed")
        # The requested lifetime bounds the refresh even if the server issues a longer-lived token.
        expires_at = issued_at + timedelta(seconds=source.expiration_seconds)
        answered = time_or_none(status.get("expirationTimestamp"))
        if answered is not None:
            expires_at = min(expires_at, answered)
        return tf.IssuedToken(token=token, issued_at=issued_at, expires_at=expires_at)

    async def _consumer_ca(self, namespace: str, fallback: str | None) -> str:
        # Every namespace's kube-root-ca.crt holds the same cluster CA: one read serves all pods for a
        # while instead of one more request per offloaded pod (a rotated CA is picked up within the TTL).
        # One read at a time: the pods of a burst that all miss the cache share it.
        async with self._ca_lock:
            cached = self._ca_cache
            if cached is not None and time.monotonic() - cached[1] < CA_CACHE_S:
                return cached[0]
            ca = await self._read_consumer_ca(namespace, fallback)
            self._ca_cache = (ca, time.monotonic())
            return ca

    async def _read_consumer_ca(self, namespace: str, fallback: str | None) -> str:
        url = rest.path("v1", "configmaps", meta.ROOT_CA_CONFIGMAP, namespace=namespace)
        try:
            config_map = await rest.get(self.local, url)
        except KubeError as e:
            if fallback is not None:
                return fallback
            reason = "ConsumerUnavailable" if e.transient else "ReferenceUnreadable"
            raise ProviderError(f"cannot read the consumer's CA: {e}", reason=reason) from e
        ca = ((config_map or {}).get("data") or {}).get(tf.CA_KEY)
        if isinstance(ca, str) and ca:
            return ca
        if fallback is not None:
            return fallback
        raise ProviderError(
            f'ConfigMap "{meta.ROOT_CA_CONFIGMAP}" (key {tf.CA_KEY}) not found in namespace {namespace}: '
            "the pod's service-account volume cannot be served",
            reason="ReferenceNotFound",
        )


def token_refused(e: Exception) -> ProviderError:
    return ProviderError(f"cannot get a service-account token from the consumer: {e}", reason="TokenRequestFailed")


def provider_refusal(e: KubeError, what: str) -> ProviderError:
    if e.transient:
        return ProviderError(f"{what}: {e}", reason="ProviderUnavailable")
    return ProviderError(f"{what}: {e}", reason="ProviderFailed")


def _pod_gone(e: KubeError, binding: tf.TokenBinding) -> bool:
    message = str(e)
    if e.status == 404:
        # A missing service account (or namespace-less request) is not a missing pod: keep the Secret.
        return 'serviceaccounts "' not in message
    return 400 <= e.status < 500 and bool(binding.pod_uid) and binding.pod_uid in message
