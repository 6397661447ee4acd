"""Fake sites of a SecAgg+ round on the in-process engine: the core's Participant, no torch.

Each :class:`SecureSite` answers the five stages of :mod:`strategies.rounds.secure_train`
as the real site does (:mod:`clients.site.secure_round`), with a fixed update: its float
arrays weighted by its coefficient (:func:`site_coefficient`), clipped, quantised and
masked by a :class:`Participant`. ``fail_at`` makes it answer one stage with an error
(a site that fails mid-round), ``tamper_unmask`` alter one of its unmask shares; ``sent``
and ``masked`` keep what it sent, for the tests' checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from strategies.wire import message_keys as keys
from strategies.wire.local_solver import LocalSolver
from strategies.wire.secure_aggregation.participant import Participant
from strategies.wire.secure_aggregation.settings import RoundPlan
from strategies.wire.secure_aggregation.signing import SiteIdentity
from strategies.wire.secure_aggregation.vector import flatten_float
from strategies.wire.secure_aggregation.weights import site_coefficient

__all__ = ["SecureSite", "with_identities"]


def with_identities(sites: dict[int, SecureSite]) -> dict[int, SecureSite]:
    """``sites``, each given a fresh signing key, all under one roster of them."""
    private = {site.name: Ed25519PrivateKey.generate() for site in sites.values()}
    roster = {name: key.public_key() for name, key in private.items()}
    for site in sites.values():
        site.identity = SiteIdentity(site.name, private[site.name], roster)
    return sites


@dataclass
class SecureSite:
    """One site: its name, size, update (model order), steps and the stage it fails at."""

    name: str
    num_examples: int
    update: list[np.ndarray]
    steps: int = 8
    fail_at: str = ""
    tamper_unmask: bool = False
    identity: SiteIdentity | None = None
    participants: dict[int, Participant] = field(default_factory=dict)
    sent: dict[int, np.ndarray] = field(default_factory=dict)
    masked: dict[int, np.ndarray] = field(default_factory=dict)

    def _reply(self, instruction: Message, records: dict) -> Message:
        content = RecordDict({keys.SITE: ConfigRecord({keys.SITE_NAME: self.name}), **records})
        return Message(content, reply_to=instruction)

    def __call__(self, message: Message) -> Message:
        config = dict(message.content[keys.CONFIG])
        stage, server_round = config[keys.SECAGG_STAGE], int(config[keys.SERVER_ROUND])
        if stage == self.fail_at:
            return Message(Error(code=0, reason=f"site {self.name}: gone at {stage}"),
                           reply_to=message)
        if stage == keys.SECAGG_SETUP:
            self.participants[server_round] = Participant.start(RoundPlan.parse(config),
                                                                config[keys.FEDERATION])
            return self._reply(message, {
                keys.SECAGG: ConfigRecord(
                    self.participants[server_round].public_keys(self._identity())),
                keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: self.num_examples})})
        participant = self.participants[server_round]
        if stage == keys.SECAGG_SHARE_KEYS:
            return self._reply(message, {keys.SECAGG: ConfigRecord(
                participant.share_keys(config, self._identity()))})
        if stage == keys.SECAGG_COLLECT:
            return self._collect(message, config, participant)
        if stage == keys.SECAGG_CONSISTENCY:
            return self._reply(message, {keys.SECAGG: ConfigRecord(
                participant.consistency(config, self._identity()))})
        entries = participant.unmask(config, 2, self._identity())
        if self.tamper_unmask:  # one seed share altered on its way to the coordinator
            shares = list(entries[keys.SECAGG_SEED_SHARES])
            shares[0] = shares[0][:-1] + bytes([shares[0][-1] ^ 1])
            entries[keys.SECAGG_SEED_SHARES] = shares
        return self._reply(message, {keys.SECAGG: ConfigRecord(entries)})

    def _identity(self) -> SiteIdentity:
        if self.identity is None:
            raise AssertionError(f"site {self.name} has no identity (see with_identities)")
        return self.identity

    def _collect(self, message: Message, config: dict, participant: Participant) -> Message:
        participant.receive_shares(config)
        coefficient = site_coefficient(self.num_examples, config[keys.SECAGG_WEIGHT_REFERENCE],
                                       LocalSolver().a_norm(self.steps),
                                       config[keys.SECAGG_A_FLOOR])
        plan = participant.plan
        sent = np.clip(coefficient * flatten_float(self.update), -plan.clip, plan.clip)
        masked = participant.mask(sent)
        self.sent[plan.server_round], self.masked[plan.server_round] = sent, masked
        metrics = {keys.NUM_EXAMPLES: self.num_examples, keys.STEPS: self.steps,
                   keys.TRAIN_LOSS: 0.5, keys.INITIAL_LOSS: 1.0,
                   keys.RESIDUAL_NORM: float(np.linalg.norm(sent))}
        return self._reply(message, {
            keys.DELTA: ArrayRecord({keys.SECAGG_MASKED: Array(masked)}),
            keys.METRICS: MetricRecord(metrics)})
