"""The patient alignment (DH-PSI) of a vertical federation, without Flower.

The coordinator's :func:`app.vertical.psi_flow.align` runs the plan over a fake
``ctx.send`` that hands each stage to the site's :func:`answer_vertical` in process
(the arrays copied, as over the wire), and keeps everything the coordinator sees.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import private_set_intersection.python as psi
import pytest

from app.vertical.federation import VerticalContext
from app.vertical.messages import StageAnswer
from app.vertical.psi_flow import align
from clients.site.policy import PolicyRefusal, SitePolicy, VerticalRules
from clients.site.site import Site
from clients.site.site_round import SiteTasks
from clients.training.site_task import TaskSettings
from clients.vertical.alignment import ALIGNMENT_FILE, load_alignment
from clients.vertical.psi import PAD
from clients.vertical.psi_secret import create_secret
from clients.vertical.stages import VerticalReply, VerticalRequest, VerticalSite, answer_vertical
from strategies.wire.errors import SiteError
from strategies.wire.vertical_options import VerticalOptions


def patients(*numbers: int) -> list[str]:
    """Patient ids ``patient-00012`` (fixed width: no id is a substring of another)."""
    return [f"patient-{number:05d}" for number in numbers]


#: The sites' shared PSI secret in a test's root folder (the policies name it).
SECRET_FILE = "psi.secret"


def secret_of(root: Path) -> bytes:
    """The PSI secret the sites under ``root`` share (made on first use)."""
    create_secret(root / SECRET_FILE)
    return (root / SECRET_FILE).read_bytes()


def salted(secret: bytes, federation: str, ids: list[str]) -> list[str]:
    """The salted ids in hex, HMAC-SHA256 computed here independently of the code under test."""
    return [hmac.new(secret, federation.encode() + b"\x00" + i.encode(), "sha256").hexdigest()
            for i in ids]


def vertical_site(root: Path, name: str, ids: list[str], federation: str,
                  minimum: int = 1, **rules_: float | str) -> VerticalSite:
    """A site holding ``ids`` (its task's loaded ids), its state folder for ``federation``;
    its policy names the secret under ``root`` and sets ``rules_``."""
    secret_of(root)
    rules = VerticalRules(allowed=True, min_intersection=minimum,
                          psi_secret=str(root / SECRET_FILE), **rules_)
    site = Site(name, root / name, root / name / "state", SitePolicy(vertical=rules))
    loaded = SimpleNamespace(report=SimpleNamespace(loaded=list(ids)))
    state = root / name / "state" / federation
    state.mkdir(parents=True, exist_ok=True)
    return VerticalSite(name=name, data_path=root / name, state_dir=state, rules=rules,
                        task_name="cxr-cls", department=name, settings=TaskSettings(), lr=0.1,
                        optimizer="sgd", momentum=0.0, seed=0,
                        tasks=SiteTasks(load=lambda *args, **kwargs: loaded), site=site)


@dataclass
class FakeContext:
    """The part of VerticalContext that align uses; keeps what the coordinator sees."""

    sites: dict[int, VerticalSite]
    federation: str
    seen: list[tuple[str, np.ndarray]] = field(default_factory=list)
    metrics: list[Mapping[str, float | int]] = field(default_factory=list)

    @property
    def nodes(self) -> list[int]:
        return list(self.sites)

    @property
    def departments(self) -> dict[int, str]:
        return {node: site.department for node, site in self.sites.items()}

    department = VerticalContext.department

    def send(self, stage: str, requests: Mapping[int, tuple[Mapping, Mapping[str, np.ndarray]]],
             server_round: int) -> dict[int, StageAnswer]:
        answers = {}
        for node, (config, arrays) in requests.items():
            self.seen.extend((f"{stage} to {node}: {name}", a) for name, a in arrays.items())
            reply: VerticalReply = answer_vertical(VerticalRequest(
                stage, self.federation, server_round, dict(config),
                {name: np.array(a) for name, a in arrays.items()}, VerticalOptions(),
                self.sites[node]))
            self.seen.extend((f"{stage} from {node}: {name}", a)
                             for name, a in reply.arrays.items())
            self.metrics.append(dict(reply.metrics))
            answers[node] = StageAnswer(node, {n: np.array(a) for n, a in reply.arrays.items()},
                                        dict(reply.metrics), dict(reply.info))
        return answers


ID_SETS = {
    "clinic": patients(*range(0, 60), 500, 501),
    "stress-lab": patients(*range(10, 80), 600),
    "cath-lab": patients(*range(5, 50), *range(70, 90)),
}
SHARED = sorted(set.intersection(*(set(ids) for ids in ID_SETS.values())))


def federation_of(root: Path, federation: str, id_sets: Mapping[str, list[str]] = ID_SETS,
                  minimum: int = 1) -> FakeContext:
    """Three sites (nodes 11, 12, 13) holding ``id_sets``."""
    return FakeContext({11 + number: vertical_site(root, name, ids, federation, minimum)
                        for number, (name, ids) in enumerate(id_sets.items())}, federation)


def test_three_sites_end_with_exactly_the_intersection_in_one_order(tmp_path: Path) -> None:
    ctx = federation_of(tmp_path, "fed-heart")
    assert align(ctx) == len(SHARED) == 40
    common = [i for _, i in sorted(zip(salted(secret_of(tmp_path), "fed-heart", SHARED),
                                       SHARED))]
    for site in ctx.sites.values():
        assert load_alignment(site.state_dir) == common
    sizes = [m["psi-size"] for m in ctx.metrics if m]
    assert sizes == [len(SHARED)] * 3 and all(set(m) <= {"psi-size"} for m in ctx.metrics)


def test_a_site_keeps_nothing_but_its_shared_ids(tmp_path: Path) -> None:
    ctx = federation_of(tmp_path, "fed-heart")
    align(ctx)
    not_shared = {i for ids in ID_SETS.values() for i in ids} - set(SHARED)
    hidden = not_shared | set(salted(secret_of(tmp_path), "fed-heart", sorted(not_shared)))
    for site in ctx.sites.values():
        assert [p.name for p in site.state_dir.iterdir()] == [ALIGNMENT_FILE]
        saved = (site.state_dir / ALIGNMENT_FILE).read_text()
        assert set(json.loads(saved)["ids"]) == set(SHARED)
        assert not [i for i in hidden if i in saved]


def test_the_coordinator_sees_curve_points_and_padded_sizes_only(tmp_path: Path) -> None:
    ctx = federation_of(tmp_path, "fed-heart")
    align(ctx)
    everything = {i for ids in ID_SETS.values() for i in ids}
    hexes = salted(secret_of(tmp_path), "fed-heart", sorted(everything))
    secrets_ = ([i.encode() for i in everything] + [h.encode() for h in hexes]
                + [bytes.fromhex(h) for h in hexes] + [secret_of(tmp_path)])
    assert ctx.seen
    for where, array in ctx.seen:
        assert array.dtype == np.uint8, where
        payload = array.tobytes()
        assert not [s for s in secrets_ if s in payload], where
    requests = [a for where, a in ctx.seen if where.startswith("psi-request from")]
    for array in requests:
        request = psi.Request()
        request.ParseFromString(array.tobytes())
        assert len(request.encrypted_elements) % PAD == 0
    setups = [a for where, a in ctx.seen if where.endswith(": setup")]
    for array in setups:
        setup = psi.ServerSetup()
        setup.ParseFromString(array.tobytes())
        assert len(setup.raw.encrypted_elements) % PAD == 0


def test_a_site_with_no_shared_patients_is_refused_at_the_minimum(tmp_path: Path) -> None:
    id_sets = {"clinic": patients(*range(30)), "stress-lab": patients(*range(30)),
               "cath-lab": patients(*range(100, 130))}
    ctx = federation_of(tmp_path, "fed-none", id_sets)
    with pytest.raises(PolicyRefusal, match="0 patients left to align") as refused:
        align(ctx)
    assert refused.value.rule == "vertical.min-intersection"
    cath = ctx.sites[13]
    with pytest.raises(PolicyRefusal) as later:
        load_alignment(cath.state_dir)  # every later per-patient stage is refused too
    assert later.value.rule == "vertical.min-intersection"
    assert [p.name for p in cath.state_dir.iterdir()] == [ALIGNMENT_FILE]
    with pytest.raises(PolicyRefusal):  # and a new PSI in the same federation
        align(ctx)


def test_an_intersection_below_the_policy_minimum_is_refused(tmp_path: Path) -> None:
    ctx = federation_of(tmp_path, "fed-small", minimum=41)  # 40 shared patients
    with pytest.raises(PolicyRefusal, match="fewer than the minimum 41"):
        align(ctx)


def test_salts_differ_per_federation(tmp_path: Path) -> None:
    first = federation_of(tmp_path / "a", "fed-a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / SECRET_FILE).write_bytes(secret_of(tmp_path / "a"))  # one secret
    second = federation_of(tmp_path / "b", "fed-b")
    align(first)
    align(second)
    in_a = load_alignment(first.sites[11].state_dir)
    in_b = load_alignment(second.sites[11].state_dir)
    assert set(in_a) == set(in_b) == set(SHARED)
    assert in_a != in_b  # the common order follows the federation's salt
    secret = secret_of(tmp_path / "a")
    assert not set(salted(secret, "fed-a", SHARED)) & set(salted(secret, "fed-b", SHARED))


def test_a_step_without_a_request_or_with_a_bad_array_is_a_site_error(tmp_path: Path) -> None:
    ctx = federation_of(tmp_path, "fed-bad")
    with pytest.raises(SiteError, match="no pending PSI request"):
        ctx.send("psi-step", {11: ({"psi-serve": 0, "psi-last": False}, {})}, 0)
    ctx.send("psi-request", {11: ({}, {})}, 0)
    with pytest.raises(SiteError, match="'request-0' must be 1-D uint8"):
        ctx.send("psi-step", {11: ({"psi-serve": 1}, {"request-0": np.zeros(3, np.float32)})}, 0)
    with pytest.raises(SiteError, match="request 0 is not a PSI message"):
        ctx.send("psi-step", {11: ({"psi-serve": 1}, {"request-0": np.full(9, 255, np.uint8)})}, 0)


def test_a_site_whose_patients_changed_since_its_request_does_not_align(tmp_path: Path) -> None:
    ctx = federation_of(tmp_path, "fed-changed", {"clinic": patients(*range(30)),
                                                  "stress-lab": patients(*range(30))})
    requests = ctx.send("psi-request", {11: ({}, {}), 12: ({}, {})}, 0)
    served = ctx.send("psi-step", {11: ({"psi-serve": 1},
                                        {"request-0": requests[12].arrays["request"]})}, 0)
    ctx.sites[12].task().report.loaded.remove("patient-00007")  # e.g. now skipped as unreadable
    answer = {"setup": served[11].arrays["setup"], "response": served[11].arrays["response-0"]}
    with pytest.raises(SiteError, match="loaded patients changed"):
        ctx.send("psi-step", {12: ({"psi-last": True}, answer)}, 0)
    assert not (ctx.sites[12].state_dir / ALIGNMENT_FILE).exists()
