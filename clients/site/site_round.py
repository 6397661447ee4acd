"""THE site's round: one instruction in, the policy checked, the work done, one reply out.

No Flower: the ClientApp (:mod:`app.client_app`) is an adapter that turns a
Message into an :class:`~clients.site.instruction.Instruction` plus the arrays it
carries, calls :func:`answer`, and turns the :class:`~clients.site.site_reply.SiteReply`
back into a Message. A test or the in-process engine calls :func:`answer` alike.

Every kind of request goes through one check path before any study is read
(:func:`clients.site.policy_check.check_request`, on :func:`request_of`); then the site's
task is loaded once per process (:class:`SiteTasks`: in a new process, in deployment every
message, from the site's disk cache of decoded data under ``state-dir`` unless the
site says ``cache-decoded = false``, :mod:`clients.site.decoded_cache`) and the site

* trains (:func:`train_round`): the update and its metrics; or, in a securely aggregated
  round (SecAgg+), answers the instruction's stage
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

**The train round** (the global model in, tau local steps, the update out) does what every
round does; what a run adds to it (the instruction's optional parts and the run's options)
is a feature behind one seam (:class:`~clients.site.site_feature.SiteFeature`): the round
iterates over its active features (:func:`~clients.site.site_feature.round_features`, in
hook order) and names none of them.

In (:func:`received_model`): the features take their entries off the instruction's arrays
(or turn them into the packed model they stand for), the packed model is read
(:mod:`strategies.wire.model_layout`), and the features pass the global model on by name;
an evaluate or query message runs the network the features make of it.

Train (:func:`local_update`): the network is built (with the features' build arguments),
loaded and trained tau steps (capped by the site, within the round's time budget, at the
round's learning rate) inside each feature's training context; then
``delta = x_global - x_local`` (DESIGN.md's sign convention), which the features pass on
(:meth:`~clients.site.site_feature.SiteFeature.outgoing`).

Out (:func:`encode_update`): the dense update as the server reads it under codec ``none``
(:func:`~strategies.wire.model_layout.pack_dense`, the codecs not entered); else the
round's codec with EF-SGD's error feedback
(Karimireddy et al. 2019, "Error feedback fixes SignSGD and other gradient
compression schemes", Algorithm 2): ``z = e + delta``, send ``C(z)``,
``e <- z - decode(C(z))``. The residual ``e`` is kept in the site's state store
(``state-dir``/<federation>/``ef-residual``, a name the features may key), so it survives a
restart of the SuperNode or of the site's worker. :func:`train_round` is both steps, the
features' reply arrays and metrics added; a feature that seals the update sends it instead.

Only weights and aggregate metrics leave the site: no paths, no per-patient outputs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.registry import TASKS, task_class
from clients.site.data_report import write_data_report
from clients.site.decoded_cache import CACHE_DIR_NAME, load_task
from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.policy_check import Request, check_request, releases_val_metrics
from clients.site.query_budget import QUERY_COUNTS, take_query
from clients.site.site import Site
from clients.site.site_adaptation import personalised_evaluation
from clients.site.site_feature import (RESIDUAL_NAME, LocalTraining, LocalUpdate, SiteFeature,
                                       StepHookChain, round_features)
from clients.site.site_reply import Metrics, SiteReply
from clients.site.state_store import SiteStateStore
from clients.training.trainer import ComputeDevice, StepHooks, TrainResult, select_device
from clients.training.personalisation.site_personalisation import NO_PERSONALISATION
from clients.training.site_task import SiteTask, TaskSettings
from strategies.wire import message_keys as keys
from strategies.wire.codecs import ErrorFeedback, parse_spec
from strategies.wire.model_layout import DENSE_SPEC, pack_dense, unpack_model
from strategies.wire.seeds import site_seed
from strategies.wire.update_codec import pack_update

__all__ = ["SiteTasks", "TaskLoader", "answer", "encode_update", "local_update",
           "received_model", "request_of", "sized_request", "train_round"]

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


def received_model(arrays: Mapping[str, np.ndarray],
                   features: Sequence[SiteFeature]) -> dict[str, np.ndarray]:
    """The global model (arrays by name, in the model's order, full shapes) of the
    instruction's ``arrays``, through the round's ``features``.

    Raises
    ------
    strategies.wire.model_layout.PackedModelError
        When the packed model is malformed.
    SiteError, FedMedError
        A feature's refusal of its entries (:meth:`SiteFeature.receive`).
    """
    passed = dict(arrays)
    for feature in features:
        passed = feature.receive(passed)
    model = unpack_model(passed)
    for feature in features:
        model = feature.received(model)
    return model


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


def _task_steps(task: SiteTask, model: torch.nn.Module, steps: int, seed: int,
                deadline: float | None, **train_args: Any) -> TrainResult:
    """The round's steps when no feature brings its own trainer: :meth:`SiteTask.train`."""
    return task.train(model, steps=steps, seed=seed, deadline=deadline, **train_args)


def _step_hooks(hooks: Sequence[StepHooks]) -> StepHooks | None:
    """The features' step hooks as the trainer takes them (``None``: none)."""
    if not hooks:
        return None
    return hooks[0] if len(hooks) == 1 else StepHookChain(hooks)


def local_update(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
                 site: Site, run: SiteRunSettings, compute: ComputeDevice,
                 features: Sequence[SiteFeature] | None = None) -> LocalUpdate:
    """Train tau local steps on the received model and return the update and its metrics.

    ``features`` are the round's (default: :func:`round_features`); their metrics follow
    the round's own.

    Raises
    ------
    SiteDataError
        At a site without training data (a test-only site).
    PolicyRefusal, SiteError
        A feature's refusal of the round (:meth:`SiteFeature.receive`,
        :meth:`SiteFeature.training`).
    """
    if features is None:
        features = round_features(instruction, site, run)
    train_set = task.require_training()
    steps = instruction.local_steps
    if site.local_steps_cap > 0:
        steps = min(steps, site.local_steps_cap)
    budget = instruction.time_budget
    deadline = time.monotonic() + budget if budget > 0 else None
    global_arrays = received_model(arrays, features)
    model = task.build_model(**{k: v for f in features for k, v in f.model_args().items()})
    model.load_state_dict({name: torch.as_tensor(a) for name, a in global_arrays.items()})
    local = LocalTraining(
        task=task, instruction=instruction, site=site, run=run, steps=steps,
        lr=run.round_lr(instruction.server_round),  # lr-schedule: the round's rate
        final=instruction.server_round > run.num_server_rounds,  # the cross-site fine-tune
        global_arrays=global_arrays, model=model,
        parameters=frozenset(name for name, _ in model.named_parameters()), network=model)
    seed = site_seed(run.seed, instruction.server_round, site.name)
    with ExitStack() as contexts:
        for feature in features:
            contexts.enter_context(feature.training(local))
        started = time.monotonic()
        local.result = (local.trainer or _task_steps)(
            task, local.network, steps, seed, deadline, lr=local.lr, momentum=run.momentum,
            compute=compute, optimizer=run.optimizer, proximal_mu=run.proximal_mu,
            label=f"{site.name} round {instruction.server_round}", **local.train_args,
            step_hooks=_step_hooks(local.step_hooks))
    result = local.result
    local_state = model.state_dict()
    # delta = x_global - x_local, in the global model's order and dtypes (0-d kept 0-d).
    delta = {name: np.asarray(value - local_state[name].detach().cpu().numpy(),
                              dtype=value.dtype)
             for name, value in global_arrays.items()}
    for feature in features:
        delta = feature.outgoing(delta, local)
    buffers = frozenset(i for i, name in enumerate(global_arrays)
                        if name not in local.parameters)
    metrics: Metrics = {
        keys.NUM_EXAMPLES: len(train_set),
        keys.STEPS: result.steps_done,
        keys.TRAIN_LOSS: result.mean_loss,
        keys.INITIAL_LOSS: result.initial_loss,
        keys.TRAIN_SECONDS: time.monotonic() - started,
        keys.STUDIES_SKIPPED: len(task.report.skipped),
    }
    for feature in features:
        metrics.update(feature.metrics())
    return LocalUpdate(list(delta.values()), buffers, metrics)


def encode_update(delta: Sequence[np.ndarray], instruction: Instruction, state_dir: Path,
                  raw: Collection[int] = frozenset(), residual: str = RESIDUAL_NAME
                  ) -> tuple[dict[str, np.ndarray], float]:
    """Pack ``delta`` with the instruction's codec; keep the error-feedback residual.

    Parameters
    ----------
    delta : sequence of numpy.ndarray
        ``x_global - x_local``, in the model's order.
    instruction : Instruction
        Its codec, codec seed, error-feedback flag and federation.
    state_dir : Path
        The site's state dir (the residual's home).
    raw : collection of int
        Positions of the model's buffers (normalisation statistics), sent uncompressed.
    residual : str
        The residual's name in the site's state store.

    Returns
    -------
    arrays, residual_norm
        The arrays to send (:func:`strategies.wire.update_codec.pack_update`; under codec
        ``none`` the dense layout written straight, the same bytes, the codecs not entered:
        :func:`strategies.wire.model_layout.pack_dense`) and ``||e||_2`` after this round (0
        without error feedback).
    """
    spec = instruction.codec
    if spec == DENSE_SPEC:  # the default round: nothing to compress, no residual
        return pack_dense(delta, instruction.codec_seed, raw=raw), 0.0
    lossy = parse_spec(spec).name != "none"
    if not (lossy and instruction.error_feedback):
        return pack_update(delta, spec, instruction.codec_seed, raw=raw), 0.0
    store = SiteStateStore(state_dir)
    feedback = ErrorFeedback(spec)
    saved = store.load(instruction.federation, residual)
    if saved is not None:
        feedback.load_state(saved)
    arrays = pack_update(delta, spec, instruction.codec_seed, feedback, raw=raw)
    state = feedback.state()
    store.save(instruction.federation, residual, state)
    return arrays, float(np.linalg.norm(state))


def train_round(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
                site: Site, run: SiteRunSettings, compute: ComputeDevice,
                features: Sequence[SiteFeature] | None = None
                ) -> tuple[dict[str, np.ndarray], Metrics]:
    """Train (:func:`local_update`, whose errors it raises) and return the packed update
    (:func:`encode_update`, or a feature's seal) and the train reply's metrics."""
    if features is None:
        features = round_features(instruction, site, run)
    local = local_update(task, arrays, instruction, site, run, compute, features)
    for feature in features:
        sealed = feature.seal(local)
        if sealed is not None:
            return sealed, local.metrics
    residual = RESIDUAL_NAME
    for feature in features:
        residual = feature.residual_name(residual)
    update, residual_norm = encode_update(local.delta, instruction, site.state_dir,
                                          raw=local.buffers, residual=residual)
    for feature in features:
        update.update(feature.reply())
    return update, {keys.RESIDUAL_NORM: residual_norm, **local.metrics}


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
        take_query(site.state_dir / QUERY_COUNTS, site.data_path, site.policy.max_queries)
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
