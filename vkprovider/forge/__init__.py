"""Pure translators between a consumer's objects and their remote twins (no I/O, no clients)."""
