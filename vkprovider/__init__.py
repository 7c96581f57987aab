"""gpufed's virtual-kubelet side: CLI, composition root, the provider-agnostic virtual-kubelet
machinery (`node`), the provider for peered clusters (`remote`), pure translators (`forge`), and the
local multi-cluster environment used by the demo and the tests (`localenv`).
"""
