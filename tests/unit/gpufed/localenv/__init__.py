"""tests.unit.gpufed.localenv."""
