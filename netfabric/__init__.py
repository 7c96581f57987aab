"""Network fabric: IPAM remapping of overlapping CIDRs, WireGuard gateways and nftables NAT.
Never imports `vkprovider`; it satisfies the IP-translation Protocol that `vkprovider.remote`
declares.
"""
