"""pvFed's aggregation: the vectors the global encoder mimics, from the local encoders' outputs.

Nishikawa et al., "pvFed", IEEJ Trans. 2024, section 3: the global encoder is
trained "to mimic the vectors obtained by aggregating the local encoders'
outputs, with the sample IDs as input", by one of three dimension-reducing
aggregations of the concatenated outputs ("通过连接和降维局部编码器生成的向量"):

* ``mean`` -- the mean of the local outputs, ``T = (1/K) sum_k Z_k``. It needs
  local outputs of one width (the paper's FEMNIST clients share an
  architecture); ``T`` has that width, not ``vertical.dim``.
* ``pca`` -- principal component analysis of ``Z = [Z_1 .. Z_K]``
  (:func:`pca_aggregation`), the paper's best (FEMNIST 0.9354 against 0.9150
  for the clients' local best).
* ``ae`` -- the bottleneck codes of an autoencoder of ``Z``
  (:func:`models.pvfed.autoencoder_aggregation`, torch: registered here by
  dotted path, imported by the coordinator on first use, so that this module
  stays pure numpy).

``Z_k`` is ``(N, d_k)``: site k's local encoder evaluated on the aligned patients
``0 .. N-1``. Every entry of :data:`VECTOR_AGGREGATIONS` is a
:class:`VectorAggregation`; :func:`aggregate` checks the outputs and calls one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from strategies.wire.errors import ConfigError, ReplyError
from strategies.wire.registry import Registry

__all__ = ["AggregationSettings", "VectorAggregation", "VECTOR_AGGREGATIONS", "aggregate",
           "mean_aggregation", "pca_aggregation", "standardised"]


@dataclass(frozen=True)
class AggregationSettings:
    """What an aggregation may read: the target length and the autoencoder's training.

    Attributes
    ----------
    dim : int
        ``vertical.dim``: length of an aggregated vector (``pca``, ``ae``).
    hidden : int
        ``vertical.hidden``: the autoencoder's hidden width.
    epochs : int
        ``vertical.global-epochs``: the autoencoder's full-batch steps.
    lr : float
        ``vertical.encoder-lr``: the autoencoder's Adam step.
    seed : int
        The autoencoder's initial weights.
    """

    dim: int
    hidden: int = 64
    epochs: int = 300
    lr: float = 0.01
    seed: int = 0


class VectorAggregation(Protocol):
    """An aggregation: the local outputs ``Z_k`` (``(N, d_k)`` each) -> targets ``(N, width)``."""

    def __call__(self, outputs: Sequence[np.ndarray],
                 settings: AggregationSettings) -> np.ndarray: ...


#: ``vertical.aggregation`` -> its function (``"module:function"``, imported on first use).
VECTOR_AGGREGATIONS: Registry[VectorAggregation] = Registry("vector aggregation",
                                                           "vertical.aggregation")


def standardised(columns: np.ndarray) -> np.ndarray:
    """``columns`` centred and scaled to unit standard deviation per column (float64).

    A constant column becomes 0 (its deviation is taken as 1).
    """
    columns = np.asarray(columns, np.float64)
    spread = columns.std(axis=0)
    return (columns - columns.mean(axis=0)) / np.where(spread > 0, spread, 1.0)


def mean_aggregation(outputs: Sequence[np.ndarray], settings: AggregationSettings) -> np.ndarray:
    """``T = (1/K) sum_k Z_k``: the paper's mean aggregation.

    Raises
    ------
    ConfigError
        If the local outputs differ in width (naming ``vertical.aggregation``).
    """
    widths = sorted({np.shape(z)[1] for z in outputs})
    if len(widths) > 1:
        raise ConfigError(f"vertical.aggregation = 'mean' averages local-encoder outputs of one "
                          f"width; the sites' widths are {widths} (their models' feature "
                          f"widths): use 'pca' or 'ae'")
    stacked = np.stack([np.asarray(z, np.float64) for z in outputs])
    return stacked.mean(axis=0).astype(np.float32)


def pca_aggregation(outputs: Sequence[np.ndarray], settings: AggregationSettings) -> np.ndarray:
    """The first ``dim`` principal component scores of the concatenated local outputs.

    ``Z = [Z_1 .. Z_K]`` (``(N, c)``, ``c = sum_k d_k``) is standardised per
    column (:func:`standardised`: correlation-matrix PCA, so that a department
    does not dominate the components by the scale of its features; the paper
    does not say), giving ``Zs``. With ``C = Zs^T Zs / (N - 1)`` and its
    eigenvectors ``v_1 .. v_c`` by decreasing eigenvalue (``numpy.linalg.eigh``),
    ``T = Zs V_dim``, ``V_dim = [v_1 .. v_dim]``. Sign rule: each ``v_j`` is
    turned so that its entry of largest absolute value (the first such) is positive.

    Raises
    ------
    ConfigError
        If ``vertical.dim`` exceeds ``c`` (naming the key), or there are under 2 patients.
    """
    z = standardised(np.concatenate(list(outputs), axis=1))
    patients, columns = z.shape
    if settings.dim > columns:
        raise ConfigError(f"vertical.dim = {settings.dim} principal components of the "
                          f"{columns} concatenated local-encoder outputs: at most {columns}")
    if patients < 2:
        raise ConfigError(f"the PCA aggregation needs at least 2 aligned patients, got {patients}")
    values, vectors = np.linalg.eigh(z.T @ z / (patients - 1))
    top = vectors[:, np.argsort(-values, kind="stable")[:settings.dim]]
    largest = np.abs(top).argmax(axis=0)
    top = top * np.sign(top[largest, np.arange(top.shape[1])])
    return (z @ top).astype(np.float32)


VECTOR_AGGREGATIONS.add("mean", mean_aggregation)
VECTOR_AGGREGATIONS.add("pca", pca_aggregation)
VECTOR_AGGREGATIONS.add_path("ae", "models.pvfed:autoencoder_aggregation")


def aggregate(name: str, outputs: Sequence[np.ndarray], settings: AggregationSettings,
              sources: Sequence[str] = ()) -> np.ndarray:
    """The targets of the global encoder: aggregation ``name`` of checked local outputs.

    Parameters
    ----------
    name : str
        ``vertical.aggregation``: ``mean``, ``pca`` or ``ae``.
    outputs : sequence of numpy.ndarray
        ``Z_k``, ``(N, d_k)`` each, one per site, rows in the aligned order.
    settings : AggregationSettings
    sources : sequence of str
        The sites' names (departments), for the messages; default their positions.

    Returns
    -------
    numpy.ndarray
        ``(N, width)`` float32 targets.

    Raises
    ------
    ConfigError
        For an unknown ``name`` or settings the aggregation refuses.
    ReplyError
        If an output is not 2-D and finite, or the sites disagree on N.
    """
    entry = VECTOR_AGGREGATIONS.get(name)
    names = list(sources) or [f"site {k}" for k in range(len(outputs))]
    if not outputs:
        raise ReplyError("pvFed aggregation: no local-encoder output to aggregate")
    for source, z in zip(names, outputs):
        if np.ndim(z) != 2 or not np.isfinite(z).all():
            raise ReplyError(f"pvFed aggregation: the local encoder of {source} gives "
                             f"{np.shape(z)} vectors that are not a finite (N, d) array")
    counts = {source: np.shape(z)[0] for source, z in zip(names, outputs)}
    if len(set(counts.values())) > 1:
        raise ReplyError(f"pvFed aggregation: the local encoders know different numbers of "
                         f"aligned patients {counts}")
    return np.asarray(entry(outputs, settings), np.float32)
