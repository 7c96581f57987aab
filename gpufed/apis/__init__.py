"""gpufed's API surface, pure (no I/O): the CRD models per group (`peering`, `offloading`, `network`,
with what they share in `meta` and the list of kinds in `kinds`), the GPU resource vocabulary
(`pool`), every name on the wire (`wire`) and resource quantities (`quantity`).
"""
