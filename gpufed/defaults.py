"""Defaults of the shell's knobs that `gpufed --help` shows, in a module that imports nothing.

The CLI declares its flags at import time; taking their defaults from here lets every `gpufed`
command start without loading the modules that use them (the doctor, the local environment, the
metrics server). Those modules re-export the values under their own names
(`gpufed.kube.metrics.DEFAULT_HOST`, `gpufed.localenv.topology.DEFAULT_BASE_PORT`, ...). The
features keep theirs beside them: `peering.defaults`, `vkprovider.defaults`, `gpupool.defaults`.
"""

from __future__ import annotations

#: Address the metrics server listens on when only a port is given: loopback, as /metrics answers
#: anyone who can connect (no authentication). Where Prometheus scrapes from other hosts or pods,
#: pass `--metrics-host 0.0.0.0` (the Helm chart does, `metrics.host`) and fence the port with a
#: NetworkPolicy.
METRICS_HOST = "127.0.0.1"
#: `gpufed doctor`: seconds one check may take (each check has its own budget).
DOCTOR_CHECK_TIMEOUT_S = 10.0
#: `gpufed doctor`: a provider API round trip slower than this (ms) is a WARN.
DOCTOR_SLOW_API_MS = 1000.0
#: `gpufed doctor`: underlay MTU assumed when judging a tunnel's MTU (standard Ethernet).
DOCTOR_UNDERLAY_MTU = 1500
#: The namespace `gpufed local demo` offloads.
DEMO_NAMESPACE = "team-a"
#: `gpufed local`: first loopback port handed out; each cluster gets a block of ports.
LOCAL_BASE_PORT = 17000
#: The address the local environment's virtual nodes publish (`gpufed.localenv.nodeaddr` says why).
LOCAL_NODE_ADDRESS = "198.18.0.1"
#: `gpufed local`: seconds a Job's pod runs on a kwok node before it completes with exit code 0.
LOCAL_JOB_SECONDS = 5.0
