"""Claims of the virtual class whose first pod stays local, and pods kept local by their claims
(vkprovider.localstorage), live against an in-memory API server: a static volume on that node is
handed to the claim, a dynamic class is asked through a shadow claim whose volume is then handed over,
claims that cannot be bound say why and are bound once they can, claims on virtual nodes are left to
the virtual kubelets, and a pod labelled kept-local gets one Event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tests.unit.fakes import FakeApiServer, serve, until
from vkprovider.localstorage import KeptLocalReporter, LocalClaims, LocalStorageSettings

LOCAL = "consumer-cpu-0"


def storage_class(name: str, provisioner: str, default: bool = True) -> dict[str, Any]:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"metadata": {"name": name, "annotations": annotations}, "provisioner": provisioner}


def node(name: str, virtual: bool = False) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if virtual:
        labels["gpufed.io/type"] = "virtual-node"
    return {"metadata": {"name": name, "labels": labels}}


def volume(name: str, node_name: str = LOCAL, size: str = "50Gi", cls: str = "local-disk") -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cls,
            "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
        },
        "status": {"phase": "Available"},
    }


def claim(name: str = "data", node_name: str = LOCAL) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "annotations": {
                "volume.kubernetes.io/storage-provisioner": "storage.gpufed.io",
                "volume.kubernetes.io/selected-node": node_name,
            },
        },
        "spec": {
            "storageClassName": "gpufed",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }


def got(api: FakeApiServer, resource: str, namespace: str, name: str) -> dict[str, Any]:
    obj = api.get(resource, namespace, name)
    assert obj is not None, f"{resource} {namespace}/{name} is missing"
    return obj


def reasons(api: FakeApiServer, name: str) -> list[str]:
    return [e["reason"] for e in api.items("events", "team") if e["involvedObject"]["name"] == name]


@contextlib.asynccontextmanager
async def binder(settings: LocalStorageSettings | None = None) -> AsyncIterator[tuple[FakeApiServer, LocalClaims]]:
    async with serve() as (api, client):
        api.create("nodes", node(LOCAL))
        api.create("nodes", node("gpufed-gpu-a", virtual=True))
        b = LocalClaims(client, settings or LocalStorageSettings(retry_s=0.1))
        task = asyncio.create_task(b.run())
        try:
            yield api, b
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_static_volume_on_the_node_is_handed_to_the_claim() -> None:
    async with binder() as (api, _b):
        api.create("storageclasses", storage_class("local-disk", "kubernetes.io/no-provisioner"))
        api.create("storageclasses", storage_class("gpufed", "storage.gpufed.io"))
        api.create("persistentvolumes", volume("elsewhere", node_name="consumer-cpu-1", size="20Gi"))
        api.create("persistentvolumes", volume("v-big", size="100Gi"))
        api.create("persistentvolumes", volume("v-small", size="20Gi"))
        c = api.create("persistentvolumeclaims", claim())
        await until(lambda: got(api, "persistentvolumes", "", "v-small")["spec"].get("claimRef") is not None)
        ref = got(api, "persistentvolumes", "", "v-small")["spec"]["claimRef"]
        assert ref["uid"] == c["metadata"]["uid"] and (ref["namespace"], ref["name"]) == ("team", "data")
        assert "claimRef" not in got(api, "persistentvolumes", "", "v-big")["spec"]
        await until(lambda: "BoundLocally" in reasons(api, "data"))
        patch = [r for r in api.requests if r.method == "PATCH" and r.path.endswith("/v-small")]
        assert patch and "resourceVersion" in patch[0].body["metadata"], "handed over at the version it was read"


async def test_claims_on_virtual_nodes_and_unscheduled_claims_are_not_touched() -> None:
    async with binder() as (api, _b):
        api.create("storageclasses", storage_class("local-disk", "kubernetes.io/no-provisioner"))
        api.create("persistentvolumes", volume("v-1"))
        api.create("persistentvolumeclaims", claim("remote", node_name="gpufed-gpu-a"))
        unscheduled = claim("later")
        del unscheduled["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
        api.create("persistentvolumeclaims", unscheduled)
        other = claim("other-provisioner")
        other["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] = "ebs.csi.aws.com"
        api.create("persistentvolumeclaims", other)
        await asyncio.sleep(0.5)
        assert "claimRef" not in got(api, "persistentvolumes", "", "v-1")["spec"]
        assert not api.items("events", "team")


async def test_a_claim_without_a_class_or_a_volume_waits_saying_why_then_binds() -> None:
    async with binder() as (api, _b):
        api.create("storageclasses", storage_class("gpufed", "storage.gpufed.io"))
        api.create("persistentvolumeclaims", claim())
        await until(lambda: "NoLocalStorageClass" in reasons(api, "data"))
        message = next(e["message"] for e in api.items("events", "team") if e["reason"] == "NoLocalStorageClass")
        assert "no default StorageClass" in message and LOCAL in message, message
        api.create("storageclasses", storage_class("local-disk", "kubernetes.io/no-provisioner"))
        await until(lambda: "NoLocalVolume" in reasons(api, "data"))
        api.create("persistentvolumes", volume("v-too-small", size="1Gi"))
        await asyncio.sleep(0.3)
        assert "claimRef" not in got(api, "persistentvolumes", "", "v-too-small")["spec"]
        api.create("persistentvolumes", volume("v-1"))
        await until(lambda: "claimRef" in got(api, "persistentvolumes", "", "v-1")["spec"])
        await until(lambda: "BoundLocally" in reasons(api, "data"))
        assert reasons(api, "data").count("NoLocalVolume") == 1, "said once"


async def test_a_named_local_class_that_does_not_exist_is_said() -> None:
    async with binder(LocalStorageSettings(local_class="fast", retry_s=0.1)) as (api, _b):
        api.create("storageclasses", storage_class("local-disk", "kubernetes.io/no-provisioner"))
        api.create("persistentvolumes", volume("v-1"))
        api.create("persistentvolumeclaims", claim())
        await until(lambda: "NoLocalStorageClass" in reasons(api, "data"))
        message = next(e["message"] for e in api.items("events", "team") if e["reason"] == "NoLocalStorageClass")
        assert "StorageClass fast" in message and "--local-storage-class" in message, message
        assert "claimRef" not in got(api, "persistentvolumes", "", "v-1")["spec"], "the default is not used instead"


async def _shadowed_claim(api: Any) -> tuple[str, str, dict[str, Any]]:
    """A claim of a dynamic local class, and the shadow the binder made for it: (claim UID, shadow
    name, shadow)."""
    api.create("storageclasses", storage_class("csi-local", "local.csi.example.com"))
    uid = str(api.create("persistentvolumeclaims", claim())["metadata"]["uid"])
    shadow_name = f"gpufed-local-{uid}"
    await until(lambda: api.get("persistentvolumeclaims", "team", shadow_name) is not None)
    return uid, shadow_name, got(api, "persistentvolumeclaims", "team", shadow_name)


async def test_a_dynamic_class_is_asked_through_a_shadow_claim_whose_volume_is_handed_over() -> None:
    async with binder() as (api, _b):
        uid, shadow_name, shadow = await _shadowed_claim(api)
        assert shadow["spec"]["storageClassName"] == "csi-local"
        assert shadow["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == LOCAL
        # the class's provisioner provisions a volume for the shadow, and the binder binds them
        pv = volume("pvc-123", cls="csi-local")
        pv["spec"]["claimRef"] = {"namespace": "team", "name": shadow_name, "uid": shadow["metadata"]["uid"]}
        pv["status"]["phase"] = "Bound"
        api.create("persistentvolumes", pv)
        api.update("persistentvolumeclaims", "team", shadow_name, lambda o: o["spec"].update(volumeName="pvc-123"))
        await until(lambda: got(api, "persistentvolumes", "", "pvc-123")["spec"]["claimRef"]["uid"] == uid)
        await until(lambda: api.get("persistentvolumeclaims", "team", shadow_name) is None)
        assert got(api, "persistentvolumes", "", "pvc-123")["spec"]["claimRef"]["name"] == "data"
        await until(lambda: "BoundLocally" in reasons(api, "data"))


async def test_a_shadow_of_a_claim_whose_pod_went_to_a_virtual_node_is_deleted() -> None:
    async with binder() as (api, _b):
        api.create("storageclasses", storage_class("csi-local", "local.csi.example.com"))
        c = api.create("persistentvolumeclaims", claim())
        shadow_name = f"gpufed-local-{c['metadata']['uid']}"
        await until(lambda: api.get("persistentvolumeclaims", "team", shadow_name) is not None)
        api.update(
            "persistentvolumeclaims",
            "team",
            "data",
            lambda o: o["metadata"]["annotations"].update({"volume.kubernetes.io/selected-node": "gpufed-gpu-a"}),
        )
        await until(lambda: api.get("persistentvolumeclaims", "team", shadow_name) is None)


async def test_a_pod_kept_local_gets_one_event() -> None:
    async with serve() as (api, client):
        reporter = KeptLocalReporter(client)
        task = asyncio.create_task(reporter.run())
        try:
            pod = {
                "metadata": {"name": "p", "namespace": "team", "labels": {"gpufed.io/kept-local": "pending"}},
                "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
            }
            api.create("pods", pod)
            api.create("pods", {"metadata": {"name": "q", "namespace": "team"}, "spec": {}})
            await until(lambda: bool(api.items("events", "team")))
            api.update("pods", "team", "p", lambda o: o["metadata"].update(annotations={"x": "y"}))
            await asyncio.sleep(0.3)
            (event,) = api.items("events", "team")
            assert event["involvedObject"]["name"] == "p" and event["reason"] == "KeptLocal"
            assert event["type"] == "Warning" and event.get("count", 1) == 1
            assert "(data)" in event["message"] and "stays Pending" in event["message"], event["message"]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_shadow_bound_before_its_volume_is_seen_is_handed_over_when_the_volume_arrives() -> None:
    async with binder() as (api, _b):
        uid, shadow_name, shadow = await _shadowed_claim(api)
        # the claim's binding is seen first, its volume only later (two watches, no order between them)
        api.update("persistentvolumeclaims", "team", shadow_name, lambda o: o["spec"].update(volumeName="pvc-9"))
        await asyncio.sleep(0.3)
        pv = volume("pvc-9", cls="csi-local")
        pv["spec"]["claimRef"] = {"namespace": "team", "name": shadow_name, "uid": shadow["metadata"]["uid"]}
        api.create("persistentvolumes", pv)
        await until(lambda: got(api, "persistentvolumes", "", "pvc-9")["spec"]["claimRef"]["uid"] == uid)
        await until(lambda: api.get("persistentvolumeclaims", "team", shadow_name) is None)
