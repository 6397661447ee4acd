"""The PSI over real Flower messages: the in-process grid, the real ClientApp, three sites.

Three radiograph sites hold overlapping rows of one synthetic site folder; their
image ids are the ids aligned (tests/clients/test_psi.py tests the protocol itself).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.config.run_config import RunConfig
from app.engine.federation import full_run_config
from app.engine.grid import InProcessGrid
from app.engine.virtual_site import VirtualSite
from app.vertical.federation import VerticalContext
from app.vertical.messages import VerticalError
from app.vertical.psi_flow import align
from clients.vertical.alignment import ALIGNMENT_FILE
from clients.vertical.psi_secret import SIMULATION_SECRET, create_secret
from tests.clients.small_sites import small_cxr_site

pytestmark = pytest.mark.usefixtures("server_identity")

#: The rows of the source folder's ``images.csv`` each site keeps: 24 (rows 4..27) shared.
KEPT = (range(0, 28), range(4, 34), range(2, 34))


def site_folders(tmp_path: Path) -> list[Path]:
    """Three copies of one 34-image site folder, each keeping its rows of :data:`KEPT`."""
    source = small_cxr_site(tmp_path / "source", 30, seed=5, num_test=4)
    header, *rows = (source / "images.csv").read_text().splitlines()
    folders = []
    for number, kept in enumerate(KEPT):
        folder = shutil.copytree(source, tmp_path / f"site-{number}")
        (folder / "images.csv").write_text("\n".join([header, *(rows[i] for i in kept)]) + "\n")
        folders.append(folder)
    return folders


def vertical_context(tmp_path: Path, policies: tuple[Path | None, ...] = (None, None, None)
                     ) -> VerticalContext:
    """The coordinator's context over the three sites of :func:`site_folders` (``policies``)."""
    run_config = full_run_config({"federation.kind": "vertical", "task": "cxr-cls",
                                  "image-size": 32})
    sites = [VirtualSite.folder(folder, site_name=f"hospital-{number}",
                                state_dir=tmp_path / f"state-{number}", policy_path=policy)
             for number, (folder, policy) in enumerate(zip(site_folders(tmp_path), policies))]
    grid = InProcessGrid(sites, run_config, run_id=31)
    config = RunConfig.from_mapping(run_config)
    return VerticalContext(grid, sorted(grid.get_node_ids()), config, config.vertical_options,
                           "fed-psi")


def test_three_sites_align_over_flower_messages(tmp_path: Path) -> None:
    ctx = vertical_context(tmp_path)
    assert align(ctx) == 24
    saved = [json.loads(next((tmp_path / f"state-{n}").rglob(ALIGNMENT_FILE)).read_text())["ids"]
             for n in range(3)]
    assert saved[0] == saved[1] == saved[2]
    assert sorted(saved[0]) == [f"img-{i:03d}" for i in range(4, 28)]
    # 3 requests, 2 forward steps, nm's serve, 2 last finishes
    assert ctx.traffic.by_stage["psi-request"]["messages"] == 3
    assert ctx.traffic.by_stage["psi-step"]["messages"] == 5


def secret_policy(tmp_path: Path, rules: str = "") -> Path:
    """A policy file allowing vertical federations under the simulated sites' PSI secret."""
    secret = tmp_path / SIMULATION_SECRET  # beside the site folders: the permissive sites' one
    create_secret(secret)
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[vertical]\nallowed = true\npsi-secret = "{secret}"\n{rules}')
    return policy


def test_a_site_whose_policy_names_no_psi_secret_is_refused(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[vertical]\nallowed = true\n")
    ctx = vertical_context(tmp_path, (None, None, policy))
    with pytest.raises(VerticalError, match="hospital-2.*policy rule vertical.psi-secret"):
        align(ctx)


def test_a_site_whose_minimum_is_not_met_stops_the_alignment(tmp_path: Path) -> None:
    policy = secret_policy(tmp_path, "min-intersection = 25\n")
    ctx = vertical_context(tmp_path, (None, None, policy))
    with pytest.raises(VerticalError, match="hospital-2.*policy rule vertical.min-intersection"):
        align(ctx)
