"""Defaults of vkprovider's knobs that `gpufed --help` shows, in a module that imports nothing.

The CLI declares its flags at import time; taking their defaults from here lets every `gpufed`
command start without loading the parts that use them (the controller, the virtual kubelet). Those
modules re-export the values under their own names (`gpufed.app.controller.DEFAULT_KUBELET_PORTS`, ...).
"""

from __future__ import annotations

#: Port range for the kubelet APIs of the virtual kubelets the controller starts.
KUBELET_PORTS = (10250, 10259)
#: A virtual kubelet's client budget towards each API server: a kubelet runs with 50 QPS / burst
#: 100; one virtual kubelet stands for a whole provider, so it gets more (it is still bounded).
VIRTUAL_KUBELET_QPS = 200.0
VIRTUAL_KUBELET_BURST = 400
#: Seconds a twin may stay unplaced (Pending on no node) at the provider before the pod is failed back.
UNPLACED_TIMEOUT_S = 120.0
