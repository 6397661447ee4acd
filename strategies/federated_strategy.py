"""The product's Flower strategy: robust rounds around the pure aggregation core.

Built on :class:`flwr.serverapp.strategy.Strategy` (Message API). Compared with
Flower's ``FedAvg`` it

* waits a bounded time for sites to connect (:func:`wait_for_nodes`) instead of
  forever;
* sends every site its own fresh ``RecordDict`` and ``ConfigRecord`` (Flower's
  FedAvg shares one content object between all train messages);
* receives *updates* ``delta_i = x_global - x_local_i`` and aggregates them with
  :func:`strategies.aggregation.fedavg_delta`, ``x <- x - sum_i p_i delta_i``,
  ``p_i = n_i / sum_j n_j`` over the accepted replies (McMahan et al., AISTATS
  2017, eq. in Alg. 1 written in update form);
* validates every reply on its own and drops a malformed one (missing keys,
  wrong shapes, NaN, site error) with a logged reason, so one bad site never
  crashes the federation;
* records a :class:`RoundReport` per round and hands it to an observer (the
  ServerApp logs it to MLflow).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from strategies import message_keys as keys
from strategies.aggregation import fedavg_delta
from strategies.node_wait import wait_for_nodes
from strategies.replies import (
    EvaluateReply,
    InvalidReplyError,
    TrainReply,
    parse_evaluate_reply,
    parse_train_reply,
    site_name,
)
from strategies.round_report import RoundReport

__all__ = ["FederatedStrategy", "NoValidRepliesError"]

RoundObserver = Callable[[RoundReport], None]


class NoValidRepliesError(RuntimeError):
    """Too many rounds in a row ended with no usable train reply."""


def _weighted_mean(values: Iterable[tuple[float, float]]) -> float:
    pairs = list(values)
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else math.nan


def _aggregate_metrics(metrics: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """Example-weighted mean of every metric all replies share."""
    if not metrics:
        return {}
    shared = set.intersection(*(set(m) for m, _ in metrics)) - {keys.NUM_EXAMPLES}
    out = {name: _weighted_mean((m[name], n) for m, n in metrics) for name in sorted(shared)}
    out[keys.NUM_EXAMPLES] = float(sum(n for _, n in metrics))
    return out


class FederatedStrategy(Strategy):
    """FedAvg over site updates, with bounded waits and per-reply validation.

    Parameters
    ----------
    min_nodes : int
        Sites that must be connected before a round starts.
    fraction_train : float
        Fraction of connected sites sampled for training (at least ``min_nodes``).
    fraction_evaluate : float
        Fraction of connected sites asked to evaluate (0 disables).
    node_wait_timeout : float
        Seconds to wait for ``min_nodes`` sites before failing.
    max_empty_rounds : int
        Abort after this many consecutive rounds without one usable reply.
    seed : int
        Seed of the site sampling (reproducible rounds).
    """

    def __init__(
        self,
        *,
        min_nodes: int = 2,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        node_wait_timeout: float = 120.0,
        max_empty_rounds: int = 3,
        seed: int = 0,
    ) -> None:
        if min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
        for name, value in (("fraction_train", fraction_train),
                            ("fraction_evaluate", fraction_evaluate)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if fraction_train == 0.0:
            raise ValueError("fraction_train must be > 0")
        self.min_nodes = min_nodes
        self.fraction_train = fraction_train
        self.fraction_evaluate = fraction_evaluate
        self.node_wait_timeout = node_wait_timeout
        self.max_empty_rounds = max_empty_rounds
        self._rng = random.Random(seed)
        self._keys: list[str] = []
        self._global: list[np.ndarray] = []
        self._sent: dict[int, str] = {}
        self._site_of: dict[int, str] = {}
        self._empty_rounds = 0
        self.reports: dict[int, RoundReport] = {}

    # ------------------------------------------------------------------ helpers
    def summary(self) -> None:
        """Log the strategy's configuration."""
        log(INFO, "\t├──> Aggregation: FedAvg over updates (fedavg_delta)")
        log(INFO, "\t├──> Sites: min %d, fraction train %.2f, evaluate %.2f",
            self.min_nodes, self.fraction_train, self.fraction_evaluate)
        log(INFO, "\t└──> Wait for sites: at most %.0f s", self.node_wait_timeout)

    def _report(self, server_round: int) -> RoundReport:
        return self.reports.setdefault(server_round, RoundReport(server_round))

    def _sample(self, grid: Grid, fraction: float) -> list[int]:
        nodes = wait_for_nodes(grid, self.min_nodes, self.node_wait_timeout)
        count = min(len(nodes), max(self.min_nodes, math.ceil(fraction * len(nodes))))
        return sorted(self._rng.sample(nodes, count))

    def _label(self, node_id: int) -> str:
        return self._site_of.get(node_id, f"node-{node_id}")

    def _messages(
        self, node_ids: list[int], arrays: ArrayRecord, config: ConfigRecord,
        server_round: int, message_type: str,
    ) -> list[Message]:
        messages = []
        for node_id in node_ids:
            site_config = ConfigRecord(dict(config))
            site_config[keys.SERVER_ROUND] = server_round
            content = RecordDict({keys.ARRAYS: arrays, keys.CONFIG: site_config})
            messages.append(Message(content=content, dst_node_id=node_id,
                                    message_type=message_type))
        self._sent = {n: self._label(n) for n in node_ids}
        return messages

    def _collect(self, replies: Iterable[Message], dropped: dict[str, str],
                 parse: Callable[[Message], object], stage: str) -> list:
        accepted = []
        answered = set()
        for message in replies:
            node = message.metadata.src_node_id
            answered.add(node)
            name = site_name(message) if message.has_content() else self._label(node)
            try:
                reply = parse(message)
            except InvalidReplyError as exc:
                dropped[name] = str(exc)
                log(WARNING, "%s: dropped reply of %s: %s", stage, name, exc)
                continue
            self._site_of[node] = reply.site
            accepted.append(reply)
        for node, name in self._sent.items():
            if node not in answered:
                label = self._site_of.get(node, name)
                dropped[label] = "no reply before the round timeout"
                log(WARNING, "%s: no reply from %s before the timeout", stage, label)
        return accepted

    # -------------------------------------------------------------------- train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample sites and send each its own copy of the instruction."""
        self._keys = list(arrays.keys())
        self._global = arrays.to_numpy_ndarrays()
        node_ids = self._sample(grid, self.fraction_train)
        log(INFO, "configure_train: %d sites selected of %d connected", len(node_ids),
            len(list(grid.get_node_ids())))
        return self._messages(node_ids, arrays, config, server_round, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, FedAvg the accepted updates, apply to the global model."""
        report = self._report(server_round)
        accepted: list[TrainReply] = self._collect(
            replies, report.train_dropped,
            lambda m: parse_train_reply(m, self._global), "aggregate_train",
        )
        for reply in accepted:
            report.train[reply.site] = dict(reply.metrics)
        if not accepted:
            self._empty_rounds += 1
            log(WARNING, "aggregate_train: no usable reply in round %d; model unchanged",
                server_round)
            if self._empty_rounds >= self.max_empty_rounds:
                raise NoValidRepliesError(
                    f"{self._empty_rounds} consecutive rounds without a usable reply; "
                    f"last reasons: {report.train_dropped}"
                )
            return None, None
        self._empty_rounds = 0
        delta = fedavg_delta([r.delta for r in accepted], [r.num_examples for r in accepted])
        updated = [np.asarray(g - d).astype(g.dtype, copy=False) for g, d in zip(self._global, delta)]
        report.train_aggregate = _aggregate_metrics(
            [(r.metrics, r.num_examples) for r in accepted])
        log(INFO, "aggregate_train: %d accepted, %d dropped", len(accepted),
            len(report.train_dropped))
        record = ArrayRecord({k: Array(v) for k, v in zip(self._keys, updated)})
        return record, MetricRecord({k: float(v) for k, v in report.train_aggregate.items()})

    # ----------------------------------------------------------------- evaluate
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask sites to evaluate the new global model on their validation data."""
        if self.fraction_evaluate == 0.0:
            self._sent = {}
            return []
        node_ids = self._sample(grid, self.fraction_evaluate)
        return self._messages(node_ids, arrays, config, server_round, MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Example-weighted mean of the sites' validation metrics."""
        report = self._report(server_round)
        accepted: list[EvaluateReply] = self._collect(
            replies, report.evaluate_dropped, parse_evaluate_reply, "aggregate_evaluate")
        for reply in accepted:
            report.evaluate[reply.site] = dict(reply.metrics)
        if not accepted:
            return None
        report.evaluate_aggregate = _aggregate_metrics(
            [(r.metrics, r.num_examples) for r in accepted])
        return MetricRecord({k: float(v) for k, v in report.evaluate_aggregate.items()})

    # -------------------------------------------------------------------- loop
    # pylint: disable=too-many-arguments
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        on_round_end: RoundObserver | None = None,
    ) -> Result:
        """Run ``num_rounds`` rounds; ``timeout`` bounds each send-and-receive.

        Same contract as :meth:`Strategy.start`, plus ``on_round_end``, called
        with the round's :class:`RoundReport` after each round.
        """
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        train_config = train_config or ConfigRecord()
        evaluate_config = evaluate_config or ConfigRecord()
        result = Result()
        arrays = initial_arrays
        for server_round in range(1, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %d/%d]", server_round, num_rounds)
            started = time.monotonic()
            replies = grid.send_and_receive(
                self.configure_train(server_round, arrays, train_config, grid),
                timeout=timeout)
            new_arrays, train_metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                arrays = result.arrays = new_arrays
            if train_metrics is not None:
                result.train_metrics_clientapp[server_round] = train_metrics
            replies = grid.send_and_receive(
                self.configure_evaluate(server_round, arrays, evaluate_config, grid),
                timeout=timeout)
            eval_metrics = self.aggregate_evaluate(server_round, replies)
            if eval_metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = eval_metrics
            if evaluate_fn is not None:
                central = evaluate_fn(server_round, arrays)
                if central is not None:
                    result.evaluate_metrics_serverapp[server_round] = central
            report = self._report(server_round)
            report.seconds = time.monotonic() - started
            if on_round_end is not None:
                on_round_end(report)
        result.arrays = arrays
        return result
