"""A site's train round: tau local steps from the global model, the update out.

Loads the received global model (:mod:`clients.site.received_model`), puts the
site's own layers on it (FedBN), checks the DP budget before training (the one
privacy ledger per federation, :mod:`clients.site.privacy_ledger`), trains
(through the run's personalisation), computes ``delta = x_global - x_local``
(DESIGN.md's sign convention), zeroes what the site keeps, and encodes it with
the round's codec and error feedback (:mod:`clients.site.update_encoding`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch

from clients.site.instruction import Instruction
from clients.site.privacy_ledger import PrivacyLedger
from clients.site.received_model import received_model
from clients.site.run_settings import SiteRunSettings
from clients.site.site import Site
from clients.site.site_reply import Metrics
from clients.site.state_store import SiteStateStore
from clients.training.device import ComputeDevice
from clients.training.personalisation.site_personalisation import site_personalisation
from clients.training.private_training import poisson_sample_rate
from clients.training.site_task import SiteTask
from clients.site.update_encoding import encode_update
from strategies import message_keys as keys
from strategies.seeds import site_seed

__all__ = ["train_round"]


def train_round(task: SiteTask, arrays: Mapping[str, np.ndarray], instruction: Instruction,
                site: Site, run: SiteRunSettings, compute: ComputeDevice
                ) -> tuple[dict[str, np.ndarray], Metrics]:
    """Train and return the packed update and the train reply's metrics.

    Raises
    ------
    SiteDataError
        At a site without training data (a test-only site).
    PolicyRefusal
        ``dp.max-epsilon``: the round would overspend the site's DP budget.
    """
    train_set = task.require_training()
    steps = instruction.local_steps
    if site.max_local_steps > 0:
        steps = min(steps, site.max_local_steps)
    budget = instruction.time_budget
    deadline = time.monotonic() + budget if budget > 0 else None
    global_arrays, downlink_metrics = received_model(arrays, instruction, site.state_dir)
    privacy = run.privacy
    model = task.build_model(private=privacy.enabled)
    model.load_state_dict({name: torch.as_tensor(a) for name, a in global_arrays.items()})
    personal = site_personalisation(run.personalisation, site.state_dir, instruction.federation)
    personal.receive(model)  # FedBN: the site's own normalisation layers
    if privacy.enabled:  # refuse before training if the round would overspend the budget
        ledger = PrivacyLedger(SiteStateStore(site.state_dir), instruction.federation,
                               privacy.accountant)
        spent = ledger.epsilon(privacy.delta)
        ledger.check((privacy.noise_multiplier, poisson_sample_rate(
            len(train_set), task.settings.batch_size), steps), privacy.delta,
            site.policy.dp.max_epsilon)
    seed = site_seed(run.seed, instruction.server_round, site.name)
    started = time.monotonic()
    result = personal.train(task, model, steps, seed, deadline, lr=run.lr,
                            momentum=run.momentum, compute=compute, optimizer=run.optimizer,
                            proximal_mu=run.proximal_mu,
                            label=f"{site.name} round {instruction.server_round}",
                            privacy=privacy)
    dp_metrics = {}
    if privacy.enabled:
        ledger.record(result.privacy_steps)
        epsilon = ledger.epsilon(privacy.delta)
        dp_metrics = {keys.EPSILON: epsilon, keys.EPSILON_ROUND: epsilon - spent}
    local_state = model.state_dict()
    # delta = x_global - x_local, in the global model's order and dtypes (0-d kept 0-d).
    delta = [np.asarray(value - local_state[name].detach().cpu().numpy(), dtype=value.dtype)
             for name, value in global_arrays.items()]
    delta = personal.keep_local(model, delta, list(global_arrays),  # FedBN: 0, kept at the site
                                save=instruction.server_round <= run.num_server_rounds)
    parameters = {name for name, _ in model.named_parameters()}
    buffers = frozenset(i for i, name in enumerate(global_arrays) if name not in parameters)
    update, residual_norm = encode_update(delta, instruction, site.state_dir, raw=buffers)
    metrics: Metrics = {
        keys.RESIDUAL_NORM: residual_norm,
        keys.NUM_EXAMPLES: len(train_set),
        keys.STEPS: result.steps_done,
        keys.TRAIN_LOSS: result.mean_loss,
        keys.INITIAL_LOSS: result.initial_loss,
        keys.TRAIN_SECONDS: time.monotonic() - started,
        keys.STUDIES_SKIPPED: len(task.report.skipped),
        **dp_metrics, **downlink_metrics,
    }
    return update, metrics
