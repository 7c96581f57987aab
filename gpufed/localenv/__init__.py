"""The local multi-cluster environment: real control planes on loopback, GPU nodes simulated by kwok.

Used by `gpufed local up|down|status`, `make clusters-up` / `make demo`, and the e2e test fixtures.
Submodules: `topology` (what to run), `pki` (key material), `kubeconfig`, `kwokcfg` (node and pod
simulation, simulated kubelet metrics), `metricsserver` (the resource metrics API), `launcher`
(processes and health), `podnet` (network namespaces, gateway agents and real pod
network stacks for the demo's data plane).
"""
