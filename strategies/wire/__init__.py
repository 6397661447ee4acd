"""The wire kernel: what the server and the sites both import and must agree on.

``clients/`` imports nothing else of ``strategies/``, and nothing here imports anything
of ``strategies/`` outside this package (stdlib, numpy, ``cryptography`` and Flower's
secure-aggregation primitives only; tests/test_layering.py). The server's side imports
the same modules, so a change here is a change of the protocol both ends speak.

Modules, by role
----------------
- errors and registry: :mod:`.errors` (the exception root and its kinds, whose codes
  cross the wire), :mod:`.registry` (the one :class:`~.registry.Registry` type);
- seeds: :mod:`.seeds` (every seed the product derives: codec, sampling, masks);
- message keys: :mod:`.message_keys` (the record, entry and metric names of every
  message);
- packing: :mod:`.model_layout` (how a model's named arrays lie in a message: the packed
  model, the update's arrays, the dense update), :mod:`.update_codec` (an update's codec
  payload);
- codecs: :mod:`.codecs` (one module per codec, one registry, bit packing, error
  feedback; :mod:`strategies.compression` is its functional-core facade);
- downlink entries: :mod:`.downlink_header` (the downlink entries of an instruction),
  :mod:`.downlink_receive` (a site's receive of the compressed downlink),
  :mod:`.downlink_reference` (the reference model both ends hold);
- plug-in option types the site parses: :mod:`.plugin_options` (``PluginOptions``,
  ``PluginError``), :mod:`.personalisation_options` (the ``personalisation.*`` section,
  the method names), :mod:`.personalisation_gain` (the personalised-gain metric names),
  :mod:`.vertical_options` (the ``vertical.*`` section), :mod:`.pruning_mask` (the
  pruning mask: compact / expand, its record), :mod:`.local_solver` (a site's own
  a-norm, FedNova and SecAgg+);
- SecAgg+ participant maths: :mod:`.secure_aggregation` (the site's side of the stages,
  the round plan, the masked vector, the site coefficient, crypto and encoding; the
  coordinator is :mod:`strategies.secure_aggregation.coordinator`);
- the run-key table: :mod:`.run_keys` (the run config's flat keys: types, defaults,
  ranges, which side reads each).
"""
