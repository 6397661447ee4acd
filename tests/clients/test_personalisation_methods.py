"""Personalisation methods through the one Registry type: each name has both sides, and
each site-side class does what its server-side flags say."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from clients.training.trainer import select_device
from clients.training.personalisation.site_personalisation import (SITE_PERSONALISATION,
                                                                   SitePersonalisation,
                                                                   personalised_metrics,
                                                                   site_personalisation)
from strategies.plugins.personalisation.method import PersonalisationMethod
from strategies.wire.personalisation_options import PERSONALISATION, PersonalisationOptions
from strategies.wire.plugin_options import PluginError
from tests.clients.site_round_fixtures import TinyCxr, run_settings

CPU = select_device("cpu")


def test_every_method_has_its_rules_and_its_site_side():
    assert PERSONALISATION.names() == SITE_PERSONALISATION.names()
    assert {"none", "finetune", "fedbn", "per-fedavg-reptile", "per-fedavg-fo"} <= set(
        PERSONALISATION.names())
    for name, rules in PERSONALISATION.entries().items():
        assert isinstance(rules, PersonalisationMethod), name
    with pytest.raises(PluginError, match="'personalisation.method' must be one of"):
        site_personalisation(SimpleNamespace(method="toy"), None, "")


@pytest.mark.parametrize("name", ["none", "finetune", "fedbn", "per-fedavg-reptile",
                                  "per-fedavg-fo"])
def test_the_site_side_does_what_the_rules_say(tmp_path, name):
    rules = PERSONALISATION.get(name)
    options = dataclasses.replace(PersonalisationOptions(), method=name, tau_out=1, tau_in=2,
                                  finetune_steps=1)
    personal = site_personalisation(options, tmp_path, "fed-1")
    assert isinstance(personal, SitePersonalisation)
    torch.manual_seed(0)
    task, run = TinyCxr(), run_settings()
    model = task.build_model()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    personal.receive(model)
    result = personal.train(task, model, 2, seed=1, deadline=None, lr=run.lr,
                            momentum=run.momentum, compute=CPU, optimizer=run.optimizer)
    assert result.steps_done == 2
    names = list(global_state)
    delta = [(global_state[n] - model.state_dict()[n]).numpy() for n in names]
    sent = personal.keep_local(model, delta, names)
    kept = [n for n, d, s in zip(names, delta, sent) if np.any(d) and not np.any(s)]
    assert bool(kept) == rules.keeps_local_layers
    model.load_state_dict(global_state)
    adapted = personal.personalised(task, model, CPU, run, "hospital-a", 1)
    assert (adapted is not None) == rules.personalises
    assert bool(personal.adaptation_steps()) == rules.adapts
    metrics = personalised_metrics(task, adapted, CPU, "val") if adapted is not None else {}
    assert ("personalised-val-loss" in metrics) == rules.personalises
