"""How batches reach the device: pinned memory, loader workers, channels-last, env settings.

The CUDA paths are checked by construction on a CPU-only machine (a CUDA
``ComputeDevice`` is only described, never used); the layouts and workers run
for real on CPU, which supports both.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clients.training.trainer import WORKERS_ENV, ComputeDevice, select_device
from clients.pe_seg.task import PESegTask
from clients.training.site_task import TaskSettings

SETTINGS = TaskSettings(image_size=32, slab_slices=9, batch_size=4)
CPU = torch.device("cpu")


def test_cuda_devices_pin_memory_and_use_workers_for_training_only():
    cuda = ComputeDevice(torch.device("cuda"), torch.bfloat16, channels_last=True,
                         loader_workers=3)
    assert cuda.loader_kwargs() == {"pin_memory": True, "num_workers": 3, "prefetch_factor": 4}
    assert cuda.loader_kwargs(workers=False) == {"pin_memory": True}
    assert not cuda.needs_grad_scaler
    assert ComputeDevice(torch.device("cuda"), torch.float16).needs_grad_scaler


def test_cpu_device_is_plain_and_reads_the_worker_setting(monkeypatch):
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    cpu = select_device("cpu")
    assert cpu.loader_kwargs() == {"pin_memory": False}
    assert not cpu.channels_last and cpu.amp_dtype is None
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert select_device("cpu").loader_kwargs()["num_workers"] == 2
    monkeypatch.setenv(WORKERS_ENV, "two")
    with pytest.raises(ValueError, match="FEDMED_LOADER_WORKERS must be an integer"):
        select_device("cpu")
    with pytest.raises(ValueError, match="loader_workers must be >= 0"):
        ComputeDevice(CPU, None, loader_workers=-1)


def _train(site: Path, compute: ComputeDevice) -> dict[str, torch.Tensor]:
    task = PESegTask(site, SETTINGS)
    torch.manual_seed(0)
    model = task.build_model()
    task.train(model, steps=3, lr=0.01, momentum=0.9, compute=compute, seed=5, optimizer="sgd")
    return model.state_dict()


def test_channels_last_training_matches_and_returns_a_contiguous_model(small_site: Path):
    plain = _train(small_site, ComputeDevice(CPU, None))
    nhwc = _train(small_site, ComputeDevice(CPU, None, channels_last=True))
    conv_weights = [name for name, value in nhwc.items() if value.dim() == 4]
    assert conv_weights
    for name, value in nhwc.items():
        assert value.is_contiguous(), name  # what the client reads back and sends
        torch.testing.assert_close(value, plain[name], rtol=1e-3, atol=1e-4)


def test_loader_workers_are_reproducible(small_site: Path):
    workers = ComputeDevice(CPU, None, loader_workers=2)
    first, second = _train(small_site, workers), _train(small_site, workers)
    for name, value in first.items():
        assert torch.equal(value, second[name]), name
