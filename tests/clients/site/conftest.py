"""The site-round fixtures of the privacy tests: a tiny radiograph task, one thread, the CPU."""

from __future__ import annotations

import pytest
import torch

from clients.site.site_round import SiteTasks
from clients.training.trainer import select_device
from tests.clients.site_round_fixtures import TinyCxr


@pytest.fixture()
def tasks() -> SiteTasks:
    """The site's loaded tasks: :class:`TinyCxr` whatever the folder, on one CPU thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SiteTasks(lambda *args, **kwargs: TinyCxr(), select_device("cpu"))
    torch.set_num_threads(threads)
