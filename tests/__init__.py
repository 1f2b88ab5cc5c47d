"""Fast unit tests: no services."""
