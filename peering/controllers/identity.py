"""This cluster's gpufed identity: a stable ClusterID and an Ed25519 key pair.

Owns: creating the identity at first start (ConfigMap `gpufed/gpufed-identity` with the ClusterID
and public key; Secret `gpufed/gpufed-identity-key` with the private key and the ClusterID) and
loading it afterwards.

Invariants: an identity is never regenerated silently. A missing Secret next to an existing
ConfigMap, a key that does not match the published public key, or a requested ClusterID that
differs from the stored one stops the controller with an error saying what to restore. A missing
ConfigMap next to an intact Secret is restored from the Secret (nothing is regenerated). Creation
uses `create`, never overwrite, so two controllers starting at once end up with one identity.

Does not: log or copy the private key anywhere.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpufed.apis.wire import (
    IDENTITY_CONFIGMAP,
    IDENTITY_SECRET,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    default_cluster_id,
    parse_cluster_id,
)
from gpufed.errors import GpufedError
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from peering.handshake import fingerprint, public_key_pem


class IdentityError(GpufedError):
    """The stored identity is damaged or conflicts with the configuration; the message says how to fix it."""


@dataclass(frozen=True)
class Identity:
    cluster_id: ClusterID
    public_pem: str
    private_key: Ed25519PrivateKey = field(repr=False)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_pem)


def _labels() -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY}


async def ensure_namespace(api: Any, name: str, labels: dict[str, str] | None = None) -> None:
    if await rest.get(api, rest.path("v1", "namespaces", name)) is not None:
        return
    try:
        await rest.request(
            api,
            "POST",
            rest.path("v1", "namespaces"),
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or _labels()}},
        )
    except KubeError as e:
        if not e.conflict:
            raise


def _configmap(cid: ClusterID, public_pem: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": IDENTITY_CONFIGMAP, "namespace": SYSTEM_NAMESPACE, "labels": _labels()},
        "data": {"clusterId": cid, "publicKey": public_pem, "fingerprint": fingerprint(public_pem)},
    }


def _load_key(secret: dict[str, Any]) -> tuple[ClusterID, Ed25519PrivateKey]:
    data = secret.get("data") or {}
    try:
        cid = parse_cluster_id(base64.b64decode(data["clusterId"]).decode())
        key = serialization.load_pem_private_key(base64.b64decode(data["privateKey"]), password=None)
    except (KeyError, ValueError, TypeError) as e:
        raise IdentityError(
            f"Secret {SYSTEM_NAMESPACE}/{IDENTITY_SECRET} is damaged ({type(e).__name__}); restore it from a backup"
        ) from e
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"Secret {SYSTEM_NAMESPACE}/{IDENTITY_SECRET} does not hold an Ed25519 key")
    return cid, key


async def _create(api: Any, obj: dict[str, Any], plural: str) -> bool:
    """Create; False when it already exists (someone else won the race)."""
    try:
        await rest.request(api, "POST", rest.path("v1", plural, namespace=SYSTEM_NAMESPACE), body=obj)
    except KubeError as e:
        if e.conflict:
            return False
        raise
    return True


async def ensure_identity(api: Any, *, name_hint: str = "", cluster_id: str | None = None) -> Identity:
    """Load this cluster's identity, creating it at first start."""
    wanted = parse_cluster_id(cluster_id) if cluster_id else None
    await ensure_namespace(api, SYSTEM_NAMESPACE)
    cm_path = rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, namespace=SYSTEM_NAMESPACE)
    secret_path = rest.path("v1", "secrets", IDENTITY_SECRET, namespace=SYSTEM_NAMESPACE)
    for _attempt in range(3):
        cm = await rest.get(api, cm_path)
        secret = await rest.get(api, secret_path)
        if secret is None and cm is not None:
            data = cm.get("data") or {}
            raise IdentityError(
                f"ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP} says this is cluster {data.get('clusterId')!r} "
                f"with key {data.get('fingerprint', '?')}, but its private key (Secret {SYSTEM_NAMESPACE}/"
                f"{IDENTITY_SECRET}) is missing. Restore the Secret from a backup; or, to start over as a new "
                f"identity (every peer must then unpeer and peer again), delete the ConfigMap."
            )
        if secret is None:
            if wanted is None:
                ks = await rest.request(api, "GET", rest.path("v1", "namespaces", "kube-system"))
                wanted = default_cluster_id(str(ks["metadata"]["uid"]), name_hint)
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {"name": IDENTITY_SECRET, "namespace": SYSTEM_NAMESPACE, "labels": _labels()},
                "data": {
                    "clusterId": base64.b64encode(wanted.encode()).decode(),
                    "privateKey": base64.b64encode(pem).decode(),
                },
            }
            await _create(api, body, "secrets")
            continue  # re-read: another controller may have won
        cid, key = _load_key(secret)
        if wanted is not None and wanted != cid:
            raise IdentityError(
                f"this cluster already has ClusterID {cid!r} (Secret {SYSTEM_NAMESPACE}/{IDENTITY_SECRET}); "
                f"refusing to become {wanted!r}. Drop --cluster-id or unpeer and delete the identity first."
            )
        pub = public_key_pem(key)
        if cm is None:
            await _create(api, _configmap(cid, pub), "configmaps")
            continue
        data = cm.get("data") or {}
        if data.get("clusterId") != cid or data.get("publicKey") != pub:
            raise IdentityError(
                f"ConfigMap {SYSTEM_NAMESPACE}/{IDENTITY_CONFIGMAP} (cluster {data.get('clusterId')!r}) does not match "
                f"the private key in Secret {SYSTEM_NAMESPACE}/{IDENTITY_SECRET} (cluster {cid!r}, key "
                f"{fingerprint(pub)}); restore the pair from a backup"
            )
        return Identity(cid, pub, key)
    raise IdentityError("the identity kept changing while it was being created; is another controller fighting?")
