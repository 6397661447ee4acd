"""A server's instruction to a site, typed: what the site's round is asked to do.

The ClientApp adapter hands the message's kind and its ``config`` record (as a
plain mapping) to :meth:`Instruction.parse`; the keys are the wire contract of
:mod:`strategies.wire.message_keys`. What the instruction leaves out comes from the
run's settings (:class:`~clients.site.run_settings.SiteRunSettings`). A value of
the wrong type or an unknown evaluation split is refused before the policy check
and before any data is read.

The entries of the round's optional features are theirs: each feature's file reads
its own as an :class:`~clients.site.site_feature.InstructionPart`
(:data:`~clients.site.round_features.INSTRUCTION_PARTS`), held in
:attr:`Instruction.parts` only when the message carries them; a part's fields read
as the instruction's attributes, their defaults when the part is absent. A part is
read only when the message carries one of the entries it declares
(:attr:`~clients.site.site_feature.InstructionPart.KEYS`): a message without them does
not enter the part's file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from clients.site.round_features import INSTRUCTION_PARTS
from clients.site.run_settings import SiteRunSettings
from clients.site.site_feature import InstructionPart, config_value
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError

__all__ = ["KINDS", "Instruction"]

#: The message kinds a site answers.
KINDS = ("train", "evaluate", "query")

_Part = TypeVar("_Part", bound=InstructionPart)


@dataclass(frozen=True)
class Instruction:
    """One train, evaluate or query request, with the run's defaults filled in.

    Attributes
    ----------
    kind : str
        One of :data:`KINDS`.
    server_round : int
        The round (``server-round``; a train message after the last round is the
        final fine-tuning of the cross-site matrix).
    federation : str
        The federation the site's state is keyed by (``federation``: the server's
        MLflow run id, else the Flower run's ``run-<id>``).
    local_steps : int
        tau (``local-steps``).
    time_budget : float
        Seconds of local training, 0 = none (``time-budget``).
    codec : str
        The update's codec spec (``codec``).
    codec_seed : int
        Its per-message seed (``codec-seed``).
    error_feedback : bool
        Whether a lossy codec keeps the EF-SGD residual (``error-feedback``).
    eval_split : str
        ``val`` or ``test`` (``eval-split``).
    loss_subset : int
        Query: the fixed subset's size, 0 = the whole training set (``loss-subset``).
    parts : tuple of InstructionPart
        The features' parts the message carries, in
        :data:`~clients.site.round_features.INSTRUCTION_PARTS`' order; each part's fields
        are attributes of the instruction (:meth:`__getattr__`).
    """

    kind: str
    server_round: int
    federation: str
    local_steps: int
    time_budget: float
    codec: str = "none"
    codec_seed: int = 0
    error_feedback: bool = True
    eval_split: str = "val"
    loss_subset: int = 0
    parts: tuple[InstructionPart, ...] = ()

    def part(self, part_type: type[_Part]) -> _Part | None:
        """The instruction's part of type ``part_type``; ``None`` when the message has none."""
        return next((part for part in self.parts if isinstance(part, part_type)), None)

    def __getattr__(self, name: str) -> Any:
        """A feature part's field ``name``: the part's value, its default without the part.

        Raises
        ------
        AttributeError
            When no part has a field ``name``.
        """
        if not name.startswith("_") and name != "parts":
            for part_type in INSTRUCTION_PARTS:
                if name in {f.name for f in fields(part_type)}:
                    return getattr(self.part(part_type) or part_type(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def parse(cls, kind: str, config: Mapping[str, Any], run: SiteRunSettings,
              run_federation: str) -> Instruction:
        """The instruction of a ``kind`` message whose config record is ``config``.

        ``run_federation`` keys the site's state when the server names no
        federation. A train instruction must name its round.

        Raises
        ------
        ConfigError
            For an unknown kind, a missing round (train), a value of the wrong
            type, an evaluation split other than ``val`` and ``test``, or a feature's
            entry its part refuses.
        FedMedError
            A part's own error for its malformed entries (naming the entry).
        """
        if kind not in KINDS:
            raise ConfigError(f"message kind {kind!r} is not one of {list(KINDS)}")
        split = config_value(config, keys.EVAL_SPLIT, str, "val")
        if split not in keys.EVAL_SPLITS:
            raise ConfigError(f"evaluate instruction key {keys.EVAL_SPLIT!r} = {split!r}: "
                              f"expected one of {', '.join(keys.EVAL_SPLITS)}; request "
                              "refused")
        server_round = config_value(config, keys.SERVER_ROUND, int,
                                    None if kind == "train" else 0)
        return cls(
            kind=kind,
            server_round=server_round,
            federation=config_value(config, keys.FEDERATION, str, "") or run_federation,
            local_steps=config_value(config, keys.LOCAL_STEPS, int, run.local_steps),
            time_budget=config_value(config, keys.TIME_BUDGET, float, run.time_budget),
            codec=config_value(config, keys.CODEC, str, "none"),
            codec_seed=config_value(config, keys.CODEC_SEED, int, 0),
            error_feedback=config_value(config, keys.ERROR_FEEDBACK, bool, True),
            eval_split=split,
            loss_subset=config_value(config, keys.LOSS_SUBSET, int, 0),
            parts=tuple(part for part in (part_type.from_config(kind, config)
                                          for part_type in INSTRUCTION_PARTS
                                          if any(key in config for key in part_type.KEYS))
                        if part is not None),
        )
