"""THE site's round: one instruction in, the policy checked, the work done, one reply out.

No Flower: the ClientApp (:mod:`app.client_app`) is an adapter that turns a
Message into an :class:`~clients.site.instruction.Instruction` plus the arrays it
carries, calls :func:`answer`, and turns the :class:`~clients.site.site_reply.SiteReply`
back into a Message. A test or the in-process engine calls :func:`answer` alike.

Every kind of request goes through one check path before any study is read
(:func:`clients.site.policy_check.check_request`); then the site's task is loaded
once per process (:class:`SiteTasks`: in a new process, in deployment every
message, from the site's disk cache of decoded data under ``state-dir`` unless the
site says ``cache-decoded = false``, :mod:`clients.site.decoded_cache`) and the site

* trains (:func:`clients.site.site_training.train_round`): the update and its metrics;
  or, in a securely aggregated round (SecAgg+), answers the instruction's stage
  (:func:`clients.site.secure_round.answer_stage`: keys, shares, the masked update,
  the unmasking shares);
* evaluates the received model on its ``val`` split, or ``test`` when asked: with
  fewer studies in it than the policy's ``min-val-items`` only the counts leave the
  site; under personalisation the personalised model's metrics too, where an
  adaptation that trains passes the training rules and the ledger
  (:mod:`clients.site.site_adaptation`); the reply's SITE record names the rules
  under which metrics were withheld (``withheld``);
* answers a loss query (Power-of-Choice): the received model's loss on its
  training data, forward passes only, optionally on a subset drawn afresh from the
  site's own entropy (cpow-d), at most ``max-queries`` per federation
  (:mod:`clients.site.query_budget`).

Only weights and aggregate metrics leave the site: no paths, no per-patient outputs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from clients.registry import TASKS, task_class
from clients.site.data_report import write_data_report
from clients.site.decoded_cache import CACHE_DIR_NAME, load_task
from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.policy_check import Request, check_request, releases_val_metrics
from clients.site.query_budget import take_query
from clients.site.site import Site
from clients.site.site_adaptation import personalised_evaluation
from clients.site.site_feature import round_features
from clients.site.site_reply import Metrics, SiteReply
from clients.site.site_training import received_model, train_round
from clients.training.trainer import ComputeDevice, select_device
from clients.training.personalisation.site_personalisation import NO_PERSONALISATION
from clients.training.site_task import SiteTask, TaskSettings
from strategies.wire import message_keys as keys

__all__ = ["SiteTasks", "TaskLoader", "answer", "request_of", "sized_request"]

log = logging.getLogger("clients.site")

#: Per evaluation split: the reply's loss and studies-count keys (metrics are ``<split>-<name>``).
_SPLIT_KEYS = {"val": (keys.VAL_LOSS, keys.VAL_STUDIES), "test": (keys.TEST_LOSS, keys.TEST_STUDIES)}


#: ``load(task_class, site_dir, settings, cache_dir, exclude=[...]) -> SiteTask``.
TaskLoader = Callable[..., SiteTask]


class SiteTasks:
    """The tasks a process has loaded, by (task, site folder, settings), and its device.

    Parameters
    ----------
    load : callable
        How a task is loaded (:func:`clients.site.decoded_cache.load_task`; a test
        passes a fake).
    compute : ComputeDevice or None
        The device; ``None``: :func:`~clients.training.trainer.select_device` on first use.
    """

    def __init__(self, load: TaskLoader = load_task, compute: ComputeDevice | None = None
                 ) -> None:
        self._load = load
        self._compute = compute
        self._tasks: dict[tuple[str, str, TaskSettings], SiteTask] = {}

    def task(self, site: Site, name: str, settings: TaskSettings) -> SiteTask:
        """Task ``name`` at ``site`` with ``settings``, loaded on first use."""
        key = (name, str(site.data_path), settings)
        if key not in self._tasks:
            cache_dir: Path | None = site.state_dir / CACHE_DIR_NAME if site.cache_decoded else None
            task = self._load(task_class(name), site.data_path, settings, cache_dir,
                              exclude=[site.state_dir])
            self._tasks[key] = task
            if isinstance(task, SiteTask):  # the hospital's view of its data (the console)
                try:
                    write_data_report(task, site.data_path, site.state_dir)
                except OSError as exc:
                    log.warning("site %s: the data report cannot be written (%s)", site.name,
                                type(exc).__name__)
        return self._tasks[key]

    def compute(self) -> ComputeDevice:
        """The process's compute device."""
        if self._compute is None:
            self._compute = select_device()
        return self._compute

    def loaded(self) -> list[SiteTask]:
        """The tasks loaded so far."""
        return list(self._tasks.values())

    def clear(self) -> None:
        """Forget the loaded tasks (a restarted process)."""
        self._tasks.clear()


def sized_request(task: str, sizes: TaskSettings, **asked) -> Request:
    """A request for ``task`` at ``sizes``, in the policy's terms, with the ``asked`` fields.

    The sizes the site would decode come from the task's
    :attr:`~clients.registry.TaskEntry.study_dims` (a volume depth or slab only where
    the task decodes one; bytes of one float32 study).
    """
    dims = TASKS.get(task).study_dims
    return Request(task=task, image_size=sizes.image_size, batch_size=sizes.batch_size,
                   volume_depth=sizes.volume_depth if "volume_depth" in dims else 0,
                   slab_slices=sizes.slab_slices if "slab_slices" in dims else 0,
                   study_bytes=4 * math.prod(getattr(sizes, dim) for dim in dims), **asked)


def request_of(instruction: Instruction, run: SiteRunSettings) -> Request:
    """What ``instruction`` asks of the site, in the policy's terms (:func:`sized_request`)."""
    plan = instruction.plan
    summed = instruction.secagg.get(keys.SECAGG_SUMMED, 0)
    return sized_request(
        run.task, run.sizes, codec=instruction.codec, local_steps=instruction.local_steps,
        time_budget=instruction.time_budget, loss_subset=instruction.loss_subset,
        dp_noise_multiplier=run.privacy.noise_multiplier,
        dp_max_grad_norm=run.privacy.max_grad_norm, dp_delta=run.privacy.delta,
        dp_accountant=run.privacy.accountant,
        shares_finetuned=(instruction.kind == "train"
                          and instruction.server_round > run.num_server_rounds),
        secagg_stage=instruction.secagg_stage,
        secagg_participants=plan.participants if plan else 0,
        secagg_neighbours=plan.neighbours if plan else 0,
        secagg_threshold=plan.threshold if plan else 0,
        secagg_summed=summed if isinstance(summed, int) else 0,
        control_variates=instruction.control_variates if instruction.kind == "train" else "",
        pruning_report=instruction.pruning_report if instruction.kind == "train" else "")


def _global_model(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
                  site: Site, run: SiteRunSettings) -> nn.Module:
    """The network an evaluate or query message runs: the task's model holding the global
    model of ``arrays`` (:func:`received_model`, through the message's features), as the
    features make it (:meth:`~clients.site.site_feature.SiteFeature.evaluated`: a pruned
    model's structured network without its pruned channels)."""
    model = task.build_model(private=run.dp_sgd)
    features = round_features(instruction, site, run)
    named = received_model(arrays, features)
    model.load_state_dict({name: torch.as_tensor(a) for name, a in named.items()})
    for feature in features:
        model = feature.evaluated(model, task)
    return model


def _evaluate(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
              site: Site, run: SiteRunSettings, tasks: SiteTasks) -> tuple[Metrics, list[str]]:
    """The evaluate reply's metrics and the rules under which the site withheld some."""
    split = instruction.eval_split
    model = _global_model(task, arrays, instruction, site, run)
    result = task.evaluate(model, tasks.compute(), split=split)
    loss_key, studies_key = _SPLIT_KEYS[split]
    metrics: Metrics = {keys.NUM_EXAMPLES: result.num_examples, studies_key: result.num_studies}
    if not (result.num_examples and releases_val_metrics(site.policy, result.num_studies)):
        log.info("site %s: %d %s studies (policy min-val-items %d): only counts leave",
                 site.name, result.num_studies, split, site.policy.min_val_items)
        return metrics, ["min-val-items"] if result.num_examples else []
    metrics[loss_key] = result.loss
    metrics.update({f"{split}-{name}": value for name, value in result.metrics.items()})
    if run.personalisation.method == NO_PERSONALISATION:  # no personalised model, none adapts
        return metrics, []
    personal, withheld = personalised_evaluation(task, model, instruction, site, run,
                                                 tasks.compute(), request_of(instruction, run))
    return {**metrics, **personal}, withheld


def _query(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
           site: Site, run: SiteRunSettings, tasks: SiteTasks) -> Metrics:
    train_set = task.require_training()  # a test-only site: SiteDataError, an error reply
    model = _global_model(task, arrays, instruction, site, run)
    loss = task.training_loss(model, tasks.compute(), subset=instruction.loss_subset)
    return {keys.NUM_EXAMPLES: len(train_set), keys.QUERY_LOSS: loss}


def answer(instruction: Instruction, arrays: Mapping[str, np.ndarray], site: Site,
           run: SiteRunSettings, tasks: SiteTasks) -> SiteReply:
    """The site's answer to one instruction.

    Parameters
    ----------
    instruction : Instruction
        What is asked (train, evaluate or query), the run's defaults filled in.
    arrays : mapping of str to numpy.ndarray
        The instruction's arrays as sent: the packed global model
        (:mod:`strategies.wire.model_layout`), or a compressed downlink step (train).
    site : Site
        The site: name, data, state dir, policy.
    run : SiteRunSettings
        The run's settings a site reads.
    tasks : SiteTasks
        The process's loaded tasks and device.

    Raises
    ------
    PolicyRefusal
        Naming the broken rule, before any data is read (the ledger's
        ``dp.max-epsilon`` once the task is loaded, before anything trains).
    SiteError, ItemError, ConfigError
        When the site cannot do the work (the adapter sends a sanitised error reply).
    SecAggError
        A SecAgg+ stage that fails the protocol (:func:`~clients.site.secure_round.answer_stage`).
    """
    check_request(site.policy, instruction.kind, request_of(instruction, run))
    if instruction.kind == "query":
        take_query(site.state_dir, instruction.federation, site.policy.max_queries)
    if instruction.secagg_stage:
        # Flower's secure-aggregation primitives (and with them Flower) load only here:
        # a site that never takes part in a SecAgg+ round imports no Flower.
        from clients.site.secure_round import answer_stage  # noqa: PLC0415
        return answer_stage(instruction, arrays, site, run, tasks)
    task = tasks.task(site, run.task, run.sizes)
    record = {keys.SITE_NAME: site.name, keys.SITE_POLICY: site.policy.fingerprint}
    if instruction.kind == "train":
        update, metrics = train_round(task, arrays, instruction, site, run, tasks.compute())
        return SiteReply(metrics, record, update)
    if instruction.kind == "evaluate":
        metrics, withheld = _evaluate(task, arrays, instruction, site, run, tasks)
        if withheld:
            record[keys.WITHHELD] = ",".join(withheld)
        return SiteReply(metrics, record)
    return SiteReply(_query(task, arrays, instruction, site, run, tasks), record)
