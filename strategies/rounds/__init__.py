"""The round machinery: the strategy loop and the collaborators it delegates to.

* :mod:`.federated_strategy` -- :class:`FederatedStrategy`, the thin loop
  (configure/aggregate train and evaluate, ``start``).
* :mod:`.train_stage` -- :class:`TrainStage`, the strategy's train half (instructions
  with tau and the round's codec rate; replies accepted, aggregated, observed).
* :mod:`.instructions` -- one fresh message per site (train, evaluate, query), the
  per-site train settings of a round (tau, codec seed), and THE exchange that sends
  them and takes each answer into the reply intake (and the bounded wait for sites).
* :mod:`.reply_intake` -- a site's reply: parsed into :class:`TrainReply` /
  :class:`MetricsReply` (the plug-ins read these), each metric range-checked against
  the one table both ends read, validated once per round (the value counted toward the
  quorum is the value aggregated); drops and no-shows recorded.
* :mod:`.site_book` -- what the server learnt of the sites (names, sizes, losses).
* :mod:`.round_metrics` -- what a round records about itself: example-weighted metrics
  of the accepted replies, bytes down/up and uplink ratios, what a selector may use
  (:class:`SelectionContext`, the ``query`` fan-out for current losses) and its choice.
* :mod:`.withheld` -- metrics a site withheld under its policy, reported by rule
  (``withheld by site policy (<rule>)``), never as NaN.
* :mod:`.round_policy` -- bounded waits (deadline, quorum, timeout); the wait for
  sites connecting is :mod:`.instructions`'.
* :mod:`.round_report`, :mod:`.checkpoint` -- what a round did; the server's
  resumable state.

The message contract (:mod:`strategies.wire.message_keys`) stays in the wire kernel:
the ClientApp shares the keys.
"""
