"""A SuperNode's site is built once: node_config and policy read once per process (#45).

Found: the ClientApp resolved the site on every message (``SiteConfig.from_node_config``,
``_policy_path``, the policy file read and parsed, ``hospital_name`` in simulation), six
times in a three-site round, although a SuperNode's node_config is fixed for its process.
Now a node_config is resolved once and its policy read once, again only when the policy
file's path, mtime or size changed; what raises is not kept (a bad node_config or a
missing policy is refused on every message that meets it).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import Context, RecordDict

from app import client_app
from app.config.site_config import SiteConfig
from clients.site import policy as site_policy
from tests.app.site_messages import instruction

pytestmark = pytest.mark.usefixtures("site_identity")


@pytest.fixture()
def seen(monkeypatch) -> list:
    """The site each message's round ran at (the round itself replaced); memo cleared."""
    client_app._site_config.cache_clear()
    client_app._site_of.cache_clear()
    sites: list = []

    def answer(instruction, arrays, site, run, tasks):
        sites.append(site)
        return SimpleNamespace(metrics={}, site={}, update=None, secagg=None)

    monkeypatch.setattr(client_app, "answer", answer)
    yield sites
    client_app._site_config.cache_clear()
    client_app._site_of.cache_clear()


@pytest.fixture()
def calls(monkeypatch) -> dict[str, int]:
    """How often the node_config is resolved and a policy file read."""
    counts = {"node": 0, "policy": 0}
    resolve, read = SiteConfig.from_node_config.__func__, site_policy.load_policy

    def from_node_config(cls, *args, **kwargs):
        counts["node"] += 1
        return resolve(cls, *args, **kwargs)

    def load_policy(path):
        counts["policy"] += 1
        return read(path)

    monkeypatch.setattr(SiteConfig, "from_node_config", classmethod(from_node_config))
    monkeypatch.setattr("app.config.site_config.load_policy", load_policy)
    return counts


def _context(node_config: dict, run_config: dict | None = None) -> Context:
    return Context(run_id=42, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config=run_config or {})


def _policy(path: Path, min_batch_size: int) -> Path:
    path.write_text(f"min-batch-size = {min_batch_size}\n")
    return path


def test_two_messages_of_one_node_resolve_it_and_read_its_policy_once(tmp_path, seen, calls):
    policy = _policy(tmp_path / "policy.toml", 4)
    context = _context({"data-path": str(tmp_path), "site-name": "hospital-a",
                        "policy-path": str(policy)})
    for kind in ("train", "evaluate"):
        assert not client_app._round(kind, instruction(kind), context).has_error()
    assert calls == {"node": 1, "policy": 1}
    assert seen[0] is seen[1] and seen[0].policy.min_batch_size == 4


def test_simulated_sites_are_resolved_once_each(tmp_path, seen, calls):
    contexts = [_context({"partition-id": i}, {"data-root": str(tmp_path)}) for i in range(3)]
    for _ in range(2):
        for context in contexts:
            client_app._round("train", instruction("train"), context)
    assert calls["node"] == 3 and len({site.name for site in seen}) == 3


def test_an_edited_policy_file_is_read_again(tmp_path, seen, calls):
    policy = _policy(tmp_path / "policy.toml", 4)
    context = _context({"data-path": str(tmp_path), "policy-path": str(policy)})
    client_app._round("train", instruction("train"), context)
    stat = policy.stat()
    _policy(policy, 16)  # one more digit: another size, and another mtime as well
    os.utime(policy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    client_app._round("train", instruction("train"), context)
    assert [site.policy.min_batch_size for site in seen] == [4, 16]
    assert calls == {"node": 1, "policy": 2}


def test_a_policy_added_to_a_simulation_folder_is_found(tmp_path, seen):
    folder = tmp_path / "policies"
    folder.mkdir()
    context = _context({"partition-id": 0}, {"data-root": str(tmp_path),
                                             "site-policy": str(folder)})
    client_app._round("train", instruction("train"), context)
    name = seen[0].name
    stat = folder.stat()
    _policy(folder / f"{name}.toml", 8)
    os.utime(folder, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    client_app._round("train", instruction("train"), context)
    assert [site.policy.min_batch_size for site in seen][1] == 8
    assert seen[0].policy.fingerprint != seen[1].policy.fingerprint


def test_a_bad_node_config_or_a_missing_policy_is_refused_on_every_message(tmp_path, seen,
                                                                            calls):
    bad = _context({"data-path": "relative/site"})
    replies = [client_app.train(instruction("train"), bad) for _ in range(2)]
    assert all(reply.has_error() and reply.error.code == 4002 for reply in replies)
    assert calls["node"] >= 2

    missing = tmp_path / "policy.toml"
    context = _context({"data-path": str(tmp_path), "policy-path": str(missing)})
    replies = [client_app.train(instruction("train"), context) for _ in range(2)]
    assert all(reply.has_error() for reply in replies) and calls["policy"] == 2
    _policy(missing, 4)  # the file now there: the next message is answered
    assert not client_app.train(instruction("train"), context).has_error()
    assert seen and seen[-1].policy.min_batch_size == 4
