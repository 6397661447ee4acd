"""Personalisation (run config ``personalisation``): how each site's own model departs from the global one.

Here, the server's side: the methods (one file each in ``methods/``, each a
:class:`.method.PersonalisationMethod`), the rules that refuse combinations that make
no sense (:mod:`.rules`). The run-config section and the methods' registry
(:mod:`strategies.wire.personalisation_options`,
:data:`~strategies.wire.personalisation_options.PERSONALISATION`) and the gains (:mod:`strategies.wire.personalisation_gain`) are in the wire kernel.
The site side of each method is in :mod:`clients.training.personalisation`.
"""
