"""The networks of pvFed (Nishikawa et al., "pvFed: personalised vertical federated learning",
IEEJ Trans. 2024): the ID encoder, the aggregation autoencoder and their fitting.

pvFed (the paper's Fig. 3) uses three kinds of network besides each client's own
local model:

* a **local encoder** per client, an ID encoder distilled with the Euclidean (MSE)
  loss to mimic the output of the local model's feature extractor ("本地编码器 ...
  使用蒸馏技术进行训练, 以模仿这些模型的特征提取层的输出");
* the **global encoder** at the server, the same architecture, trained to mimic an
  aggregate of the local encoders' outputs ("模仿通过使用样本 ID 作为输入聚合本地编码器的
  输出而获得的向量");
* for the "AE" aggregation, an **autoencoder** on the concatenated local outputs
  whose bottleneck codes are that aggregate.

An ID encoder maps a patient's index in the aligned order (the private set
intersection's common order) to a vector: ``Embedding(N, hidden) -> ReLU ->
Linear(hidden, width)``. Its weights are a lookup table of the aligned patients:
**sending an encoder sends one vector per patient**.

The feature extractor of a local model is the model with its last module, an
``nn.Linear`` output layer, replaced by ``nn.Identity`` (:func:`split_output_layer`).

Pure torch and numpy; every fit is full-batch Adam from seeded initial weights, so a
fit is a function of its inputs and seed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch
from torch import nn

__all__ = ["IdEncoder", "VectorAutoencoder", "AutoencoderSettings", "split_output_layer",
           "fit_id_encoder", "fit_full_batch", "encoder_arrays", "encoder_from_arrays",
           "autoencoder_aggregation"]


class IdEncoder(nn.Module):
    """Patient index -> representation vector: ``Embedding(N, hidden) -> ReLU -> Linear``.

    Parameters
    ----------
    num_ids : int
        Aligned patients N; inputs are indices ``0 .. N - 1``.
    hidden : int
        Embedding width (``vertical.hidden``).
    width : int
        Output length: the local model's feature width for a local encoder, the
        aggregate's width for the global encoder.
    seed : int, optional
        Seed of the initial weights (torch's global generator is left as it was).
    """

    def __init__(self, num_ids: int, hidden: int, width: int, seed: int | None = None) -> None:
        super().__init__()
        if min(num_ids, hidden, width) < 1:
            raise ValueError(f"an ID encoder needs positive sizes, got ids={num_ids}, "
                             f"hidden={hidden}, width={width}")
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.embedding = nn.Embedding(num_ids, hidden)
            self.output = nn.Linear(hidden, width)

    @property
    def num_ids(self) -> int:
        """N, the patients the encoder knows."""
        return self.embedding.num_embeddings

    @property
    def width(self) -> int:
        """Length of an output vector."""
        return self.output.out_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Vectors ``(n, width)`` of patient indices ``(n,)``."""
        return self.output(torch.relu(self.embedding(ids)))

    @torch.no_grad()
    def vectors(self) -> np.ndarray:
        """The vectors of every patient ``0 .. N - 1``, ``(N, width)`` float32."""
        self.eval()
        return self(torch.arange(self.num_ids)).numpy().astype(np.float32)


def split_output_layer(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """The feature extractor of ``model`` and its output layer (the paper's local model split).

    The extractor is a deep copy of ``model`` whose last registered module, the
    output ``nn.Linear``, is replaced by ``nn.Identity``: its output is the
    output layer's input, of width ``output.in_features``. ``model`` is unchanged.

    Raises
    ------
    ValueError
        If the last module of ``model`` is not an ``nn.Linear``.
    """
    name, last = list(model.named_modules())[-1]
    if not isinstance(last, nn.Linear) or not name:
        raise ValueError(f"pvFed needs a model whose last module is its nn.Linear output layer; "
                         f"{type(model).__name__}'s is {type(last).__name__} {name!r}")
    extractor = copy.deepcopy(model)
    parent_name, _, attribute = name.rpartition(".")
    parent = extractor.get_submodule(parent_name) if parent_name else extractor
    setattr(parent, attribute, nn.Identity())
    return extractor, copy.deepcopy(last)


def fit_id_encoder(encoder: IdEncoder, targets: np.ndarray, epochs: int,
                   lr: float) -> list[float]:
    """Distil ``targets`` into ``encoder``: full-batch Adam on ``mean ||E(i) - t_i||^2``.

    The paper's Euclidean distillation loss, over every patient ``i = 0 .. N-1``.
    The encoder is trained from its current weights (a warm start in later rounds).

    Parameters
    ----------
    encoder : IdEncoder
        Trained in place.
    targets : numpy.ndarray
        ``(N, width)`` vectors, row ``i`` for patient ``i``.
    epochs : int
        Full-batch steps.
    lr : float
        Adam's learning rate (``vertical.encoder-lr``).

    Returns
    -------
    list of float
        The loss before each step, then the final loss (``epochs + 1`` values).

    Raises
    ------
    ValueError
        If ``targets`` does not have one row per patient and the encoder's width.
    """
    expected = (encoder.num_ids, encoder.width)
    if tuple(targets.shape) != expected:
        raise ValueError(f"targets of shape {tuple(targets.shape)} for an encoder of {expected}")
    return fit_full_batch(encoder, torch.arange(encoder.num_ids),
                          torch.as_tensor(np.asarray(targets, np.float32)), epochs, lr)


def fit_full_batch(net: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, epochs: int,
                   lr: float) -> list[float]:
    """``epochs`` full-batch Adam steps of ``net`` on ``mse(net(inputs), targets)``.

    Returns the loss before each step, then the final loss (``epochs + 1`` values).
    """
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    losses = []
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = nn.functional.mse_loss(net(inputs), targets)
        losses.append(float(loss.detach()))
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        losses.append(float(nn.functional.mse_loss(net(inputs), targets)))
    return losses


def encoder_arrays(encoder: IdEncoder) -> dict[str, np.ndarray]:
    """The encoder's weights by state-dict name (what travels: one vector per patient)."""
    return {name: tensor.detach().numpy().copy() for name, tensor in encoder.state_dict().items()}


def encoder_from_arrays(arrays: Mapping[str, np.ndarray]) -> IdEncoder:
    """The ID encoder of :func:`encoder_arrays`, its sizes read from the weights' shapes.

    Raises
    ------
    ValueError
        If a weight is missing or the shapes do not make an ID encoder.
    """
    needed = ("embedding.weight", "output.weight", "output.bias")
    missing = [name for name in needed if name not in arrays]
    if missing:
        raise ValueError(f"an ID encoder needs arrays {list(needed)}; missing {missing}")
    num_ids, hidden = np.shape(arrays["embedding.weight"])
    width = np.shape(arrays["output.weight"])[0]
    encoder = IdEncoder(int(num_ids), int(hidden), int(width))
    try:
        encoder.load_state_dict({name: torch.as_tensor(np.asarray(arrays[name], np.float32))
                                 for name in needed})
    except RuntimeError as exc:
        raise ValueError(f"not an ID encoder's weights: {exc}") from exc
    return encoder


class VectorAutoencoder(nn.Module):
    """``c -> hidden -> code -> hidden -> c`` with ReLUs: the paper's AE aggregation network."""

    def __init__(self, columns: int, hidden: int, code: int) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(columns, hidden), nn.ReLU(), nn.Linear(hidden, code))
        self.decode = nn.Sequential(nn.Linear(code, hidden), nn.ReLU(), nn.Linear(hidden, columns))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``z`` ``(n, columns)``."""
        return self.decode(self.encode(z))


class AutoencoderSettings(Protocol):
    """What :func:`autoencoder_aggregation` reads of the aggregation settings."""

    dim: int
    hidden: int
    epochs: int
    lr: float
    seed: int


def autoencoder_aggregation(outputs: Sequence[np.ndarray],
                            settings: AutoencoderSettings) -> np.ndarray:
    """pvFed's AE aggregation: the bottleneck codes of an autoencoder of the local outputs.

    The local-encoder outputs ``Z_k`` (``(N, d_k)`` each) are concatenated into
    ``Z = [Z_1 .. Z_K]`` and standardised per column (mean 0, standard deviation
    1; a constant column becomes 0), as the PCA aggregation does, so that no
    department weighs more for the scale of its features. A
    :class:`VectorAutoencoder` with a ``settings.dim`` bottleneck is trained
    full-batch (Adam, ``settings.lr``, ``settings.epochs`` steps, initial weights
    seeded by ``settings.seed``) to reconstruct the standardised ``Z`` with the
    mean squared error; the aggregate of patient ``i`` is its code ``encode(z_i)``.

    Parameters
    ----------
    outputs : sequence of numpy.ndarray
        The local encoders' outputs, one ``(N, d_k)`` array per site, rows in the aligned order.
    settings : AutoencoderSettings

    Returns
    -------
    numpy.ndarray
        ``(N, settings.dim)`` float32 codes.
    """
    columns = np.concatenate([np.asarray(z, np.float64) for z in outputs], axis=1)
    spread = columns.std(axis=0)
    columns = (columns - columns.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    z = torch.as_tensor(columns.astype(np.float32))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        net = VectorAutoencoder(z.shape[1], settings.hidden, settings.dim)
    fit_full_batch(net, z, z, settings.epochs, settings.lr)
    with torch.no_grad():
        return net.encode(z).numpy().astype(np.float32)
