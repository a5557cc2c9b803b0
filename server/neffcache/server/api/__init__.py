"""HTTP routes, one module per resource; errors map to statuses in ``app``."""
