"""Certificate expiry as metrics: when each credential gpufed holds or serves stops being valid.

Owns the gauges `gpufed_credential_expiry_timestamp_seconds{remote_cluster,kind}` (Unix time the
certificate's notAfter falls on: `x - time()` is the time left) and
`gpufed_credential_issued_timestamp_seconds{remote_cluster,kind}` (its notBefore; with the expiry,
the lifetime, so an alert can say "less than a third of its lifetime left"), and the helpers that
set and drop them. `kind` names the credential: `client` (this consumer's client certificate on
provider `remote_cluster`), `serving` (the serving certificate of a virtual node's kubelet API; there
`remote_cluster` is the virtual node, named after its provider, since one provider may have several).

Reads only a certificate's public validity fields; never a key.

Does not: decide when to renew anything, or read Secrets.
"""

from __future__ import annotations

import contextlib

from cryptography import x509
from prometheus_client import Gauge

#: `kind` of a consumer's client certificate on a provider.
CLIENT = "client"
#: `kind` of a virtual node's kubelet serving certificate.
SERVING = "serving"

CREDENTIAL_EXPIRY = Gauge(
    "gpufed_credential_expiry_timestamp_seconds",
    "Unix time a credential's certificate expires (notAfter); minus time() is the time left.",
    ["remote_cluster", "kind"],
)
CREDENTIAL_ISSUED = Gauge(
    "gpufed_credential_issued_timestamp_seconds",
    "Unix time a credential's certificate became valid (notBefore); expiry minus this is its lifetime.",
    ["remote_cluster", "kind"],
)


def export(remote_cluster: str, kind: str, cert: x509.Certificate) -> None:
    """Publish `cert`'s validity for (`remote_cluster`, `kind`)."""
    CREDENTIAL_EXPIRY.labels(remote_cluster, kind).set(cert.not_valid_after_utc.timestamp())
    CREDENTIAL_ISSUED.labels(remote_cluster, kind).set(cert.not_valid_before_utc.timestamp())


def drop(remote_cluster: str, kind: str) -> None:
    """The credential is gone: remove its series."""
    for gauge in (CREDENTIAL_EXPIRY, CREDENTIAL_ISSUED):
        with contextlib.suppress(KeyError):
            gauge.remove(remote_cluster, kind)


__all__ = ["CLIENT", "CREDENTIAL_EXPIRY", "CREDENTIAL_ISSUED", "SERVING", "drop", "export"]
