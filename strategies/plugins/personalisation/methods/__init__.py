"""The personalisation methods, one per file, each registered in
:data:`strategies.plugins.personalisation.method.PERSONALISATION` (discovered on first use)."""
