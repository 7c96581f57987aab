"""Trust and tenancy between two clusters: the authenticated handshake (`handshake`), grant decisions
(`grants`), the offload pod-security policy (`podsecurity`) and the admission policies that enforce it
(`admission`), the reconcilers of both roles (`controllers`) and the operator's peering and offloading
commands (`ops`).
"""
