"""The runtime decides before the app sees a message: every data rule, checked by the hospital's code.

The approved app's ClientApp checks the site policy too, but that check is the
researcher's code: one changed line in a bundle signed by a trusted key would make it
send what the policy forbids. NVIDIA FLARE applies its privacy filters in the site
runtime for this reason. Here the hospital's installed runtime (this module, never the
bundle's copy) parses each message with its own code and checks it against every rule
of the policy before the worker receives it (:func:`admit`):

* train, evaluate and query: the run's settings and the instruction are parsed
  (:meth:`~clients.site.instruction.SiteRunSettings.from_run_config`,
  :meth:`~clients.site.instruction.Instruction.parse`) and checked with
  :func:`clients.site.policy_check.check_request`: task, sizes, batch size, steps, time
  budget, codecs, DP required and its parameters, secure aggregation required and each
  SecAgg+ stage's plan, ``share-finetuned-model``, ``share-control-variates``,
  ``share-pruning-gradients``, the query rules (``answer-queries``, ``min-batch-size``
  of a subset, DP required) and ``max-queries``, counted in the runtime's own folder;
* an evaluate message's personalisation adaptation: ``evaluate-trains`` and the
  training rules for its steps; where they refuse, the personalised metrics are
  withheld from the reply (:class:`Admission.withheld`), as the site's round does;
  ``min-val-items`` from the runtime's own count of the evaluated split
  (:mod:`app.site_runtime.dataset_census`);
* a vertical stage: ``vertical.allowed``, the site's task (``allowed-tasks``), the
  vanilla SplitNN's labels (``vertical.share-labels``), the training rules of the
  batches a ``split-train`` asks for, and each PSI request a ``psi-step`` asks the site
  to serve, counted per dataset (``vertical.max-psi-requests``);
* split learning's label rules (``vertical.share-labels``, and
  ``vertical.label-dp-epsilon``: U-shaped training with private labels needs label DP)
  for a ``split-train`` with batches and a ``split-head``; a ``split-eval-finish`` is
  counted per dataset (``vertical.max-evaluations``) and refused for a split of fewer
  than ``min-val-items`` items (the runtime's own count);
* every DP-SGD computation the message asks for is returned as a
  :class:`~app.site_runtime.runtime_ledger.PlannedSpend`, which the runner charges to
  the ledger before the worker runs (:mod:`app.site_runtime.runtime_ledger`).

A refusal is a :class:`~clients.site.policy.PolicyRefusal` naming the rule; a message
the runtime cannot parse is a :class:`~strategies.wire.errors.ConfigError`. Either way the
worker never sees the message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message

from app.site_runtime.dataset_census import DatasetCensus
from app.site_runtime.runtime_ledger import PlannedSpend
from app.site_runtime.worker_view import runtime_dir
from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.policy import PolicyRefusal, SitePolicy
from clients.site.policy_check import check_adaptation, check_request, check_training
from clients.site.query_budget import EVALUATIONS, PSI_REQUESTS, take_query, take_request
from clients.site.site_round import request_of, sized_request
from clients.training.site_task import EVAL_SPLITS
from clients.training.personalisation.site_personalisation import site_personalisation
from clients.vertical.psi_stages import REQUESTS_RULE, SERVE as PSI_SERVE, request_key
from clients.vertical.label_dp import check_label_rules
from clients.vertical.split_model import batch_key
from clients.vertical.stages import VERTICAL_STAGES, declared_site
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from strategies.wire.personalisation_gain import PERSONALISED
from strategies.wire.vertical_options import split_vertical

__all__ = ["Admission", "SiteFacts", "admit", "KINDS", "QUERIES_DIR"]

#: Message type -> the kind the runtime checks it as.
KINDS = {"train": "train", "evaluate": "evaluate", "query": "query",
         keys.VERTICAL_MESSAGE_TYPE: "vertical"}
#: The runtime's request counts, per dataset (:mod:`clients.site.query_budget`), in its own folder.
QUERIES_DIR = "queries"
#: The vertical stage that trains the site's part on batches of its data.
_SPLIT_TRAIN = "split-train"
#: The U-shaped stage whose gradients carry the labels, and the stage that scores outputs.
_SPLIT_HEAD = "split-head"
_SPLIT_EVAL_FINISH = "split-eval-finish"
#: The PSI stage that may serve requests (clients/vertical/psi_stages.py).
_PSI_STEP = "psi-step"


@dataclass(frozen=True)
class SiteFacts:
    """What the runtime knows of its site (from the node config, never from the message)."""

    name: str
    data_path: Path
    state_dir: Path
    #: node_config ``local-steps-cap`` (0: none), the worker's cap on tau.
    local_steps_cap: int = 0


@dataclass(frozen=True)
class Admission:
    """A message the runtime accepted, and what it must do around the worker."""

    #: ``train``, ``evaluate``, ``query`` or ``vertical``.
    kind: str
    federation: str
    #: The parsed instruction (None for a vertical stage).
    instruction: Instruction | None = None
    #: The vertical stage ("" otherwise).
    stage: str = ""
    #: The DP-SGD computation to charge before the worker runs (None: none).
    spend: PlannedSpend | None = None
    #: The runtime's count of the training examples (0 when not counted).
    examples: int = 0
    #: Rules under which metrics must not leave, and the metric-name prefixes they cover
    #: (``personalised-``: the adaptation; "": every metric but the counts).
    withheld: dict[str, str] = field(default_factory=dict)


def _config(message: Message) -> Mapping[str, Any]:
    if message.has_content() and keys.CONFIG in message.content:
        record = message.content[keys.CONFIG]
        if isinstance(record, ConfigRecord):
            return record
    return ConfigRecord()


def _adaptation(instruction: Instruction, run: SiteRunSettings, policy: SitePolicy,
                request: Any) -> tuple[int, str | None]:
    """The adaptation's steps and the rule that refuses it (None: allowed)."""
    steps = site_personalisation(run.personalisation, None,
                                 instruction.federation).adaptation_steps()
    if not steps:
        return 0, None
    try:
        check_adaptation(policy, dataclasses.replace(request, local_steps=steps,
                                                     time_budget=0.0))
    except PolicyRefusal as refusal:
        return steps, refusal.rule
    return steps, None


def _horizontal(kind: str, message: Message, context: Context, policy: SitePolicy,
                site: SiteFacts, census: DatasetCensus) -> Admission:
    run = SiteRunSettings.from_run_config(context.run_config)
    instruction = Instruction.parse(kind, _config(message), run, f"run-{context.run_id}")
    request = request_of(instruction, run)
    check_request(policy, kind, request)
    if kind == "query":
        take_query(runtime_dir(site.state_dir) / QUERIES_DIR, site.data_path, policy.max_queries)
        return Admission(kind, instruction.federation, instruction)
    withheld: dict[str, str] = {}
    steps, kind_of_spend = 0, ""
    if kind == "train" and instruction.secagg_stage in ("", keys.SECAGG_COLLECT):
        steps = instruction.local_steps
        if site.local_steps_cap > 0:
            steps = min(steps, site.local_steps_cap)
        kind_of_spend = ("cross-site" if instruction.server_round > run.num_server_rounds
                         else "train")
    elif kind == "evaluate":
        if policy.min_val_items > 0:
            counted = census.counts(run.task, site.data_path, run.sizes, site.state_dir)
            if counted.studies.get(instruction.eval_split, 0) < policy.min_val_items:
                withheld["min-val-items"] = ""
        adapt_steps, refused = _adaptation(instruction, run, policy, request)
        if refused is not None:
            withheld[refused] = PERSONALISED
        elif adapt_steps and "min-val-items" not in withheld:
            steps, kind_of_spend = adapt_steps, "evaluate-adapt"
    if not (steps and run.privacy.enabled):
        return Admission(kind, instruction.federation, instruction, withheld=withheld)
    examples = census.counts(run.task, site.data_path, run.sizes, site.state_dir).train_examples
    if not examples:  # nothing to train on: the worker answers that (nothing is spent)
        return Admission(kind, instruction.federation, instruction, withheld=withheld)
    spend = PlannedSpend(kind_of_spend, steps, run.privacy, run.sizes.batch_size)
    return Admission(kind, instruction.federation, instruction, spend=spend, examples=examples,
                     withheld=withheld)


def _vertical(message: Message, context: Context, policy: SitePolicy,
              site: SiteFacts, census: DatasetCensus) -> Admission:
    config = _config(message)
    stage = str(config.get(keys.VERTICAL_STAGE, ""))
    federation = str(config.get(keys.FEDERATION, "")) or f"run-{context.run_id}"
    if not policy.vertical.allowed:
        raise PolicyRefusal("vertical.allowed", "this site's policy does not allow vertical "
                            "federations (their messages carry per-patient vectors)")
    if stage not in VERTICAL_STAGES:
        raise ConfigError(f"vertical stage {stage!r} is not one of {sorted(VERTICAL_STAGES)}; "
                          "request refused")
    run = SiteRunSettings.from_run_config(context.run_config)
    task = declared_site(site.data_path).get("task", run.task)
    if not policy.allows_task(task):
        raise PolicyRefusal("allowed-tasks", f"task {task!r} is not allowed")
    batches = int(config.get("batches", 0)) if stage == _SPLIT_TRAIN else 0
    if batches or stage == _SPLIT_HEAD:
        check_label_rules(policy.vertical, split_vertical(context.run_config)[0].method)
    if batches:
        check_training(policy, sized_request(task, run.sizes, local_steps=batches))
    if stage == _SPLIT_EVAL_FINISH:
        _split_evaluation(message, policy, site, census, task, run)
    if stage == _PSI_STEP:
        for _ in range(_psi_requests(message, config)):
            take_request(runtime_dir(site.state_dir) / QUERIES_DIR, site.data_path, PSI_REQUESTS,
                         policy.vertical.max_psi_requests, REQUESTS_RULE)
    return Admission("vertical", federation, stage=stage)


def _psi_requests(message: Message, config: Mapping[str, Any]) -> int:
    """The PSI requests a ``psi-step`` asks the site to serve (config ``psi-serve`` = r:
    arrays ``request-0`` .. ``request-(r-1)``, clients/vertical/psi_stages.py), each counted
    per dataset (``vertical.max-psi-requests``) as the site's worker counts them again."""
    served = config.get(PSI_SERVE, 0)
    if isinstance(served, bool) or not isinstance(served, int):
        raise ConfigError(f"{PSI_SERVE} must be a whole number, got {served!r}; request refused")
    record = message.content.array_records.get(keys.ARRAYS) if message.has_content() else None
    names = set(record.keys()) if record is not None else set()
    if served > len(names) or any(request_key(n) not in names for n in range(served)):
        raise ConfigError(f"{PSI_SERVE} = {served} names requests the message does not carry; "
                          "request refused")
    return served


def _split_evaluation(message: Message, policy: SitePolicy, site: SiteFacts,
                      census: DatasetCensus, task: str, run: SiteRunSettings) -> None:
    """A ``split-eval-finish`` scores outputs the coordinator chose against the site's
    labels (a label oracle if unbounded): every split it scores (``output-<split>``) holds
    at least ``min-val-items`` items by the runtime's own count, and each call is counted
    per dataset in the runtime's folder (``vertical.max-evaluations``, all federations
    together), as the worker counts it again in its own."""
    record = message.content.array_records.get(keys.ARRAYS) if message.has_content() else None
    names = set(record.keys()) if record is not None else set()
    scored = [split for split in EVAL_SPLITS if batch_key("output", split) in names]
    if not scored:
        return
    if policy.min_val_items > 0:
        studies = census.counts(task, site.data_path, run.sizes, site.state_dir).studies
        for split in scored:
            if studies.get(split, 0) < policy.min_val_items:
                raise PolicyRefusal("min-val-items", f"split {split!r} holds "
                                    f"{studies.get(split, 0)} items, fewer than the policy's "
                                    f"{policy.min_val_items}")
    take_request(runtime_dir(site.state_dir) / QUERIES_DIR, site.data_path, EVALUATIONS,
                 policy.vertical.max_evaluations, "vertical.max-evaluations")


def admit(message: Message, context: Context, policy: SitePolicy, site: SiteFacts,
          census: DatasetCensus) -> Admission:
    """Check ``message`` against every data rule of ``policy`` with the runtime's own code.

    Raises
    ------
    PolicyRefusal
        Naming the first rule the message breaks (``message-type`` for a type the site
        does not answer).
    ConfigError
        The message or the run config cannot be parsed (naming the key).
    SiteError
        The site's data cannot be counted where a rule needs the count.
    """
    kind = KINDS.get(message.metadata.message_type)
    if kind is None:
        raise PolicyRefusal("message-type", f"the site answers only {sorted(KINDS)} messages")
    if kind == "vertical":
        return _vertical(message, context, policy, site, census)
    return _horizontal(kind, message, context, policy, site, census)
