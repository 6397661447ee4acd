"""The demo's synthetic hospitals (`make data`) hold enough val and test studies for the
shipped site policy to release their metrics (``min-val-items``)."""

from __future__ import annotations

import dataclasses
import importlib
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from clients.registry import synthetic_module

ROOT = Path(__file__).resolve().parents[2]
#: Only the study counts matter here: the images are shrunk to keep the test cheap.
SMALL = {"pe-seg": {"num_slices": (9, 9)}, "ct3d-cls": {"image_size": 16, "num_slices": (4, 5),
                      "slice_spacing_mm": (20.0, 24.0)},
         "cxr-cls": {}}
IMAGE_SIZE = {"pe-seg": 16, "cxr-cls": 32, "ct3d-cls": None}


@pytest.mark.parametrize("task", ["pe-seg", "cxr-cls", "ct3d-cls"])
@pytest.mark.parametrize("sites", [2, 3])  # the deployment walkthrough's and `make data`'s
def test_every_demo_site_has_enough_val_and_test_items_for_the_shipped_policy(tmp_path, task,
                                                                                sites) -> None:
    shipped = tomllib.loads((ROOT / "configs" / "site-policy.toml").read_text())["min-val-items"]
    synthetic = synthetic_module(task)
    manifest = importlib.import_module(synthetic.__name__.replace("synthetic", "manifest"))
    seed = 0  # `make data`'s SEED
    for profile in synthetic.site_profiles(sites, seed):
        site = tmp_path / profile.name
        small = dataclasses.replace(profile, **SMALL[task])
        if IMAGE_SIZE[task] is None:
            synthetic.generate_site(site, small, seed)
        else:
            synthetic.generate_site(site, small, seed, IMAGE_SIZE[task])
        counts = Counter(row.split for row in manifest.read_manifest(site))
        assert counts["val"] >= shipped and counts["test"] >= shipped, (profile.name, counts)
