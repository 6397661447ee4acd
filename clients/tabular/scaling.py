"""Missing values and scales of a table's features, learned from the site's training rows only.

A row of ``F`` features (NaN = missing) becomes ``2F`` inputs of the network:

* the ``F`` values, each missing one replaced by the **median of its column over the
  training split** (0 when the column has no training value at all);
* ``F`` 0/1 **missing indicators**, one per feature, 1 where the value was missing
  (the "missing-indicator method": the model may learn from the fact that a
  test was not done, e.g. the thallium scan of most non-Cleveland patients of
  UCI Heart Disease).

All ``2F`` inputs are then standardised, ``(x - mean) / sd``, with the training
split's mean and standard deviation (a constant column: ``sd = 1``). Nothing is
fitted on ``val`` or ``test``. The indicator is present for every feature, not
only for those with a missing value at this site, so that the input width is a
function of the header alone (``2F``): every site with the same columns builds
the same network, which a horizontal federation needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FeatureScaling", "input_names"]


def input_names(features: tuple[str, ...]) -> tuple[str, ...]:
    """The ``2F`` input names: the features, then ``<feature>-missing`` for each."""
    return features + tuple(f"{name}-missing" for name in features)


def _with_indicators(values: np.ndarray, medians: np.ndarray) -> np.ndarray:
    """``[imputed values, missing indicators]`` of ``(N, F)`` values: ``(N, 2F)`` float64."""
    missing = np.isnan(values)
    imputed = np.where(missing, medians[None, :], values)
    return np.concatenate([imputed, missing.astype(np.float64)], axis=1)


@dataclass(frozen=True)
class FeatureScaling:
    """The training split's medians (``F``) and the means and sds (``2F``) of the inputs."""

    medians: np.ndarray
    means: np.ndarray
    sds: np.ndarray

    @classmethod
    def fit(cls, train: np.ndarray) -> FeatureScaling:
        """The statistics of ``train``, ``(N, F)`` values with NaN where missing (``N`` may be 0).

        Raises
        ------
        ValueError
            If ``train`` is not two-dimensional.
        """
        train = np.asarray(train, dtype=np.float64)
        if train.ndim != 2:
            raise ValueError(f"training values must be (rows, features), got shape {train.shape}")
        observed = [column[~np.isnan(column)] for column in train.T]
        medians = np.array([np.median(c) if c.size else 0.0 for c in observed])
        inputs = _with_indicators(train, medians)
        if not len(inputs):
            ones = np.ones(inputs.shape[1])
            return cls(medians, ones * 0.0, ones)
        sds = inputs.std(axis=0)
        return cls(medians, inputs.mean(axis=0), np.where(sds > 0, sds, 1.0))

    def transform(self, values: np.ndarray) -> np.ndarray:
        """The standardised inputs ``(N, 2F)`` (``float32``) of ``(N, F)`` values, NaN = missing.

        Raises
        ------
        ValueError
            If the rows do not have the ``F`` features of the fit.
        """
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != self.medians.size:
            raise ValueError(f"expected (rows, {self.medians.size}) values, got shape {values.shape}")
        inputs = _with_indicators(values, self.medians)
        return ((inputs - self.means) / self.sds).astype(np.float32)
