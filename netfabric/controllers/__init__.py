"""Long-running fabric components: the gateway agent (one per peering per side)."""
