"""The local providers' storage (gpufed.localenv.storage): one default StorageClass of static local
volumes and the volumes, pinned to the GPU nodes; nothing for a cluster without GPUs."""

from __future__ import annotations

from gpufed.apis.wire import STORAGE_CLASS_ACCESS_MODES_ANNOTATION
from gpufed.localenv import install, storage
from gpufed.localenv.topology import default_topology
from peering import storage as offers


def test_gpu_clusters_get_a_default_class_and_volumes_on_every_gpu_node() -> None:
    topo = default_topology()
    assert storage.manifests(topo.cluster("consumer")) == []
    docs = storage.manifests(topo.cluster("gpu-b"))
    sc, *volumes = docs
    assert sc["kind"] == "StorageClass" and sc["metadata"]["name"] == storage.STORAGE_CLASS == "local-disk"
    assert sc["provisioner"] == "kubernetes.io/no-provisioner" and sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert sc["metadata"]["annotations"][STORAGE_CLASS_ACCESS_MODES_ANNOTATION] == "ReadWriteOnce"
    info = offers.storage_class_info(sc)
    assert info.default and info.static, "what the provider's controller offers by default"
    nodes = [n.name for n in topo.cluster("gpu-b").nodes()]
    assert len(volumes) == len(nodes) * storage.VOLUMES_PER_GPU_NODE == 24
    first = volumes[0]
    assert first["metadata"]["name"] == f"{nodes[0]}-vol-0"
    spec = first["spec"]
    assert spec["local"] == {"path": "/mnt/disks/vol-0"} and spec["capacity"] == {"storage": "50Gi"}
    assert spec["persistentVolumeReclaimPolicy"] == "Retain" and spec["storageClassName"] == "local-disk"
    term = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term == {"key": "kubernetes.io/hostname", "operator": "In", "values": [nodes[0]]}
    assert len({v["metadata"]["name"] for v in volumes}) == len(volumes)


def test_the_launcher_knows_how_to_apply_them() -> None:
    for doc in storage.manifests(default_topology().cluster("gpu-a"))[:2]:
        assert doc["kind"] in install._EXTRA_KINDS
