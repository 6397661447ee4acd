"""Defences (``strategy.defence``): what is done to the accepted replies before the aggregator.

A defence has ``filter(replies) -> (replies, info)``: it may scale updates
(``norm-bound``) or keep a subset (``multi-krum``), and returns values to track
(per-site clip factors, which sites were kept). It composes with any
aggregator's weights (FedAvg, FedNova, trimmed mean, median) through
:func:`strategies.plugins.defences.defended.with_defence`. ``none`` keeps the
replies as they are.
"""
