"""The top-k downlink's NaN (issue 50): normalisation statistics under double compression.

Recorded in bench/results/compression_to_target.json (cxr-cls, seed 1,
``topk:0.01+ef down=topk:0.01``): in round 3 every site's validation loss was not
finite. Cause: with a compressed downlink every site trains from the reference
:math:`\\hat x` (:mod:`strategies.downlink`), not from the server's global model
:math:`x = \\hat x + e`, and its BatchNorm statistics update is relative to
:math:`\\hat x`. A statistic is an estimate, not a gradient step: a site's new
running variance is :math:`a \\hat v + (1 - a) D` (``a = 0.9^tau``, ``D`` its data's
variance), so its update ``hat v - local`` says "move to D" from wherever
:math:`\\hat v` is. Applied to :math:`x` it moves :math:`x` by the same amount again each
round in which top-k leaves the channel out of the step: the variance and mean run past
the sites' data (the server residual grows linearly), a variance towards and below 0
(the reply check then refuses every honest site, or the repair freezes it near 0) and
the network's eval-mode output explodes to inf / NaN.

The sites here are numpy stand-ins of a BatchNorm network's site (the real downlink
receive, the real strategy, the in-process engine): each holds its reference through
:func:`strategies.wire.downlink_receive.receive`, runs ``tau`` BatchNorm-like steps on
it and answers ``x_hat - x_local`` with its statistics raw, as the site's round does.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from strategies.plugins.registries import AGGREGATORS, DEFENCES, SCHEDULES, SELECTORS
from strategies.rounds.active_features import active_features
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.instructions import named_arrays
from strategies.rounds.update_stream import with_defence
from strategies.wire import message_keys as keys
from strategies.wire.downlink_header import DownlinkHeader
from strategies.wire.downlink_receive import receive
from strategies.wire.downlink_reference import Reference
from strategies.wire.model_layout import unpack_model
from strategies.wire.update_codec import pack_update
from tests.strategies.scripted_grid import flower_round, scripted_grid

pytestmark = pytest.mark.usefixtures("server_identity")

TAU, MOMENTUM, CHANNELS, WEIGHTS = 4, 0.1, 64, 2000
NAMES = ("conv.weight", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked")
BUFFERS = frozenset({1, 2, 3})
KEEP = (1.0 - MOMENTUM) ** TAU  # BatchNorm's running average after tau steps


def _initial() -> ArrayRecord:
    """A fresh network: BatchNorm's initial statistics (mean 0, variance 1)."""
    return ArrayRecord({NAMES[0]: Array(np.zeros(WEIGHTS, np.float32)),
                        NAMES[1]: Array(np.zeros(CHANNELS, np.float32)),
                        NAMES[2]: Array(np.ones(CHANNELS, np.float32)),
                        NAMES[3]: Array(np.array(0, np.int64))})


class BatchNormSite:
    """A site of a BatchNorm network: quadratic weights, running statistics of its data.

    Its data's per-channel mean and variance are fixed (``seed``); most variances are
    far below the initial 1 (a trained network's channels are), so a statistic that
    overshoots crosses 0.
    """

    def __init__(self, name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.name = name
        self.optimum = rng.normal(0.0, 1e-3, WEIGHTS).astype(np.float32)
        self.mean = rng.normal(0.5, 0.2, CHANNELS).astype(np.float32)
        self.var = rng.uniform(0.01, 0.05, CHANNELS).astype(np.float32)
        self.held: Reference | None = None

    def local(self, start: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The site's model after ``TAU`` steps from ``start``."""
        weights = start[NAMES[0]] + 0.5 * (self.optimum - start[NAMES[0]])
        mean = KEEP * start[NAMES[1]] + (1.0 - KEEP) * self.mean
        var = KEEP * start[NAMES[2]] + (1.0 - KEEP) * self.var
        return [weights.astype(np.float32), mean.astype(np.float32), var.astype(np.float32),
                np.asarray(start[NAMES[3]] + TAU, np.int64)]

    def __call__(self, instruction: Message) -> Message:
        config = instruction.content[keys.CONFIG]
        header, arrays = DownlinkHeader.from_config(config), instruction.content[keys.ARRAYS]
        self.held = (Reference.of(unpack_model(named_arrays(arrays)), 1) if header is None
                     else receive(named_arrays(arrays), header, self.held))
        start = self.held.named()
        delta = [np.asarray(start[n] - new, dtype=start[n].dtype)
                 for n, new in zip(NAMES, self.local(start))]
        packed = pack_update(delta, str(config[keys.CODEC]), int(config[keys.CODEC_SEED]),
                             raw=BUFFERS)
        metrics = {keys.NUM_EXAMPLES: 100, keys.STEPS: TAU, keys.TRAIN_LOSS: 0.5,
                   keys.INITIAL_LOSS: 1.0, keys.DOWNLINK_VERSION: self.held.version}
        return Message(RecordDict({
            keys.SITE: ConfigRecord({keys.SITE_NAME: self.name}),
            keys.METRICS: MetricRecord(metrics),
            keys.DELTA: ArrayRecord({k: Array(v) for k, v in packed.items()})}),
            reply_to=instruction)


def _strategy(downlink: str, defence: bool) -> FederatedStrategy:
    aggregator = AGGREGATORS.create("fedavg")
    if defence:  # the product's default: norm-bound, with the statistics' median rule
        aggregator = with_defence(DEFENCES.create("norm-bound"), aggregator)
    return FederatedStrategy(aggregator=aggregator,
                             schedule=SCHEDULES.create("fixed", tau0=TAU),
                             selector=SELECTORS.create("uniform"), min_nodes=2,
                             node_wait_timeout=1,
                             features=active_features(downlink_codec=downlink))


def _eval_output(model: ArrayRecord, sites: list[BatchNormSite], depth: int = 40) -> float:
    """A deep BatchNorm network's eval-mode output magnitude on the sites' data: each of
    ``depth`` layers normalises with the model's statistics, ``(h - mu) / sqrt(var + eps)``,
    and a channel's activations keep the data's spread; the largest over the sites."""
    named = named_arrays(model)
    mu, var = named[NAMES[1]].astype(np.float32), named[NAMES[2]].astype(np.float32)
    worst = 0.0
    for site in sites:
        h = site.mean + np.sqrt(site.var)  # one standard deviation above the data's mean
        with np.errstate(all="ignore"):
            for _ in range(depth):
                h = ((h - mu) / np.sqrt(var + np.float32(1e-5))).astype(np.float32)
                h = site.mean + (h - site.mean) * np.sqrt(site.var)  # the next layer's input
            worst = max(worst, float(np.max(np.abs(h))) if np.all(np.isfinite(h)) else np.inf)
    return worst


def _run(downlink: str, defence: bool, rounds: int = 8):
    sites = {11: BatchNormSite("a", 1), 12: BatchNormSite("b", 2), 13: BatchNormSite("c", 3)}
    strategy, model = _strategy(downlink, defence), _initial()
    models = []
    for t in range(1, rounds + 1):
        new, _ = flower_round(strategy, t, scripted_grid(sites), model, ConfigRecord({}))
        model = new if new is not None else model
        models.append(model)
    return strategy, models, list(sites.values())


@pytest.mark.parametrize("defence", [False, True], ids=["fedavg", "norm-bound"])
def test_topk_downlink_keeps_the_statistics_the_sites_measured(defence):
    """Regression (failed before the fix): with top-k on the downlink, the global model's
    running statistics stay the aggregate of what the sites measured on their data (each
    variance between the sites' lowest and highest, no honest reply refused, nothing
    repaired), as with a dense downlink."""
    strategy, models, sites = _run("topk:0.01", defence)
    lows = np.minimum.reduce([s.var for s in sites])
    for t, model in enumerate(models, start=1):
        report = strategy.reports[t]
        assert not report.train_dropped, f"round {t}: honest replies refused {report.train_dropped}"
        assert report.strategy.get("statistics-repaired", 0.0) == 0.0, f"round {t}"
        named = named_arrays(model)
        var = named[NAMES[2]]
        assert np.all(var > 0), f"round {t}: variance {var.min()}"
        if t >= 4:  # after 4 rounds of 4 steps the initial variance weighs 0.9^16 < 0.2
            assert np.all(var < 1.0)
            assert np.all(var > 0.5 * lows), f"round {t}: variance {var.min()} collapsed"


def test_topk_downlink_model_evaluates_finite():
    """Regression (failed before the fix): a deep network in eval mode on the global
    statistics stays finite and of the size the dense downlink gives, every round."""
    _, dense_models, sites = _run("none", defence=True)
    _, models, _ = _run("topk:0.01", defence=True)
    for t, (dense, model) in enumerate(zip(dense_models, models), start=1):
        bound = _eval_output(dense, sites)
        assert np.isfinite(bound)
        assert _eval_output(model, sites) <= 10.0 * bound + 1.0, f"round {t}"
