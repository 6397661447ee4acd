"""A server's instruction to a site, typed: what the site's round is asked to do.

The ClientApp adapter hands the message's kind and its ``config`` record (as a
plain mapping) to :meth:`Instruction.parse`; the keys are the wire contract of
:mod:`strategies.message_keys`. What the instruction leaves out comes from the
run's settings (:class:`~clients.site.run_settings.SiteRunSettings`). A value of
the wrong type or an unknown evaluation split is refused before the policy check
and before any data is read.

A train instruction of a securely aggregated round (SecAgg+,
:mod:`clients.site.secure_round`) names its stage (``secagg-stage``) and carries the
round's plan (:class:`~strategies.secure_aggregation.settings.RoundPlan`) and the
stage's protocol entries (``secagg-*``), kept as sent for the site's
:class:`~strategies.secure_aggregation.participant.Participant`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clients.site.run_settings import SiteRunSettings
from strategies import message_keys as keys
from strategies.downlink_header import DownlinkHeader
from strategies.errors import ConfigError
from strategies.secure_aggregation.settings import RoundPlan

__all__ = ["KINDS", "Instruction"]

#: The message kinds a site answers.
KINDS = ("train", "evaluate", "query")


def _value(config: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    """``config[key]`` as ``kind`` (``default`` when absent), naming the key when it is not."""
    if key not in config:
        if default is None:
            raise ConfigError(f"instruction key {key!r} is missing; request refused")
        return default
    try:
        return kind(config[key])
    except (TypeError, ValueError):
        raise ConfigError(f"instruction key {key!r} = {config[key]!r} is not a "
                               f"{kind.__name__}; request refused") from None


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
    downlink : DownlinkHeader or None
        A compressed downlink's entries (``downlink-*``); ``None``: the packed model as sent.
    secagg_stage : str
        The SecAgg+ stage of a train instruction (``secagg-stage``: one of
        :data:`~strategies.message_keys.SECAGG_STAGES`); "" for a plain train.
    plan : RoundPlan or None
        The stage's round plan (``None`` without a stage).
    secagg : dict of str to Any
        The stage's config entries as sent (``server-round`` and every ``secagg-*``).
    pruning_version : int
        The mask version of the instruction's model (``pruning-version``); 0: not pruned.
    pruning_mode : str
        ``unstructured`` or ``structured`` (``pruning-mode``); "" when not pruned.
    pruning_report : str
        The codec of the squared gradients to send back this round (``pruning-report``);
        "" when none are asked.
    control_variates : str
        ``scaffold`` when the instruction carries SCAFFOLD's ``c`` (``control-variates``);
        "" otherwise.
    control_codec : str
        The codec ``c`` was sent with (``control-variates-codec``).
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
    downlink: DownlinkHeader | None = None
    secagg_stage: str = ""
    plan: RoundPlan | None = None
    secagg: dict[str, Any] = field(default_factory=dict)
    pruning_version: int = 0
    pruning_mode: str = ""
    pruning_report: str = ""
    control_variates: str = ""
    control_codec: str = "none"

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
            type, an evaluation split other than ``val`` and ``test`` or an unknown
            SecAgg+ stage.
        SecAggError
            For a stage whose round plan is missing or malformed (naming the entry).
        """
        if kind not in KINDS:
            raise ConfigError(f"message kind {kind!r} is not one of {list(KINDS)}")
        split = _value(config, keys.EVAL_SPLIT, str, "val")
        if split not in keys.EVAL_SPLITS:
            raise ConfigError(f"evaluate instruction key {keys.EVAL_SPLIT!r} = {split!r}: "
                                   f"expected one of {', '.join(keys.EVAL_SPLITS)}; request "
                                   "refused")
        try:  # a dense downlink (no header) needs no parse
            downlink = (DownlinkHeader.from_config(config)
                        if keys.DOWNLINK_VERSION in config else None)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"instruction downlink entries are incomplete or "
                                   f"malformed ({exc!r}); request refused") from None
        control = _value(config, keys.CONTROL_VARIATES, str, "")
        if control not in ("", "scaffold"):
            raise ConfigError(f"instruction key {keys.CONTROL_VARIATES!r} = {control!r}: "
                              "expected 'scaffold' or none; request refused")
        stage = _value(config, keys.SECAGG_STAGE, str, "") if kind == "train" else ""
        if stage and stage not in keys.SECAGG_STAGES:
            raise ConfigError(f"train instruction key {keys.SECAGG_STAGE!r} = {stage!r}: "
                              f"expected one of {', '.join(keys.SECAGG_STAGES)}; request refused")
        return cls(
            kind=kind,
            server_round=_value(config, keys.SERVER_ROUND, int, None if kind == "train" else 0),
            federation=_value(config, keys.FEDERATION, str, "") or run_federation,
            local_steps=_value(config, keys.LOCAL_STEPS, int, run.local_steps),
            time_budget=_value(config, keys.TIME_BUDGET, float, run.time_budget),
            codec=_value(config, keys.CODEC, str, "none"),
            codec_seed=_value(config, keys.CODEC_SEED, int, 0),
            error_feedback=_value(config, keys.ERROR_FEEDBACK, bool, True),
            eval_split=split,
            loss_subset=_value(config, keys.LOSS_SUBSET, int, 0),
            downlink=downlink,
            secagg_stage=stage,
            plan=RoundPlan.parse(config) if stage else None,
            secagg={key: value for key, value in config.items()
                    if stage and (key == keys.SERVER_ROUND or key.startswith("secagg-"))},
            pruning_version=_value(config, keys.PRUNING_VERSION, int, 0),
            pruning_mode=_value(config, keys.PRUNING_MODE, str, ""),
            pruning_report=_value(config, keys.PRUNING_REPORT, str, ""),
            control_variates=control,
            control_codec=_value(config, keys.CONTROL_CODEC, str, "none"),
        )
