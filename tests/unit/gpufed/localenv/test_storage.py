"""The local clusters' storage (gpufed.localenv.storage): one default StorageClass of static local
volumes and the volumes, pinned to the GPU nodes of a provider, to every node of the consumer."""

from __future__ import annotations

from gpufed.apis.wire import STORAGE_CLASS_ACCESS_MODES_ANNOTATION
from gpufed.localenv import install, storage
from gpufed.localenv.topology import default_topology
from peering import storage as offers


def test_gpu_clusters_get_a_default_class_and_volumes_on_every_gpu_node() -> None:
    topo = default_topology()
    docs = storage.manifests(topo.cluster("gpu-b"))
    sc, *volumes = docs
    assert sc["kind"] == "StorageClass" and sc["metadata"]["name"] == storage.STORAGE_CLASS == "local-disk"
    assert sc["provisioner"] == "kubernetes.io/no-provisioner" and sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert sc["metadata"]["annotations"][STORAGE_CLASS_ACCESS_MODES_ANNOTATION] == "ReadWriteOnce"
    info = offers.storage_class_info(sc)
    assert info.default and info.static, "what the provider's controller offers by default"
    nodes = [n.name for n in topo.cluster("gpu-b").nodes()]
    assert len(volumes) == len(nodes) * storage.VOLUMES_PER_NODE == 24
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


def test_a_cluster_without_gpus_gets_volumes_on_all_its_nodes() -> None:
    consumer = default_topology().cluster("consumer")
    sc, *volumes = storage.manifests(consumer)
    assert sc["metadata"]["name"] == "local-disk"
    nodes = [n.name for n in consumer.nodes()]
    assert nodes and all(n.pool.gpus == 0 for n in consumer.nodes())
    assert sorted({v["metadata"]["labels"]["gpufed.io/local-node"] for v in volumes}) == sorted(nodes)
    assert len(volumes) == len(nodes) * storage.VOLUMES_PER_NODE
