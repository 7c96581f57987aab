"""tests.unit.gpufed.apis."""
