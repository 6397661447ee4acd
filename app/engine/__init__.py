"""The in-process engine: the real ServerApp against N virtual sites, in one process.

:class:`InProcessGrid` implements Flower's Grid over :class:`VirtualSite` objects
(the real ClientApp by default, each with one persistent Context, declarative
:class:`SiteFaults` and, with ``egress_filter``, the site runtime's egress filter);
:func:`run_federation` runs the product's ServerApp on it.
No SuperLink, no Ray, no subprocess: small runs (``make simulate ENGINE=local``),
the benchmarks and the tests. Ray stays the engine at scale (``ENGINE=ray``).
"""

from app.engine.federation import full_run_config, run_federation, server_identity
from app.engine.grid import InjectedFault, InProcessGrid, SiteFaults
from app.engine.virtual_site import VirtualSite, partition_sites

__all__ = ["InProcessGrid", "InjectedFault", "SiteFaults", "VirtualSite", "full_run_config",
           "partition_sites", "run_federation", "server_identity"]
