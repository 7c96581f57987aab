"""Trust and tenancy between two clusters: the authenticated handshake (`handshake`), grant decisions
(`grants`), the offload pod-security policy (`podsecurity`), the reconcilers of both roles
(`controllers`) and the operator's peering and offloading commands (`ops`).
"""
