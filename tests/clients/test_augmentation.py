"""Site-side augmentation of the training images: seeded, training only, nothing leaves changed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from app.config.run_config import RunConfig
from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.site_round import SiteTasks, answer
from clients.training.augmentation import AugmentedImages, augmented
from clients.training.augmentation_levels import AUGMENTATIONS
from clients.training.classification import LabelledTensors, balanced_loader
from clients.training.trainer import select_device
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from tests.clients.site_round_fixtures import SIZES, TinyCxr, packed_global, run_settings, site

CPU = select_device("cpu")


def _images(shape: tuple[int, ...], count: int = 4) -> LabelledTensors:
    rng = np.random.default_rng(0)
    return LabelledTensors([rng.uniform(size=shape).astype(np.float32) for _ in range(count)],
                           [np.array([i % 2], np.float32) for i in range(count)])


def _draw(dataset, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [dataset[i][0] for i in range(len(dataset))]


def test_none_trains_on_the_images_as_loaded() -> None:
    data = _images((8, 8))
    assert augmented(data, "none") is data


def test_light_moves_pixels_keeps_shape_dtype_and_labels_and_is_seeded() -> None:
    data = _images((16, 16), count=8)
    light = augmented(data, "light")
    first, again, other = _draw(light, 3), _draw(light, 3), _draw(light, 4)
    for i, image in enumerate(first):
        assert image.shape == data[i][0].shape == (1, 16, 16) and image.dtype == torch.float32
        assert type(image) is torch.Tensor  # no MONAI MetaTensor reaches the loop
        assert torch.equal(light[i][1], data[i][1])
        assert torch.equal(image, again[i])  # the same seed draws the same transforms
    assert any(not torch.equal(a, b) for a, b in zip(first, other))
    assert any(not torch.allclose(a, data[i][0]) for i, a in enumerate(first))


def test_a_volume_augments_in_3d_and_a_table_row_is_refused_naming_the_key() -> None:
    volume = augmented(_images((6, 8, 8), count=2), "strong")
    torch.manual_seed(0)
    assert volume[0][0].shape == (1, 6, 8, 8)
    with pytest.raises(ConfigError, match="'augmentation' needs 2D or 3D images"):
        AugmentedImages(_images((5,)), AUGMENTATIONS.get("light"))
    with pytest.raises(ConfigError, match="'augmentation' must be one of"):
        augmented(_images((8, 8)), "heavy")


def test_the_balanced_loader_augments_the_drawn_images_only() -> None:
    data = _images((16, 16), count=8)
    plain = balanced_loader(data, 4, 0.5, seed=1, compute=CPU)
    light = balanced_loader(data, 4, 0.5, seed=1, compute=CPU, augmentation="light")
    torch.manual_seed(0)
    (x, y), = [next(iter(plain))]
    torch.manual_seed(0)
    (xa, ya), = [next(iter(light))]
    assert torch.equal(y, ya) and x.shape == xa.shape and not torch.equal(x, xa)


class _AugmentedTinyCxr(TinyCxr):
    def __init__(self) -> None:
        super().__init__()
        self.settings = dataclasses.replace(SIZES, augmentation="strong")


def _reply(tmp_path, task_class, kind: str, arrays: dict[str, np.ndarray]):
    tasks = SiteTasks(lambda *args, **kwargs: task_class(), CPU)
    instruction = Instruction.parse(kind, {keys.SERVER_ROUND: 1, keys.LOCAL_STEPS: 5},
                                    run_settings(), "run-1")
    return answer(instruction, arrays, site(tmp_path), run_settings(), tasks)


def test_what_leaves_the_site_is_the_same_with_and_without_augmentation(
        tmp_path, one_torch_thread) -> None:
    arrays = packed_global()
    plain = _reply(tmp_path / "plain", TinyCxr, "train", arrays)
    again = _reply(tmp_path / "again", TinyCxr, "train", arrays)
    strong = _reply(tmp_path / "strong", _AugmentedTinyCxr, "train", arrays)
    assert sorted(plain.metrics) == sorted(strong.metrics)
    assert {k: (v.shape, v.dtype) for k, v in plain.update.items()} == {
        k: (v.shape, v.dtype) for k, v in strong.update.items()}
    assert all(np.array_equal(plain.update[k], again.update[k]) for k in plain.update)
    assert any(not np.array_equal(plain.update[k], strong.update[k]) for k in plain.update)
    # evaluation never augments: the same model scores the same
    assert (_reply(tmp_path / "ep", TinyCxr, "evaluate", arrays).metrics
            == _reply(tmp_path / "es", _AugmentedTinyCxr, "evaluate", arrays).metrics)


def test_the_run_config_declares_the_key_and_refuses_it_where_it_cannot_apply() -> None:
    assert RunConfig.from_mapping({}).task_sizes.augmentation == "none"
    config = RunConfig.from_mapping({"task": "cxr-cls", "augmentation": "light"})
    assert config.task_sizes.augmentation == "light"
    assert config.as_params()["augmentation"] == "light"
    with pytest.raises(ConfigError, match="'augmentation' must be 'none' for task 'tabular-cls'"):
        RunConfig.from_mapping({"task": "tabular-cls", "augmentation": "light"})
    with pytest.raises(ConfigError, match="'augmentation' must be one of"):
        RunConfig.from_mapping({"task": "cxr-cls", "augmentation": "heavy"})
    site_run = SiteRunSettings.from_run_config({"augmentation": "strong"})
    assert site_run.sizes.augmentation == "strong"
    with pytest.raises(ConfigError, match="'augmentation' must be one of"):
        SiteRunSettings.from_run_config({"augmentation": "heavy"})
