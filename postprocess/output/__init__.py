"""Output: the report, the bundle and the bundle's manifest."""
