"""Placeholder: the pure GPU capacity model (written next)."""
