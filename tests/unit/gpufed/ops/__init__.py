"""tests.unit.gpufed.ops."""
