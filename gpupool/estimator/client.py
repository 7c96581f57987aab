"""The consumer's side of a provider's capacity estimator.

Owns: `EstimatorClient` (one gRPC channel over mutual TLS: the estimator's own certificate as the
only trusted CA, the consumer's client certificate from its provider kubeconfig as identity),
calls with deadlines, the Watch stream with an idle limit, and `from_provider`, which finds the
estimator through ConfigMap gpufed/gpufed-estimator on the provider (`endpoint`, `ca.crt`).

Invariants: callers see `gpupool.capacity` values and `EstimatorError` only — no protobuf types,
no grpc exceptions; every error names the endpoint and says what failed; keys are never logged.

Does not: retry or reconnect (the caller decides: a failed `watch` is re-opened, usually after
re-reading the ConfigMap with `from_provider`, since the estimator's certificate may have changed).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncGenerator, Mapping
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio

from gpufed.apis.wire import ESTIMATOR_CONFIGMAP, SYSTEM_NAMESPACE
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpupool.capacity import Placement, PodShape, Snapshot
from gpupool.estimator import estimator_pb2 as pb
from gpupool.estimator import wire

#: Seconds a unary call may take.
DEFAULT_TIMEOUT_S = 5.0
#: Seconds a Watch stream may stay silent (the estimator sends a heartbeat every 10 s by default).
DEFAULT_WATCH_IDLE_S = 60.0


class EstimatorError(GpufedError):
    """A call to the estimator failed; `code` is the gRPC status name ("" when none applies)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class EstimatorClient:
    """Calls one provider's estimator; `close()` (or `async with`) when done."""

    def __init__(
        self,
        endpoint: str,
        ca_pem: bytes,
        cert_pem: bytes,
        key_pem: bytes,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._credentials = grpc.ssl_channel_credentials(
            root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
        )
        self._chan: grpc.aio.Channel | None = None

    def _channel(self) -> grpc.aio.Channel:
        # Created on first use, inside the event loop that will drive it.
        if self._chan is None:
            self._chan = grpc.aio.secure_channel(self.endpoint, self._credentials)
        return self._chan

    def _error(self, e: grpc.aio.AioRpcError, what: str) -> EstimatorError:
        code = e.code()
        details = e.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            why = f"no answer within {self.timeout_s:g} s"
        elif code == grpc.StatusCode.UNAVAILABLE:
            why = (
                "not reachable, or the TLS handshake failed (a client certificate this provider did not "
                f"issue, or an outdated ca.crt): {details}"
            )
        elif code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            why = f"refused: {details}"
        else:
            why = f"{code.name}: {details}"
        return EstimatorError(f"capacity estimator at {self.endpoint}: {what} failed: {why}", code=code.name)

    async def get_capacity(self) -> Snapshot:
        call = self._channel().unary_unary(
            wire.GET_CAPACITY,
            request_serializer=pb.CapacityRequest.SerializeToString,
            response_deserializer=pb.Snapshot.FromString,
        )
        try:
            return wire.snapshot_from_pb(await call(pb.CapacityRequest(), timeout=self.timeout_s))
        except grpc.aio.AioRpcError as e:
            raise self._error(e, "GetCapacity") from None

    async def can_place(self, shape: PodShape) -> Placement:
        call = self._channel().unary_unary(
            wire.CAN_PLACE,
            request_serializer=pb.PodShape.SerializeToString,
            response_deserializer=pb.Placement.FromString,
        )
        try:
            return wire.placement_from_pb(await call(wire.shape_to_pb(shape), timeout=self.timeout_s))
        except grpc.aio.AioRpcError as e:
            raise self._error(e, "CanPlace") from None

    async def max_replicas(self, shape: PodShape) -> tuple[int, str]:
        call = self._channel().unary_unary(
            wire.MAX_REPLICAS,
            request_serializer=pb.PodShape.SerializeToString,
            response_deserializer=pb.Replicas.FromString,
        )
        try:
            return wire.replicas_from_pb(await call(wire.shape_to_pb(shape), timeout=self.timeout_s))
        except grpc.aio.AioRpcError as e:
            raise self._error(e, "MaxReplicas") from None

    async def watch(self, *, idle_timeout_s: float = DEFAULT_WATCH_IDLE_S) -> AsyncGenerator[Snapshot, None]:
        """Snapshots as the estimator sends them: the current one, then one per change, and
        heartbeats (same revision, newer `observed_at`). Never ends normally: raises EstimatorError
        when the stream fails, ends, or says nothing for `idle_timeout_s`."""
        method = self._channel().unary_stream(
            wire.WATCH,
            request_serializer=pb.WatchRequest.SerializeToString,
            response_deserializer=pb.Snapshot.FromString,
        )
        call = method(pb.WatchRequest())
        stream = call.__aiter__()
        try:
            while True:
                try:
                    async with asyncio.timeout(idle_timeout_s):
                        msg = await anext(stream)
                except StopAsyncIteration:
                    raise EstimatorError(
                        f"capacity estimator at {self.endpoint}: Watch ended by the server", code="CANCELLED"
                    ) from None
                except TimeoutError:
                    raise EstimatorError(
                        f"capacity estimator at {self.endpoint}: Watch failed: "
                        f"no snapshot or heartbeat for {idle_timeout_s:g} s",
                        code="DEADLINE_EXCEEDED",
                    ) from None
                except grpc.aio.AioRpcError as e:
                    raise self._error(e, "Watch") from None
                yield wire.snapshot_from_pb(msg)
        finally:
            call.cancel()

    async def close(self) -> None:
        if self._chan is not None:
            chan, self._chan = self._chan, None
            await chan.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _user_credentials(kubeconfig: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of the kubeconfig's current user (or its only user)."""
    users = {u.get("name"): u.get("user") or {} for u in kubeconfig.get("users") or [] if isinstance(u, Mapping)}
    contexts = {
        c.get("name"): c.get("context") or {} for c in kubeconfig.get("contexts") or [] if isinstance(c, Mapping)
    }
    current = contexts.get(kubeconfig.get("current-context"), {})
    user = users.get(current.get("user")) if current else None
    if user is None and len(users) == 1:
        user = next(iter(users.values()))
    cert, key = (user or {}).get("client-certificate-data"), (user or {}).get("client-key-data")
    if not cert or not key:
        raise EstimatorError(
            "the provider kubeconfig's user has no client certificate and key (client-certificate-data, "
            "client-key-data): the estimator accepts only the consumer's certificate"
        )
    try:
        return base64.b64decode(str(cert), validate=True), base64.b64decode(str(key), validate=True)
    except (binascii.Error, ValueError) as e:
        raise EstimatorError(f"the provider kubeconfig's client certificate or key is not base64: {e}") from e


async def from_provider(
    remote_api: Any, kubeconfig: Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> EstimatorClient | None:
    """A client for the estimator a provider publishes (ConfigMap gpufed/gpufed-estimator, read
    with `remote_api`), identified by the client certificate of `kubeconfig` (the consumer's
    credentials for that provider). None when the provider publishes no estimator (no ConfigMap,
    or none this consumer may read); EstimatorError when it cannot be read or is incomplete."""
    path_ = rest.path("v1", "configmaps", ESTIMATOR_CONFIGMAP, namespace=SYSTEM_NAMESPACE)
    try:
        cm = await rest.get(remote_api, path_)
    except KubeError as e:
        if e.forbidden:
            return None  # a provider without the estimator's RBAC does not offer one
        raise EstimatorError(f"cannot read the provider's estimator ConfigMap: {e}") from e
    if cm is None:
        return None
    data = cm.get("data") or {}
    endpoint, ca = str(data.get("endpoint") or ""), str(data.get("ca.crt") or "")
    if not endpoint or not ca:
        raise EstimatorError(
            f"ConfigMap {SYSTEM_NAMESPACE}/{ESTIMATOR_CONFIGMAP} on the provider lacks "
            f"{' and '.join(k for k, v in (('endpoint', endpoint), ('ca.crt', ca)) if not v)}"
        )
    cert, key = _user_credentials(kubeconfig)
    return EstimatorClient(endpoint, ca.encode(), cert, key, timeout_s=timeout_s)


__all__ = ["DEFAULT_TIMEOUT_S", "DEFAULT_WATCH_IDLE_S", "EstimatorClient", "EstimatorError", "from_provider"]
