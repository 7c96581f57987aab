"""The local multi-cluster environment: real control planes on loopback, GPU nodes simulated by kwok.

Used by `gpufed local up|down|status|demo`, `make clusters-up` / `make demo`, the e2e test fixtures and
the benchmarks. Submodules:

- the clusters: `topology` (what to run), `pki` (key material), `kubeconfig`, `kwokcfg` (node and pod
  simulation, simulated kubelet metrics), `metricsserver` (the resource metrics API), `components`
  (each component's command line), `install` (the objects written into each cluster), `supervise`
  (the long-running processes), `process` (the one runner of short commands, under a timeout),
  `launcher` (`LocalEnvironment`: up, status, down);
- the demo: `steps` (a generic runner of narrated, timed steps), `shell` (commands as a user runs
  them), `manifests` (the plain workloads, shared with the e2e tests and the benchmarks), `story`
  (what each step does), `demo` (the 17 steps in order), `podnet` (network namespaces, gateway agents
  and real pod network stacks for the demo's data plane).
"""
