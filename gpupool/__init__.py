"""The global GPU pool: the capacity model (`capacity`, pure), the provider's capacity estimator
(`estimator`: gRPC server, client, proto) and the GPU node agent (`agent`: NVML facts on the Node).
"""
