"""One site-name rule and one way to name a synthetic hospital (issue #45, item 5).

Found: ``hospital-NN`` was written out 16 times although ``hospital_name`` exists, and the
server's reply intake, the node config and the deployment's keys had three name rules.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.config.site_config import SiteConfig, SiteConfigError
from app.tooling.certs import CertError, check_site_name
from strategies.rounds.site_book import site_name_problem

ROOT = Path(__file__).resolve().parents[1]
#: The plain-Flower peer app of bench/peer_flower_app imports nothing of the product.
PEER = ROOT / "bench" / "peer_flower_app"
WRITTEN_OUT = re.compile(r"""f["']hospital-\{""")


def test_hospital_names_come_from_hospital_name_only():
    found = [f"{path.relative_to(ROOT)}:{number}"
             for folder in ("app", "clients", "strategies", "models", "bench")
             for path in (ROOT / folder).rglob("*.py") if PEER not in path.parents
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if WRITTEN_OUT.search(line) and path.name != "federation.py"]
    assert not found, found


@pytest.mark.parametrize("name", ["hospital-a", "site_7", "a.b", "H" * 64])
def test_a_good_name_passes_every_door(name, tmp_path):
    assert site_name_problem(name) is None
    assert check_site_name(name) == name
    assert SiteConfig.from_node_config({"data-path": str(tmp_path), "site-name": name},
                                       "").name == name


@pytest.mark.parametrize("name", ["a/b", "..", "-x", ".hidden", "a b", "H" * 65, ""])
def test_a_bad_name_is_refused_at_every_door(name, tmp_path):
    assert site_name_problem(name) is not None
    with pytest.raises(CertError, match="site name rule"):
        check_site_name(name)
    with pytest.raises(SiteConfigError, match="site name rule"):
        SiteConfig.from_node_config({"data-path": str(tmp_path), "site-name": name}, "")
