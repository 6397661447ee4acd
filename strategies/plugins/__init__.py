"""Strategy plug-ins, one per file, in one folder per kind.

``aggregators/``, ``schedules/`` and ``selectors/`` each belong to one registry of
:mod:`strategies.registry`; a plug-in declares its typed options
(:mod:`strategies.plugins.options`) and registers itself by name.
"""
