"""What the server asks of a site: for the run (:class:`SiteRunSettings`) and for the round
(:class:`Instruction`).

**The run.** The ClientApp adapter (:mod:`app.client_app`) and ``make predict PERSONAL=...``
build the site's settings with :meth:`SiteRunSettings.from_run_config` from Flower's run
config: the task, its sizes, the optimiser, DP, personalisation. Only the keys a site uses
are parsed: the ``site`` and ``both`` keys of the one run-config table
(:data:`strategies.wire.run_keys.RUN_KEYS`), whose types, defaults and ranges this view and
the server's (:class:`app.config.run_config.RunConfig`) share, their registry choices
checked against the site side's names (:data:`clients.training.task_settings.SITE_CHOICES`);
errors name the key. The server validated the whole run config before the run started,
rules between keys included, and a site trusts none of it anyway: it checks every request
against its own policy. A missing key keeps the table's default.

**The round.** The adapter hands a message's kind and its ``config`` record (as a plain
mapping) to :meth:`Instruction.parse`; the keys are the wire contract of
:mod:`strategies.wire.message_keys`. What the instruction leaves out comes from the run's
settings. A value of the wrong type or an unknown evaluation split is refused before the
policy check and before any data is read.

The entries of the round's optional features are theirs: each feature's file reads its own
as an :class:`~clients.site.site_feature.InstructionPart`
(:data:`~clients.site.site_feature.INSTRUCTION_PARTS`), held in :attr:`Instruction.parts`
only when the message carries them; a part's fields read as the instruction's attributes,
their defaults when the part is absent. A part is read only when the message carries one of
the entries it declares (:attr:`~clients.site.site_feature.InstructionPart.KEYS`): a message
without them does not enter the part's file. The :class:`Instruction` names no feature
(``tests/clients/site/test_site_feature_seam.py``); the run's settings name the run-config
keys of each, as the run config does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, TypeVar

from clients.site.site_feature import INSTRUCTION_PARTS, InstructionPart, config_value
from clients.training.lr_schedule import CONSTANT, round_lr
from clients.training.private_training import DpSettings
from clients.training.site_task import TaskSettings
from clients.training.task_settings import SITE_CHOICES
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from strategies.wire.personalisation_options import PersonalisationOptions, split_personalisation
from strategies.wire.run_keys import RUN_KEYS, check, run_key, typed

__all__ = ["KINDS", "Instruction", "SiteRunSettings"]


def _read(values: Mapping[str, Any], key: str) -> Any:
    """``values[key]`` typed and checked (:mod:`strategies.wire.run_keys`), else its default."""
    value = typed(key, values[key]) if key in values else RUN_KEYS[key].default
    check(key, value, SITE_CHOICES.get(key, ()))
    return value


def _keyed(kind: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``kind``'s run-config fields (those declared with :func:`run_key`), read from ``values``."""
    return {f.name: _read(values, f.metadata["key"]) for f in fields(kind) if "key" in f.metadata}


@dataclass(frozen=True)
class SiteRunSettings:
    """The run's settings a site's round uses (run-config keys in the comments)."""

    #: ``task``: the registered task name.
    task: str = run_key("task")
    #: ``image-size``, ``batch-size``, ... of the task.
    sizes: TaskSettings = field(default_factory=TaskSettings)
    #: ``local-steps``: tau when an instruction names none.
    local_steps: int = run_key("local-steps")
    #: ``optimizer``, ``lr``, ``momentum``: the local solver.
    optimizer: str = run_key("optimizer")
    lr: float = run_key("lr")
    momentum: float = run_key("momentum")
    #: ``seed``: the run seed (:func:`strategies.wire.seeds.site_seed`).
    seed: int = run_key("seed")
    #: ``num-server-rounds``: a train message after the last round is the final fine-tuning.
    num_server_rounds: int = run_key("num-server-rounds")
    #: ``lr-schedule``, ``lr-floor``: the rate over the rounds
    #: (:mod:`clients.training.lr_schedule`).
    lr_schedule: str = run_key("lr-schedule")
    lr_floor: float = run_key("lr-floor")
    #: ``time-budget``: seconds of local training when an instruction names none (0 = none).
    time_budget: float = run_key("time-budget")
    #: ``proximal-mu``: FedProx's proximal term (0 = none).
    proximal_mu: float = run_key("proximal-mu")
    #: ``data-root``: simulation only, the virtual sites' data folder ("" = node_config's).
    data_root: str = run_key("data-root")
    #: ``site-policy``: simulation only, the virtual sites' policy file ("" = node_config's).
    site_policy: str = run_key("site-policy")
    #: ``privacy.*``: DP-SGD (noise multiplier 0 = none).
    privacy: DpSettings = field(default_factory=DpSettings)
    #: ``personalisation.*``: the method and its sizes.
    personalisation: PersonalisationOptions = field(default_factory=PersonalisationOptions)

    @classmethod
    def from_run_config(cls, values: Mapping[str, Any]) -> SiteRunSettings:
        """The site's keys of Flower's run config (``local-steps``, ``privacy.delta``, ...).

        Other keys are the server's and are not read; a missing key keeps its default.

        Raises
        ------
        ConfigError
            Naming the key, for a value of the wrong type or out of range.
        PluginError
            For a bad ``personalisation.*`` key, naming it.

        A run's config does not change from one message to the next: the settings of a
        config already read are reused (read once per process and config; a refused one is
        read, and refused, again).
        """
        try:
            # each value with its type: 1, 1.0 and True are equal keys, not the same entry
            items = tuple(sorted((key, type(value).__name__, value)
                                 for key, value in values.items()))
            hash(items)
        except TypeError:  # a value that is not hashable: read every time
            return cls._parse(values)
        return _parsed(cls, items)

    @classmethod
    def _parse(cls, values: Mapping[str, Any]) -> SiteRunSettings:
        """:meth:`from_run_config`, read."""
        personal = (split_personalisation(values)[0]
                    if any(k.startswith("personalisation.") for k in values)
                    else PersonalisationOptions())
        return cls(sizes=TaskSettings(**_keyed(TaskSettings, values)),
                   privacy=DpSettings(**_keyed(DpSettings, values)), personalisation=personal,
                   **_keyed(cls, values))

    @property
    def dp_sgd(self) -> bool:
        """Whether local training is DP-SGD (``privacy.noise-multiplier`` > 0: what
        :attr:`DpSettings.enabled` says, read here so that a run without DP-SGD does not
        enter the DP code to learn it)."""
        return self.privacy.noise_multiplier > 0

    def round_lr(self, server_round: int) -> float:
        """The local learning rate of round ``server_round`` (``lr`` under ``lr-schedule``;
        a constant schedule's is ``lr`` itself, not looked up)."""
        if self.lr_schedule == CONSTANT:
            return self.lr
        return round_lr(self.lr, self.lr_schedule, server_round, self.num_server_rounds,
                        self.lr_floor)


@lru_cache(maxsize=16)
def _parsed(kind: type[SiteRunSettings],
            items: tuple[tuple[str, str, Any], ...]) -> SiteRunSettings:
    """The settings of the run config ``items`` (``(key, type name, value)``, sorted), read
    once."""
    return kind._parse({key: value for key, _, value in items})


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
        :data:`~clients.site.site_feature.INSTRUCTION_PARTS`' order; each part's fields
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
