"""Defaults of the GPU pool's knobs that `gpufed --help` shows, in a module that imports nothing
(`gpufed.defaults` says why such modules exist); `gpupool.agent.agent` re-exports them."""

from __future__ import annotations

#: Seconds between the GPU agent's NVML readings.
GPU_AGENT_INTERVAL_S = 30.0
