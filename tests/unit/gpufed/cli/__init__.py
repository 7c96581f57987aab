"""tests.unit.gpufed.cli."""
