"""Provider-agnostic virtual-kubelet machinery: the Node and its lease (`node`), the pod controller
(`pods`), and the contract a provider implements (`provider.PodProvider`, `NodeProvider`,
`StreamingProvider`).

Depends on: the Kubernetes kernel (`gpufed.kube`: REST, watch, work queue, events, metrics, RFC 3339
times), the shared wire names and quantities (`gpufed.apis.wire`, `gpufed.apis.quantity`: virtual-node
labels and taint), the pure pod forge (`vkprovider.forge.pods`: status patches, terminal status) and
`vkprovider.defaults`. Knows nothing about peering, remote clusters or GPU pools: nothing here imports
`peering`, `vkprovider.remote` or `gpupool`, directly or through what it imports.
"""
