"""Defaults of vkprovider's knobs that `gpufed --help` shows, in a module that imports nothing.

The CLI declares its flags at import time; taking their defaults from here lets every `gpufed`
command start without loading the parts that use them (the controller, the virtual kubelet). Those
modules re-export the values under their own names (`gpufed.app.controller.DEFAULT_KUBELET_PORTS`, ...).
"""

from __future__ import annotations

#: Port range for the kubelet APIs of the virtual kubelets the controller starts.
KUBELET_PORTS = (10250, 10259)
#: A virtual kubelet's client budget towards each API server. A kubelet runs with 50 QPS / burst
#: 100; one virtual kubelet stands for every node of a provider (ten kubelets' worth here), and an
#: offloaded pod costs it two requests per side on create, so 500 QPS lets it start pods at the rate
#: of a local cluster (about 200 pods/s) and delete them as fast. The budget is a bound on a runaway
#: loop, not the API server's protection: that is its priority-and-fairness (every gpufed identity
#: is in the default flow schemas, queued and shed like any other client).
VIRTUAL_KUBELET_QPS = 500.0
VIRTUAL_KUBELET_BURST = 1000
#: Seconds a twin may stay unplaced (Pending on no node) at the provider before the pod is failed back.
UNPLACED_TIMEOUT_S = 120.0
