"""What happened in one federated round, for tracking and progress output."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RoundReport"]


@dataclass
class RoundReport:
    """Per-round record filled by the strategy and read by the tracker.

    Attributes
    ----------
    server_round : int
        Round number, from 1.
    train : dict[str, dict[str, float]]
        Per site name, the metrics of its accepted train reply.
    train_dropped : dict[str, str]
        Per site name (or ``node-<id>``), why its train reply was dropped.
    train_aggregate : dict[str, float]
        Example-weighted train metrics over the accepted replies.
    evaluate : dict[str, dict[str, float]]
        Per site name, its validation metrics on the new global model.
    evaluate_dropped : dict[str, str]
        Per site, why its evaluate reply was dropped.
    evaluate_aggregate : dict[str, float]
        Example-weighted validation metrics (over the sites that released each one).
    evaluate_withheld : dict[str, str]
        Per site whose evaluate reply withheld metrics under its site policy, the
        rules (comma-separated, :mod:`strategies.rounds.withheld`).
    seconds : float
        Wall time of the round (train + evaluate).
    schedule_tau : int
        Local steps the schedule asked for this round.
    strategy : dict[str, float]
        Plug-in values to track (e.g. ``tau-eff``, ``schedule-tau``, ``global-loss``).
    missing : dict[str, int]
        Per stage (``train``, ``evaluate``), selected sites with no reply when the
        round closed.
    late_arrivals : list[str]
        Sites whose reply to an earlier round arrived during this one (dropped).
    selection : dict
        ``selected``, ``candidates`` (site names) and their query ``losses``.
    times_selected : dict[str, float]
        Per site, how many rounds it has been selected for so far.
    traffic : dict[str, dict[str, float]]
        Per site, serialised bytes down (instruction) and up (reply), and the
        uplink ratio dense-fp32 / bytes up.
    aggregation_failed : str
        Why the round kept the previous global model although it had usable
        replies (the aggregation failed or the new model was not finite);
        empty when the model was updated or no reply was usable.
    policies : dict[str, str]
        Per site with an accepted reply, the fingerprint of the site policy it
        runs under (``clients.site.policy``).
    reply_seconds : dict[str, dict[str, float]]
        Per site, seconds from sending its instruction to receiving its reply
        (``train-reply-seconds``, ``evaluate-reply-seconds``): transport, the
        site's start-up and its work.
    """

    server_round: int
    train: dict[str, dict[str, float]] = field(default_factory=dict)
    train_dropped: dict[str, str] = field(default_factory=dict)
    train_aggregate: dict[str, float] = field(default_factory=dict)
    evaluate: dict[str, dict[str, float]] = field(default_factory=dict)
    evaluate_dropped: dict[str, str] = field(default_factory=dict)
    evaluate_aggregate: dict[str, float] = field(default_factory=dict)
    evaluate_withheld: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    schedule_tau: int = 0
    strategy: dict[str, float] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    late_arrivals: list[str] = field(default_factory=list)
    traffic: dict[str, dict[str, float]] = field(default_factory=dict)
    selection: dict = field(default_factory=dict)
    times_selected: dict[str, float] = field(default_factory=dict)
    aggregation_failed: str = ""
    policies: dict[str, str] = field(default_factory=dict)
    reply_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
