"""The provider's ValidatingAdmissionPolicies for a consumer's namespaces, rendered as CEL that
kube-apiserver evaluates itself (no webhook to run or to fail open): the pod policy
`gpufed-offload-policy` (`pods`), the policy for the Services, EndpointSlices and Ingresses a
consumer writes `gpufed-consumer-objects` (`objects`), and the CEL building blocks and binding they
share (`cel`).

Does not: decide what is allowed (the rules, their constants and the namespace projection the
policies read are `peering.podsecurity`), or apply anything (peering.controllers.tenant_namespaces does).

Pure: no I/O.
"""
