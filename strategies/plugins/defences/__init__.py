"""Defences (``strategy.defence``): what is done to the accepted replies before the aggregator.

A defence has ``filter(replies, scales) -> (replies, info)``: it may scale updates
(``norm-bound``) or keep a subset (``multi-krum``), judging each update as it
enters the aggregate (``scales``: the aggregator's ``update_scale``, FedNova's
normalisation), and returns values to track (per-site clip factors, which sites
were kept); ``observe(accepted_norms)`` lets it learn from the round once it is
aggregated (norm-bound's history of accepted norms). It composes with any
aggregator's weights (FedAvg, FedNova, trimmed mean, median) through
:func:`strategies.rounds.update_stream.with_defence`. ``none`` keeps the
replies as they are.
"""
