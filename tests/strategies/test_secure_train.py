"""A SecAgg+ train round through the strategy on the in-process engine (fake sites, no torch).

The four stages run through the product's exchange against sites that mask with the
core's Participant (:mod:`tests.strategies.secure_fake_sites`): the masks cancel (the new
model is the plain FedAvg / FedNova of the sites' updates within quantisation error),
a site failing at collect is left out (its pairwise masks removed), one failing at unmask
is kept (its self mask removed from its neighbours' shares), and the strategy holds no
site's vector afterwards.
"""

from __future__ import annotations

import logging
from dataclasses import fields, is_dataclass

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from app.engine import SiteFaults
from strategies.aggregation import fednova_delta
from strategies.wire import message_keys as keys
from strategies.wire.errors import FederationError
from strategies.plugins.registries import (AGGREGATORS, SCHEDULES, SECURE_AGGREGATION,
                                           SELECTORS, SERVER_OPTIMIZERS)
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.reply_intake import NO_REPLY
from strategies.rounds.round_policy import RoundPolicy
from tests.strategies.scripted_grid import scripted_grid
from tests.strategies.secure_fake_sites import SecureSite, with_identities

pytestmark = pytest.mark.usefixtures("server_identity")

MODEL = {"conv.weight": np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 2),
         "bn.running_var": np.ones(2, dtype=np.float32),
         "bn.num_batches_tracked": np.array(5, dtype=np.int64)}
TAU = 8


def _sites(count: int, steps: tuple[int, ...] = (TAU,), **fail_at: str) -> dict[int, SecureSite]:
    rng = np.random.default_rng(3)
    sites = {}
    for i in range(count):
        name = f"site-{i}"
        update = [rng.uniform(-0.4, 0.4, a.shape).astype(a.dtype) if a.dtype.kind == "f"
                  else np.zeros_like(a) for a in MODEL.values()]
        sites[10 + i] = SecureSite(name, num_examples=20 * (i + 1), update=update,
                                   steps=steps[i % len(steps)], fail_at=fail_at.get(name, ""))
    return with_identities(sites)


def _strategy(count: int, aggregator: str = "fedavg", policy: RoundPolicy | None = None,
              server_opt: str = "sgd", **options) -> FederatedStrategy:
    return FederatedStrategy(
        aggregator=AGGREGATORS.create(aggregator),
        schedule=SCHEDULES.create("fixed", tau0=TAU), selector=SELECTORS.create("uniform"),
        min_nodes=count, node_wait_timeout=1, fraction_evaluate=0.0, policy=policy,
        secure_aggregation=SECURE_AGGREGATION.create("secagg+"),
        server_opt=SERVER_OPTIMIZERS.create(server_opt, **options))


def _run(sites: dict[int, SecureSite], aggregator: str = "fedavg", *, rounds: int = 1,
         policy: RoundPolicy | None = None, faults: dict[int, SiteFaults] | None = None,
         **options):
    strategy = _strategy(len(sites), aggregator, policy, **options)
    grid = scripted_grid(dict(sites), faults=faults)
    initial = ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})
    result = strategy.start(grid, initial, num_rounds=rounds)
    return strategy, strategy.reports[rounds], result.arrays.to_numpy_ndarrays()


def _fedavg(sites: list[SecureSite]) -> list[np.ndarray]:
    n = np.array([s.num_examples for s in sites], dtype=np.float64)
    return [sum(w * s.update[j].astype(np.float64) for w, s in zip(n / n.sum(), sites))
            for j in range(len(MODEL))]


def _assert_model(new: list[np.ndarray], delta: list[np.ndarray], steps: float) -> None:
    reference = list(MODEL.values())
    np.testing.assert_allclose(new[0], reference[0] - delta[0], atol=2e-5)
    np.testing.assert_allclose(new[1], reference[1] - delta[1], atol=2e-5)
    assert int(new[2]) == 5 + round(steps)  # the counter advanced by the mean steps


def test_masks_cancel_fedavg_of_the_sites_updates():
    sites = _sites(4)
    strategy, report, new = _run(sites)
    _assert_model(new, _fedavg(list(sites.values())), TAU)
    assert report.strategy["secagg-summed"] == 4 and report.strategy["secagg-dropped"] == 0
    assert sorted(report.train) == [s.name for s in sites.values()]
    assert not report.train_dropped and not report.aggregation_failed
    assert all(keys.RESIDUAL_NORM not in m for m in report.train.values())
    # bytes up: every site's four replies, at least its masked vector
    for site in sites.values():
        assert report.traffic[site.name]["bytes-up"] > site.masked[1].nbytes
    assert strategy.train.empty_rounds == 0


def test_fednova_weights_applied_at_the_sites():
    sites = _sites(4, steps=(8, 4, 6, 2))  # 2 < 0.5 x 8: counted as 4 (the a-norm floor)
    _, report, new = _run(sites, "fednova")
    ordered = list(sites.values())
    a_norms = [max(s.steps, 4) for s in ordered]
    expected = fednova_delta([s.update for s in ordered], [s.num_examples for s in ordered],
                             a_norms)
    n = np.array([s.num_examples for s in ordered], dtype=np.float64)
    _assert_model(new, expected, float(np.dot(n, [s.steps for s in ordered]) / n.sum()))
    assert report.strategy["tau-eff"] == pytest.approx(np.dot(n / n.sum(), a_norms))


def test_server_momentum_applies_to_the_secure_fednova_update():
    sites = _sites(4)
    _, _, new = _run(sites, "fednova", rounds=2, server_opt="avgm", momentum=0.5)
    once = _fedavg(list(sites.values()))  # all steps = tau: FedNova's update is FedAvg's
    reference = list(MODEL.values())
    # the weight: x - D, then x - D - (0.5 D + D); the running variance takes D (a statistic)
    np.testing.assert_allclose(new[0], reference[0] - 2.5 * once[0], atol=5e-5)
    np.testing.assert_allclose(new[1], reference[1] - 2.0 * once[1], atol=5e-5)
    assert int(new[2]) == 5 + 2 * TAU


def test_a_site_failing_at_share_keys_is_left_out():
    sites = _sites(5, **{"site-0": "share-keys"})
    _, report, new = _run(sites)
    _assert_model(new, _fedavg([s for s in sites.values() if s.name != "site-0"]), TAU)
    assert report.train_dropped["site-0"].startswith("secagg share-keys: ")
    assert report.strategy["secagg-summed"] == 4 and report.strategy["secagg-dropped"] == 0


def test_each_stage_closes_at_the_deadline_once_the_quorum_answered():
    sites = _sites(5)
    policy = RoundPolicy(deadline=0.2, quorum=4, timeout=30.0, poll_interval=0.01)
    _, report, new = _run(sites, policy=policy,
                          faults={12: SiteFaults(silent_stages=(keys.SECAGG_COLLECT,))})
    _assert_model(new, _fedavg([s for n, s in sites.items() if n != 12]), TAU)
    assert report.train_dropped["site-2"] == f"secagg collect: {NO_REPLY}"
    assert report.missing["train"] == 1 and report.missing["secagg-unmask"] == 0
    assert report.strategy["secagg-dropped"] == 1


def test_a_site_failing_at_collect_is_left_out_its_masks_removed():
    sites = _sites(5, **{"site-2": "collect"})
    _, report, new = _run(sites)
    kept = [s for s in sites.values() if s.name != "site-2"]
    _assert_model(new, _fedavg(kept), TAU)
    assert report.train_dropped["site-2"].startswith("secagg collect: ")
    assert report.strategy["secagg-summed"] == 4 and report.strategy["secagg-dropped"] == 1
    assert "site-2" not in report.train


def test_a_site_failing_at_unmask_keeps_its_input_in_the_sum():
    sites = _sites(5, **{"site-1": "unmask"})
    _, report, new = _run(sites)
    _assert_model(new, _fedavg(list(sites.values())), TAU)
    assert report.train_dropped["site-1"].startswith("secagg unmask: ")
    assert report.strategy["secagg-summed"] == 5


def test_a_site_failing_at_setup_is_not_asked_again():
    sites = _sites(5, **{"site-4": "setup"})
    _, report, new = _run(sites)
    _assert_model(new, _fedavg([s for s in sites.values() if s.name != "site-4"]), TAU)
    assert report.train_dropped["site-4"].startswith("secagg setup: ")
    assert report.missing["secagg-share-keys"] == 0 and 1 not in sites[14].participants


def test_a_tampered_unmask_share_is_named_and_the_sum_still_unmasked():
    sites = _sites(5)
    sites[12].tamper_unmask = True
    _, report, new = _run(sites)
    _assert_model(new, _fedavg(list(sites.values())), TAU)
    assert report.strategy["secagg-bad-shares/site-2"] == 1.0


def test_too_few_inputs_keep_the_model_and_count_as_an_empty_round():
    sites = _sites(3, **{"site-0": "collect", "site-1": "collect"})
    strategy, report, new = _run(sites)
    assert "secure aggregation failed" in report.aggregation_failed
    assert "secagg.min-participants" in report.aggregation_failed
    for got, before in zip(new, MODEL.values()):
        np.testing.assert_array_equal(got, before)
    assert strategy.train.empty_rounds == 1


def test_a_single_plain_train_exchange_is_refused_under_secure_aggregation():
    strategy = _strategy(2)
    initial = ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})
    with pytest.raises(FederationError, match="strategy.secure-aggregation"):
        strategy.configure_train(1, initial, ConfigRecord(), scripted_grid(_sites(2)))


def _held_arrays(value: object, seen: set[int], out: list[np.ndarray]) -> None:
    """Every numpy array reachable from ``value`` (attributes, containers, dataclasses)."""
    if id(value) in seen or isinstance(value, (str, bytes, int, float, type(None))):
        return
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        out.append(value)
        return
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, (list, tuple, set)):
        children = list(value)
    elif is_dataclass(value):
        children = [getattr(value, f.name) for f in fields(value)]
    else:
        children = list(getattr(value, "__dict__", {}).values())
    for child in children:
        _held_arrays(child, seen, out)


def test_the_strategy_holds_and_logs_no_site_vector_after_the_round(caplog):
    sites = _sites(4, **{"site-3": "unmask"})
    sites[11].tamper_unmask = True  # a warning naming it
    with caplog.at_level(logging.DEBUG):
        strategy, report, _ = _run(sites)
    assert "secagg_unmask" in caplog.text
    for site in sites.values():  # no coordinate of its update or of what it sent is logged
        for value in (*site.sent[1], *np.concatenate([a.ravel() for a in site.update[:2]])):
            assert f"{abs(float(value)):.6f}"[1:] not in caplog.text
    held: list[np.ndarray] = []
    _held_arrays(strategy, set(), held)
    site_vectors = [v for s in sites.values()
                    for v in (s.masked[1], s.sent[1], *s.update[:2])]
    for array in held:
        for vector in site_vectors:
            assert not (array.shape == vector.shape and np.array_equal(array, vector))
    assert not any(a.dtype == np.uint8 and a.size >= sites[10].masked[1].size for a in held)
    assert all(keys.RESIDUAL_NORM not in metrics for metrics in report.train.values())
