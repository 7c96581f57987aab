"""tests.unit.gpufed.ops.doctor."""
