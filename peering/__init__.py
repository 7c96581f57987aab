"""Peering: cluster identity, the authenticated handshake, CRD models and the domain-free
Kubernetes plumbing (`peering.kube`) that every other part builds on.
"""
