"""tests.unit.gpufed."""
