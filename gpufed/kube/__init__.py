"""Domain-free Kubernetes plumbing: client factory (and, as later parts need them, error mapping,
resilient watches, work queues). Imports nothing else from `peering`, so it could move to a
package of its own; client-library exceptions do not leak past it.
"""
