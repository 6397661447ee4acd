"""A coordinator that forges PSI messages to learn which patients a site holds (issue #46, found 4).

Each attack runs through the site's own stage handlers (:func:`answer_vertical`, as in
tests/clients/test_psi.py) and asserts what the coordinator must *not* get; on the code
before issue #46 (salt = the federation name, serving unbounded) each of these tests
fails: the forged request learns the membership, the oversized and repeated requests are
served. The DH-PSI itself is the one of clients/vertical/psi.py (Angelou et al. 2020).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from pathlib import Path

import numpy as np
import private_set_intersection.python as psi
import pytest

from clients.site.policy import PolicyRefusal
from clients.site.query_budget import PSI_REQUESTS, QUERY_COUNTS, answered
from clients.vertical.alignment import load_alignment
from clients.vertical.stages import VerticalSite
from tests.clients.test_psi import FakeContext, patients, salted, secret_of, vertical_site

#: The site's patients: 60 ids, so its own padded set is 64 items (PAD = 64).
HELD = patients(*range(60))
#: The coordinator's six guesses: three the site holds, three it does not.
GUESSED = patients(3, 17, 42, 700, 701, 702)


def one_site(root: Path, federation: str, ids: list[str] = HELD, minimum: int = 20,
             **rules: float) -> FakeContext:
    """One site (node 11) in ``federation`` with the shipped rules, after its ``psi-request``."""
    ctx = FakeContext({11: vertical_site(root, "clinic", ids, federation, minimum, **rules)},
                      federation)
    ctx.send("psi-request", {11: ({}, {})}, 0)
    return ctx


def forged(items: list[str]) -> tuple[psi.client, np.ndarray]:
    """The coordinator's own client key and a request over ``items``, as the wire carries it."""
    client = psi.client.CreateWithNewKey(True)
    return client, np.frombuffer(client.CreateRequest(items).SerializeToString(), np.uint8)


def probe(ctx: FakeContext, items: list[str]) -> set[int]:
    """Serve a forged request over ``items`` at node 11; the indices of those the site holds."""
    client, request = forged(items)
    reply = ctx.send("psi-step", {11: ({"psi-serve": 1}, {"request-0": request})}, 0)[11]
    setup, response = psi.ServerSetup(), psi.Response()
    setup.ParseFromString(reply.arrays["setup"].tobytes())
    response.ParseFromString(reply.arrays["response-0"].tobytes())
    return set(client.GetIntersection(setup, response))


def dummies(count: int) -> list[str]:
    """``count`` random items (256 bits each, as the padding's)."""
    return [secrets.token_hex(32) for _ in range(count)]


def served(site: VerticalSite) -> int:
    """The PSI requests the site's dataset has served (its own count)."""
    return answered(site.site.state_dir / QUERY_COUNTS, site.data_path, PSI_REQUESTS)


def refused_rule(ctx: FakeContext, config: dict, arrays: dict) -> str:
    """The rule of the PolicyRefusal a ``psi-step`` at node 11 gets."""
    with pytest.raises(PolicyRefusal) as refused:
        ctx.send("psi-step", {11: (config, arrays)}, 0)
    return refused.value.rule


def test_a_forged_request_over_guessed_ids_learns_no_membership(tmp_path: Path) -> None:
    """The coordinator chose the federation name, so it could salt guesses itself."""
    ctx = one_site(tmp_path, "fed-heart")
    federation_salted = [hashlib.sha256(b"fed-heart\x00" + i.encode()).hexdigest()
                         for i in GUESSED]
    assert probe(ctx, federation_salted) == set()  # before #46: {0, 1, 2}, the ids held
    # Only the sites' secret makes a guess an item: a site colluding with the coordinator
    # (docs/VERTICAL.md) would give exactly the membership, so the probe above is a real one.
    assert probe(ctx, salted(secret_of(tmp_path), "fed-heart", GUESSED)) == {0, 1, 2}


def test_a_request_larger_than_the_ratio_of_the_sites_own_set_is_refused(tmp_path: Path) -> None:
    ctx = one_site(tmp_path, "fed-ratio")  # 60 patients: 64 padded, ratio 2.0: 128 items
    _, request = forged(dummies(129))
    assert refused_rule(ctx, {"psi-serve": 1}, {"request-0": request}) == \
        "vertical.max-request-ratio"
    assert served(ctx.sites[11]) == 0  # refused before it was counted
    assert probe(ctx, dummies(128)) == set()
    assert served(ctx.sites[11]) == 1


def test_two_requests_of_20000_items_are_refused(tmp_path: Path) -> None:
    ctx = one_site(tmp_path, "fed-probe")
    _, request = forged(dummies(20_000))
    rule = refused_rule(ctx, {"psi-serve": 2}, {"request-0": request, "request-1": request})
    assert rule == "vertical.max-request-ratio"
    assert served(ctx.sites[11]) == 0


def test_psi_requests_are_counted_per_dataset_across_federations(tmp_path: Path) -> None:
    first = one_site(tmp_path, "fed-1", max_psi_requests=3)
    _, request = forged(dummies(64))
    first.send("psi-step", {11: ({"psi-serve": 2}, {"request-0": request, "request-1": request})},
               0)
    second = one_site(tmp_path, "fed-2", max_psi_requests=3)  # same dataset, a new federation
    assert probe(second, dummies(64)) == set()
    assert served(second.sites[11]) == 3
    for ctx in (second, one_site(tmp_path, "fed-3", max_psi_requests=3)):
        assert refused_rule(ctx, {"psi-serve": 1}, {"request-0": request}) == \
            "vertical.max-psi-requests"
    other = one_site(tmp_path / "other", "fed-3", max_psi_requests=3)  # its own count
    assert probe(other, dummies(64)) == set()


def test_serving_a_set_below_the_minimum_is_refused_and_the_refusal_kept(tmp_path: Path) -> None:
    ctx = one_site(tmp_path, "fed-min", ids=patients(*range(30)), minimum=20)
    site = ctx.sites[11]
    site.rules = dataclasses.replace(site.rules, min_intersection=40)  # the hospital raised it
    _, request = forged(dummies(64))
    assert refused_rule(ctx, {"psi-serve": 1}, {"request-0": request}) == \
        "vertical.min-intersection"
    assert served(site) == 0
    with pytest.raises(PolicyRefusal, match="30 patients left"):
        load_alignment(site.state_dir)  # every later per-patient stage is refused
    with pytest.raises(PolicyRefusal):
        ctx.send("psi-request", {11: ({}, {})}, 0)  # and so is a new PSI in the federation
