"""The run config's ``vertical.*`` section: how a vertical federation runs (docs/VERTICAL.md).

A vertical federation (``federation.kind = "vertical"``) is one of

- ``pvfed``: personalised vertical FL (Nishikawa et al., IEEJ Trans. 2024): each site
  keeps its own task and model; local encoders (patient id -> vector) distilled from
  the local models' feature extractors go to the coordinator, which trains a global
  encoder on their aggregate (mean, autoencoder or PCA of the concatenation) and
  sends it back; each site retrains a redefined output layer on [global vector, own
  features]. The sites' patients are aligned first by a private set intersection.
- ``splitnn`` / ``splitnn-u``: split learning (Vepakomma et al. 2018): the site runs the
  network up to the cut, the coordinator the rest (vanilla, the labels go with the
  activations) or the middle (U-shaped: the last layers and the labels stay at the
  site); sites in turn or in parallel (SplitFed, Thapa et al. 2022).

Example::

    flwr run . -c 'federation.kind="vertical" vertical.method="pvfed" vertical.aggregation="pca"'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strategies.wire.plugin_options import PluginOptions, option

__all__ = ["FEDERATION_KINDS", "METHODS", "AGGREGATIONS", "SPLIT_MODES", "SECTION",
           "VerticalOptions", "split_vertical"]

#: ``federation.kind``: the sites hold different patients (horizontal) or the same ones.
FEDERATION_KINDS = ("horizontal", "vertical")
METHODS = ("pvfed", "splitnn", "splitnn-u")
AGGREGATIONS = ("mean", "ae", "pca")
SPLIT_MODES = ("parallel", "sequential")
SECTION = "vertical"


@dataclass(frozen=True)
class VerticalOptions(PluginOptions):
    """Run-config section ``vertical``.

    Attributes
    ----------
    method : str
        ``vertical.method``: ``pvfed``, ``splitnn`` (vanilla) or ``splitnn-u`` (U-shaped).
    aggregation : str
        ``vertical.aggregation``: pvFed's aggregate of the local encoders' outputs that the
        global encoder mimics: ``mean``, ``ae`` (an autoencoder's code) or ``pca``.
    dim : int
        ``vertical.dim``: length of the representation vector (global encoder).
    hidden : int
        ``vertical.hidden``: hidden width of the id encoders.
    local_epochs, encoder_epochs, global_epochs, head_epochs : int
        ``vertical.local-epochs`` (a site's local model), ``vertical.encoder-epochs`` (its
        local encoder's distillation), ``vertical.global-epochs`` (the coordinator's global
        encoder and autoencoder), ``vertical.head-epochs`` (the redefined output layer).
    encoder_lr : float
        ``vertical.encoder-lr``: Adam's step for the encoders and the autoencoder.
    split_mode : str
        ``vertical.split-mode``: ``parallel`` (SplitFed: every site at once, the site parts
        averaged after each round) or ``sequential`` (sites in turn, the site part handed on).
    cut : int
        ``vertical.cut``: the site runs the network's first ``cut`` blocks.
    head_layers : int
        ``vertical.head-layers``: U-shaped only, the last blocks kept at the site.
    batches_per_message : int
        ``vertical.batches-per-message``: batches of activations one message carries.
    """

    section = SECTION
    method: str = option("pvfed")
    aggregation: str = option("pca")
    dim: int = option(8, at_least=1)
    hidden: int = option(64, at_least=1)
    local_epochs: int = option(100, at_least=1)
    encoder_epochs: int = option(300, at_least=1)
    global_epochs: int = option(300, at_least=1)
    head_epochs: int = option(200, at_least=1)
    encoder_lr: float = option(0.01, at_least=0.0)
    split_mode: str = option("parallel")
    cut: int = option(2, at_least=1)
    head_layers: int = option(1, at_least=1)
    batches_per_message: int = option(8, at_least=1)

    def check(self) -> None:
        """Known method, aggregation and split mode; a positive step.

        Raises
        ------
        PluginError
            Naming the key and the known values.
        """
        for name, known in (("method", METHODS), ("aggregation", AGGREGATIONS),
                            ("split_mode", SPLIT_MODES)):
            if getattr(self, name) not in known:
                self.fail(name, f"must be one of {list(known)}")
        if self.encoder_lr <= 0.0:
            self.fail("encoder_lr", "must be > 0")

    @property
    def needs_alignment(self) -> bool:
        """Whether the sites share patients (pvFed: a PSI first); split learning's sites do not."""
        return self.method == "pvfed"


def split_vertical(values: Mapping[str, Any]) -> tuple[VerticalOptions, dict[str, Any]]:
    """The ``vertical.*`` section of a flat run config, and the other keys.

    Raises
    ------
    PluginError
        For an unknown key of the section or a bad value, naming the full key.
    """
    return VerticalOptions.split_from(values)
