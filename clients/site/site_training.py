"""A site's train round: the global model in, tau local steps, the update out.

In (:func:`received_model`): without downlink entries the instruction's arrays
are the packed model (:mod:`strategies.model_buffer`); with them
(:mod:`strategies.downlink_receive`) the site's last global model
(:class:`~clients.site.last_global.LastGlobal`) is advanced by the compressed
step, or replaced by the dense snapshot, verified by its checksum and saved for
the next round; the reply acknowledges its version (``downlink-version``).

With pruning (``pruning-version``, :mod:`clients.site.site_pruning`) the covered arrays arrive
compacted and are expanded with the mask the site holds (:func:`received_pruned_model`); the
site trains with the pruned weights held at 0 (structured: the smaller network), sends the
compacted update and, in a re-pruning round, its squared gradients (``pruning-sqgrad``).

Train (:func:`local_update`): puts the site's own layers on the model (FedBN),
checks the DP budget before training and records the steps after (the site's one
privacy ledger per dataset, all federations together, :mod:`clients.site.privacy_charge`;
the cross-site exchange's fine-tune after the last round is charged like any round),
trains (through the run's personalisation),
computes ``delta = x_global - x_local`` (DESIGN.md's sign convention) and zeroes
what the site keeps.

Out (:func:`encode_update`): the round's codec with EF-SGD's error feedback
(Karimireddy et al. 2019, "Error feedback fixes SignSGD and other gradient
compression schemes", Algorithm 2): ``z = e + delta``, send ``C(z)``,
``e <- z - decode(C(z))``. The residual ``e`` is kept in the site's state store
(``state-dir``/<federation>/``ef-residual``), so it survives a restart of the
SuperNode or of the site's worker. :func:`train_round` is both steps; a securely
aggregated round masks the update instead (:mod:`clients.site.secure_update`).

With SCAFFOLD (``control-variates``, :mod:`clients.site.site_scaffold`) the steps are corrected
by ``c - c_i`` and the reply carries ``Delta c_i`` (``scaffold-dc``) next to the update.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from clients.site.instruction import Instruction
from clients.site.last_global import LastGlobal
from clients.site.privacy_charge import PrivacyCharge
from clients.site.run_settings import SiteRunSettings
from clients.site.site import Site
from clients.site.site_pruning import (MASK_ENTRIES, PrunedTraining, received_mask,
                                       refuse_structural_change, squared_gradient_report)
from clients.site.site_reply import Metrics
from clients.site.site_scaffold import SiteControl, control_reply, received_control, split_control
from clients.site.state_store import SiteStateStore
from clients.training.device import ComputeDevice
from clients.training.personalisation.site_personalisation import site_personalisation
from clients.training.site_task import SiteTask
from strategies import message_keys as keys
from strategies.compression import ErrorFeedback, parse_spec
from strategies.downlink_receive import receive
from strategies.downlink_reference import Reference
from strategies.local_solver import LocalSolver
from strategies.model_buffer import PackedModelError, unpack_model
from strategies.plugins.pruning.mask import compact, expand
from strategies.seeds import site_seed
from strategies.update_codec import pack_update

__all__ = ["RESIDUAL_NAME", "LocalUpdate", "encode_update", "local_update", "received_model",
           "received_pruned_model", "train_round"]

#: The error-feedback residual's name in the site's state store.
RESIDUAL_NAME = "ef-residual"


def received_model(arrays: Mapping[str, np.ndarray], instruction: Instruction,
                   state_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The global model (arrays by name, in the model's order) and the reply's downlink metric.

    Raises
    ------
    strategies.model_buffer.PackedModelError
        When a packed model is malformed.
    strategies.downlink_receive.DownlinkSyncError
        When a compressed step does not apply to what the site holds.
    """
    header = instruction.downlink
    if header is None:
        return unpack_model(arrays), {}
    store = LastGlobal(state_dir, instruction.federation)
    saved = store.load()
    try:
        held = None if saved is None else Reference.from_packed(saved)
    except PackedModelError:  # an unreadable model: the step is refused, a snapshot follows
        held = None
    reference = receive(arrays, header, held)
    store.save(reference.packed())
    return reference.named(), {keys.DOWNLINK_VERSION: reference.version}


def received_pruned_model(arrays: Mapping[str, np.ndarray], instruction: Instruction,
                          state_dir: Path) -> tuple[dict[str, np.ndarray], Metrics,
                                                    dict[str, np.ndarray]]:
    """:func:`received_model` of a possibly pruned instruction: the global model in full shapes
    (pruned coordinates 0), the reply's metrics of it and the round's mask ({} unpruned).

    Raises
    ------
    clients.site.site_pruning.MaskVersionError
        When the site does not hold the mask version the instruction names.
    """
    if not instruction.pruning_version:
        named, metrics = received_model(arrays, instruction, state_dir)
        return named, metrics, {}
    entries = {k: np.asarray(v) for k, v in arrays.items() if k in MASK_ENTRIES}
    model = {k: v for k, v in arrays.items() if k not in MASK_ENTRIES}
    masks = received_mask(entries, instruction.pruning_version, instruction.federation,
                          state_dir)
    compacted, metrics = received_model(model, instruction, state_dir)
    metrics = {**metrics, keys.PRUNING_VERSION: instruction.pruning_version}
    return expand(compacted, masks), metrics, masks


def encode_update(delta: Sequence[np.ndarray], instruction: Instruction, state_dir: Path,
                  raw: Collection[int] = frozenset()) -> tuple[dict[str, np.ndarray], float]:
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

    Returns
    -------
    arrays, residual_norm
        The arrays to send (:func:`strategies.update_codec.pack_update`) and
        ``||e||_2`` after this round (0 without error feedback).
    """
    spec = instruction.codec
    lossy = parse_spec(spec).name != "none"
    if not (lossy and instruction.error_feedback):
        return pack_update(delta, spec, instruction.codec_seed, raw=raw), 0.0
    store = SiteStateStore(state_dir)
    feedback = ErrorFeedback(spec)
    # the residual of the kept weights of one pruning mask: a new mask starts a new one
    name = RESIDUAL_NAME + (f"-mask-{instruction.pruning_version}"
                            if instruction.pruning_version else "")
    saved = store.load(instruction.federation, name)
    if saved is not None:
        feedback.load_state(saved)
    arrays = pack_update(delta, spec, instruction.codec_seed, feedback, raw=raw)
    residual = feedback.state()
    store.save(instruction.federation, name, residual)
    return arrays, float(np.linalg.norm(residual))


@dataclass(frozen=True)
class LocalUpdate:
    """One round's local training at a site, before its update is encoded or masked.

    Attributes
    ----------
    delta : list of numpy.ndarray
        ``x_global - x_local`` in the global model's order and dtypes, zero where the
        site keeps its own layers (FedBN).
    buffers : frozenset of int
        Positions of the model's buffers (normalisation statistics, counters).
    metrics : dict
        The train reply's metrics but the codec's (``residual-norm``).
    sqgrad : numpy.ndarray or None
        A pruned re-pruning round's encoded squared gradients (``pruning-sqgrad``); the delta
        of a pruned round holds the kept coordinates only (:mod:`clients.site.site_pruning`).
    control : tuple of SiteControl and numpy.ndarray, or None
        SCAFFOLD: the round's control variates and option II's ``c_i^+``.
    """

    delta: list[np.ndarray]
    buffers: frozenset[int]
    metrics: Metrics
    sqgrad: np.ndarray | None = None
    control: tuple[SiteControl, np.ndarray] | None = None


def local_update(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
                 site: Site, run: SiteRunSettings, compute: ComputeDevice) -> LocalUpdate:
    """Train tau local steps on the received model and return the update and its metrics.

    Raises
    ------
    SiteDataError
        At a site without training data (a test-only site).
    PolicyRefusal
        ``dp.max-epsilon``: the round would overspend the DP budget of the site's data.
    """
    train_set = task.require_training()
    steps = instruction.local_steps
    if site.local_steps_cap > 0:
        steps = min(steps, site.local_steps_cap)
    budget = instruction.time_budget
    deadline = time.monotonic() + budget if budget > 0 else None
    arrays, control_payload = split_control(arrays)
    global_arrays, downlink_metrics, masks = received_pruned_model(arrays, instruction,
                                                                   site.state_dir)
    control = (received_control(control_payload, instruction, global_arrays, site.state_dir,
                                run.optimizer, run.privacy.enabled)
               if instruction.control_variates else None)
    privacy = run.privacy
    model = task.build_model(private=privacy.enabled)
    model.load_state_dict({name: torch.as_tensor(a) for name, a in global_arrays.items()})
    personal = site_personalisation(run.personalisation, site.state_dir, instruction.federation)
    personal.receive(model)  # FedBN: the site's own normalisation layers
    if masks:
        refuse_structural_change(instruction.pruning_mode, personal.keeps_layers)
    pruned = (PrunedTraining(model, masks, instruction.pruning_mode,
                             torch.as_tensor(task.example_input(task.settings)))
              if masks else None)
    final = instruction.server_round > run.num_server_rounds  # the cross-site fine-tune
    charge = (PrivacyCharge.before(site, privacy, len(train_set), task.settings.batch_size,
                                   steps, instruction.federation,
                                   "cross-site" if final else "train")
              if privacy.enabled else None)  # refused here if it would overspend the budget
    seed = site_seed(run.seed, instruction.server_round, site.name)
    lr = run.round_lr(instruction.server_round)  # lr-schedule: the round's rate
    parameters = {name for name, _ in model.named_parameters()}
    hooks = (pruned.hooks if pruned is not None
             else control.hooks(parameters) if control is not None else None)
    started = time.monotonic()
    try:
        result = personal.train(task, model if pruned is None else pruned.model, steps, seed,
                                deadline, lr=lr, momentum=run.momentum, compute=compute,
                                optimizer=run.optimizer, proximal_mu=run.proximal_mu,
                                label=f"{site.name} round {instruction.server_round}",
                                privacy=privacy,
                                step_hooks=hooks)
    except BaseException:
        if charge is not None:  # nothing of it leaves the site: release the reservation
            charge.cancel()
        raise
    dp_metrics = charge.record(result.privacy_steps) if charge is not None else {}
    if pruned is not None:
        pruned.finish()
    local_state = model.state_dict()
    # delta = x_global - x_local, in the global model's order and dtypes (0-d kept 0-d).
    delta = [np.asarray(value - local_state[name].detach().cpu().numpy(), dtype=value.dtype)
             for name, value in global_arrays.items()]
    controlled = None
    if control is not None:  # option II from x - y and the steps actually run
        solver = LocalSolver(optimizer=run.optimizer, momentum=run.momentum, lr=lr,
                             proximal_mu=run.proximal_mu)
        controlled = (control, control.updated(dict(zip(global_arrays, delta)), parameters,
                                               solver.a_norm(result.steps_done), lr))
    delta = personal.keep_local(model, delta, list(global_arrays),  # FedBN: 0, kept at the site
                                save=not final)
    sqgrad = None
    if pruned is not None:  # the kept coordinates only; the squared gradients when asked
        sqgrad = squared_gradient_report(pruned.squared_gradients(), global_arrays,
                                         instruction.pruning_report, instruction.federation,
                                         site.state_dir)
        delta = list(compact(dict(zip(global_arrays, delta)), masks).values())
    buffers = frozenset(i for i, name in enumerate(global_arrays) if name not in parameters)
    metrics: Metrics = {
        keys.NUM_EXAMPLES: len(train_set),
        keys.STEPS: result.steps_done,
        keys.TRAIN_LOSS: result.mean_loss,
        keys.INITIAL_LOSS: result.initial_loss,
        keys.TRAIN_SECONDS: time.monotonic() - started,
        keys.STUDIES_SKIPPED: len(task.report.skipped),
        **dp_metrics, **downlink_metrics,
    }
    return LocalUpdate(delta, buffers, metrics, sqgrad, controlled)


def train_round(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
                site: Site, run: SiteRunSettings, compute: ComputeDevice
                ) -> tuple[dict[str, np.ndarray], Metrics]:
    """Train (:func:`local_update`, whose errors it raises) and return the packed update
    (:func:`encode_update`) and the train reply's metrics."""
    local = local_update(task, arrays, instruction, site, run, compute)
    update, residual_norm = encode_update(local.delta, instruction, site.state_dir,
                                          raw=local.buffers)
    if local.sqgrad is not None:
        update[keys.PRUNING_SQGRAD] = local.sqgrad
    if local.control is not None:
        update[keys.CONTROL_DELTA] = control_reply(*local.control, instruction, site.state_dir)
    return update, {keys.RESIDUAL_NORM: residual_norm, **local.metrics}
