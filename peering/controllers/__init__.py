"""The peering reconcilers of `gpufed controller`: cluster identity, the provider role (tenants,
handshake verification, CSR signing, RBAC, twin namespaces, grants and quotas) and the consumer
role (answering challenges, credentials, slice mirroring).
"""
