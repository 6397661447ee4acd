"""A site's train round: the global model in, tau local steps, the update out.

What every round does is here; what a run adds to it (the instruction's optional parts and
the run's options) is a feature behind one seam (:class:`~clients.site.site_feature.SiteFeature`):
the round iterates over its active features (:func:`~clients.site.site_feature.round_features`,
in hook order) and names none of them.

In (:func:`received_model`): the features take their entries off the instruction's arrays
(or turn them into the packed model they stand for), the packed model is read
(:mod:`strategies.wire.model_layout`), and the features pass the global model on by name.

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
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.site import Site
from clients.site.site_feature import (RESIDUAL_NAME, LocalTraining, LocalUpdate, SiteFeature,
                                       StepHookChain, round_features)
from clients.site.site_reply import Metrics
from clients.site.state_store import SiteStateStore
from clients.training.site_task import SiteTask
from clients.training.trainer import ComputeDevice, StepHooks, TrainResult
from strategies.wire import message_keys as keys
from strategies.wire.codecs import ErrorFeedback, parse_spec
from strategies.wire.model_layout import DENSE_SPEC, pack_dense, unpack_model
from strategies.wire.seeds import site_seed
from strategies.wire.update_codec import pack_update

__all__ = ["RESIDUAL_NAME", "LocalUpdate", "encode_update", "local_update", "received_model",
           "train_round"]


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
