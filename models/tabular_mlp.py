"""A small multilayer perceptron for one table row (the ``tabular-cls`` task).

``Flatten - (Linear - ReLU - Dropout) x 2 - Linear``: two hidden layers of
``width`` units and one final ``nn.Linear`` to the logits. The final layer is
always the network's last module (``model[-1]``): pvFed (Nishikawa et al.,
IEEJ 2024) replaces it with its redefined output layer on ``[global vector,
own features]`` and keeps the rest as the frozen feature extractor
(``model[:-1]``, whose output is the ``width``-long representation).
No normalisation layer: FedAvg of the ``state_dict`` is exact and DP-SGD needs
no change of the network.
"""

from __future__ import annotations

from torch import nn

__all__ = ["make_tabular_mlp"]


def make_tabular_mlp(inputs: int, num_labels: int = 1, width: int = 32,
                     dropout: float = 0.1) -> nn.Sequential:
    """The MLP of ``inputs`` values per row and ``num_labels`` logits.

    Parameters
    ----------
    inputs : int
        Length of one row's input vector (``(N, inputs)``; a ``(N, 1, inputs)`` batch is
        flattened first).
    num_labels : int, optional
        Logits (one sigmoid each).
    width : int, optional
        Units of each of the two hidden layers (the representation length).
    dropout : float, optional
        Dropout probability after each hidden layer.

    Raises
    ------
    ValueError
        If ``inputs``, ``num_labels`` or ``width`` is below 1, or ``dropout`` is outside [0, 1).
    """
    if min(inputs, num_labels, width) < 1 or not 0.0 <= dropout < 1.0:
        raise ValueError(f"make_tabular_mlp needs inputs, num_labels, width >= 1 and dropout in "
                         f"[0, 1); got {inputs}, {num_labels}, {width}, {dropout}")
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(inputs, width), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(width, num_labels),
    )
