"""DP-SGD at a site with Opacus: per-example clipping, Gaussian noise, Poisson sampling.

DP-SGD (Abadi et al., "Deep learning with differential privacy", CCS 2016,
Alg. 1): every step draws a Poisson sample of the site's training examples
(each example independently with probability ``q``), clips each example's
gradient to L2 norm ``C`` (``max_grad_norm``), sums, adds Gaussian noise
``N(0, sigma^2 C^2 I)`` and averages over the expected batch size ``q n``.
The privacy loss of the steps is tracked by Opacus's accountant (RDP,
Mironov, "Renyi differential privacy", CSF 2017, with the subsampled Gaussian
bound of Mironov, Talwar & Zhang 2019; or PRV, Gopi, Lee & Wutschitz,
NeurIPS 2021). Nothing here clips, adds noise or accounts by hand: all of it is
:class:`opacus.PrivacyEngine`'s.

Models are made DP-compatible by :func:`dp_compatible` (BatchNorm mixes the
examples of a batch, so it becomes GroupNorm; modules that fold a sequence
into the batch dimension, the ConvLSTM's slices, use slice-wise layers that keep
the volumes as the first dimension, so that each example's gradient is its own).
The server builds its model the same way when the run asks for DP, so every
state dict matches. Per-example gradients are Opacus's ``hooks`` mode with the
closed forms of :mod:`clients.training.grad_samplers` for the models' layers
(DP-SGD costs 1.5-2.9x plain training per sample on CPU, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader

from clients.training import grad_samplers
from clients.training.dp_accountants import ACCOUNTANTS
from clients.training.opacus_loader import opacus
from models.slice_layers import slice_wise
from strategies.wire.errors import ConfigError
from strategies.wire.run_keys import run_key

if TYPE_CHECKING:
    from opacus.accountants import IAccountant

__all__ = ["DpSettings", "PrivateModelError", "GRAD_SAMPLE_MODES", "dp_compatible",
           "noise_only_step", "poisson_sample_rate", "private_training"]

#: Opacus's per-example gradient engines for a model trained in place (``wrap_model=False``):
#: ``"hooks"``, a layer's closed-form per-example gradient from its activations and
#: back-propagated errors (:mod:`clients.training.grad_samplers` for the models' layers,
#: Opacus's own for the others), and ``"functorch"``, every layer's by ``torch.func.vmap``
#: of its own gradient. ``"hooks"`` is the faster on CPU for all three tasks' models
#: (``bench/privacy_utility.py``, docs/BENCHMARKS.md). Not offered: Opacus's expanded
#: weights (``"ew"``, not with ``wrap_model=False``) and ghost clipping (``"ghost"``: Opacus
#: has no per-example norm rule for convolutions, so it computes the same per-example
#: gradients and adds a second backward pass: not faster than ``"hooks"`` on cxr-cls).
GRAD_SAMPLE_MODES = ("hooks", "functorch")


class PrivateModelError(ConfigError):
    """A model cannot be trained with DP-SGD (Opacus rejects one of its layers)."""


@dataclass(frozen=True)
class DpSettings:
    """The DP-SGD parameters of a run (run config ``privacy.*``)."""

    #: sigma: noise standard deviation over the clipping norm (0 = no DP-SGD).
    noise_multiplier: float = run_key("privacy.noise-multiplier")
    #: C: per-example gradient clipping norm (L2).
    max_grad_norm: float = run_key("privacy.max-grad-norm")
    #: delta of the (epsilon, delta) guarantee the accountant reports.
    delta: float = run_key("privacy.delta")
    #: Opacus accountant (run config ``privacy.accountant``), one of
    #: :data:`~clients.training.dp_accountants.ACCOUNTANTS`.
    accountant: str = run_key("privacy.accountant")
    #: How Opacus computes per-example gradients, one of :data:`GRAD_SAMPLE_MODES`. Not a
    #: privacy parameter: every mode clips and noises the same per-example gradients, only
    #: the cost differs.
    grad_sample_mode: str = "hooks"

    @property
    def enabled(self) -> bool:
        """Whether local training is DP-SGD."""
        return self.noise_multiplier > 0


def dp_compatible(model: nn.Module) -> tuple[nn.Module, tuple[str, ...]]:
    """The model with DP-SGD-compatible layers, and the changes made (for the run's log).

    BatchNorm layers become GroupNorm (:meth:`opacus.validators.ModuleValidator.fix`;
    BatchNorm's batch statistics make one example's output depend on the others,
    so per-example gradients are not defined); a module with a ``fold_slices``
    attribute (:func:`models.slice_layers.per_slice`) stops folding slices into the batch
    and its 2D layers become slice-wise (:func:`models.slice_layers.slice_wise`: one call
    for all slices, the volumes still the first dimension, where per-example gradients
    are taken); in-place activations (``ReLU(inplace=True)``) work out of place, as Opacus's
    backward hooks require. None of these changes the parameters or their names.

    Raises
    ------
    PrivateModelError
        If Opacus still rejects a layer after the fix.
    """
    norms = Counter(type(m).__name__ for m in model.modules() if isinstance(m, _BatchNorm))
    validator = opacus("validators").ModuleValidator
    model = validator.fix(model)
    changes = [f"{count} {name} -> GroupNorm" for name, count in sorted(norms.items())]
    inplace = [m for m in model.modules() if getattr(m, "inplace", False) is True]
    for module in inplace:
        module.inplace = False
    if inplace:
        changes.append(f"{len(inplace)} in-place activations -> out-of-place")
    unfolded = [m for m in model.modules() if getattr(m, "fold_slices", False)]
    for module in unfolded:
        module.fold_slices = False
    if unfolded:
        layers = sum(slice_wise(module) for module in unfolded)
        changes.append(f"{len(unfolded)} slice-folding modules -> {layers} slice-wise layers")
    errors = validator.validate(model, strict=False)
    if errors:
        raise PrivateModelError(f"DP-SGD (privacy.noise-multiplier > 0): model "
                                f"{type(model).__name__} has layers Opacus rejects: {errors[0]}")
    return model, tuple(changes)


def poisson_sample_rate(num_examples: int, batch_size: int) -> float:
    """``q``: Opacus's rate, one over the number of batches of a ``drop_last`` epoch.

    The same value :meth:`opacus.PrivacyEngine.make_private` derives from the
    task's loader (``1 / len(loader)``), so a budget check before training
    plans with the rate training will use.
    """
    if num_examples < 1 or batch_size < 1:
        raise ValueError(f"need examples and batch size >= 1, got {num_examples}, {batch_size}")
    return 1.0 / max(num_examples // batch_size, 1)


@contextmanager
def private_training(
    model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, settings: DpSettings,
) -> Iterator[tuple[torch.optim.Optimizer, DataLoader, IAccountant]]:
    """DP-SGD versions of ``optimizer`` and ``loader`` for training ``model`` in place.

    Opacus hooks ``model`` for per-example gradients (the model itself is trained,
    so its state-dict keys stay as they are), wraps the optimiser (clip to
    ``max_grad_norm``, add noise ``noise_multiplier * max_grad_norm``, the
    accountant's hook on every step) and replaces the loader's sampler by Poisson
    sampling at :func:`poisson_sample_rate` (empty batches possible). The noise and
    the Poisson sample each draw from a generator seeded by the operating system's
    entropy, never from the run's seed, which the server knows: it could otherwise
    regenerate and subtract the noise, or tell in which steps an example was
    sampled, and the accountant's amplification by subsampling assumes the sample
    is secret (Balle, Barthe & Gaboardi, NeurIPS 2018).
    Yields ``(optimizer, loader, accountant)``; the hooks are removed on exit.
    """
    if settings.accountant not in ACCOUNTANTS:
        raise PrivateModelError(f"run-config 'privacy.accountant' must be one of "
                                f"{ACCOUNTANTS.names()}, got {settings.accountant!r}")
    if settings.grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise PrivateModelError(f"DpSettings.grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, "
                                f"got {settings.grad_sample_mode!r}")
    grad_samplers.register()
    engine = opacus().PrivacyEngine(accountant=settings.accountant)
    device = next(model.parameters()).device
    noise = torch.Generator(device=device).manual_seed(secrets.randbits(63))
    hooks, dp_optimizer, dp_loader = engine.make_private(
        noise_generator=noise,
        module=model, optimizer=optimizer, data_loader=loader,
        noise_multiplier=settings.noise_multiplier, max_grad_norm=settings.max_grad_norm,
        poisson_sampling=True, wrap_model=False,
        grad_sample_mode=settings.grad_sample_mode)
    dp_loader.batch_sampler.generator = torch.Generator().manual_seed(secrets.randbits(63))
    try:
        yield dp_optimizer, dp_loader, engine.accountant
    finally:
        hooks.cleanup()


def noise_only_step(optimizer: torch.optim.Optimizer) -> None:
    """The DP-SGD step of an empty Poisson batch: no example's gradient, only the noise.

    What Opacus's optimiser does when an empty batch has (empty) per-example
    gradients: the clipped sum is zero, the Gaussian noise is added and the
    accountant counts the step (the sampling, not the batch's content, is what
    the accounting assumes). Some layers' per-example gradients cannot be formed
    on an empty batch, so they are set empty here instead of by a backward pass.
    """
    optimizer.zero_grad(set_to_none=True)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad_sample = p.new_zeros((0, *p.shape))
    optimizer.step()
