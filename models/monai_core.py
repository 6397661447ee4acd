"""The parts of MONAI the product uses, imported without MONAI's optional extras.

MONAI's package ``__init__`` imports every submodule (``load_submodules``), and
its :func:`monai.utils.optional_import` imports each optional dependency at
once to learn whether it is installed. Our environment has most of them, as
MLflow's dependencies (matplotlib, pandas, scikit-learn, SciPy, Pillow) or as
MLflow itself (``monai.handlers.mlflow_handler``), so ``import monai`` cost 13 s
more than torch on an idle 2-core machine (16.1 s against 3.2-3.7 s without
them). Every process that builds a model or a task pays it: the ServerApp, each
Ray actor of a simulation, each warm site worker, ``make predict``.

The networks, losses and metrics imported here need none of those extras.
MONAI is imported once with them hidden from MONAI's own modules (an import
made by a module named ``monai.*`` of a hidden package fails as if it were not
installed): MONAI records them as absent, and its placeholders raise
``OptionalImportError`` if a MONAI feature that needs one is used. Any other
module imports them as usual, before or after; if MONAI was imported before
this module, nothing is hidden.
"""

from __future__ import annotations

import importlib.abc
import sys
from importlib.machinery import ModuleSpec
from types import FrameType

__all__ = ["HIDDEN_FROM_MONAI", "DenseNet", "DenseNet121", "DiceCELoss", "DiceMetric", "UNet",
           "compute_roc_auc"]

#: Top-level packages MONAI's import must not load (none is used by what we import of it).
HIDDEN_FROM_MONAI = frozenset({"matplotlib", "pandas", "mlflow", "sklearn", "scipy",
                               "skimage", "tensorboard", "ignite", "PIL", "einops"})


def _importing_module(frame: FrameType | None) -> str:
    """``__name__`` of the first module up the stack that is not the import machinery."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("importlib") and name != __name__:
            return name
        frame = frame.f_back
    return ""


class _HiddenFromMonai(importlib.abc.MetaPathFinder):
    """Fails an import of a :data:`HIDDEN_FROM_MONAI` package made by a ``monai.*`` module."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> ModuleSpec | None:
        if fullname.split(".")[0] not in HIDDEN_FROM_MONAI:
            return None
        if _importing_module(sys._getframe(1)).split(".")[0] != "monai":  # pylint: disable=W0212
            return None
        raise ModuleNotFoundError(f"{fullname} is hidden from MONAI's import "
                                  f"({__name__})", name=fullname)


def _import_monai() -> None:
    if "monai" in sys.modules:
        return
    finder = _HiddenFromMonai()
    sys.meta_path.insert(0, finder)
    try:
        import monai  # noqa: F401,PLC0415  pylint: disable=import-outside-toplevel,unused-import
    finally:
        sys.meta_path.remove(finder)


_import_monai()

# pylint: disable=wrong-import-position
from monai.losses import DiceCELoss  # noqa: E402
from monai.metrics import DiceMetric, compute_roc_auc  # noqa: E402
from monai.networks.nets import DenseNet, DenseNet121, UNet  # noqa: E402
