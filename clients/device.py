"""Compute-device choice for site trainers: CUDA with AMP when present, else CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["ComputeDevice", "select_device"]


@dataclass(frozen=True)
class ComputeDevice:
    """Where a trainer runs and which autocast precision it uses.

    Attributes
    ----------
    device : torch.device
        ``cuda`` when available, else ``cpu``.
    amp_dtype : torch.dtype | None
        Autocast dtype on CUDA (bfloat16 where supported, else float16);
        ``None`` on CPU (full float32).
    """

    device: torch.device
    amp_dtype: torch.dtype | None

    @property
    def needs_grad_scaler(self) -> bool:
        """Float16 autocast needs loss scaling; bfloat16 and float32 do not."""
        return self.amp_dtype is torch.float16


def select_device(prefer: str = "auto") -> ComputeDevice:
    """Pick the compute device.

    Parameters
    ----------
    prefer : str
        ``"auto"`` (CUDA if available), ``"cuda"`` or ``"cpu"``.

    Raises
    ------
    ValueError
        For an unknown choice, or ``"cuda"`` on a machine without CUDA.
    """
    if prefer not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {prefer!r}")
    if prefer == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    if prefer != "cpu" and torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return ComputeDevice(torch.device("cuda"), dtype)
    threads = int(os.environ.get("FEDMED_TORCH_THREADS", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    return ComputeDevice(torch.device("cpu"), None)
