"""Provider-agnostic virtual-kubelet machinery: the Node and its lease, the pod controller, and the
contract (`provider.PodProvider`) a provider implements. Knows nothing about peering or remote clusters."""
