"""gpufed: the product shell (CLI, composition roots, cross-feature commands, the local environment,
developer tools) and the shared kernel every feature builds on (`gpufed.apis`, `gpufed.kube`).

The features live in sibling top-level packages: `vkprovider` (the virtual kubelet), `peering`
(trust and tenancy), `gpupool` (the GPU pool) and `netfabric` (the network fabric).
"""

#: gpufed's top-level packages, shell and features alike (profiles and scans tell our code by them).
PACKAGES = ("gpufed", "vkprovider", "peering", "gpupool", "netfabric")
