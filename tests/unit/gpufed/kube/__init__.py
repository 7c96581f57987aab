"""tests.unit.gpufed.kube."""
