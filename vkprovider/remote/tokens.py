"""`PodTokens`: consumer-issued service-account tokens for offloaded pods, kept fresh in the twin namespace.

Owns, for one consumer and one provider:
- the pod's token Secret `gpufed-token-<pod>` in its twin namespace (layout in
  vkprovider.forge.tokens; its tokens issued and its writes made by `remote.token_issue`): its
  tokens are requested before the twin is created (`prepare`), and it is written right after, owned
  by the twin (`ensure`: created in one request when no Secret of that name is known, server-side
  applied when refreshed), so the provider's garbage collector removes it with the twin; never
  written over an object of that name that this consumer did not create (`NameCollision`; the
  tokens asked for a create that found the name taken are dropped, written nowhere); `missing`
  says when a twin's Secret must be written again (it was not listed);
- refreshing: `run` rebuilds its schedule from the token Secrets of the twin namespaces every
  `resync_s` (so a restarted process resumes) and watches them (`remote.token_watch`): a Secret
  the provider writes or edits (a resourceVersion this process did not write or list) is judged at
  once, once per Secret between two listings (a provider that keeps editing one gets no more
  TokenRequests than the listing gave it; one it deletes is written again after the next listing,
  as before); it re-issues each pod's tokens once
  `refresh_fraction` of their lifetime has passed or they are 24 h old (the kubelet's rule). The
  provider stores those Secrets, so what they say is only a claim: a refresh reads the LOCAL pod
  they name and requests exactly what that pod's spec asks for (its service account, its projected
  token sources' audiences, their lifetimes capped at `forge.tokens.MAX_EXPIRATION_S`), never what
  the Secret's annotations say. A Secret that is not the token Secret of a pod of the namespace the
  consumer mapped to that twin namespace, bound to this provider's nodes, gets no token at all;
  one whose annotations differ from the pod's spec gets the pod's own tokens. Both are reported
  (a log line, which says whether a watch event or a listing brought the Secret,
  `gpufed_token_secrets_refused_total{remote_cluster,reason}`, and where the pod is
  known a Warning Event `TokenSecretRefused` on it, offered to the bounded `EventRelay`: a flood of
  such Secrets costs at most the relay's queue, what it cannot take is counted as dropped there,
  never a task per report), each once per Secret and reason (remembered for at most
  `MAX_REPORTED` reports). A Secret whose bound pod is gone on the consumer is deleted (UID
  precondition), without any TokenRequest;
- `forget`: when a pod's twin goes, its token Secret leaves the schedule; one that no twin owns (a
  Secret written before Secrets were owned) is deleted.

Construction takes the collaborators: the two API clients and `events`, the `EventRelay` of this
provider's Events on consumer objects, which its owner runs (None: a relay of its own, with the
default limits, run by `run`).

Never logs, and never puts into an error message, a token: only names, namespaces and API messages.

Does not: create or delete twins or decide when (vkprovider.remote.provider and vkprovider.node do),
or rewrite the twin's spec (forge.pods.remote_pod with the `PodIdentity` `ensure` returns).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from prometheus_client import Counter

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from vkprovider.forge import meta
from vkprovider.forge import tokens as tf
from vkprovider.node.provider import ProviderError
from vkprovider.remote.events_relay import EventRelay
from vkprovider.remote.token_issue import PodGoneError, TokenIssuer, provider_refusal, token_refused
from vkprovider.remote.token_watch import TokenSecretWatch

#: Refresh once this fraction of a token's lifetime has passed (the kubelet's 80%).
DEFAULT_REFRESH_FRACTION = tf.DEFAULT_REFRESH_FRACTION
#: Seconds between two listings of the token Secrets (schedule rebuilt, failed refreshes retried).
DEFAULT_RESYNC_S = 60.0
#: Shortest sleep (s) of the refresh loop when a refresh is due sooner (never a busy loop).
MIN_SLEEP_S = 0.005
COMPONENT = "gpufed-virtual-kubelet"
#: Reason of the Warning Event on a pod whose token Secret on the provider was refused or corrected.
REFUSED_REASON = "TokenSecretRefused"
#: Reports remembered as made (beyond: forgotten; a repeated report is harmless).
MAX_REPORTED = 10_000

TOKEN_SECRETS_REFUSED = Counter(
    "gpufed_token_secrets_refused_total",
    "Token Secrets on a provider whose claims the consumer did not follow (no token issued for them, "
    "or the pod's own tokens issued instead), by why.",
    ["remote_cluster", "reason"],
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class TokenSettings:
    #: Address of the CONSUMER's API server as offloaded pods reach it (KUBERNETES_SERVICE_HOST).
    api_host: str
    #: Its port (KUBERNETES_SERVICE_PORT).
    api_port: int
    #: Fraction (0..1) of a token's lifetime after which it is re-issued.
    refresh_fraction: float = DEFAULT_REFRESH_FRACTION
    #: Seconds between two listings of the token Secrets.
    resync_s: float = DEFAULT_RESYNC_S


Key = tuple[str, str]  # (twin namespace, Secret name)


@dataclass
class _Entry:
    state: tf.TokenSecretState
    #: Write generation: entries written while a resync listed are kept over the (older) listing.
    gen: int
    #: The Secret's resourceVersion as written or read here ("": unknown): a watch event with it is no news.
    rv: str = ""
    #: A refresh failed: not tried again before the next resync.
    failed: bool = False


class PodTokens:
    def __init__(
        self,
        local_api: Any,
        remote_api: Any,
        consumer: str,
        settings: TokenSettings,
        *,
        clock: Callable[[], datetime] = _utcnow,
        provider: str = "",
        events: EventRelay | None = None,
    ) -> None:
        self.local = local_api
        self.remote = remote_api
        self.consumer = consumer
        self.settings = settings
        self.clock = clock
        self.provider = provider
        #: Where the Warning Events about refused Secrets go (bounded, rate-limited).
        self.events = events if events is not None else EventRelay(local_api, provider, COMPONENT)
        #: Whether `run` runs the relay (it is this object's own, not its owner's).
        self._runs_events = events is None
        #: twin namespace -> the local namespace the consumer maps to it (from `run`'s mapping, and
        #: learned from `ensure`, whose caller decided it).
        self._local_ns: dict[str, str] = {}
        self._learned_ns: dict[str, str] = {}
        #: Whether a local pod is bound to this provider's nodes (None: not checked).
        self._owns_pod: Callable[[Mapping[str, Any]], bool] | None = None
        #: (twin namespace, Secret name) -> the resourceVersion of that Secret last refused (reported once).
        self._refused: dict[Key, str] = {}
        #: (key, reason, message) already reported.
        self._reported: set[tuple[Key, str, str]] = set()
        #: Set once the first pass of `run` (listing + due refreshes) is done.
        self.ready = asyncio.Event()
        self._issuer = TokenIssuer(local_api, remote_api, clock=clock)
        self._schedule: dict[Key, _Entry] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self._gen = 0
        #: Set when the refresh loop has something to look at before its next due time.
        self._wake = asyncio.Event()
        #: Secrets a watch event had judged since the last listing (at most once each in between).
        self._prompted: set[Key] = set()
        #: Secrets a watch event prompted a judgement of that has not been made yet (what a refusal's
        #: log line calls found_by "watch"; kept across a listing, which may judge them first).
        self._via_watch: set[Key] = set()
        #: Twin namespaces `ensure` woke the loop for, to be watched, since the last listing (once each).
        self._to_watch: set[str] = set()
        self._watches = TokenSecretWatch(remote_api, consumer, self.seen)
        self._log = structlog.get_logger().bind(component="pod-tokens", consumer=consumer)

    # ---- pods

    def identity(self, pod: Mapping[str, Any]) -> tf.PodIdentity | None:
        """The identity `forge.pods.remote_pod` needs for `pod`; None when it mounts no token."""
        if not tf.token_sources(pod):
            return None
        name = str((pod.get("metadata") or {}).get("name", ""))
        return tf.PodIdentity(tf.token_secret_name(name), self.settings.api_host, self.settings.api_port)

    def missing(self, pod: Mapping[str, Any], target: meta.Target) -> bool:
        """Whether `pod` mounts a token whose Secret the last listing did not find and nothing wrote
        since (False until the first listing is done): its twin exists, so `ensure` it."""
        identity = self.identity(pod)
        if identity is None or not self.ready.is_set():
            return False
        return (target.namespace, identity.secret_name) not in self._schedule

    async def prepare(self, pod: Mapping[str, Any], target: meta.Target) -> dict[str, Any] | None:
        """The token Secret of a pod whose Secret is not known here (a new pod), with fresh tokens and
        written nowhere: `ensure` writes it once the twin exists, so a pod the consumer refuses a
        token gets no twin. None when the pod mounts no token or its Secret is known. ProviderError
        as `ensure`."""
        identity = self.identity(pod)
        if identity is None or (target.namespace, identity.secret_name) in self._schedule:
            return None
        try:
            return await self._issuer.secret(tf.binding_of(pod, target, identity), None)
        except PodGoneError as e:
            raise token_refused(e) from e

    async def ensure(
        self,
        pod: Mapping[str, Any],
        target: meta.Target,
        *,
        owner: Mapping[str, Any] | None = None,
        prepared: Mapping[str, Any] | None = None,
    ) -> tf.PodIdentity | None:
        """Make the token Secret of `pod` in `target.namespace` hold fresh tokens; its identity.

        `owner`: the twin, which the Secret then names as its owner (the provider's garbage collector
        removes the Secret with it); `prepared`: what `prepare` returned for this pod, written as it
        is when no Secret of that name is known. Tokens not yet due are not requested again.
        ProviderError: `NameCollision` (a Secret of that name not created by this consumer, left
        alone), `TokenRequestFailed` (the consumer refused, with its message), `ConsumerUnavailable`,
        `ReferenceNotFound` (no `kube-root-ca.crt` on the consumer), `ProviderUnavailable`/`ProviderFailed`.
        """
        identity = self.identity(pod)
        if identity is None:
            return None
        binding = tf.binding_of(pod, target, identity)
        key = (target.namespace, identity.secret_name)
        self._learned_ns[target.namespace] = binding.pod_namespace
        if target.namespace not in self._watches.namespaces and target.namespace not in self._to_watch:
            self._to_watch.add(target.namespace)
            self._wake.set()  # a namespace to watch (the loop reads the twin namespaces again)
        owners = [tf.twin_owner_reference(owner)] if owner is not None else []
        async with self._lock(key):
            if key not in self._schedule:
                # No Secret of that name is known here (a new pod): created at once rather than read
                # first; one that exists after all (a conflict) is read and judged below.
                try:
                    created = await self._issuer.create(binding, owners, prepared)
                except PodGoneError as e:
                    raise token_refused(e) from e
                if created is not None:
                    self._remember_applied(key, created)
                    return identity
            url = rest.path("v1", "secrets", identity.secret_name, namespace=target.namespace)
            try:
                existing = await rest.get(self.remote, url)
            except KubeError as e:
                raise provider_refusal(e, f"cannot read Secret {target.namespace}/{identity.secret_name}") from e
            if existing is not None and not meta.owned_by(existing, self.consumer):
                raise ProviderError(
                    f"Secret {target.namespace}/{identity.secret_name} on the provider was not created by gpufed; "
                    "it is left alone and this pod cannot get its service-account token under that name",
                    reason="NameCollision",
                )
            state = tf.read_token_secret(existing) if existing is not None else None
            owned = owner is None or (state is not None and owners[0]["uid"] in state.owner_uids)
            if state is not None and state.binding == binding and owned and not state.due(self.clock(), self._fraction):
                self._remember(key, state, _rv(existing))
                return identity
            # The owners it has stay (the garbage collector drops those that are gone): a Secret of an
            # earlier pod of that name, rewritten for this one, is not removed with the earlier twin.
            kept = tf.pod_owner_references(existing) if existing is not None else []
            kept += [o for o in owners if o["uid"] not in {k["uid"] for k in kept}]
            try:
                applied = await self._issuer.apply(binding, fallback_ca=None, owners=kept)
            except PodGoneError as e:
                raise token_refused(e) from e
            self._remember_applied(key, applied)
        return identity

    async def forget(self, namespace: str, pod_name: str, twin_namespace: str, *, uid: str | None = None) -> None:
        """Delete the token Secret of pod `namespace/pod_name` (of the pod `uid` only, when given).

        A missing Secret is fine; one not created by this consumer (or for another pod) is left alone.
        ProviderError when the provider refuses or does not answer (the caller retries).
        """
        key = (twin_namespace, tf.token_secret_name(pod_name))
        async with self._lock(key):
            url = rest.path("v1", "secrets", key[1], namespace=twin_namespace)
            known = self._schedule.get(key)
            if known is not None and known.state.owner_uids and _is_pods(known.state, namespace, pod_name, uid):
                # Owned by its twin: the provider's garbage collector removes it with the twin.
                self._schedule.pop(key, None)
                self._drop_lock(key)
                return
            if known is not None and _is_pods(known.state, namespace, pod_name, uid):
                # The Secret this process wrote or listed as this consumer's: deleted at its UID in one
                # request; a conflict means another object holds the name now, judged below.
                try:
                    await rest.delete(
                        self.remote, url, uid=known.state.uid, what=f"delete token Secret {twin_namespace}/{key[1]}"
                    )
                except KubeError as e:
                    if not e.conflict:
                        raise provider_refusal(e, f"cannot delete Secret {twin_namespace}/{key[1]}") from e
                else:
                    self._log.debug("token secret deleted", namespace=twin_namespace, secret=key[1], pod=pod_name)
                    self._schedule.pop(key, None)
                    self._drop_lock(key)
                    return
            try:
                existing = await rest.get(self.remote, url)
            except KubeError as e:
                raise provider_refusal(e, f"cannot read Secret {twin_namespace}/{key[1]}") from e
            if existing is not None and tf.pod_owner_references(existing):
                self._log.debug("token secret left to the garbage collector", namespace=twin_namespace, secret=key[1])
            elif existing is not None:
                state = tf.read_token_secret(existing)
                same_pod = state is None or (state.binding.pod_namespace, state.binding.pod_name) == (
                    namespace,
                    pod_name,
                )
                if not (meta.owned_by(existing, self.consumer, uid) and same_pod):
                    self._log.info("token secret of another owner left alone", namespace=twin_namespace, secret=key[1])
                    return
                try:
                    await rest.delete(
                        self.remote,
                        url,
                        uid=str(existing["metadata"].get("uid") or "") or None,
                        what=f"delete token Secret {twin_namespace}/{key[1]}",
                    )
                except KubeError as e:
                    if not e.conflict:  # a conflict is the UID precondition: that Secret is already gone
                        raise provider_refusal(e, f"cannot delete Secret {twin_namespace}/{key[1]}") from e
                self._log.debug("token secret deleted", namespace=twin_namespace, secret=key[1], pod=pod_name)
            self._schedule.pop(key, None)
        self._drop_lock(key)

    # ---- refresh loop

    async def run(
        self,
        twin_namespaces: Callable[[], Mapping[str, str] | Iterable[str]],
        owns_pod: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        """Refresh token Secrets in the twin namespaces `twin_namespaces()` names; runs until cancelled.

        A Mapping names each twin namespace's local namespace (the consumer's decision); a plain list
        relies on what `ensure` was told. `owns_pod` says whether a local pod is bound to this
        provider (None: not checked). Runs the relay too when it is this object's own.
        """
        if not self._runs_events:
            await self._run(twin_namespaces, owns_pod)
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.events.run())
            await self._run(twin_namespaces, owns_pod)

    async def _run(
        self,
        twin_namespaces: Callable[[], Mapping[str, str] | Iterable[str]],
        owns_pod: Callable[[Mapping[str, Any]], bool] | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._owns_pod = owns_pod
        try:
            while True:
                try:
                    wanted = twin_namespaces()
                    self._local_ns = dict(wanted) if isinstance(wanted, Mapping) else {}
                    await self._resync(list(wanted))
                except Exception as e:  # never crash the loop: the next resync tries again
                    self._log.warning("cannot resync token secrets", error=str(e))
                deadline = loop.time() + self.settings.resync_s
                while True:
                    self._wake.clear()
                    self._watches.follow(twin_namespaces())
                    await self._refresh_due()
                    self.ready.set()
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(remaining, max(self._seconds_to_next_due(), MIN_SLEEP_S))):
                            await self._wake.wait()
        finally:
            await self._watches.close()

    def seen(self, kind: str, secret: dict[str, Any]) -> None:
        """A watch event about a token Secret in a twin namespace (`TokenSecretWatch`).

        One this process wrote or listed (same resourceVersion), or refused unchanged, is no news. Any
        other is taken into the schedule as a listing would take it, and the refresh loop woken: a
        Secret that is due (a planted or edited one claims so) is judged against its local pod at
        once, at most once per Secret until the next listing. Deletions wait for the listing (a
        provider deleting a Secret in a loop must not cost a TokenRequest each time).
        """
        if kind == "DELETED":
            return
        item_meta = secret.get("metadata") or {}
        key = (str(item_meta.get("namespace") or ""), str(item_meta.get("name") or ""))
        known = self._schedule.get(key)
        rv = _rv(secret)
        if (known is not None and known.rv == rv) or self._refused.get(key) == rv or key in self._prompted:
            return
        state = tf.read_token_secret(secret)
        if state is None or not meta.owned_by(secret, self.consumer):
            return  # the listing logs what it cannot read
        self._gen += 1
        self._schedule[key] = _Entry(state, self._gen, rv)
        if state.due(self.clock(), self._fraction):
            # What costs a TokenRequest: once per Secret until the listing. Only then is the loop
            # woken (each wake walks the schedule): one not due waits for its time like any other.
            self._prompted.add(key)
            self._via_watch.add(key)
            self._wake.set()

    async def _resync(self, namespaces: list[str]) -> None:
        start = self._gen
        self._prompted.clear()
        self._to_watch.clear()
        listed: dict[Key, _Entry] = {}
        ok: set[str] = set()
        selector = f"{tf.TOKEN_FOR_POD_LABEL},{ORIGIN_CLUSTER_LABEL}={self.consumer}"
        for namespace in namespaces:
            try:
                items = await rest.list_items(
                    self.remote, rest.path("v1", "secrets", namespace=namespace), params={"labelSelector": selector}
                )
            except KubeError as e:
                self._log.warning("cannot list token secrets; keeping the schedule", namespace=namespace, error=str(e))
                continue
            ok.add(namespace)
            for item in items:
                item_meta = item.get("metadata") or {}
                seen = self._refused.get((namespace, str(item_meta.get("name") or "")))
                if seen is not None and seen == str(item_meta.get("resourceVersion") or ""):
                    continue  # refused already, unchanged since
                state = tf.read_token_secret(item)
                if state is None or not meta.owned_by(item, self.consumer):
                    self._log.warning(
                        "unreadable token secret left alone",
                        namespace=namespace,
                        secret=(item.get("metadata") or {}).get("name"),
                    )
                    continue
                listed[(namespace, state.binding.secret_name)] = _Entry(state, start, _rv(item))
        wanted = set(namespaces)
        schedule: dict[Key, _Entry] = {}
        for key, entry in self._schedule.items():
            # Kept: namespaces that could not be listed, and what was written while listing.
            if key[0] in wanted and (key[0] not in ok or entry.gen > start):
                schedule[key] = entry
        for key, entry in listed.items():
            schedule.setdefault(key, entry)
        self._schedule = schedule
        self._refused = {k: v for k, v in self._refused.items() if k[0] in wanted}
        for key in list(self._locks):
            if key not in schedule and not self._locks[key].locked():
                del self._locks[key]
        self._via_watch &= schedule.keys()

    async def _refresh_due(self) -> None:
        now = self.clock()
        for key, entry in list(self._schedule.items()):
            if entry.failed or not entry.state.due(now, self._fraction):
                continue
            try:
                await self._refresh(key)
            except Exception as e:  # never crash the loop: retried on the next resync
                self._log.warning("token refresh failed; retrying later", namespace=key[0], secret=key[1], error=str(e))
                current = self._schedule.get(key)
                if current is not None:
                    current.failed = True

    async def _refresh(self, key: Key) -> None:
        try:
            await self._judge(key)
        finally:
            self._via_watch.discard(key)

    async def _judge(self, key: Key) -> None:
        """Read the Secret at `key` again; re-issue its tokens when due, from its local pod's spec."""
        async with self._lock(key):
            entry = self._schedule.get(key)
            if entry is None:
                return
            url = rest.path("v1", "secrets", key[1], namespace=key[0])
            existing = await rest.get(self.remote, url)  # the latest state: ensure may have refreshed it
            state = tf.read_token_secret(existing) if existing is not None else None
            if existing is None or state is None or not meta.owned_by(existing, self.consumer):
                self._schedule.pop(key, None)
                return
            if not state.due(self.clock(), self._fraction):
                self._remember(key, state, _rv(existing))
                return
            try:
                binding = await self._binding_from_pod(key, existing, state)
                if binding is None:
                    return
                applied = await self._issuer.apply(
                    binding, fallback_ca=tf.data_value(existing, tf.CA_KEY), owners=tf.pod_owner_references(existing)
                )
            except PodGoneError as gone:
                self._log.info(
                    "bound pod is gone on the consumer; deleting its token secret",
                    namespace=key[0],
                    secret=key[1],
                    pod=f"{state.binding.pod_namespace}/{state.binding.pod_name}",
                    reason=str(gone),
                )
                self._schedule.pop(key, None)  # before the delete: a failed one is listed again next resync
                with contextlib.suppress(KubeError):  # a conflict: replaced meanwhile; else next pass
                    await rest.delete(self.remote, url, uid=state.uid, what=f"delete token Secret {key[0]}/{key[1]}")
                return
            self._remember_applied(key, applied)
            self._log.info("tokens refreshed", namespace=key[0], secret=key[1], pod=state.binding.pod_name)

    # ---- what a Secret may obtain: only what its local pod asks for

    def _local_namespace(self, twin_namespace: str) -> str | None:
        return self._local_ns.get(twin_namespace) or self._learned_ns.get(twin_namespace)

    async def _binding_from_pod(
        self, key: Key, secret: Mapping[str, Any], state: tf.TokenSecretState
    ) -> tf.TokenBinding | None:
        """The binding to request for the token Secret at `key`, built from the LOCAL pod it names;
        None when the Secret gets no token (refused and reported). PodGoneError: the pod is gone."""
        claimed = state.binding
        local_ns = self._local_namespace(key[0])
        why = ""
        if local_ns is None:
            why = f"twin namespace {key[0]} is not the twin of any namespace offloaded to this provider"
        elif claimed.pod_namespace != local_ns:
            why = f"it names namespace {claimed.pod_namespace!r}, but {key[0]} is the twin of {local_ns}"
        elif not meta.is_dns_subdomain(claimed.pod_name) or tf.token_secret_name(claimed.pod_name) != key[1]:
            why = f"it is not the token Secret of pod {claimed.pod_name!r}"
        if why or local_ns is None:
            self._refuse(key, secret, "NotAPodsSecret", why, None)
            return None
        url = rest.path("v1", "pods", claimed.pod_name, namespace=local_ns)
        try:
            pod = await rest.get(self.local, url)
        except KubeError as e:
            reason = "ConsumerUnavailable" if e.transient else "TokenRequestFailed"
            raise ProviderError(f"cannot read pod {local_ns}/{claimed.pod_name}: {e}", reason=reason) from e
        if pod is None or str(pod["metadata"].get("uid") or "") != claimed.pod_uid:
            raise PodGoneError(f"pod {local_ns}/{claimed.pod_name} ({claimed.pod_uid}) is gone")
        if self._owns_pod is not None and not self._owns_pod(pod):
            # Not permanent: right after a restart a pool node may not be served yet. Tried again at
            # the next resync; reported once.
            why = f"pod {local_ns}/{claimed.pod_name} is not offloaded to this provider"
            entry = self._schedule.get(key)
            if entry is not None:
                entry.failed = True
            self._report(
                "NotOffloadedHere", f"token Secret {key[0]}/{key[1]} on the provider gets no token: {why}", pod, key
            )
            return None
        identity = tf.PodIdentity(key[1], self.settings.api_host, self.settings.api_port)
        binding = tf.binding_of(pod, meta.Target(self.consumer, "", key[0]), identity)
        if not binding.sources:
            self._refuse(key, secret, "NoTokenSources", f"pod {local_ns}/{claimed.pod_name} mounts no token", pod)
            return None
        if binding != claimed:
            self._report(
                "Tampered",
                f"token Secret {key[0]}/{key[1]} on the provider asks for other tokens than pod "
                f"{local_ns}/{claimed.pod_name}'s spec does (service account, audiences or lifetimes): "
                "the pod's own tokens are issued",
                pod,
                key,
                str((secret.get("metadata") or {}).get("resourceVersion") or ""),
            )
        return binding

    def _refuse(
        self, key: Key, secret: Mapping[str, Any], reason: str, why: str, pod: Mapping[str, Any] | None
    ) -> None:
        self._schedule.pop(key, None)
        self._refused[key] = str((secret.get("metadata") or {}).get("resourceVersion") or "")
        self._report(reason, f"token Secret {key[0]}/{key[1]} on the provider gets no token: {why}", pod, key)

    def _report(self, reason: str, message: str, pod: Mapping[str, Any] | None, key: Key, version: str = "") -> None:
        """Log, count and (with the pod) offer an Event to the relay, once per Secret, reason and
        `version`. Never blocks and starts nothing: what the relay cannot take it drops and counts."""
        seen = (key, reason, version or message)
        if seen in self._reported:
            return
        if len(self._reported) >= MAX_REPORTED:  # bounded: a repeated report is harmless
            self._reported.clear()
        self._reported.add(seen)
        TOKEN_SECRETS_REFUSED.labels(self.provider, reason).inc()
        # found_by: a watch event brought it ("watch"), or a listing did.
        found_by = "watch" if key in self._via_watch else "listing"
        self._log.warning(
            "token secret refused", namespace=key[0], secret=key[1], reason=reason, why=message, found_by=found_by
        )
        if pod is not None:
            self.events.offer(pod, type_="Warning", reason=REFUSED_REASON, message=message)

    # ---- schedule

    @property
    def _fraction(self) -> float:
        return self.settings.refresh_fraction

    def _lock(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def _drop_lock(self, key: Key) -> None:
        lock = self._locks.get(key)
        if lock is not None and not lock.locked() and key not in self._schedule:
            del self._locks[key]

    def _remember(self, key: Key, state: tf.TokenSecretState, rv: str) -> None:
        self._gen += 1
        self._schedule[key] = _Entry(state, self._gen, rv)
        if state.due(self.clock(), self._fraction):
            # Freshly issued yet already due (a clock skew, a server's very short token): wait for the
            # next resync rather than re-issuing in a tight loop.
            self._schedule[key].failed = True

    def _remember_applied(self, key: Key, applied: Mapping[str, Any]) -> None:
        state = tf.read_token_secret(applied)
        if state is not None:
            self._remember(key, state, _rv(applied))

    def _seconds_to_next_due(self) -> float:
        now = self.clock()
        waits = [
            (tf.refresh_at(e.state.issued_at, e.state.expires_at, self._fraction) - now).total_seconds()
            for e in self._schedule.values()
            if not e.failed and e.state.issued_at is not None and e.state.expires_at is not None
        ]
        return min(waits, default=self.settings.resync_s)

    def scheduled(self) -> dict[Key, datetime | None]:
        """(twin namespace, Secret name) -> when its tokens are due (None: at the next resync)."""
        out: dict[Key, datetime | None] = {}
        for key, entry in self._schedule.items():
            issued, expires = entry.state.issued_at, entry.state.expires_at
            known = issued is not None and expires is not None and not entry.failed
            out[key] = tf.refresh_at(issued, expires, self._fraction) if known and issued and expires else None
        return out


def _rv(secret: Mapping[str, Any] | None) -> str:
    return str(((secret or {}).get("metadata") or {}).get("resourceVersion") or "")


def _is_pods(state: tf.TokenSecretState, namespace: str, pod_name: str, uid: str | None) -> bool:
    """Whether a known token Secret is the one of pod `namespace/pod_name` (of the pod `uid`, when given)."""
    b = state.binding
    return bool(state.uid) and (b.pod_namespace, b.pod_name) == (namespace, pod_name) and uid in (None, b.pod_uid)
