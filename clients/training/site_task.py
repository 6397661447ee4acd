"""What every imaging task of a site provides, and the local training they share.

A *site task* ties a site's data (read once, bad items skipped and counted) to
a model factory, a loss, a sampler and a validation metric. Local training
(:meth:`SiteTask.train`), the Power-of-Choice loss probe
(:meth:`SiteTask.training_loss`) and evaluation on a split
(:meth:`SiteTask.evaluate`, ``val`` or the held-out ``test``) are the same for
every task; a task only says how to load its data, build its model, batch its
training data and evaluate one data set. A site may hold no training item (a
test-only site): it loads and evaluates, and training on it is a
:class:`SiteDataError`. No Flower imports: the ClientApp calls this.
"""

from __future__ import annotations

import logging
import math
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from clients.training.task_settings import OPTIMIZERS, TaskSettings
from clients.manifests.csv_rows import EVAL_SPLITS
from clients.manifests.load_report import LoadReport
from clients.prediction.items import PredictionItem, plain_folder_items
from clients.training.private_training import (DpSettings, dp_compatible, noise_only_step,
                                               private_training)
from clients.training.trainer import ComputeDevice, StepHooks, TrainResult, train_steps
from strategies.wire.errors import SiteError

if TYPE_CHECKING:
    from clients.prediction.predictor import Predictor

__all__ = ["SiteDataError", "TaskSettings", "EvalResult", "SiteTask", "make_optimizer",
           "sgd_optimizer", "adam_optimizer", "merged_report", "OPTIMIZERS", "EVAL_SPLITS"]

log = logging.getLogger(__name__)


class SiteDataError(SiteError):
    """A site has no usable data for the requested work (no item at all, or none to train on)."""


@dataclass(frozen=True)
class EvalResult:
    """Evaluation of a model on one split (``val`` or ``test``) of a site's data.

    ``metrics`` holds only the metrics defined at this site (finite values); one
    that is undefined on the site's data (ROC AUC of a one-class split) is left out.
    A split without items gives ``num_examples = num_studies = 0``, ``loss`` NaN
    and no metrics.
    """

    num_examples: int
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    num_studies: int = 0


def merged_report(*reports: LoadReport) -> LoadReport:
    """One load report of several splits: loaded ids in order, skipped ids merged."""
    merged = LoadReport()
    for report in reports:
        merged.loaded.extend(report.loaded)
        merged.skipped.update(report.skipped)
    return merged


def sgd_optimizer(params: Iterable[nn.Parameter], lr: float,
                  momentum: float) -> torch.optim.Optimizer:
    """``optimizer = "sgd"``: SGD with heavy-ball ``momentum``."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def adam_optimizer(params: Iterable[nn.Parameter], lr: float,
                   momentum: float) -> torch.optim.Optimizer:
    """``optimizer = "adam"``: Adam with beta1 = ``momentum``."""
    return torch.optim.Adam(params, lr=lr, betas=(momentum, 0.999))


def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float,
                   momentum: float) -> torch.optim.Optimizer:
    """Local optimiser by name, from :data:`OPTIMIZERS`.

    Raises
    ------
    ConfigError
        For a name not in :data:`OPTIMIZERS`, naming the key ``optimizer``.
    """
    return OPTIMIZERS.get(name)(params, lr, momentum)


class SiteTask(ABC):
    """One site's data for one task, and the operations the ClientApp runs on it.

    Subclasses set ``name``, ``main_metric`` and ``manifest_name`` and implement
    :meth:`model_for`, :meth:`example_input`, :meth:`loss_fn`,
    :meth:`_train_loader` and :meth:`_evaluate_on`; their ``__init__`` loads
    ``train_set``, ``val_set`` and ``test_set`` (Datasets of ``(input, target)``,
    ``None`` for a split without usable items) and ``report``, and calls
    :meth:`_require_items`. A task whose model is a 2D CNN on ``(N, C, H, W)``
    inputs sets ``channels_last_ok`` so that it runs NHWC on devices that ask
    for it (:attr:`ComputeDevice.channels_last`).

    Hooks for applying a logged model (``make predict``) and logging it, all
    class-level so that no site data is loaded for them; app/ asks the task
    through them and names no task:

    - ``preprocessing`` (attribute): what a site does to an item before the
      model sees it, one line formatted with the :class:`TaskSettings` fields
      (:meth:`preprocessing_text`); logged with the model.
    - :meth:`manifest_items`: a site folder's manifest rows as
      :class:`~clients.prediction.items.PredictionItem` s, with their references.
    - ``item_files`` and ``item_series`` (attributes): which files, and whether
      folders of other files (DICOM series), are items of a plain folder;
      override :meth:`folder_items` for another rule.
    - :meth:`predictor`: reads and preprocesses one item as in training and
      writes its output (a :class:`~clients.prediction.predictor.Predictor`).
    """

    name: ClassVar[str]
    main_metric: ClassVar[str]
    #: The site folder's manifest (``images.csv``, ``manifest.csv``, ``labels.csv``), named in errors.
    manifest_name: ClassVar[str]
    channels_last_ok: ClassVar[bool] = False
    #: One line of preprocessing, with ``{image_size}``-style fields of :class:`TaskSettings`.
    preprocessing: ClassVar[str]
    #: Lower-case suffixes of a plain folder's files that are one item each.
    item_files: ClassVar[tuple[str, ...]] = ()
    #: Whether a plain folder's folder of other files is one item (a DICOM series).
    item_series: ClassVar[bool] = False

    def __init__(self, site_dir: Path, settings: TaskSettings) -> None:
        self.site_dir = Path(site_dir)
        self.settings = settings
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.report = LoadReport()

    def _require_items(self, noun: str) -> None:
        """Refuse a site with no usable item in any split (nothing to train or evaluate on).

        Raises
        ------
        SiteDataError
            Naming the manifest and the number of skipped items.
        """
        if not any(data is not None and len(data) for data in
                   (self.train_set, self.val_set, self.test_set)):
            raise SiteDataError(f"{self.site_dir / self.manifest_name}: no usable {noun} in any "
                                f"split ({len(self.report.skipped)} skipped)")

    def require_training(self) -> Dataset:
        """The training data, for :meth:`train` and :meth:`training_loss`.

        Raises
        ------
        SiteDataError
            If the site has no usable training item (a site holding only ``val`` /
            ``test`` items can evaluate, not train); the message names the manifest.
        """
        if self.train_set is None or not len(self.train_set):
            raise SiteDataError(
                f"{self.site_dir / self.manifest_name}: no training items (no usable row of split "
                f"'train'; {len(self.report.skipped)} item(s) skipped): the site can only evaluate")
        return self.train_set

    def eval_set(self, split: str) -> Dataset | None:
        """The data of evaluation split ``split`` (``"val"`` or ``"test"``), ``None`` if it has none.

        Raises
        ------
        ValueError
            On any other split.
        """
        if split not in EVAL_SPLITS:
            raise ValueError(f"evaluation split must be one of {EVAL_SPLITS}, got {split!r}")
        return self.val_set if split == "val" else self.test_set

    def split_studies(self, split: str) -> int:
        """Studies in ``split`` (``train``, ``val`` or ``test``): what an evaluate reply's
        ``<split>-studies`` counts (a task whose examples are parts of studies overrides it)."""
        data = self.train_set if split == "train" else self.eval_set(split)
        return 0 if data is None else len(data)

    @classmethod
    @abstractmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """A fresh model for these settings (the server builds it without any data)."""

    @classmethod
    @abstractmethod
    def example_input(cls, settings: TaskSettings) -> np.ndarray:
        """One input batch of the model, for MLflow's model signature."""

    @classmethod
    def preprocessing_text(cls, settings: TaskSettings) -> str:
        """:attr:`preprocessing` with these settings' values (the logged model's ``preprocessing``)."""
        return cls.preprocessing.format(**asdict(settings))

    @classmethod
    @abstractmethod
    def manifest_items(cls, site_dir: Path, split: str | None,
                       settings: TaskSettings) -> list[PredictionItem]:
        """The rows of ``site_dir``'s manifest of ``split`` (all when ``None``) as prediction items,
        in file order, with their reference (mask, labels) where the row has a usable one.

        Raises
        ------
        ManifestError
            If the manifest is missing or malformed.
        """

    @classmethod
    def folder_items(cls, folder: Path) -> list[PredictionItem]:
        """The items of a plain folder (no manifest), by :attr:`item_files` and :attr:`item_series`
        (:func:`~clients.prediction.items.plain_folder_items`)."""
        return plain_folder_items(folder, cls.item_files, cls.item_series)

    @classmethod
    @abstractmethod
    def predictor(cls, model: nn.Module, settings: TaskSettings, compute: ComputeDevice,
                  out: Path) -> Predictor:
        """The predictor of ``model`` (in eval mode), writing beside its table into ``out``."""

    @staticmethod
    @abstractmethod
    def loss_fn() -> nn.Module:
        """Training loss on logits."""

    @classmethod
    def private_loss_fn(cls) -> nn.Module:
        """Training loss under DP-SGD: the mean of per-example losses.

        Per-example clipping bounds each example's influence only if the batch
        loss is a mean (or sum) of per-example terms; a task whose :meth:`loss_fn`
        pools over the batch (a batch Dice) overrides this.
        """
        return cls.loss_fn()

    @classmethod
    def model_for_run(cls, settings: TaskSettings, private: bool = False) -> nn.Module:
        """:meth:`model_for`, made DP-SGD-compatible when ``private`` (the server builds
        the same, so state-dict keys match; the changes are logged)."""
        model = cls.model_for(settings)
        if private:
            model, changes = dp_compatible(model)
            log.info("%s model for DP-SGD: %s", cls.name, "; ".join(changes) or "no change")
        return model

    @abstractmethod
    def _train_loader(self, seed: int, compute: ComputeDevice) -> DataLoader:
        """Batches of training data, sampled with ``seed``, fed as ``compute`` asks
        (:meth:`ComputeDevice.loader_kwargs`)."""

    @abstractmethod
    def _evaluate_on(self, model: nn.Module, data: Dataset, compute: ComputeDevice) -> EvalResult:
        """Loss and metrics (``main_metric`` among them) on ``data`` (one split, not empty)."""

    def evaluate(self, model: nn.Module, compute: ComputeDevice, split: str = "val") -> EvalResult:
        """Loss and metrics of ``model`` on the site's ``split`` (``"val"`` or ``"test"``).

        A split without usable items gives ``EvalResult(0, nan)`` (no metrics), not an error.

        Raises
        ------
        ValueError
            On a split other than ``"val"`` or ``"test"``.
        """
        data = self.eval_set(split)
        if data is None or not len(data):
            return EvalResult(num_examples=0, loss=math.nan, metrics={}, num_studies=0)
        return self._evaluate_on(model, data, compute)

    def build_model(self, private: bool = False) -> nn.Module:
        """A fresh model for this site's settings (DP-SGD-compatible if ``private``)."""
        return self.model_for_run(self.settings, private)

    def train(
        self, model: nn.Module, steps: int, lr: float, momentum: float,
        compute: ComputeDevice, seed: int, optimizer: str = "adam",
        deadline: float | None = None, label: str = "", proximal_mu: float = 0.0,
        privacy: DpSettings | None = None, loop: Callable[..., TrainResult] = train_steps,
        step_hooks: StepHooks | None = None,
    ) -> TrainResult:
        """Run ``steps`` local optimiser steps on the site's training data.

        ``loop`` is the training loop, called as :func:`train_steps` (Per-FedAvg-FO's
        :func:`~clients.training.personalisation.per_fedavg_fo.per_fedavg_fo_steps`
        takes its place; not under DP-SGD).

        ``optimizer`` is ``"sgd"`` (heavy-ball ``momentum``, PyTorch style) or
        ``"adam"`` (Kingma & Ba 2015; ``momentum`` is its beta1). The optimiser
        state is fresh every round, as in FedAvg with local Adam. On a
        channels-last device the model is trained NHWC and handed back in the
        default (contiguous) layout.

        With ``privacy`` enabled the steps are DP-SGD (Opacus,
        :mod:`clients.training.private_training`) on a model from
        ``build_model(private=True)``, in full precision, with
        :meth:`private_loss_fn`; the result carries the accountant's history.

        ``step_hooks`` run around every optimiser step, DP-SGD's included (pruning's
        :class:`~clients.training.pruning.MaskedTraining`: its ``before_step`` sees the
        per-example gradients before Opacus clips them).

        Raises
        ------
        SiteDataError
            If the site has no training item (:meth:`require_training`).
        """
        self.require_training()
        torch.manual_seed(seed)
        if privacy is not None and privacy.enabled:
            return self._train_private(model, steps, lr, momentum, compute, seed, optimizer,
                                       deadline, label, privacy, step_hooks)
        channels_last = compute.channels_last and self.channels_last_ok
        model.to(compute.device)
        if channels_last:
            model.to(memory_format=torch.channels_last)
        try:
            opt = make_optimizer(optimizer, model.parameters(), lr, momentum)
            return loop(model, self._train_loader(seed, compute), self.loss_fn(), opt,
                        steps, compute, deadline=deadline, label=label,
                        proximal_mu=proximal_mu, channels_last=channels_last,
                        step_hooks=step_hooks)
        finally:
            if channels_last:
                model.to(memory_format=torch.contiguous_format)

    def _train_private(
        self, model: nn.Module, steps: int, lr: float, momentum: float, compute: ComputeDevice,
        seed: int, optimizer: str, deadline: float | None, label: str, privacy: DpSettings,
        step_hooks: StepHooks | None = None,
    ) -> TrainResult:
        """DP-SGD steps (see :meth:`train`); Opacus's grad samplers need float32 and NCHW."""
        compute = replace(compute, amp_dtype=None, channels_last=False)
        model.to(compute.device)
        opt = make_optimizer(optimizer, model.parameters(), lr, momentum)
        with private_training(model, opt, self._train_loader(seed, compute),
                              privacy) as (dp_opt, dp_loader, accountant):
            result = train_steps(model, dp_loader, self.private_loss_fn(), dp_opt, steps,
                                 compute, deadline=deadline, label=label,
                                 empty_batch_step=noise_only_step, step_hooks=step_hooks)
        return replace(result, privacy_steps=tuple(accountant.history))

    @torch.no_grad()
    def training_loss(self, model: nn.Module, compute: ComputeDevice, subset: int = 0) -> float:
        """Loss of ``model`` on the training data (forward passes only).

        ``subset > 0`` uses a random subset of that many examples (the cheap loss
        estimate of cpow-d), drawn afresh for every call from the operating system's
        entropy (:mod:`secrets`), which the server neither chooses nor sees: the
        difference of two answers is not one patient's loss (issue #28: with nested
        subsets of one seeded permutation, ``5 L5 - 4 L4`` was exactly the loss of
        example ``perm[4]``). 0 uses all of them (pow-d). A site without training
        items raises :class:`SiteDataError` (:meth:`require_training`).
        """
        train_set = self.require_training()
        model.to(compute.device).eval()
        indices = list(range(len(train_set)))
        if 0 < subset < len(indices):
            generator = torch.Generator().manual_seed(secrets.randbits(63))
            indices = torch.randperm(len(indices), generator=generator)[:subset].tolist()
        loader = DataLoader(Subset(train_set, indices),
                            batch_size=max(self.settings.batch_size, 16),
                            **compute.loader_kwargs(workers=False))
        loss_fn, total, count = self.loss_fn(), torch.zeros((), device=compute.device), 0
        for x, y in loader:
            x = x.to(compute.device, non_blocking=True)
            y = y.to(compute.device, non_blocking=True)
            with compute.autocast():
                logits = model(x)
            total += loss_fn(logits.float(), y).detach() * x.shape[0]
            count += x.shape[0]
        return float(total) / max(count, 1)
