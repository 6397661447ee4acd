"""A SecAgg+ round between tiny sites and the core's coordinator, through the site's round.

No Flower: each stage's instruction is parsed from the coordinator's entries
(:class:`~strategies.secure_aggregation.coordinator.SecAggRound`) as the ClientApp
adapter would, answered by :func:`clients.site.site_round.answer`, and the reply's
entries handed back to the coordinator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.policy import SitePolicy
from clients.site.site import Site
from clients.site.site_reply import SiteReply
from clients.site.site_round import SiteTasks, answer
from strategies.rounds.normalisation_statistics import StatisticPositions
from strategies.secure_aggregation.coordinator import SecAggRound, SecureSum
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import unpack_model
from strategies.wire.secure_aggregation import participant as participant_module
from strategies.wire.secure_aggregation.settings import SecAggSettings
from strategies.wire.secure_aggregation.signing import generate_key, public_text, write_roster
from strategies.wire.secure_aggregation.vector import flatten_float, kept_indices, shared_codec_seed
from tests.clients.site_round_fixtures import packed_global, run_settings, site

FEDERATION = "fed-secagg"
#: The tiny task's model, packed as a train instruction carries it.
MODEL = packed_global()


def _with_pki(tmp_path: Path, names: list[str], policy: SitePolicy) -> dict[str, SitePolicy]:
    """``policy`` for each site, naming its own signing key and one roster of them all."""
    folder = tmp_path / "pki"
    folder.mkdir(exist_ok=True)
    roster = folder / "roster.json"
    private = {name: generate_key(folder / f"{name}.key") for name in names}
    write_roster(roster, {name: public_text(key) for name, key in private.items()})
    return {name: dataclasses.replace(policy, secure_aggregation=dataclasses.replace(
        policy.secure_aggregation, roster=str(roster), signing_key=str(folder / f"{name}.key")))
        for name in names}


def sites(tmp_path: Path, count: int, policy: SitePolicy | None = None) -> list[Site]:
    """``count`` sites ``hospital-1..count``, each with its own state dir under ``tmp_path``,
    their data folders in one data root (so simulation's PKI gives them one roster); a
    ``policy`` other than the permissive one is given each site's key and the roster."""
    names = [f"hospital-{i}" for i in range(1, count + 1)]
    policies = (_with_pki(tmp_path, names, policy) if policy not in (None,
                SitePolicy.permissive()) else dict.fromkeys(names, policy))
    return [dataclasses.replace(site(tmp_path / f"h{i}", policies[name]), name=name,
                                data_path=tmp_path / "hospitals" / name)
            for i, name in enumerate(names, start=1)]


def instruction(entries: dict, run: SiteRunSettings, codec: str = "none",
                reference: float = 12.0, a_floor: float = 0.0) -> Instruction:
    """The train instruction a stage's ``entries`` make (the collect stage's weights added)."""
    config = {keys.FEDERATION: FEDERATION, keys.LOCAL_STEPS: run.local_steps,
              keys.CODEC: codec, **entries}
    if entries[keys.SECAGG_STAGE] == keys.SECAGG_COLLECT:
        config.update({keys.SECAGG_WEIGHT_REFERENCE: reference, keys.SECAGG_A_FLOOR: a_floor})
    return Instruction.parse("train", config, run, "run-1")


def vector_length(codec: str, run: SiteRunSettings, server_round: int) -> int:
    """Values in each masked vector: the model's float values, or rand-k's kept ones."""
    named = unpack_model(MODEL)
    arrays = list(named.values())
    kept = kept_indices(arrays, codec, shared_codec_seed(run.seed, server_round),
                        whole=StatisticPositions.of(list(named), arrays).estimates)
    return flatten_float(arrays).size if kept is None else kept.size


@dataclass
class RoundRecord:
    """What one round produced: the unmasked sum, the replies, and what each site quantised."""

    result: SecureSum
    replies: dict[str, dict[str, SiteReply]] = field(default_factory=dict)
    quantised: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)


def run_round(monkeypatch, members: list[Site], tasks: SiteTasks, *, server_round: int = 1,
              settings: SecAggSettings = SecAggSettings(clip=0.5, bits=16),
              codec: str = "none", run: SiteRunSettings | None = None,
              drop_after_shares: tuple[str, ...] = (),
              tamper: Callable[[str, dict], None] | None = None) -> RoundRecord:
    """One SecAgg+ round over ``members``; sites in ``drop_after_shares`` send no masked input.

    ``tamper(site_name, entries)`` may alter a stage's entries before the site parses them.
    """
    run = run or run_settings()
    quantised, values = [], []
    real_quantise, real_mask = participant_module.quantise, participant_module.Participant.mask

    def recording_quantise(vector, clip, bits):
        levels = real_quantise(vector, clip, bits)
        quantised.append(levels.copy())
        return levels

    def recording_mask(self, vector):
        values.append(np.array(vector))
        return real_mask(self, vector)

    monkeypatch.setattr(participant_module, "quantise", recording_quantise)
    monkeypatch.setattr(participant_module.Participant, "mask", recording_mask)
    by_node = {node: member for node, member in enumerate(members, start=100)}
    server = SecAggRound(settings, server_round, list(by_node), seed=0,
                         length=vector_length(codec, run, server_round))
    record = RoundRecord(None, quantised=quantised, values=values)  # type: ignore[arg-type]

    def ask(stage: str, entries_of: Callable[[int], dict]) -> dict[int, SiteReply]:
        replies = {}
        for node in server.stage_nodes(stage):
            member = by_node[node]
            if stage == keys.SECAGG_COLLECT and member.name in drop_after_shares:
                continue
            entries = entries_of(node)
            if tamper is not None:
                tamper(member.name, entries)
            reply = answer(instruction(entries, run, codec), MODEL, member, run, tasks)
            record.replies.setdefault(stage, {})[member.name] = reply
            replies[node] = reply
        return replies

    for node, reply in ask(keys.SECAGG_SETUP, server.setup_entries).items():
        server.take_keys(node, {**reply.secagg, keys.SITE_NAME: by_node[node].name})
    for node, reply in ask(keys.SECAGG_SHARE_KEYS, server.share_keys_entries).items():
        server.take_shares(node, reply.secagg)
    for node, reply in ask(keys.SECAGG_COLLECT, server.collect_entries).items():
        server.take_masked(node, reply.update[keys.SECAGG_MASKED])
    for node, reply in ask(keys.SECAGG_CONSISTENCY, server.consistency_entries).items():
        server.take_consistency(node, reply.secagg)
    for node, reply in ask(keys.SECAGG_UNMASK, server.unmask_entries).items():
        server.take_unmask(node, reply.secagg)
    record.result = server.finish()
    return record
