"""The GPU node agent (`gpufed gpu-agent`, one per GPU node): NVML facts and health on the Node object.

`nvml` reads the GPUs (blocking, pynvml), `labels` turns a reading into labels and annotations
(pure), `agent` publishes them on the node it runs on. Where NVML is missing the agent says so and
leaves the device plugin's capacity and existing `nvidia.com/*` labels to speak for the node.
"""
