"""tests.unit.deploy.local."""
