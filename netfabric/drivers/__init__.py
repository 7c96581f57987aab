"""The gateway's data plane, behind small interfaces: network namespaces (netns), nftables (nft) and
the WireGuard tunnel drivers (wireguard). Everything here touches the kernel; what to configure is
decided by the pure `netfabric.render` and `netfabric.ipam`."""
