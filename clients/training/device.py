"""Compute-device choice for site trainers: CUDA with AMP when present, else CPU.

Besides the device and the autocast precision, a :class:`ComputeDevice` holds the
host-side settings that keep a GPU fed: pinned host memory with non-blocking
copies, channels-last activations for 2D convolutions (the layout cuDNN's
tensor-core kernels use under AMP) and DataLoader worker processes. On CPU all
three are off and only the thread count (``FEDMED_TORCH_THREADS``) applies.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ComputeDevice", "select_device", "THREADS_ENV", "WORKERS_ENV"]

#: Environment variable: torch intra-op threads on CPU (unset or 0: torch's default).
THREADS_ENV = "FEDMED_TORCH_THREADS"
#: Environment variable: DataLoader worker processes (unset: 0 on CPU, min(4, cores // 2) on CUDA).
WORKERS_ENV = "FEDMED_LOADER_WORKERS"


@dataclass(frozen=True)
class ComputeDevice:
    """Where a trainer runs, in which precision, and how its batches are fed."""

    #: ``cuda`` when available, else ``cpu``.
    device: torch.device
    #: Autocast dtype on CUDA (bfloat16 where supported, else float16); ``None`` on CPU (full
    #: float32).
    amp_dtype: torch.dtype | None
    #: Run 2D convolutional models with NHWC (``torch.channels_last``) weights and inputs; on by
    #: default on CUDA.
    channels_last: bool = False
    #: DataLoader worker processes for training batches (0: load in the training process).
    loader_workers: int = 0

    def __post_init__(self) -> None:
        if self.loader_workers < 0:
            raise ValueError(f"loader_workers must be >= 0, got {self.loader_workers}")

    @property
    def needs_grad_scaler(self) -> bool:
        """Float16 autocast needs loss scaling; bfloat16 and float32 do not."""
        return self.amp_dtype is torch.float16

    @property
    def pin_memory(self) -> bool:
        """Page-locked host batches, so host-to-GPU copies can be asynchronous."""
        return self.device.type == "cuda"

    def autocast(self) -> AbstractContextManager:
        """The autocast context of this device (a no-op in full precision)."""
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def loader_kwargs(self, workers: bool = True) -> dict[str, Any]:
        """DataLoader keyword arguments: pinned memory, and workers when ``workers``.

        Evaluation loaders pass ``workers=False``: they run once per round over
        in-memory data, where starting worker processes costs more than it saves.
        """
        kwargs: dict[str, Any] = {"pin_memory": self.pin_memory}
        if workers and self.loader_workers > 0:
            kwargs.update(num_workers=self.loader_workers, prefetch_factor=4)
        return kwargs


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    return number


def select_device(prefer: str = "auto") -> ComputeDevice:
    """Pick the compute device and its feeding settings.

    Parameters
    ----------
    prefer : str
        ``"auto"`` (CUDA if available), ``"cuda"`` or ``"cpu"``.

    Raises
    ------
    ValueError
        For an unknown choice, ``"cuda"`` on a machine without CUDA, or a
        malformed ``FEDMED_TORCH_THREADS`` / ``FEDMED_LOADER_WORKERS``.
    """
    if prefer not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {prefer!r}")
    if prefer == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    workers = _env_int(WORKERS_ENV)
    if prefer != "cpu" and torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if workers is None:
            workers = min(4, (os.cpu_count() or 1) // 2)
        return ComputeDevice(torch.device("cuda"), dtype, channels_last=True,
                             loader_workers=workers)
    threads = _env_int(THREADS_ENV)
    if threads:
        torch.set_num_threads(threads)
    return ComputeDevice(torch.device("cpu"), None, loader_workers=workers or 0)
