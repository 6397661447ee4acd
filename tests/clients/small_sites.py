"""Small synthetic sites the tests write: a few 32-pixel radiographs in a site folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from clients.cxr_cls.synthetic import generate_site, site_profiles


def small_cxr_site(folder: Path, num_images: int, seed: int, num_test: int = 0) -> Path:
    """Write a synthetic radiograph site of ``num_images`` 32-px images (train and val) at ``folder``.

    The first profile of the seed-0 federation with ``num_images`` images, hospital seed
    ``seed``, and ``num_test`` more images in split ``test``. Returns ``folder``.
    """
    profile = dataclasses.replace(site_profiles(1, 0)[0], num_images=num_images)
    return generate_site(folder, profile, seed=seed, image_size=32, num_test=num_test)
