"""The GPU resource vocabulary: what NVIDIA's device plugin names, and what a slice may request.

Owns: the extended resource the device plugin advertises (`nvidia.com/gpu`), the node label naming
the GPU model (`nvidia.com/gpu.product`), and the resource names a ResourceSlice or a tenant's
policy may hold (`SLICE_RESOURCES`).

Does not: hold gpufed's own pool annotations and labels (`gpufed.apis.wire`), or measure a pool
(`gpupool.capacity`).

Pure: no I/O.
"""

from __future__ import annotations

#: The extended resource NVIDIA's device plugin advertises, and the node label naming the GPU model.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: Resource names a ResourceSlice may request.
SLICE_RESOURCES = ("cpu", "memory", "pods", GPU_RESOURCE)
