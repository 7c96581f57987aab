"""Defaults of peering's knobs that `gpufed --help` shows, in a module that imports nothing.

The CLI declares its flags at import time; taking their defaults from here lets every `gpufed`
command start without loading the modules that use them (aiohttp, pydantic models, the Kubernetes
client: about a second of a short command's start). Those modules re-export the values under their
own names (`peering.ops.peer.DEFAULT_TIMEOUT_S`, ...); they and the CLI are this module's only readers.
"""

from __future__ import annotations

#: Seconds `gpufed peer`, `unpeer`, `network connect` and `offload-namespace` may take in all.
OPERATION_TIMEOUT_S = 120.0
#: Seconds a consumer's client certificate lives (what the provider asks its CSR API for; >= 600).
CLIENT_CERT_SECONDS = 90 * 24 * 3600
#: Fraction of a client certificate's lifetime after which the consumer renews it.
CLIENT_CERT_RENEW_FRACTION = 2 / 3
#: The CSR API's shortest certificate lifetime (`expirationSeconds`).
MIN_CERT_SECONDS = 600
