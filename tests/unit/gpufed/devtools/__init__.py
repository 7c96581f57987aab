"""tests.unit.gpufed.devtools."""
