"""Which key and roster a site's SecAgg+ round signs and checks with (issue #46, the PKI).

A policy file must name both (unsigned keys can be substituted); the files may come from
the hospital's runtime (its sandboxed worker cannot read a 0600 key itself); simulated
sites share one roster beside their data; ``app.tooling.secagg_keys`` makes the files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from app.config.site_config import SiteConfig, SiteConfigError, encode_policy_files
from app.site_runtime.worker_view import policy_files, worker_context
from app.tooling import secagg_keys
from clients.site.policy import PolicyRefusal, SecAggRules, SitePolicy
from clients.site.secure_identity import SIMULATION_PKI, site_identity
from clients.site.site import Site
from strategies.wire.secure_aggregation.signing import load_roster, roster_fingerprint
from tests.make_dry_run import make_n


def _keygen(site: str, key: Path) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert secagg_keys.main(["keygen", "--site", site, "--out", str(key)]) == 0
    return printed.getvalue().split()[-1]


def _site(tmp_path: Path, name: str = "hospital-a", **rules) -> Site:
    policy = dataclasses.replace(SitePolicy.permissive(),
                                 secure_aggregation=SecAggRules(required=True, **rules))
    return Site(name, tmp_path / "data" / name, tmp_path / "state", policy)


@pytest.fixture()
def pki(tmp_path):
    roster = tmp_path / "pki" / "roster.json"
    keys = {}
    for site in ("hospital-a", "hospital-b"):
        keys[site] = tmp_path / "pki" / f"{site}.key"
        public = _keygen(site, keys[site])
        assert secagg_keys.main(["add", "--roster", str(roster), "--site", site,
                                 "--public", public]) == 0
    return roster, keys


def test_a_policy_file_without_the_pki_refuses_secagg(tmp_path, pki):
    roster, keys = pki
    with pytest.raises(PolicyRefusal, match="secure-aggregation.roster"):
        site_identity(_site(tmp_path))
    with pytest.raises(PolicyRefusal, match="secure-aggregation.signing-key"):
        site_identity(_site(tmp_path, roster=str(roster)))
    with pytest.raises(PolicyRefusal, match="secure-aggregation.roster"):  # b's key, a's name
        site_identity(_site(tmp_path, roster=str(roster), signing_key=str(keys["hospital-b"])))
    with pytest.raises(PolicyRefusal, match="secure-aggregation.signing-key"):
        site_identity(_site(tmp_path, roster=str(roster),
                            signing_key=str(tmp_path / "missing.key")))
    identity = site_identity(_site(tmp_path, roster=str(roster),
                                   signing_key=str(keys["hospital-a"])))
    assert identity.name == "hospital-a" and sorted(identity.roster) == ["hospital-a",
                                                                         "hospital-b"]


def test_the_runtime_hands_its_worker_the_files_the_policy_names(tmp_path, pki):
    roster, keys = pki
    site = _site(tmp_path, roster=str(roster), signing_key=str(keys["hospital-a"]))
    files = policy_files(site.policy)
    assert set(files) == {str(roster), str(keys["hospital-a"])}
    context = Context(run_id=1, node_id=1, node_config={"data-path": str(site.data_path)},
                      state=RecordDict(), run_config={})
    worker = worker_context(context, tmp_path / "state", tmp_path / "copy.toml", files)
    config = SiteConfig.from_node_config(worker.node_config, data_root="")
    assert dict(config.policy_files) == files
    keys["hospital-a"].unlink()  # what the sandboxed worker cannot read
    handed = dataclasses.replace(site, policy_files=config.policy_files)
    assert site_identity(handed).name == "hospital-a"
    with pytest.raises(PolicyRefusal, match="secure-aggregation.signing-key"):
        site_identity(site)
    with pytest.raises(SiteConfigError, match="policy-files"):
        SiteConfig.from_node_config({"data-path": "/abs", "policy-files": "{not json"}, "")
    assert encode_policy_files({}) == "{}"


def test_simulated_sites_share_one_roster_beside_their_data(tmp_path):
    sites = [Site(f"hospital-0{i}", tmp_path / "data" / f"hospital-0{i}", tmp_path / f"s{i}",
                  SitePolicy.permissive()) for i in range(3)]
    for site in sites:
        site_identity(site)
    again = site_identity(sites[0])  # the key is made once and kept
    roster = load_roster(tmp_path / "data" / SIMULATION_PKI / "roster.json")
    assert sorted(roster) == [s.name for s in sites] == sorted(again.roster)
    assert (tmp_path / "data" / SIMULATION_PKI / "hospital-00.key").stat().st_mode & 0o777 \
        == 0o600


def test_the_roster_tooling_refuses_a_changed_key_and_prints_the_fingerprint(tmp_path, pki,
                                                                             capsys):
    roster, keys = pki
    other = _keygen("hospital-a", tmp_path / "other.key")
    capsys.readouterr()
    assert secagg_keys.main(["add", "--roster", str(roster), "--site", "hospital-a",
                             "--public", other]) == 2
    assert "another key (--replace" in capsys.readouterr().err
    assert secagg_keys.main(["add", "--roster", str(roster), "--site", "hospital-c",
                             "--public", "bm90IGEga2V5"]) == 2
    assert sorted(load_roster(roster)) == ["hospital-a", "hospital-b"]  # left as it was
    assert secagg_keys.main(["list", "--roster", str(roster)]) == 0
    assert roster_fingerprint(load_roster(roster)) in capsys.readouterr().out
    assert secagg_keys.main(["keygen", "--site", "hospital-a",
                             "--out", str(keys["hospital-a"])]) == 0  # kept, not overwritten
    assert "left as it is" in capsys.readouterr().err


def test_the_make_targets_call_the_tooling():
    assert "app.tooling.secagg_keys keygen --site hospital-a --out /srv/k.key" in make_n(
        "secagg-key", "SITE=hospital-a", "KEY=/srv/k.key")
    added = make_n("secagg-roster-add", "SECAGG_ROSTER=/srv/r.json", "SITE=hospital-a",
                    "PUBLIC=abc=")
    assert "add --roster /srv/r.json --site hospital-a" in added and "--replace" not in added
    assert "--replace" in make_n("secagg-roster-add", "SECAGG_ROSTER=/srv/r.json",
                                  "SITE=hospital-a", "PUBLIC=abc=", "REPLACE=1")
    assert "list --roster /srv/r.json" in make_n("secagg-roster-list",
                                                  "SECAGG_ROSTER=/srv/r.json")
