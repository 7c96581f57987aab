"""gpufed's API surface: the CRD models, the names on the wire and resource quantities (pure, no I/O)."""
