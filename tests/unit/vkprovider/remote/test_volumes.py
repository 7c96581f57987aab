"""The storage provisioner of one provider (vkprovider.remote.volumes), live against two in-memory API
servers: claims handed to storage.gpufed.io and scheduled to this provider's virtual nodes are created
in the twin namespace and get a virtual volume, which then mirrors the provider's claim (phase, and
once Bound the size and access modes of its volume; what the provider reports wrongly is ignored and
logged once); others are left alone; released volumes take the provider's claim with them, and only
the consumer's own copy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from structlog.testing import capture_logs

from gpufed.apis.wire import (
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_UID_LABEL,
    PROVIDER_STORAGE_CLASS_ANNOTATION,
    REMOTE_PHASE_ANNOTATION,
)
from tests.unit.fakes import FakeApiServer, serve, until
from vkprovider.forge.claims import StorageOffer
from vkprovider.remote.volumes import ClaimProvisioner, VolumeSettings

FAST = StorageOffer("fast", True, ("ReadWriteOnce",))


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    def offer(self, obj: Any, *, type_: str, reason: str, message: str) -> bool:
        self.seen.append((obj["metadata"]["name"], type_, reason, message))
        return True

    def reasons(self, name: str) -> list[str]:
        return [r for n, _t, r, _m in self.seen if n == name]


def claim(name: str, node: str | None = "gpufed-gpu-a", provisioner: str = "storage.gpufed.io") -> dict[str, Any]:
    annotations = {"volume.kubernetes.io/storage-provisioner": provisioner}
    if node:
        annotations["volume.kubernetes.io/selected-node"] = node
    return {
        "metadata": {"name": name, "namespace": "team", "annotations": annotations},
        "spec": {
            "storageClassName": "gpufed",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }


@contextlib.asynccontextmanager
async def provisioner(
    offers: tuple[StorageOffer, ...] = (FAST,),
    resync_s: float = 0.2,
) -> AsyncIterator[tuple[FakeApiServer, FakeApiServer, ClaimProvisioner, Events, dict[str, tuple[StorageOffer, ...]]]]:
    async with serve() as (local, local_api), serve() as (remote, remote_api):
        events = Events()
        current = {"offers": offers}
        p = ClaimProvisioner(
            local_api,
            remote_api,
            "consumer-1",
            "gpu-a",
            nodes=lambda: {"gpufed-gpu-a"},
            twin_namespace=lambda ns: f"{ns}-consumer-1" if ns == "team" else None,
            offers=lambda: current["offers"],
            events=events,
            settings=VolumeSettings(retry_s=0.1, resync_s=resync_s, held_after_s=0.3),
        )
        task = asyncio.create_task(p.run())
        try:
            yield local, remote, p, events, current
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_claim_scheduled_here_is_bound_on_the_provider_with_a_virtual_volume() -> None:
    async with provisioner() as (local, remote, _p, events, _offers):
        c = local.create("persistentvolumeclaims", claim("data"))
        await until(lambda: local.get("persistentvolumes", "", f"gpufed-{c['metadata']['uid']}") is not None)
        copy = remote.get("persistentvolumeclaims", "team-consumer-1", "data")
        assert copy is not None and copy["spec"]["storageClassName"] == "fast"
        assert copy["metadata"]["labels"][ORIGIN_CLUSTER_LABEL] == "consumer-1"
        assert copy["metadata"]["labels"][ORIGIN_UID_LABEL] == c["metadata"]["uid"]
        await until(lambda: "Provisioned" in events.reasons("data"))
        # the volume's claim goes: the provider's copy goes with it, then the volume
        pv_name = f"gpufed-{c['metadata']['uid']}"
        local.update("persistentvolumes", "", pv_name, lambda pv: pv.update(status={"phase": "Released"}))
        await until(lambda: local.get("persistentvolumes", "", pv_name) is None)
        assert remote.get("persistentvolumeclaims", "team-consumer-1", "data") is None


async def test_claims_not_for_this_provider_are_left_alone() -> None:
    async with provisioner() as (local, remote, _p, _events, _offers):
        local.create("persistentvolumeclaims", claim("elsewhere", node="gpufed-gpu-b"))
        local.create("persistentvolumeclaims", claim("unscheduled", node=None))
        local.create("persistentvolumeclaims", claim("other-provisioner", provisioner="ebs.csi.aws.com"))
        local.create(
            "persistentvolumeclaims",
            {
                **claim("ns-not-offloaded"),
                "metadata": {**claim("ns-not-offloaded")["metadata"], "namespace": "private"},
            },
        )
        await asyncio.sleep(0.5)
        assert remote.items("persistentvolumeclaims") == [] and local.items("persistentvolumes") == []


async def test_a_class_the_provider_does_not_offer_is_refused_until_the_grant_offers_it() -> None:
    async with provisioner() as (local, remote, p, events, current):
        c = claim("gold")
        c["metadata"]["annotations"][PROVIDER_STORAGE_CLASS_ANNOTATION] = "gold"
        local.create("persistentvolumeclaims", c)
        await until(lambda: "StorageNotOffered" in events.reasons("gold"))
        assert remote.items("persistentvolumeclaims") == []
        current["offers"] = (FAST, StorageOffer("gold"))
        p.grant_changed()
        await until(lambda: remote.get("persistentvolumeclaims", "team-consumer-1", "gold") is not None)


async def test_a_provider_claim_that_is_not_the_consumers_copy_is_neither_used_nor_deleted() -> None:
    async with provisioner() as (local, remote, _p, events, _offers):
        theirs = {"metadata": {"name": "data", "namespace": "team-consumer-1", "labels": {"owner": "provider"}}}
        remote.create("persistentvolumeclaims", theirs)
        local.create("persistentvolumeclaims", claim("data"))
        await until(lambda: "ProvisioningFailed" in events.reasons("data"))
        assert local.items("persistentvolumes") == []
        # a released virtual volume naming the provider's own claim never deletes it
        forged = {
            "metadata": {
                "name": "gpufed-x",
                "labels": {"gpufed.io/remote-cluster-id": "gpu-a"},
                "annotations": {"gpufed.io/remote-claim": "team-consumer-1/data"},
            },
            "spec": {"persistentVolumeReclaimPolicy": "Delete", "claimRef": {"uid": "u-9"}},
            "status": {"phase": "Released"},
        }
        local.create("persistentvolumes", forged)
        await until(lambda: local.get("persistentvolumes", "", "gpufed-x") is None)
        assert remote.get("persistentvolumeclaims", "team-consumer-1", "data") is not None


async def _delete_protected(local: FakeApiServer) -> None:
    """Provision claim `data`, then delete it as the API server does while Kubernetes' protection
    finalizer is on it."""
    c = local.create("persistentvolumeclaims", claim("data"))
    pv_name = f"gpufed-{c['metadata']['uid']}"
    await until(lambda: local.get("persistentvolumes", "", pv_name) is not None)

    def deleting(obj: dict[str, Any]) -> None:
        obj["spec"]["volumeName"] = pv_name
        obj["metadata"]["finalizers"] = ["kubernetes.io/pvc-protection"]
        obj["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"

    local.update("persistentvolumeclaims", "team", "data", deleting)


async def test_deleting_a_claim_in_use_is_said_once() -> None:
    async with provisioner() as (local, _remote, _p, events, _offers):
        await _delete_protected(local)
        await until(lambda: "ClaimInUse" in events.reasons("data"))
        local.update("persistentvolumeclaims", "team", "data", lambda obj: obj["metadata"].update(labels={"x": "y"}))
        await asyncio.sleep(0.3)
        held = [m for n, _t, r, m in events.seen if n == "data" and r == "ClaimInUse"]
        assert len(held) == 1 and "its data on provider gpu-a" in held[0] and "deleted then" in held[0]


async def test_a_claim_no_pod_uses_is_deleted_without_the_warning() -> None:
    # Kubernetes' protection finalizer is on every claim being deleted for a moment, until the
    # controller-manager sees that no pod uses it: that moment is no wait worth a Warning.
    async with provisioner() as (local, _remote, _p, events, _offers):
        await _delete_protected(local)
        await asyncio.sleep(0.1)
        local.remove("persistentvolumeclaims", "team", "data")  # the finalizer went: the claim is gone
        await asyncio.sleep(0.6)
        assert "ClaimInUse" not in events.reasons("data")


async def test_a_volume_released_after_its_namespace_was_unoffloaded_goes_without_asking_the_provider() -> None:
    async with provisioner() as (local, remote, _p, _events, _offers):
        gone = {
            "metadata": {
                "name": "gpufed-u-7",
                "labels": {"gpufed.io/remote-cluster-id": "gpu-a"},
                "annotations": {"gpufed.io/remote-claim": "private-consumer-1/data"},
            },
            "spec": {
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": "private", "name": "data", "uid": "u-7"},
            },
            "status": {"phase": "Released"},
        }
        local.create("persistentvolumes", gone)
        await until(lambda: local.get("persistentvolumes", "", "gpufed-u-7") is None)
        # its twin namespace is gone, and the provider's claim with it: nothing is read or deleted there
        assert not [r for r in remote.requests if "private-consumer-1" in r.path]


def _bound_here(local: FakeApiServer, pv_name: str) -> None:
    """What the consumer's kube-controller-manager does with a new virtual volume: bind it."""
    local.update("persistentvolumes", "", pv_name, lambda pv: pv.update(status={"phase": "Bound"}))


def _provider_binds(remote: FakeApiServer, status: dict[str, Any]) -> None:
    """What the provider's kube-controller-manager does once the twin pod is scheduled: bind its claim."""
    remote.update("persistentvolumeclaims", "team-consumer-1", "data", lambda c: c.update(status=status))


async def test_a_provider_claim_not_bound_yet_is_looked_at_every_retry_not_every_resync() -> None:
    async with provisioner(resync_s=60.0) as (local, remote, _p, _events, _offers):
        c = local.create("persistentvolumeclaims", claim("data"))
        pv_name = f"gpufed-{c['metadata']['uid']}"
        await until(lambda: local.get("persistentvolumes", "", pv_name) is not None)
        _bound_here(local, pv_name)
        await asyncio.sleep(0.3)  # looked at while the provider's claim is Pending
        _provider_binds(remote, {"phase": "Bound", "capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"]})

        def shows_50gi() -> bool:
            pv = local.get("persistentvolumes", "", pv_name) or {}
            return (pv.get("spec") or {}).get("capacity") == {"storage": "50Gi"}

        # within a few retries (0.1 s), not the 60 s resync
        await until(shows_50gi, what="the provider's size mirrored", timeout=2)


async def test_the_virtual_volume_mirrors_the_providers_volume_once_bound() -> None:
    async with provisioner() as (local, remote, _p, _events, _offers):
        c = local.create("persistentvolumeclaims", claim("data"))
        pv_name = f"gpufed-{c['metadata']['uid']}"
        await until(lambda: local.get("persistentvolumes", "", pv_name) is not None)
        _bound_here(local, pv_name)

        def annotated(phase: str) -> bool:
            pv = local.get("persistentvolumes", "", pv_name) or {}
            return bool((pv.get("metadata") or {}).get("annotations", {}).get(REMOTE_PHASE_ANNOTATION) == phase)

        await until(lambda: annotated("Pending"))
        pv = local.get("persistentvolumes", "", pv_name)
        assert pv is not None and pv["spec"]["capacity"] == {"storage": "10Gi"}  # the claim's, until bound
        # a static 50Gi volume that also allows ReadWriteMany took the 10Gi claim on the provider
        _provider_binds(
            remote,
            {"phase": "Bound", "capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"]},
        )

        def shows_50gi() -> bool:
            pv = local.get("persistentvolumes", "", pv_name) or {}
            return (pv.get("spec") or {}).get("capacity") == {"storage": "50Gi"}

        await until(shows_50gi, what="the provider's size mirrored")
        pv = local.get("persistentvolumes", "", pv_name)
        assert pv is not None and pv["spec"]["accessModes"] == ["ReadWriteMany", "ReadWriteOnce"]
        assert annotated("Bound")
        # the provider's claim goes (not through the consumer): said on the volume, the rest kept
        remote.remove("persistentvolumeclaims", "team-consumer-1", "data")
        await until(lambda: annotated("Missing"))
        assert shows_50gi()


async def test_what_a_provider_claim_reports_wrongly_is_ignored_and_logged_once() -> None:
    with capture_logs() as logs:
        async with provisioner() as (local, remote, _p, _events, _offers):
            c = local.create("persistentvolumeclaims", claim("data"))
            pv_name = f"gpufed-{c['metadata']['uid']}"
            await until(lambda: local.get("persistentvolumes", "", pv_name) is not None)
            _bound_here(local, pv_name)
            _provider_binds(
                remote,
                {"phase": "Bound", "capacity": {"storage": "a lot"}, "accessModes": ["ReadWriteOnce", "Anything"]},
            )

            def annotated() -> bool:
                pv = local.get("persistentvolumes", "", pv_name) or {}
                return bool((pv.get("metadata") or {}).get("annotations", {}).get(REMOTE_PHASE_ANNOTATION) == "Bound")

            await until(annotated)
            await asyncio.sleep(0.6)  # a few resyncs (every 0.2 s)
            # other wrong words in the same field are not logged again: a provider cannot fill the log
            _provider_binds(remote, {"phase": "Bound", "capacity": {"storage": "even more"}})
            await asyncio.sleep(0.6)
            pv = local.get("persistentvolumes", "", pv_name)
            assert pv is not None
            assert pv["spec"]["capacity"] == {"storage": "10Gi"} and pv["spec"]["accessModes"] == ["ReadWriteOnce"]
    said = [e for e in logs if e["event"] == "provider claim not mirrored"]
    assert sorted(e["problem"] for e in said) == [
        "access modes ['Anything'] are not Kubernetes access modes",
        "capacity 'a lot' is not a quantity",
    ], said
    assert all(e["volume"] == pv_name and e["log_level"] == "warning" for e in said)
