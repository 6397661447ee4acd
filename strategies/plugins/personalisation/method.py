"""A personalisation method as the server sees it: what it needs of the run config.

Each method (``personalisation.method``) is one file in ``methods/``: a class
meeting :class:`PersonalisationMethod`, registered in
:data:`~strategies.wire.personalisation_options.PERSONALISATION`
(the product's one :class:`~strategies.wire.registry.Registry` type) under its name.
Its flags say what the generic rules of :func:`~strategies.plugins.personalisation.rules.check_personalisation`
apply to it, and :meth:`PersonalisationMethod.requires` holds its own. The site
side of the same method (training, adaptation, kept layers) is the class of the
same name in :mod:`clients.training.personalisation.methods`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from strategies.wire.personalisation_options import CHOICE_KEY
from strategies.wire.plugin_options import PluginError

if TYPE_CHECKING:
    from strategies.plugins.personalisation.rules import PersonalisationRun
    from strategies.wire.personalisation_options import PersonalisationOptions

__all__ = ["MethodRules", "PersonalisationMethod", "refuse"]


@runtime_checkable
class PersonalisationMethod(Protocol):
    """``personalisation.method``: how each site's own model departs from the global one."""

    #: Whether a site ends the federation with a model of its own (``none``: no).
    personalises: ClassVar[bool]
    #: Whether the site adapts the global model on its training data at evaluation
    #: (outside DP-SGD's accountant: refused with ``privacy.noise-multiplier > 0``).
    adapts: ClassVar[bool]
    #: Whether its local optimiser must be plain SGD (no proximal term).
    sgd_only: ClassVar[bool]
    #: Whether the site keeps its normalisation layers (the model must have some with state).
    keeps_local_layers: ClassVar[bool]

    @staticmethod
    def requires(options: PersonalisationOptions, run: PersonalisationRun) -> None:
        """Refuse (:func:`refuse`) a run config this method cannot serve, beyond the flags."""


class MethodRules:
    """Defaults of :class:`PersonalisationMethod`: no flag set, no rule of its own."""

    personalises: ClassVar[bool] = False
    adapts: ClassVar[bool] = False
    sgd_only: ClassVar[bool] = False
    keeps_local_layers: ClassVar[bool] = False

    @staticmethod
    def requires(options: PersonalisationOptions, run: PersonalisationRun) -> None:
        """Any run config the generic rules accept."""


def refuse(method: str, rule: str) -> None:
    """Raise :class:`PluginError`: ``run config key 'personalisation.method' = <method> <rule>``."""
    raise PluginError(f"run config key '{CHOICE_KEY}' = {method!r} {rule}")
