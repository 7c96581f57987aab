"""Token forge: a consumer-issued service-account identity for an offloaded pod, as plain API dicts.

Owns: which projected service-account tokens a pod asks for (`token_sources`, keyed `token-0`,
`token-1`, ... in volume/source order), the rewrite of the twin's spec that mounts them from ONE
Secret in the twin namespace at exactly the paths the pod expects and points every container at the
consumer's API server (`rewrite_spec`), that Secret (`token_secret`, `secret_for`), its name
(`token_secret_name`), the TokenRequest body (`token_request`), reading a Secret back into what a
refresher needs without the local pod (`read_token_secret`), and when a token is due for a refresh
(`refresh_due`, `refresh_at`: the kubelet's rule, 80% of the lifetime or 24 h).

Secret layout (type Opaque, base64 `data`, in the twin namespace, named `gpufed-token-<pod>`):
- data: `token-<i>` (the i-th token source's token), `ca.crt` (the consumer's CA, from its
  `kube-root-ca.crt` ConfigMap), `namespace` (the pod's CONSUMER namespace);
- labels: the origin labels of `meta.origin_labels` (origin-uid = the LOCAL pod's UID) and
  `gpufed.io/token-for-pod=<pod name>` (shortened with a hash beyond 63 characters);
- ownerReferences: the twin it serves (`twin_owner_reference`), so that the provider's garbage
  collector removes the Secret once that twin is gone (a Secret written for a re-created twin under
  the same name gets that twin added as one more owner);
- annotations: `gpufed.io/token-pod`, `gpufed.io/token-namespace`, `gpufed.io/token-service-account`,
  `gpufed.io/token-sources` (JSON list of {key, audience, expirationSeconds}),
  `gpufed.io/token-issued-at` and `gpufed.io/token-expires-at` (RFC 3339, earliest over the keys).

Invariants: the projected volumes keep their names (volumeMounts stay valid) and `defaultMode`;
`kube-root-ca.crt` inside a token volume is the consumer's CA taken from the Secret, never the
provider's ConfigMap of the same name; `metadata.namespace` from the downward API is the consumer
namespace, never the twin namespace; a container that sets `KUBERNETES_SERVICE_HOST`/`_PORT` itself
keeps its value; the twin keeps `automountServiceAccountToken: false` (the provider adds no token of
its own).

A token Secret lives on the provider, so `read_token_secret` reads back what it CLAIMS; a refresher
compares it with `binding_of` the local pod and requests only the latter.

Does not: request tokens, read or write anything (vkprovider.remote.tokens does), or decide which
pods get an identity (the caller hands `pods.remote_pod` a `PodIdentity` or None). Imports only
`forge.meta` of the forge: `forge.pods` builds on this module, never the other way round.

Pure: no I/O, no client imports; inputs are never mutated, except the spec handed to `rewrite_spec`
(`forge.pods.remote_pod`'s own deep copy).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL
from gpufed.kube.times import rfc3339, time_or_none
from vkprovider.forge.meta import ROOT_CA_CONFIGMAP, Target, origin_labels

#: Data key of the i-th token source.
TOKEN_KEY_PREFIX = "token-"  # noqa: S105 -- a key prefix, not a password
#: Data key of the consumer's cluster CA (PEM).
CA_KEY = "ca.crt"
#: Data key of the pod's consumer namespace.
NAMESPACE_KEY = "namespace"
#: Lifetime the API server gives a projected token that names none (its projection default).
DEFAULT_EXPIRATION_S = 3607
#: TokenRequest refuses lifetimes under 10 minutes.
MIN_EXPIRATION_S = 600
#: The longest lifetime requested for an offloaded pod's token, whatever the pod asks for: the token
#: is readable on the provider, so it lives one hour (the refresher renews it at 80 % of that). Not
#: 3607 s, the projection's default: kube-apiserver extends a token requested for exactly that long
#: to a year (`--service-account-extend-token-expiration`), which it must never be here.
MAX_EXPIRATION_S = 3600
#: Refresh once this fraction of a token's lifetime has passed (the kubelet's 80%).
DEFAULT_REFRESH_FRACTION = 0.8
#: Refresh any token older than this, however long it is valid (the kubelet's rule).
MAX_TOKEN_AGE = timedelta(hours=24)
DEFAULT_SERVICE_ACCOUNT = "default"

SECRET_PREFIX = "gpufed-token-"  # noqa: S105 -- a name prefix, not a password
SECRET_TYPE = "Opaque"  # noqa: S105 -- a Secret type
MAX_NAME = 253
MAX_LABEL_VALUE = 63
#: Hex characters of the hash that keeps a shortened name unique.
HASH_CHARS = 10

TOKEN_FOR_POD_LABEL = "gpufed.io/token-for-pod"  # noqa: S105 -- a label name
TOKEN_POD_ANNOTATION = "gpufed.io/token-pod"  # noqa: S105
TOKEN_NAMESPACE_ANNOTATION = "gpufed.io/token-namespace"  # noqa: S105
TOKEN_SERVICE_ACCOUNT_ANNOTATION = "gpufed.io/token-service-account"  # noqa: S105
TOKEN_SOURCES_ANNOTATION = "gpufed.io/token-sources"  # noqa: S105
TOKEN_ISSUED_AT_ANNOTATION = "gpufed.io/token-issued-at"  # noqa: S105
TOKEN_EXPIRES_AT_ANNOTATION = "gpufed.io/token-expires-at"  # noqa: S105

#: Explicit container env wins over the kubelet's service env: these point in-cluster clients
#: (client-go, the Python client, ...) at the consumer's API server.
API_HOST_ENV = "KUBERNETES_SERVICE_HOST"
API_PORT_ENV = "KUBERNETES_SERVICE_PORT"
NAMESPACE_FIELD = "metadata.namespace"
_NAME_TAIL = re.compile(r"[-.]+$")


@dataclass(frozen=True)
class TokenSource:
    """One `serviceAccountToken` projection of a pod: its Secret key, audience and lifetime (s)."""

    key: str
    audience: str | None
    expiration_seconds: int


@dataclass(frozen=True)
class PodIdentity:
    """What the twin's spec needs: the token Secret's name and the consumer API server's address."""

    secret_name: str
    api_host: str
    api_port: int


@dataclass(frozen=True)
class IssuedToken:
    """A token the consumer issued; `issued_at`/`expires_at` are timezone-aware."""

    token: str
    issued_at: datetime
    expires_at: datetime

    def __repr__(self) -> str:  # never put a token into a log line or a test failure by accident
        return f"IssuedToken(token=<{len(self.token)} chars>, issued_at={self.issued_at}, expires_at={self.expires_at})"


@dataclass(frozen=True)
class TokenBinding:
    """Whose tokens a Secret holds and how to request them again, without the local pod."""

    consumer: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    service_account: str
    sources: tuple[TokenSource, ...]
    secret_name: str
    twin_namespace: str


@dataclass(frozen=True)
class TokenSecretState:
    """A token Secret as read back: its binding, UID and the earliest issue/expiry over its keys."""

    binding: TokenBinding
    uid: str
    issued_at: datetime | None
    expires_at: datetime | None
    #: UIDs of the twins (pods of the twin namespace) the Secret names as its owners.
    owner_uids: tuple[str, ...] = ()

    def due(self, now: datetime, fraction: float = DEFAULT_REFRESH_FRACTION) -> bool:
        """Whether the tokens need a refresh (unknown times: at once)."""
        if self.issued_at is None or self.expires_at is None:
            return True
        return refresh_due(self.issued_at, self.expires_at, now, fraction)


# ---------------------------------------------------------------- sources and names


def is_token_projection(volume: Mapping[str, Any]) -> bool:
    """A projected volume with at least one `serviceAccountToken` source."""
    sources = (volume.get("projected") or {}).get("sources") or []
    return any("serviceAccountToken" in source for source in sources)


def _token_projections(volumes: list[Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(key, serviceAccountToken source) in volume/source order: THE order of the keys."""
    counter = itertools.count()
    for volume in volumes:
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "serviceAccountToken" in source:
                yield f"{TOKEN_KEY_PREFIX}{next(counter)}", source["serviceAccountToken"] or {}


def token_sources(pod: Mapping[str, Any]) -> list[TokenSource]:
    """Every `serviceAccountToken` projection of the pod's volumes, keyed `token-0`, `token-1`, ...;
    lifetimes within [MIN_EXPIRATION_S, MAX_EXPIRATION_S]."""
    volumes = list((pod.get("spec") or {}).get("volumes") or [])
    out = []
    for key, source in _token_projections(volumes):
        seconds = int(source.get("expirationSeconds") or DEFAULT_EXPIRATION_S)
        out.append(
            TokenSource(key, source.get("audience") or None, min(max(seconds, MIN_EXPIRATION_S), MAX_EXPIRATION_S))
        )
    return out


def _short_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:HASH_CHARS]


def _shorten(value: str, limit: int) -> str:
    """`value` when it fits, else a prefix + `-` + a stable hash of the whole, within `limit`."""
    if len(value) <= limit:
        return value
    # The prefix must not end in '-' or '.' ("a.-b" and "a--" are no DNS subdomain / label value).
    head = _NAME_TAIL.sub("", value[: limit - HASH_CHARS - 1])
    return f"{head}-{_short_hash(value)}" if head else _short_hash(value)


def token_secret_name(pod_name: str) -> str:
    """`gpufed-token-<pod>`; beyond 253 characters the pod name is cut and a stable hash appended."""
    return _shorten(SECRET_PREFIX + pod_name, MAX_NAME)


def pod_label_value(pod_name: str) -> str:
    """Value of `gpufed.io/token-for-pod`: the pod name, or beyond 63 characters a prefix + hash."""
    return _shorten(pod_name, MAX_LABEL_VALUE)


def service_account(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec") or {}
    return str(spec.get("serviceAccountName") or spec.get("serviceAccount") or DEFAULT_SERVICE_ACCOUNT)


# ---------------------------------------------------------------- the twin's spec


def _secret_source(identity: PodIdentity, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"secret": {"name": identity.secret_name, "items": items}}


def _item(key: str, item: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "path": item.get("path", "")}
    if "mode" in item:
        out["mode"] = item["mode"]
    return out


def _rewrite_sources(
    sources: list[Any], keys: Iterator[tuple[str, Mapping[str, Any]]], identity: PodIdentity
) -> list[Any]:
    out: list[Any] = []
    for source in sources:
        if "serviceAccountToken" in source:
            key, token = next(keys)
            out.append(_secret_source(identity, [_item(key, token)]))
            continue
        config_map = source.get("configMap")
        if config_map is not None and config_map.get("name") == ROOT_CA_CONFIGMAP:
            # The consumer's CA: the provider's own kube-root-ca.crt has the same name and would
            # make clients distrust the consumer's API server.
            wanted = config_map.get("items")
            items = (
                [_item(CA_KEY, i) for i in wanted if i.get("key") == CA_KEY]
                if wanted
                else [{"key": CA_KEY, "path": CA_KEY}]
            )
            if items:
                out.append(_secret_source(identity, items))
            continue
        downward = source.get("downwardAPI")
        if downward is not None:
            # The downward API would give the TWIN namespace; clients need the consumer's.
            namespace_items = [
                i for i in downward.get("items") or [] if (i.get("fieldRef") or {}).get("fieldPath") == NAMESPACE_FIELD
            ]
            others = [i for i in downward.get("items") or [] if i not in namespace_items]
            if others:
                out.append({**source, "downwardAPI": {**downward, "items": others}})
            if namespace_items:
                out.append(_secret_source(identity, [_item(NAMESPACE_KEY, i) for i in namespace_items]))
            continue
        out.append(source)
    return out


def rewrite_spec(spec: dict[str, Any], identity: PodIdentity) -> None:
    """Mount the pod's tokens from the Secret `identity.secret_name` and point it at the consumer.

    Mutates `spec` (pods.remote_pod's deep copy): every projected volume with a
    `serviceAccountToken` source keeps its name and `defaultMode`; its token sources, the
    `kube-root-ca.crt` ConfigMap source and the downward API's `metadata.namespace` items become
    items of that Secret at the same paths; other sources stay. Every container and init container
    gets `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` unless it sets that name itself.
    """
    volumes = list(spec.get("volumes") or [])
    keys = _token_projections(volumes)
    rewritten = []
    for volume in volumes:
        if is_token_projection(volume):
            projected = volume["projected"]
            volume = {
                **volume,
                "projected": {**projected, "sources": _rewrite_sources(projected["sources"], keys, identity)},
            }
        rewritten.append(volume)
    if volumes:
        spec["volumes"] = rewritten
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            env = list(container.get("env") or [])
            names = {e.get("name") for e in env}
            for name, value in ((API_HOST_ENV, identity.api_host), (API_PORT_ENV, str(identity.api_port))):
                if name not in names:
                    env.append({"name": name, "value": value})
            container["env"] = env


# ---------------------------------------------------------------- the Secret


def binding_of(pod: Mapping[str, Any], target: Target, identity: PodIdentity) -> TokenBinding:
    """The binding of `pod`'s tokens, their Secret to be `identity.secret_name` in `target.namespace`."""
    meta = pod.get("metadata") or {}
    return TokenBinding(
        consumer=target.consumer,
        pod_namespace=str(meta.get("namespace", "")),
        pod_name=str(meta.get("name", "")),
        pod_uid=str(meta.get("uid", "")),
        service_account=service_account(pod),
        sources=tuple(token_sources(pod)),
        secret_name=identity.secret_name,
        twin_namespace=target.namespace,
    )


def token_request(binding: TokenBinding, source: TokenSource) -> dict[str, Any]:
    """Body of the TokenRequest (POST .../serviceaccounts/<sa>/token) for one source, bound to the pod."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [source.audience] if source.audience else [],
            "expirationSeconds": min(max(source.expiration_seconds, MIN_EXPIRATION_S), MAX_EXPIRATION_S),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": binding.pod_name, "uid": binding.pod_uid},
        },
    }


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def secret_for(binding: TokenBinding, tokens: Mapping[str, IssuedToken], ca_pem: str) -> dict[str, Any]:
    """The token Secret of `binding` holding `tokens` (one per source key; ValueError if one is missing)."""
    missing = [s.key for s in binding.sources if s.key not in tokens]
    if missing or not binding.sources:
        raise ValueError(f"no token for {', '.join(missing) or 'any source'} of pod {binding.pod_name}")
    issued = [tokens[s.key] for s in binding.sources]
    data = {s.key: _b64(tokens[s.key].token) for s in binding.sources}
    data[CA_KEY] = _b64(ca_pem)
    data[NAMESPACE_KEY] = _b64(binding.pod_namespace)
    labels = origin_labels({"uid": binding.pod_uid}, Target(binding.consumer, "", binding.twin_namespace))
    labels[TOKEN_FOR_POD_LABEL] = pod_label_value(binding.pod_name)
    sources = [
        {"key": s.key, "audience": s.audience, "expirationSeconds": s.expiration_seconds} for s in binding.sources
    ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": binding.secret_name,
            "namespace": binding.twin_namespace,
            "labels": labels,
            "annotations": {
                TOKEN_POD_ANNOTATION: binding.pod_name,
                TOKEN_NAMESPACE_ANNOTATION: binding.pod_namespace,
                TOKEN_SERVICE_ACCOUNT_ANNOTATION: binding.service_account,
                TOKEN_SOURCES_ANNOTATION: json.dumps(sources, separators=(",", ":")),
                TOKEN_ISSUED_AT_ANNOTATION: rfc3339(min(t.issued_at for t in issued)),
                TOKEN_EXPIRES_AT_ANNOTATION: rfc3339(min(t.expires_at for t in issued)),
            },
        },
        "type": SECRET_TYPE,
        "data": data,
    }


def token_secret(
    pod: Mapping[str, Any],
    target: Target,
    identity: PodIdentity,
    tokens: Mapping[str, IssuedToken],
    ca_pem: str,
) -> dict[str, Any]:
    """The token Secret of `pod` in `target.namespace` (see the module docstring for its layout)."""
    return secret_for(binding_of(pod, target, identity), tokens, ca_pem)


def _sources_of(raw: Any) -> tuple[TokenSource, ...] | None:
    try:
        items = json.loads(raw)
        sources = tuple(
            TokenSource(str(i["key"]), str(i["audience"]) if i.get("audience") else None, int(i["expirationSeconds"]))
            for i in items
        )
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return sources or None


def read_token_secret(secret: Mapping[str, Any]) -> TokenSecretState | None:
    """What a refresher needs from a token Secret; None when it is not one gpufed could have written."""
    meta = secret.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    sources = _sources_of(notes.get(TOKEN_SOURCES_ANNOTATION))
    pod_name = notes.get(TOKEN_POD_ANNOTATION)
    pod_namespace = notes.get(TOKEN_NAMESPACE_ANNOTATION) or data_value(secret, NAMESPACE_KEY)
    if sources is None or not pod_name or not pod_namespace or not labels.get(ORIGIN_UID_LABEL):
        return None
    binding = TokenBinding(
        consumer=str(labels.get(ORIGIN_CLUSTER_LABEL, "")),
        pod_namespace=str(pod_namespace),
        pod_name=str(pod_name),
        pod_uid=str(labels[ORIGIN_UID_LABEL]),
        service_account=str(notes.get(TOKEN_SERVICE_ACCOUNT_ANNOTATION) or DEFAULT_SERVICE_ACCOUNT),
        sources=sources,
        secret_name=str(meta.get("name", "")),
        twin_namespace=str(meta.get("namespace", "")),
    )
    return TokenSecretState(
        binding=binding,
        uid=str(meta.get("uid", "")),
        issued_at=time_or_none(notes.get(TOKEN_ISSUED_AT_ANNOTATION)),
        expires_at=time_or_none(notes.get(TOKEN_EXPIRES_AT_ANNOTATION)),
        owner_uids=tuple(str(r["uid"]) for r in pod_owner_references(secret)),
    )


def twin_owner_reference(twin: Mapping[str, Any]) -> dict[str, Any]:
    """The ownerReference that hands a token Secret to the garbage collector along with `twin`."""
    meta = twin.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Pod", "name": str(meta.get("name", "")), "uid": str(meta.get("uid", ""))}


def pod_owner_references(secret: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ownerReferences of `secret` that name pods of its namespace (well-formed ones only)."""
    refs = (secret.get("metadata") or {}).get("ownerReferences") or []
    return [
        {"apiVersion": "v1", "kind": "Pod", "name": str(r["name"]), "uid": str(r["uid"])}
        for r in refs
        if isinstance(r, Mapping)
        and r.get("apiVersion") == "v1"
        and r.get("kind") == "Pod"
        and isinstance(r.get("name"), str)
        and isinstance(r.get("uid"), str)
        and r["uid"]
    ]


def with_owners(secret: Mapping[str, Any], owners: list[dict[str, Any]]) -> dict[str, Any]:
    """`secret` (a body `secret_for` built) with `owners` as its ownerReferences (none: unchanged)."""
    if not owners:
        return dict(secret)
    meta = dict(secret.get("metadata") or {})
    meta["ownerReferences"] = [dict(o) for o in owners]
    return {**secret, "metadata": meta}


def data_value(secret: Mapping[str, Any], key: str) -> str | None:
    """The decoded value of `data[key]` (None when absent or not base64 UTF-8)."""
    raw = (secret.get("data") or {}).get(key)
    if not isinstance(raw, str):
        return None
    try:
        return base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------- refresh


def refresh_at(issued_at: datetime, expires_at: datetime, fraction: float = DEFAULT_REFRESH_FRACTION) -> datetime:
    """When a token is due: `fraction` of its lifetime after issue, at the latest 24 h after issue."""
    return min(issued_at + (expires_at - issued_at) * fraction, issued_at + MAX_TOKEN_AGE)


def refresh_due(
    issued_at: datetime, expires_at: datetime, now: datetime, fraction: float = DEFAULT_REFRESH_FRACTION
) -> bool:
    """The kubelet's rule: refresh once `fraction` of the lifetime has passed, or the token is 24 h old."""
    return now >= refresh_at(issued_at, expires_at, fraction)
