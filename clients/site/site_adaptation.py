"""An evaluate message's personalisation adaptation: training on patients, governed as training.

Methods that adapt the global model at evaluation (``finetune``, Per-FedAvg's)
take ``personalisation.finetune-steps`` steps on the site's training data
(:meth:`~clients.training.personalisation.site_personalisation.SitePersonalisation.adaptation_steps`). Issue #28
found an evaluate message doing so with no batch, step or DP rule and no ledger
entry. Here, before anything trains:

* the site's ``evaluate-trains`` rule must allow it;
* the adaptation passes the training rules (:func:`clients.site.policy_check.check_adaptation`:
  min-batch-size, min/max-local-steps for its steps, dp.*);
* under DP-SGD (the run's ``privacy.*``) the site's ledger checks the budget
  (:class:`~clients.site.privacy_charge.PrivacyCharge`) and records the steps after.

A rule that refuses only withholds the personalised metrics (the global model's
metrics still leave), and the evaluate reply names the rule in its SITE record's
``withheld``. A method that does not train at evaluation (``none``, ``fedbn``) is
not governed here: its personalised model is a function of what the site already
trained under the rules.
"""

from __future__ import annotations

import dataclasses
import logging

from torch import nn

from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.policy import PolicyRefusal
from clients.site.policy_check import Request, check_adaptation
from clients.site.privacy_charge import PrivacyCharge
from clients.site.site import Site
from clients.site.site_reply import Metrics
from clients.training.trainer import ComputeDevice
from clients.training.personalisation.site_personalisation import (personalised_metrics,
                                                                   site_personalisation)
from clients.training.site_task import SiteTask

__all__ = ["personalised_evaluation"]

log = logging.getLogger("clients.site")


def personalised_evaluation(task: SiteTask, model: nn.Module, instruction: Instruction,
                            site: Site, run: SiteRunSettings, compute: ComputeDevice,
                            request: Request) -> tuple[Metrics, list[str]]:
    """The personalised model's metrics on the instruction's split, and the rules that withheld them.

    Parameters
    ----------
    task, model
        The site's task and the received global model (left as it is).
    instruction, site, run
        The evaluate instruction, the site and the run's settings.
    compute : ComputeDevice
        Where to adapt and evaluate.
    request : Request
        The evaluate message's request (:func:`clients.site.site_round.request_of`); its
        ``local_steps`` become the adaptation's ``finetune-steps``.

    Returns
    -------
    metrics, withheld
        ``personalised-<split>-<name>`` metrics (plus ``epsilon``, ``epsilon-round`` and
        ``epsilon-left`` when the ledger was charged), and the rules under which the
        site withheld them (empty when it did not).
    """
    personal = site_personalisation(run.personalisation, site.state_dir, instruction.federation)
    privacy = run.privacy if run.dp_sgd else None
    charge = None
    steps = personal.adaptation_steps()
    if steps:
        try:
            check_adaptation(site.policy, dataclasses.replace(request, local_steps=steps,
                                                              time_budget=0.0))
            if privacy is not None and task.train_set is not None and len(task.train_set):
                charge = PrivacyCharge.before(site, privacy, len(task.train_set),
                                              task.settings.batch_size, steps,
                                              instruction.federation, "evaluate-adapt")
        except PolicyRefusal as refusal:
            log.info("site %s: personalised metrics withheld (%s)", site.name, refusal)
            return {}, [refusal.rule]
    try:
        adapted = personal.adapt(task, model, compute, run, site.name, instruction.server_round,
                                 privacy=privacy)
    except BaseException:
        if charge is not None:  # nothing of it leaves the site: release the reservation
            charge.cancel()
        raise
    metrics: Metrics = {}
    if charge is not None:
        metrics.update(charge.record(adapted.privacy_steps if adapted is not None else ()))
    if adapted is not None:
        metrics.update(personalised_metrics(task, adapted.model, compute,
                                            instruction.eval_split))
    return metrics, []
