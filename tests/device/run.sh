#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, as one command on a GPU machine (from the repo root; $OUT is
# where the results go, the current directory when unset). Python packages the machine lacks come
# as wheels in .whl/ (installed into /tmp/site when the project's own imports fail).
#   1. nvidia-smi, for the record;
#   2. one NVML session of the GPU node agent's reader, recorded call by call ($OUT/nvml-recording.json,
#      the format of tests/unit/data/nvml/);
#   3. the agent's unit tests, whose test of the real reader then reads real GPUs;
#   4. `gpufed gpu-agent --once` against real NVML, publishing to a Node (tests/device/agent_on_nvml.py).
set -uo pipefail
OUT=${OUT:-.}
if ! python3 -c "import kubernetes_asyncio, structlog, orjson, pytest_asyncio" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
rc=0
echo "== nvidia-smi"; nvidia-smi | tee "$OUT/nvidia-smi.txt" || rc=1
echo "== recording one NVML session"; python3 -m tests.unit.gpupool.agent.test_agent "$OUT/nvml-recording.json" || rc=1
echo "== the agent's unit tests"; python3 -m pytest -q -p no:cacheprovider tests/unit/gpupool/agent/test_agent.py 2>&1 | tee "$OUT/unit.txt" || rc=1
echo "== gpufed gpu-agent --once on real NVML"; python3 -m tests.device.agent_on_nvml "$OUT/agent-node.json" || rc=1
echo "== rc=$rc"; exit $rc
