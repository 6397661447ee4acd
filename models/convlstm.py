"""Convolutional LSTM classifier for 3D CT volumes (e.g. emphysema detection).

A CT volume is read as a *sequence of axial slices*: 2D convolutions extract
in-plane features from every slice, and convolutional LSTMs (ConvLSTM; Shi et
al., "Convolutional LSTM Network: A Machine Learning Approach for Precipitation
Nowcasting", NeurIPS 2015) integrate them through the stack, alternately
scanning the slices upwards and downwards. One label per volume is enough to
train it (weak, volume-level supervision). The architecture is the one of
Braman, Beymer & Dehghan, "Disease Detection in Weakly Annotated Volumetric
Medical Images using a Convolutional LSTM Network" (arXiv:1812.01087, 2018),
which the book chapter on federated learning for medical imaging trains
across hospitals for emphysema detection in chest CT.

ConvLSTM equations (Shi et al. 2015, eq. 3), with ``*`` a 2D convolution and
``o`` the Hadamard product::

    i_t = sigma(W_xi * X_t + W_hi * H_{t-1} + b_i)
    f_t = sigma(W_xf * X_t + W_hf * H_{t-1} + b_f)
    C_t = f_t o C_{t-1} + i_t o tanh(W_xc * X_t + W_hc * H_{t-1} + b_c)
    o_t = sigma(W_xo * X_t + W_ho * H_{t-1} + b_o)
    H_t = o_t o tanh(C_t)

Differences from eq. 3, as in the Keras ``ConvLSTM2D`` layer the chapter's
model was built with: no peephole terms ``W_c. o C`` (Shi et al. add them after
Graves 2013; they are usually dropped), and the recurrent activation ``sigma``
is the *hard* sigmoid ``clip(0.2 x + 0.5, 0, 1)`` (Keras 2 definition; note that
PyTorch's ``hardsigmoid`` is ``clip(x / 6 + 0.5, 0, 1)``, a different slope).
The forget-gate bias starts at ``forget_bias`` = 1 (Keras ``unit_forget_bias``;
Jozefowicz et al., ICML 2015): with the hard sigmoid an initial forget gate of
``0.2 b + 0.5`` = 0.7, so an untrained cell keeps ~3 % of what it saw ten slices
earlier; ``b = 2`` (0.9) trained no better on the synthetic emphysema data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.slice_layers import per_slice

__all__ = ["ASCENDING", "FORGET_BIAS", "DESCENDING", "hard_sigmoid", "ConvLSTMCell", "ConvLSTM",
           "ConvLSTMUnit", "ConvLSTMClassifier3D"]

ASCENDING = "ascending"
DESCENDING = "descending"
_DIRECTIONS = (ASCENDING, DESCENDING)
#: Initial forget-gate bias (pre-activation); see the module docstring.
FORGET_BIAS = 1.0


def hard_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Keras-style hard sigmoid ``clip(0.2 x + 0.5, 0, 1)``, elementwise, values in ``[0, 1]``.

    A piecewise-linear logistic: 0 for ``x <= -2.5``, 1 for ``x >= 2.5``, slope 0.2 in between.
    """
    return torch.clamp(0.2 * x + 0.5, min=0.0, max=1.0)


class ConvLSTMCell(nn.Module):
    """One ConvLSTM step (Shi et al. 2015, eq. 3, without peepholes).

    The four gate pre-activations are ``W_x * X_t + W_h * H_{t-1} + b`` in
    the order ``(i, f, c~, o)``. ``W_x * X_t`` is a separate convolution
    (:attr:`input_conv`) so that a layer can compute it for all time steps in
    one batched call; only ``W_h * H_{t-1}`` (:attr:`hidden_conv`) is recurrent.

    Parameters
    ----------
    in_channels : int
        Channels of the input ``X_t``.
    hidden_channels : int
        Channels (filters) of the hidden state ``H_t`` and cell ``C_t``.
    kernel_size : int, optional
        Odd square kernel of both convolutions ("same" padding). Default 3.
    forget_bias : float, optional
        Initial bias of the forget-gate pre-activation (the other biases start
        at 0). Default :data:`FORGET_BIAS`.

    Raises
    ------
    ValueError
        If a size is not positive or the kernel is even.
    """

    def __init__(
        self, in_channels: int, hidden_channels: int, kernel_size: int = 3, forget_bias: float = FORGET_BIAS
    ) -> None:
        super().__init__()
        if in_channels < 1 or hidden_channels < 1:
            raise ValueError(f"channels must be >= 1, got in={in_channels}, hidden={hidden_channels}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and >= 1, got {kernel_size}")
        self.in_channels = in_channels
        self.hidden_channels = hidden_channels
        padding = kernel_size // 2
        self.input_conv = nn.Conv2d(in_channels, 4 * hidden_channels, kernel_size, padding=padding, bias=True)
        self.hidden_conv = nn.Conv2d(hidden_channels, 4 * hidden_channels, kernel_size, padding=padding, bias=False)
        with torch.no_grad():
            self.input_conv.bias.zero_()
            self.input_conv.bias[hidden_channels : 2 * hidden_channels].fill_(forget_bias)

    def initial_state(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero ``(H_0, C_0)`` matching an input ``x`` of shape ``(B, C_in, H, W)``."""
        b, _, h, w = x.shape
        zeros = x.new_zeros(b, self.hidden_channels, h, w)
        return zeros, zeros.clone()

    def step(
        self, input_gates: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance one step from precomputed ``W_x * X_t + b``.

        Parameters
        ----------
        input_gates : torch.Tensor
            ``input_conv(X_t)``, shape ``(B, 4 * hidden, H, W)``.
        state : tuple of torch.Tensor or None
            ``(H_{t-1}, C_{t-1})``; ``None`` means zeros (the first step).

        Returns
        -------
        tuple of torch.Tensor
            ``(H_t, C_t)``, each ``(B, hidden, H, W)``.
        """
        if state is None:
            gates = input_gates
            c_prev = None
        else:
            h_prev, c_prev = state
            gates = input_gates + self.hidden_conv(h_prev)
        i, f, g, o = torch.chunk(gates, 4, dim=1)
        i, f, o = hard_sigmoid(i), hard_sigmoid(f), hard_sigmoid(o)
        c = i * torch.tanh(g) if c_prev is None else f * c_prev + i * torch.tanh(g)
        h = o * torch.tanh(c)
        return h, c

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``(H_t, C_t)`` from ``X_t`` of shape ``(B, C_in, H, W)`` and ``(H_{t-1}, C_{t-1})``."""
        return self.step(self.input_conv(x), state)


class ConvLSTM(nn.Module):
    """A ConvLSTM layer scanning a sequence of 2D maps in one direction.

    Parameters
    ----------
    in_channels : int
        Channels of each input map.
    hidden_channels : int
        Filters of the cell.
    direction : str, optional
        ``"ascending"`` scans ``t = 0, 1, ..., T-1`` (slice index order);
        ``"descending"`` scans ``t = T-1, ..., 0``. Default ascending.
    return_sequences : bool, optional
        Return all hidden states ``(B, T, hidden, H, W)`` or only the state
        after the last step of the scan ``(B, hidden, H, W)``. Default True.
    kernel_size : int, optional
        Odd kernel size. Default 3.
    forget_bias : float, optional
        Initial forget-gate bias of the cell. Default :data:`FORGET_BIAS`.

    Notes
    -----
    The returned sequence is always indexed by *slice*: ``out[:, t]`` is the
    hidden state produced when slice ``t`` was read, whatever the direction
    (as PyTorch's bidirectional RNNs do). So in a descending layer ``out[:, t]``
    summarises slices ``t..T-1`` and the next layer still receives the slices
    in anatomical order. (Keras ``go_backwards=True`` instead returns the
    outputs in scan order, i.e. reversed.) The state returned with
    ``return_sequences=False`` is the last one of the scan: ``H`` at slice
    ``T-1`` when ascending, at slice 0 when descending.
    ``fold_slices`` (as in :class:`ConvLSTMUnit`): see :func:`models.slice_layers.per_slice`; DP-SGD clears it.
    """

    fold_slices: bool = True

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        direction: str = ASCENDING,
        return_sequences: bool = True,
        kernel_size: int = 3,
        forget_bias: float = FORGET_BIAS,
    ) -> None:
        super().__init__()
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
        self.cell = ConvLSTMCell(in_channels, hidden_channels, kernel_size, forget_bias)
        self.direction = direction
        self.return_sequences = return_sequences

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scan ``x`` of shape ``(B, T, C_in, H, W)``; see the class docstring for the output."""
        if x.ndim != 5:
            raise ValueError(f"ConvLSTM expects (B, T, C, H, W), got shape {tuple(x.shape)}")
        t = x.shape[1]
        if t < 1:
            raise ValueError("ConvLSTM needs at least one time step (slice), got 0")
        # W_x * X_t + b for every step at once: one batched convolution (per slice under DP-SGD).
        input_gates = per_slice(self.cell.input_conv, x, self.fold_slices)
        # unbind, not input_gates[:, k]: one backward op instead of T full-size zero-filled gradients.
        per_step = input_gates.unbind(1)
        order = range(t) if self.direction == ASCENDING else range(t - 1, -1, -1)
        state: tuple[torch.Tensor, torch.Tensor] | None = None
        outputs: list[torch.Tensor] = [x.new_empty(0)] * t
        for k in order:
            state = self.cell.step(per_step[k], state)
            outputs[k] = state[0]
        if not self.return_sequences:
            return outputs[t - 1 if self.direction == ASCENDING else 0]
        return torch.stack(outputs, dim=1)


class ConvLSTMUnit(nn.Module):
    """One unit of the classifier: per-slice conv block, 2x2 max pooling, then a ConvLSTM.

    Every slice goes through ``[3x3 conv -> ReLU -> batch norm] x 2`` and a
    2x2 max pooling (Braman et al. 2018: "two 2D convolutional layers with
    ReLU activation, each followed by batch normalization"), with shared
    weights across slices; then a :class:`ConvLSTM` of the same width scans
    the slices.

    Parameters
    ----------
    in_channels : int
        Channels of each input slice.
    width : int
        Filters of both convolutions and of the ConvLSTM.
    direction : str
        ``"ascending"`` or ``"descending"`` scan.
    return_sequences : bool
        Passed to the :class:`ConvLSTM`.
    forget_bias : float, optional
        Initial forget-gate bias of the ConvLSTM. Default :data:`FORGET_BIAS`.
    """

    fold_slices: bool = True

    def __init__(
        self,
        in_channels: int,
        width: int,
        direction: str,
        return_sequences: bool,
        forget_bias: float = FORGET_BIAS,
    ) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"unit width must be >= 1, got {width}")
        self.slice_block = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.BatchNorm2d(width),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.BatchNorm2d(width),
            nn.MaxPool2d(2),
        )
        self.lstm = ConvLSTM(
            width, width, direction=direction, return_sequences=return_sequences, forget_bias=forget_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, C, H, W)`` -> ``(B, T, width, H/2, W/2)`` or, for the last unit, ``(B, width, H/2, W/2)``."""
        return self.lstm(per_slice(self.slice_block, x, self.fold_slices))


class ConvLSTMClassifier3D(nn.Module):
    """Binary volume classifier: four ConvLSTM units, global pooling, one logit.

    Architecture (Braman et al. 2018, as used in the chapter): units of widths
    ``(32, 32, 64, 64)`` scanning the slices ascending, descending, ascending,
    descending; every unit passes its full sequence to the next, the last
    returns its final hidden state, which summarises the whole volume. Global
    average pooling over that state and a fully connected layer give one logit
    ``z``; the probability of disease is ``sigmoid(z)``.

    ``forward`` returns the **logit**: train with
    ``torch.nn.BCEWithLogitsLoss`` (which applies the sigmoid, numerically
    stably), and use :meth:`predict_proba` for probabilities.

    Parameters
    ----------
    in_channels : int, optional
        Channels of the input volume. Default 1 (CT).
    widths : Sequence[int], optional
        Filters of each unit. Default ``(32, 32, 64, 64)``; smaller widths such
        as ``(8, 8, 16, 16)`` are meant for tests and CPU demos.
    directions : Sequence[str], optional
        Scan direction of each unit, same length as ``widths``. Default
        alternating, starting ascending.
    forget_bias : float, optional
        Initial forget-gate bias of every ConvLSTM. Default :data:`FORGET_BIAS`.

    Notes
    -----
    Input ``(B, C, D, H, W)`` with D slices (the scan axis). Each unit halves H
    and W, so they must be at least ``2 ** len(widths)``. Batch norm makes the
    output depend on the batch in training mode; call ``eval()`` for inference.
    """

    def __init__(
        self,
        in_channels: int = 1,
        widths: Sequence[int] = (32, 32, 64, 64),
        directions: Sequence[str] | None = None,
        forget_bias: float = FORGET_BIAS,
    ) -> None:
        super().__init__()
        widths = tuple(int(w) for w in widths)
        if not widths or min(widths) < 1:
            raise ValueError(f"widths must be a non-empty sequence of positive ints, got {widths}")
        if in_channels < 1:
            raise ValueError(f"in_channels must be >= 1, got {in_channels}")
        if directions is None:
            directions = tuple(ASCENDING if k % 2 == 0 else DESCENDING for k in range(len(widths)))
        directions = tuple(directions)
        if len(directions) != len(widths):
            raise ValueError(f"need one direction per unit: {len(widths)} widths, {len(directions)} directions")
        for d in directions:
            if d not in _DIRECTIONS:
                raise ValueError(f"direction must be one of {_DIRECTIONS}, got {d!r}")
        self.widths = widths
        self.directions = directions
        units = []
        channels = in_channels
        for k, (width, direction) in enumerate(zip(widths, directions)):
            last = k == len(widths) - 1
            units.append(ConvLSTMUnit(channels, width, direction, return_sequences=not last, forget_bias=forget_bias))
            channels = width
        self.units = nn.ModuleList(units)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, 1)

    @property
    def min_in_plane_size(self) -> int:
        """Smallest H and W the network accepts (one 2x2 pooling per unit)."""
        return 2 ** len(self.units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of volumes.

        Parameters
        ----------
        x : torch.Tensor
            ``(B, C, D, H, W)`` volumes, D slices in ascending order.

        Returns
        -------
        torch.Tensor
            ``(B, 1)`` logits (apply a sigmoid for probabilities), the layout of
            a one-label classifier: targets are ``(B, 1)`` float vectors, as in
            :mod:`clients.training.classification`.

        Raises
        ------
        ValueError
            On a wrong rank, channel count or too small in-plane size.
        """
        if x.ndim != 5:
            raise ValueError(f"expected (B, C, D, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != self.units[0].slice_block[0].in_channels:
            raise ValueError(f"expected {self.units[0].slice_block[0].in_channels} channel(s), got {x.shape[1]}")
        if min(x.shape[-2:]) < self.min_in_plane_size:
            raise ValueError(f"H and W must be >= {self.min_in_plane_size}, got {tuple(x.shape[-2:])}")
        y = x.transpose(1, 2)  # (B, D, C, H, W): slices are the sequence
        for unit in self.units:
            y = unit(y)
        return self.fc(self.pool(y).flatten(1))

    @torch.no_grad()
    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities ``sigmoid(forward(x))``, shape ``(B, 1)``, without gradients.

        Runs in ``eval()`` mode (batch-norm running statistics) and restores
        the previous mode afterwards.
        """
        was_training = self.training
        self.eval()
        try:
            return torch.sigmoid(self.forward(x))
        finally:
            self.train(was_training)
