"""SecAgg+ (Bell et al., CCS 2020): the server learns only the sum of the sites' updates.

Here, the coordinator's side (:mod:`.coordinator`). The maths both ends share (stages,
round plan, masked vector, crypto, encoding) is in the wire kernel,
:mod:`strategies.wire.secure_aggregation`; no Flower message objects. The site's side is
:class:`~strategies.wire.secure_aggregation.participant.Participant`, the coordinator's
:class:`~strategies.secure_aggregation.coordinator.SecAggRound`; the round machinery
(:mod:`strategies.rounds.secure_train`) and the site's round
(:mod:`clients.site.secure_round`) carry their entries in Flower messages.
"""
