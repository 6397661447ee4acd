"""SecAgg+ (Bell et al., CCS 2020), the maths both ends share: the site's side of the stages.

Pure numpy + ``cryptography`` + Flower's secure-aggregation primitives
(:mod:`flwr.common.secure_aggregation`: Shamir sharing, Fernet encryption, the share
plaintext format, quantisation); no Flower message objects. :mod:`.participant` is the
site's side (:class:`~.participant.Participant`); :mod:`.settings` the round plan in a
stage's instruction; :mod:`.vector` the masked vector (rand-k's shared coordinates);
:mod:`.weights` the site coefficient applied before masking; :mod:`.crypto` and
:mod:`.encoding` the key agreement, shares and quantised packing; :mod:`.errors`
:class:`~.errors.SecAggError`. The coordinator's side is
:class:`~strategies.secure_aggregation.coordinator.SecAggRound`.
"""
