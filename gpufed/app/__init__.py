"""Composition roots: build settings and clients, wire the parts, run them under one TaskGroup."""
