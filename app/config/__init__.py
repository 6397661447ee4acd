"""Run and node configuration: the typed, validated settings of a federation and a site.

* :mod:`app.config.run_config`: :class:`RunConfig`, ``[tool.flwr.app.config]`` plus
  overrides (the plug-ins validate their own sections, :mod:`strategies.plugins.registries`);
* :mod:`app.config.site_config`: :class:`SiteConfig`, a site's paths from node_config.
"""
