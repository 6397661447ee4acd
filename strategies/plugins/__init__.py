"""Strategy plug-ins, one per file; each registers itself in :mod:`strategies.registry`."""
