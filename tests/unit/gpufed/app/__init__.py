"""tests.unit.gpufed.app."""
