# Added by gpufed.devtools.protogen: protoc's stubs use bare Mapping in constructor signatures.
# mypy: disable-error-code="type-arg"
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CapacityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Bucket(_message.Message):
    __slots__ = ("free_gpus", "nodes")
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    free_gpus: int
    nodes: int
    def __init__(self, free_gpus: _Optional[int] = ..., nodes: _Optional[int] = ...) -> None: ...

class ProductCapacity(_message.Message):
    __slots__ = ("product", "nodes", "unhealthy_nodes", "total", "allocatable", "in_use", "free", "largest_shape", "histogram", "free_cpu_millis", "free_memory_bytes", "free_pods", "labels", "gpu_memory_mib", "source", "largest_node")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_NODES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    LARGEST_SHAPE_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    FREE_CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_PODS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LARGEST_NODE_FIELD_NUMBER: _ClassVar[int]
    product: str
    nodes: int
    unhealthy_nodes: int
    total: int
    allocatable: int
    in_use: int
    free: int
    largest_shape: int
    histogram: _containers.RepeatedCompositeFieldContainer[Bucket]
    free_cpu_millis: int
    free_memory_bytes: int
    free_pods: int
    labels: _containers.ScalarMap[str, str]
    gpu_memory_mib: int
    source: str
    largest_node: int
    def __init__(self, product: _Optional[str] = ..., nodes: _Optional[int] = ..., unhealthy_nodes: _Optional[int] = ..., total: _Optional[int] = ..., allocatable: _Optional[int] = ..., in_use: _Optional[int] = ..., free: _Optional[int] = ..., largest_shape: _Optional[int] = ..., histogram: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ..., free_cpu_millis: _Optional[int] = ..., free_memory_bytes: _Optional[int] = ..., free_pods: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., gpu_memory_mib: _Optional[int] = ..., source: _Optional[str] = ..., largest_node: _Optional[int] = ...) -> None: ...

class Attribute(_message.Message):
    __slots__ = ("name", "kind", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    value: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class CapacityEntry(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class DeviceGroup(_message.Message):
    __slots__ = ("product", "driver", "device_classes", "attributes", "capacity", "extended_resource", "total", "free", "largest")
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_CLASSES_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    LARGEST_FIELD_NUMBER: _ClassVar[int]
    product: str
    driver: str
    device_classes: _containers.RepeatedScalarFieldContainer[str]
    attributes: _containers.RepeatedCompositeFieldContainer[Attribute]
    capacity: _containers.RepeatedCompositeFieldContainer[CapacityEntry]
    extended_resource: str
    total: int
    free: int
    largest: int
    def __init__(self, product: _Optional[str] = ..., driver: _Optional[str] = ..., device_classes: _Optional[_Iterable[str]] = ..., attributes: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ..., capacity: _Optional[_Iterable[_Union[CapacityEntry, _Mapping]]] = ..., extended_resource: _Optional[str] = ..., total: _Optional[int] = ..., free: _Optional[int] = ..., largest: _Optional[int] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("revision", "products", "observed_at", "heartbeat", "devices")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PRODUCTS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    revision: int
    products: _containers.RepeatedCompositeFieldContainer[ProductCapacity]
    observed_at: float
    heartbeat: bool
    devices: _containers.RepeatedCompositeFieldContainer[DeviceGroup]
    def __init__(self, revision: _Optional[int] = ..., products: _Optional[_Iterable[_Union[ProductCapacity, _Mapping]]] = ..., observed_at: _Optional[float] = ..., heartbeat: _Optional[bool] = ..., devices: _Optional[_Iterable[_Union[DeviceGroup, _Mapping]]] = ...) -> None: ...

class Toleration(_message.Message):
    __slots__ = ("key", "operator", "value", "effect")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    value: str
    effect: str
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ...) -> None: ...

class SelectorPair(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class PodShape(_message.Message):
    __slots__ = ("gpus", "cpu_millis", "memory_bytes", "gpu_product", "node_selector", "tolerations")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_PRODUCT_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOLERATIONS_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    cpu_millis: int
    memory_bytes: int
    gpu_product: str
    node_selector: _containers.RepeatedCompositeFieldContainer[SelectorPair]
    tolerations: _containers.RepeatedCompositeFieldContainer[Toleration]
    def __init__(self, gpus: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., gpu_product: _Optional[str] = ..., node_selector: _Optional[_Iterable[_Union[SelectorPair, _Mapping]]] = ..., tolerations: _Optional[_Iterable[_Union[Toleration, _Mapping]]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("placeable", "reason", "nodes")
    PLACEABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    placeable: bool
    reason: str
    nodes: int
    def __init__(self, placeable: _Optional[bool] = ..., reason: _Optional[str] = ..., nodes: _Optional[int] = ...) -> None: ...

class Replicas(_message.Message):
    __slots__ = ("replicas", "reason")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    reason: str
    def __init__(self, replicas: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
