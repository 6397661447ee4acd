"""Strategy plug-ins, one per file, in one folder per kind.

``aggregators/``, ``defences/``, ``schedules/``, ``selectors/`` and
``personalisation/`` each belong to one :class:`~strategies.wire.registry.Registry`
(:mod:`strategies.plugins.registries`); a plug-in declares its typed options
(:mod:`strategies.wire.plugin_options`), registers itself by name and meets the
Protocol of its kind (:mod:`strategies.plugins.protocols`).
"""
