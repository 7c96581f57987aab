"""Operator-driven peering operations (`gpufed peer`, `unpeer`, `info`), run with the operator's
kubeconfigs for both clusters. The CLI is the courier of the handshake; the controllers on each
side do the cryptography and the decisions.
"""
