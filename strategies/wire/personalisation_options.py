"""The run-config section ``personalisation``: the method and its sizes.

``personalisation.method`` picks the method (a name registered in
:data:`PERSONALISATION`, one file per method in
``strategies/plugins/personalisation/methods/``; a TOML key cannot be both a value and
a table, so the choice is a key of the section); the other keys:

* ``personalisation.tau-out`` / ``personalisation.tau-in``: Per-FedAvg-Reptile's
  tasks per round and SGD steps per task (Xia & Cui 2022, Algorithm 2);
* ``personalisation.alpha``: the Reptile meta step size in (0, 1]
  (Nichol, Achiam, Schulman 2018, "On first-order meta-learning algorithms": epsilon);
* ``personalisation.inner-lr``: Per-FedAvg-FO's personalisation step alpha (Fallah,
  Mokhtari, Ozdaglar, NeurIPS 2020; its beta is the run config's ``lr``);
* ``personalisation.finetune-steps``: k, the local steps a site takes from the
  global model before the personalised evaluation.

Every error names the full key (:class:`~strategies.wire.plugin_options.PluginOptions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strategies.wire.plugin_options import PluginError, PluginOptions, option
from strategies.wire.registry import Registry

__all__ = ["CHOICE_KEY", "PERSONALISATION", "SECTION", "PersonalisationOptions",
           "split_personalisation"]

#: The run-config section.
SECTION = "personalisation"
#: The run-config key that picks the method.
CHOICE_KEY = f"{SECTION}.method"

#: The personalisation methods by name, discovered from ``methods/``: each entry is a
#: class meeting the server's
#: :class:`~strategies.plugins.personalisation.method.PersonalisationMethod`. Both sides
#: agree on these names (the site's side of each method is registered under the same name
#: in :mod:`clients.training.personalisation.methods`).
PERSONALISATION: Registry[type] = Registry(
    "personalisation method", CHOICE_KEY,
    package="strategies.plugins.personalisation.methods", error=PluginError)


@dataclass(frozen=True)
class PersonalisationOptions(PluginOptions):
    """Run-config section ``personalisation``.

    Attributes
    ----------
    method : str
        ``personalisation.method``: a registered method (``none``: FedAvg-style training
        with the global model only).
    tau_out : int
        ``personalisation.tau-out``: Reptile tasks per round (>= 1).
    tau_in : int
        ``personalisation.tau-in``: SGD steps per task (>= 1).
    alpha : float
        ``personalisation.alpha``: meta step size, ``w <- w - alpha (w - w_task)``, in (0, 1].
    inner_lr : float
        ``personalisation.inner-lr``: Per-FedAvg-FO's step ``w~ = w - inner_lr grad f(w)``
        (> 0), also its adaptation step at evaluation.
    finetune_steps : int
        ``personalisation.finetune-steps``: adaptation steps k before the personalised
        evaluation (>= 1).
    """

    section = SECTION
    method: str = option("none")
    tau_out: int = option(4, at_least=1)
    tau_in: int = option(4, at_least=1)
    alpha: float = option(0.5, at_least=0.0)
    inner_lr: float = option(0.01, at_least=0.0)
    finetune_steps: int = option(1, at_least=1)

    def check(self) -> None:
        """A registered method; ``alpha`` in (0, 1] (0 never moves, above 1 overshoots the task).

        Raises
        ------
        PluginError
            Naming the key (an unknown method: the registered ones too).
        """
        PERSONALISATION.get(self.method)
        if not 0.0 < self.alpha <= 1.0:
            self.fail("alpha", "must be in (0, 1]")
        if self.inner_lr <= 0.0:
            self.fail("inner_lr", "must be > 0")


def split_personalisation(values: Mapping[str, Any]
                          ) -> tuple[PersonalisationOptions, dict[str, Any]]:
    """The ``personalisation.*`` section of a flat run config, and the other keys.

    Raises
    ------
    PluginError
        For an unknown key of the section or a bad value, naming the full key.
    """
    return PersonalisationOptions.split_from(values)

