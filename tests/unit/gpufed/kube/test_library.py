"""gpufed.kube.library: gpufed's processes never load kubernetes-asyncio's generated API classes and
models, yet code that asks for a model still gets it (checked in fresh interpreters, since this test
session has long imported the library in full)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, resource, sys
import gpufed.cli  # what every `gpufed` process imports, then what its verb imports:
import gpufed.app.controller, gpufed.app.virtual_kubelet, gpufed.ops.doctor.report, gpufed.localenv.demo
from gpufed.kube import library
out = {"lazy": not library.fully_loaded(), "modules": sum(m.startswith("kubernetes_asyncio") for m in sys.modules)}
from kubernetes_asyncio import client
out["model"] = client.V1Pod.__name__
out["full_after"] = library.fully_loaded()
print(json.dumps(out))
"""


def test_gpufed_imports_none_of_the_generated_modules_but_models_still_load() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["lazy"], "importing the CLI loaded kubernetes-asyncio's generated models"
    assert out["modules"] < 100, f"{out['modules']} kubernetes_asyncio modules loaded (the full library has ~1,200)"
    assert out["model"] == "V1Pod", "asking for a model runs the real package __init__"
    assert out["full_after"]
