"""Protobuf <-> `gpupool.capacity` values, for the estimator's server and client.

Owns: the one mapping between the wire messages of estimator.proto and the frozen dataclasses
callers use, both ways, so that nobody outside `gpupool.estimator` sees a protobuf type. Lossless:
`snapshot_from_pb(snapshot_to_pb(s)) == s` (and likewise for shapes, placements).

Pure: no I/O.
"""

from __future__ import annotations

from gpupool.capacity import (
    Attribute,
    Bucket,
    DeviceGroup,
    Placement,
    PodShape,
    ProductCapacity,
    Snapshot,
    Toleration,
)
from gpupool.estimator import estimator_pb2 as pb

SERVICE = "gpufed.estimator.v1.Estimator"
GET_CAPACITY = f"/{SERVICE}/GetCapacity"
CAN_PLACE = f"/{SERVICE}/CanPlace"
MAX_REPLICAS = f"/{SERVICE}/MaxReplicas"
WATCH = f"/{SERVICE}/Watch"


def product_to_pb(p: ProductCapacity) -> pb.ProductCapacity:
    msg = pb.ProductCapacity(
        product=p.product,
        nodes=p.nodes,
        unhealthy_nodes=p.unhealthy_nodes,
        total=p.total,
        allocatable=p.allocatable,
        in_use=p.in_use,
        free=p.free,
        largest_shape=p.largest_shape,
        histogram=[pb.Bucket(free_gpus=b.free_gpus, nodes=b.nodes) for b in p.histogram],
        free_cpu_millis=p.free_cpu_millis,
        free_memory_bytes=p.free_memory_bytes,
        free_pods=p.free_pods,
        labels=dict(p.labels),
        source=p.source,
        largest_node=p.largest_node,
    )
    if p.gpu_memory_mib is not None:
        msg.gpu_memory_mib = p.gpu_memory_mib
    return msg


def product_from_pb(m: pb.ProductCapacity) -> ProductCapacity:
    return ProductCapacity(
        product=m.product,
        nodes=m.nodes,
        unhealthy_nodes=m.unhealthy_nodes,
        total=m.total,
        allocatable=m.allocatable,
        in_use=m.in_use,
        free=m.free,
        largest_shape=m.largest_shape,
        histogram=tuple(Bucket(free_gpus=b.free_gpus, nodes=b.nodes) for b in m.histogram),
        free_cpu_millis=m.free_cpu_millis,
        free_memory_bytes=m.free_memory_bytes,
        free_pods=m.free_pods,
        labels=dict(sorted(m.labels.items())),
        gpu_memory_mib=m.gpu_memory_mib if m.HasField("gpu_memory_mib") else None,
        source=m.source,
        largest_node=m.largest_node,
    )


def group_to_pb(g: DeviceGroup) -> pb.DeviceGroup:
    return pb.DeviceGroup(
        product=g.product,
        driver=g.driver,
        device_classes=list(g.device_classes),
        attributes=[pb.Attribute(name=a.name, kind=a.kind, value=a.value) for a in g.attributes],
        capacity=[pb.CapacityEntry(name=n, value=v) for n, v in g.capacity],
        extended_resource=g.extended_resource,
        total=g.total,
        free=g.free,
        largest=g.largest,
    )


def group_from_pb(m: pb.DeviceGroup) -> DeviceGroup:
    return DeviceGroup(
        product=m.product,
        driver=m.driver,
        device_classes=tuple(m.device_classes),
        attributes=tuple(Attribute(a.name, a.kind, a.value) for a in m.attributes),
        capacity=tuple((c.name, c.value) for c in m.capacity),
        extended_resource=m.extended_resource,
        total=m.total,
        free=m.free,
        largest=m.largest,
    )


def snapshot_to_pb(s: Snapshot, *, heartbeat: bool = False) -> pb.Snapshot:
    return pb.Snapshot(
        revision=s.revision,
        products=[product_to_pb(p) for p in s.products],
        observed_at=s.observed_at,
        heartbeat=heartbeat,
        devices=[group_to_pb(g) for g in s.devices],
    )


def snapshot_from_pb(m: pb.Snapshot) -> Snapshot:
    return Snapshot(
        revision=m.revision,
        products=tuple(product_from_pb(p) for p in m.products),
        observed_at=m.observed_at,
        devices=tuple(group_from_pb(g) for g in m.devices),
    )


def shape_to_pb(s: PodShape) -> pb.PodShape:
    msg = pb.PodShape(
        gpus=s.gpus,
        cpu_millis=s.cpu_millis,
        memory_bytes=s.memory_bytes,
        node_selector=[pb.SelectorPair(key=k, value=v) for k, v in s.node_selector],
        tolerations=[
            pb.Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect) for t in s.tolerations
        ],
    )
    if s.gpu_product is not None:
        msg.gpu_product = s.gpu_product
    return msg


def shape_from_pb(m: pb.PodShape) -> PodShape:
    return PodShape(
        gpus=m.gpus,
        cpu_millis=m.cpu_millis,
        memory_bytes=m.memory_bytes,
        gpu_product=m.gpu_product if m.HasField("gpu_product") else None,
        node_selector=tuple((p.key, p.value) for p in m.node_selector),
        tolerations=tuple(
            Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect) for t in m.tolerations
        ),
    )


def placement_to_pb(p: Placement) -> pb.Placement:
    return pb.Placement(placeable=p.placeable, reason=p.reason, nodes=p.nodes)


def placement_from_pb(m: pb.Placement) -> Placement:
    return Placement(placeable=m.placeable, reason=m.reason, nodes=m.nodes)


def replicas_to_pb(replicas: int, reason: str) -> pb.Replicas:
    return pb.Replicas(replicas=replicas, reason=reason)


def replicas_from_pb(m: pb.Replicas) -> tuple[int, str]:
    return m.replicas, m.reason
