"""Secure aggregation (``strategy.secure-aggregation``): what the coordinator learns of the updates.

``none`` (the default): each site's update reaches the coordinator on its own, as
always. ``secagg+``: SecAgg+ (Bell et al., CCS 2020) with the run's ``secagg.*``
settings; the train half of each round becomes the five exchanges of
:mod:`strategies.rounds.secure_train` and the coordinator learns only the sum.
"""
