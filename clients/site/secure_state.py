"""A site's SecAgg+ round between its stages: one file in its state dir, never only in memory.

The five stages of a securely aggregated round are five messages, and in deployment
each may be served by a fresh process (the site runner's warm worker or not). What the
site needs from one stage to the next, its two private keys, its self-mask seed, its
neighbours' public keys and the shares it holds
(:meth:`~strategies.wire.secure_aggregation.participant.Participant.to_bytes`), is kept in
``<state-dir>/<federation>/secagg-round.json``: written atomically
(:mod:`clients.site.atomic_file`), readable by the site's account only (mode 0600:
it holds secrets), overwritten by the next setup, deleted after the unmask reply. A
stage for another round than the saved one is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from clients.site.atomic_file import write_atomic
from clients.site.state_store import SiteStateStore
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.participant import Participant

__all__ = ["STATE_FILE", "SecureRoundState"]

#: The file of a round in progress, in the federation's folder of the state dir.
STATE_FILE = "secagg-round.json"


class SecureRoundState:
    """The saved SecAgg+ round of ``federation`` at the site keeping its state in ``state_dir``."""

    def __init__(self, state_dir: Path, federation: str) -> None:
        self.path = SiteStateStore(state_dir).folder(federation) / STATE_FILE

    def save(self, participant: Participant) -> None:
        """Keep ``participant`` (atomically, mode 0600), replacing any earlier round."""
        write_atomic(self.path, lambda handle: handle.write(participant.to_bytes()))
        os.chmod(self.path, 0o600)

    def load(self, server_round: int) -> Participant:
        """The saved participant of ``server_round``.

        Raises
        ------
        SecAggError
            When no round was set up here, or the saved one is another round (naming both).
        """
        if not self.path.is_file():
            raise SecAggError(f"round {server_round}: no secure aggregation round was set up "
                              f"at this site ({STATE_FILE})")
        participant = Participant.from_bytes(self.path.read_bytes())
        if participant.plan.server_round != server_round:
            raise SecAggError(f"the stage is for round {server_round}, but this site's secure "
                              f"aggregation state is round {participant.plan.server_round} "
                              f"({STATE_FILE})")
        return participant

    def delete(self) -> None:
        """Forget the round (after the unmask reply)."""
        self.path.unlink(missing_ok=True)
