"""SecAgg+ (Bell et al., CCS 2020): the server learns only the sum of the sites' updates.

Pure numpy + ``cryptography`` + Flower's secure-aggregation primitives
(:mod:`flwr.common.secure_aggregation`: Shamir sharing, Fernet encryption, the share
plaintext format, quantisation); no Flower message objects. The site's side is
:class:`~strategies.secure_aggregation.participant.Participant`, the coordinator's
:class:`~strategies.secure_aggregation.coordinator.SecAggRound`; the round machinery
(:mod:`strategies.rounds.secure_train`) and the site's round
(:mod:`clients.site.secure_round`) carry their entries in Flower messages.
"""
