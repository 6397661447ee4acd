"""The site's side of a SecAgg+ round (Bell et al., CCS 2020): its five stages.

A securely aggregated train round is five train messages told apart by
``secagg-stage`` (:data:`~strategies.wire.message_keys.SECAGG_STAGES`). The site's round
(:func:`clients.site.site_round.answer`) checks every one against the site policy
(the train rules plus ``[secure-aggregation]``, before any data is read) and then
calls :func:`answer_stage`, which drives the site's
:class:`~strategies.wire.secure_aggregation.participant.Participant`, kept between stages
in the site's state dir (:class:`~clients.site.secure_state.SecureRoundState`):

Every stage but collect uses the site's long-term signing key and the federation's roster
its policy names (:func:`~clients.site.secure_identity.site_identity`):

1. ``setup``: two fresh X25519 key pairs; reply: both public keys, signed, and
   ``num-examples``;
2. ``share-keys``: every neighbour's keys checked against the roster (a substituted key
   refuses the stage, naming the site, and the site leaves the round: its saved round is
   deleted); Shamir shares of the self-mask seed and of the mask key, one pair per
   neighbour, each encrypted for it; reply: the ciphertexts and the seed's commitment;
3. ``collect``: the shares addressed to the site are decrypted first (an altered or
   misaddressed one refuses the round before anything trains); then the site trains as
   in a plain round (:func:`~clients.site.site_round.train_round` with the round's
   features: DP-SGD, the ledger, FedBN), and its update is weighted, clipped and masked by
   the :class:`~clients.site.secure_update.SecureMasking` feature, which seals it; reply:
   the packed masked vector (``delta`` / ``secagg-masked``) and the metrics that do not
   reveal the update (no ``residual-norm``);
4. ``consistency``: the site signs the survivor set it is shown (once);
5. ``unmask``: only for the set it signed, with enough valid signatures of it by its
   members: for each neighbour, the share of its self-mask seed when it is in the set, of
   its mask key when it is not, never both; the saved round is deleted.

A stage's protocol entries leave in the reply's ``secagg`` record
(:attr:`~clients.site.site_reply.SiteReply.secagg`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.secure_identity import site_identity
from clients.site.secure_state import SecureRoundState
from clients.site.secure_update import SecureMasking
from clients.site.site import Site
from clients.site.site_feature import round_features
from clients.site.site_reply import SiteReply
from clients.site.site_round import train_round
from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.participant import Participant

if TYPE_CHECKING:  # site_round imports this module
    from clients.site.site_round import SiteTasks

__all__ = ["answer_stage"]


def answer_stage(instruction: Instruction, arrays: Mapping[str, np.ndarray], site: Site,
                 run: SiteRunSettings, tasks: SiteTasks) -> SiteReply:
    """The site's reply to one SecAgg+ stage (its policy already checked).

    Parameters
    ----------
    instruction : Instruction
        A train instruction with a stage, its plan and its ``secagg-*`` entries.
    arrays : mapping of str to numpy.ndarray
        The collect stage's global model (as a plain train's); unused by the others.
    site, run, tasks
        As :func:`clients.site.site_round.answer`'s.

    Raises
    ------
    SecAggError
        A stage for another round than the one set up, or entries that fail the
        protocol (an altered share names its sender's index, never a secret).
    SiteDataError, PolicyRefusal
        As a plain train round (no training data; ``dp.max-epsilon``).
    """
    plan = instruction.plan
    if plan is None:
        raise SecAggError("a secure aggregation stage needs its round plan")
    record = {keys.SITE_NAME: site.name, keys.SITE_POLICY: site.policy.fingerprint}
    state = SecureRoundState(site.state_dir, instruction.federation)
    stage = instruction.secagg_stage
    if stage == keys.SECAGG_SETUP:
        train_set = tasks.task(site, run.task, run.sizes).require_training()
        participant = Participant.start(plan, instruction.federation)
        entries = participant.public_keys(site_identity(site))
        state.save(participant)
        return SiteReply({keys.NUM_EXAMPLES: len(train_set)}, record, secagg=entries)
    participant = state.load(plan.server_round)
    if stage == keys.SECAGG_SHARE_KEYS:
        try:
            entries = participant.share_keys(instruction.secagg, site_identity(site))
        except SecAggError:
            state.delete()  # a neighbour failed the roster: this site leaves the round
            raise
        state.save(participant)
        return SiteReply({}, record, secagg=entries)
    if stage == keys.SECAGG_COLLECT:
        participant.receive_shares(instruction.secagg)  # before anything trains
        task = tasks.task(site, run.task, run.sizes)
        features = [*round_features(instruction, site, run),
                    SecureMasking(participant, instruction, run, site.state_dir)]
        masked, metrics = train_round(task, arrays, instruction, site, run, tasks.compute(),
                                      features)
        state.save(participant)
        return SiteReply(metrics, record, masked)
    if stage == keys.SECAGG_CONSISTENCY:
        entries = participant.consistency(instruction.secagg, site_identity(site))
        state.save(participant)
        return SiteReply({}, record, secagg=entries)
    state.delete()  # whatever the unmask stage holds, this round reveals nothing more
    entries = participant.unmask(instruction.secagg,
                                 site.policy.secure_aggregation.min_participants,
                                 site_identity(site))
    return SiteReply({}, record, secagg=entries)
