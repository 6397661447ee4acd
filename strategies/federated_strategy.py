"""The product's Flower strategy: one class composed of plug-ins.

Built on :class:`flwr.serverapp.strategy.Strategy` (Message API) and composed of

* an **aggregator** (``fedavg`` | ``fednova``, :mod:`strategies.plugins`),
* a **local-steps schedule** (``fixed`` | ``adacomm``) that sets tau per round,
* a **client selector** (``uniform``),
* a **round policy** (deadline and quorum, :mod:`strategies.round_policy`),

each chosen by name from the run config through :mod:`strategies.registry`.
Compared with Flower's ``FedAvg`` it

* waits a bounded time for sites to connect (:func:`wait_for_nodes`) instead of
  forever;
* sends every site its own fresh ``RecordDict`` and ``ConfigRecord`` (Flower's
  FedAvg shares one content object between all train messages);
* receives *updates* ``delta_i = x_global - x_local_i`` and applies the
  aggregator's ``Delta`` as ``x <- x - Delta``;
* validates every reply on its own and drops a malformed one (missing keys,
  wrong shapes, NaN, site error) with a logged reason, so one bad site never
  crashes the federation; stragglers past the deadline are dropped and logged;
* records a :class:`RoundReport` per round and hands it to an observer (the
  ServerApp logs it to MLflow).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
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
from strategies.local_solver import LocalSolver
from strategies.node_wait import wait_for_nodes
from strategies.replies import (
    EvaluateReply,
    InvalidReplyError,
    TrainReply,
    parse_evaluate_reply,
    parse_query_reply,
    parse_train_reply,
    site_name,
)
from strategies.round_policy import RoundPolicy, collect_replies
from strategies.round_report import RoundReport
from strategies.compression import derive_seed, parse_spec
from strategies.update_codec import dense_bytes
from strategies.wire_bytes import wire_size
from strategies.errors import FederationError

__all__ = ["FederatedStrategy", "NoValidRepliesError", "SelectionContext"]

RoundObserver = Callable[[RoundReport, ArrayRecord], None]


@dataclass
class SelectionContext:
    """What a client selector may use: known data sizes, last train losses, a query.

    ``query_losses(candidates, subset)`` sends Flower ``query`` messages and
    returns ``{node_id: loss of the current global model}`` for the sites that
    answered (on ``subset`` examples each, or all their training data if 0).
    """

    sizes: dict[int, int]
    last_losses: dict[int, float]
    query_losses: Callable[[list[int], int], dict[int, float]]


class NoValidRepliesError(FederationError):
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
    """Plug-in composed strategy with bounded waits and per-reply validation.

    Parameters
    ----------
    aggregator : object
        ``aggregate(replies) -> (delta arrays, info dict)`` and ``state()``.
    schedule : object
        ``tau`` (local steps for the next round), ``observe(replies) -> info``
        and ``state()``.
    selector : object
        ``select(server_round, node_ids, SelectionContext) -> node_ids``.
    policy : RoundPolicy
        Deadline, quorum and hard timeout of each round.
    min_nodes : int
        Sites that must be connected before a round starts.
    fraction_evaluate : float
        Fraction of connected sites asked to evaluate (0 disables).
    node_wait_timeout : float
        Seconds to wait for ``min_nodes`` sites before failing.
    time_budget : float
        Per-round wall-clock budget sent to sites (0 = none): a site stops local
        training after it and reports the steps it actually did.
    codec : str
        Update codec spec for the uplink (:mod:`strategies.compression`).
    error_feedback : bool
        Whether sites keep an error-feedback residual for lossy codecs.
    federation : str
        Stable id of the federation (the MLflow run id); sites key their
        persistent state (residuals) by it.
    seed : int
        Base of the per-round, per-site codec seeds (``randk``, ``qsgd``).
    max_empty_rounds : int
        Abort after this many consecutive rounds without one usable reply.
    local_solver : LocalSolver, optional
        The sites' local optimiser settings; the server computes each reply's
        FedNova a-norm from its reported steps with it (default: plain steps).
    """

    def __init__(
        self,
        *,
        aggregator,
        schedule,
        selector,
        policy: RoundPolicy | None = None,
        min_nodes: int = 2,
        fraction_evaluate: float = 1.0,
        node_wait_timeout: float = 120.0,
        time_budget: float = 0.0,
        codec: str = "none",
        error_feedback: bool = True,
        federation: str = "",
        seed: int = 0,
        max_empty_rounds: int = 3,
        local_solver: LocalSolver | None = None,
    ) -> None:
        if min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        self.aggregator = aggregator
        self.schedule = schedule
        self.selector = selector
        self.policy = policy or RoundPolicy()
        self.min_nodes = min_nodes
        self.fraction_evaluate = fraction_evaluate
        self.node_wait_timeout = node_wait_timeout
        self.time_budget = time_budget
        self.codec = str(parse_spec(codec))
        self.error_feedback = error_feedback
        self.federation = federation
        self.seed = seed
        self.max_empty_rounds = max_empty_rounds
        self.local_solver = local_solver or LocalSolver()
        self._tau_sent: dict[int, int] = {}
        self._codec_seeds: dict[int, int] = {}
        self._down_bytes: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._last_losses: dict[int, float] = {}
        self._keys: list[str] = []
        self._global: list[np.ndarray] = []
        self._sent: dict[int, str] = {}
        self._site_of: dict[int, str] = {}
        self._late_ids: dict[str, int] = {}
        self._empty_rounds = 0
        self.reports: dict[int, RoundReport] = {}

    # ------------------------------------------------------------------ helpers
    def summary(self) -> None:
        """Log the strategy's configuration."""
        log(INFO, "\t├──> Aggregator: %s | schedule: %s (tau %d) | selector: %s",
            type(self.aggregator).__name__, type(self.schedule).__name__,
            self.schedule.tau, type(self.selector).__name__)
        log(INFO, "\t├──> Round policy: deadline %.0f s, quorum %s, timeout %.0f s",
            self.policy.deadline, self.policy.quorum or "all", self.policy.timeout)
        log(INFO, "\t└──> Sites: min %d; wait for them at most %.0f s",
            self.min_nodes, self.node_wait_timeout)

    def _report(self, server_round: int) -> RoundReport:
        return self.reports.setdefault(server_round, RoundReport(server_round))

    def _label(self, node_id: int) -> str:
        return self._site_of.get(node_id, f"node-{node_id}")

    def _messages(
        self, node_ids: list[int], arrays: ArrayRecord, config: ConfigRecord,
        server_round: int, message_type: str,
        extra: Callable[[int], dict] | None = None,
    ) -> list[Message]:
        messages = []
        for node_id in node_ids:
            site_config = ConfigRecord(dict(config))
            site_config[keys.SERVER_ROUND] = server_round
            site_config.update(extra(node_id) if extra else {})
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
                dropped[label] = "no reply before the round closed (deadline or timeout)"
                log(WARNING, "%s: no reply from %s before the round closed", stage, label)
        return accepted

    # -------------------------------------------------------------------- train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Select sites and send each its own instruction with this round's tau."""
        self._keys = list(arrays.keys())
        self._global = arrays.to_numpy_ndarrays()
        nodes = wait_for_nodes(grid, self.min_nodes, self.node_wait_timeout)
        report = self._report(server_round)
        context = SelectionContext(
            sizes=dict(self._sizes), last_losses=dict(self._last_losses),
            query_losses=lambda candidates, subset: self._query_losses(
                grid, server_round, arrays, candidates, subset, report))
        node_ids = self.selector.select(server_round, nodes, context)
        if not node_ids:
            raise NoValidRepliesError(f"round {server_round}: the selector chose no site")
        for node, name in self._site_of.items():
            if node not in nodes:  # a known site whose SuperNode is gone: a failed site
                report.train_dropped[name] = "site offline: not connected to the SuperLink"
                log(WARNING, "configure_train: %s is offline", name)
        self._record_selection(report)
        log(INFO, "configure_train: %d sites selected of %d connected, tau %d",
            len(node_ids), len(nodes), self.schedule.tau)
        self._codec_seeds = {n: derive_seed(self.seed, server_round, n) for n in node_ids}
        self._tau_sent = {n: int(self.schedule.tau) for n in node_ids}

        def extra(node_id: int) -> dict:
            return {keys.LOCAL_STEPS: self._tau_sent[node_id],
                    keys.TIME_BUDGET: float(self.time_budget),
                    keys.CODEC: self.codec, keys.ERROR_FEEDBACK: self.error_feedback,
                    keys.CODEC_SEED: self._codec_seeds[node_id],
                    keys.FEDERATION: self.federation}

        messages = self._messages(node_ids, arrays, config, server_round, MessageType.TRAIN,
                                  extra)
        self._down_bytes = {m.metadata.dst_node_id: wire_size(m.content) for m in messages}
        return messages

    def _query_losses(self, grid: Grid, server_round: int, arrays: ArrayRecord,
                      candidates: list[int], subset: int, report: RoundReport
                      ) -> dict[int, float]:
        """Ask candidates for the global model's loss on their data (Flower ``query``)."""
        messages = []
        for node_id in candidates:
            config = ConfigRecord({keys.SERVER_ROUND: server_round, keys.LOSS_SUBSET: subset})
            messages.append(Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: config}),
                                    dst_node_id=node_id, message_type=MessageType.QUERY))
        sent = sum(wire_size(m.content) for m in messages)
        collected = collect_replies(grid, messages, self.policy,
                                    lambda m: m.has_content(), {})
        losses: dict[int, float] = {}
        received = 0
        for reply in collected.replies:
            node = reply.metadata.src_node_id
            try:
                parsed = parse_query_reply(reply)
            except InvalidReplyError as exc:
                log(WARNING, "query: dropped reply of %s: %s", self._label(node), exc)
                continue
            received += wire_size(reply.content)
            self._site_of[node] = parsed.site
            self._sizes[node] = parsed.num_examples
            losses[node] = parsed.metrics[keys.QUERY_LOSS]
        report.strategy.update({"query-bytes-down": float(sent),
                                "query-bytes-up": float(received),
                                "query-seconds": collected.seconds})
        return losses

    def _record_selection(self, report: RoundReport) -> None:
        last = getattr(self.selector, "last", {})
        label = self._label
        report.selection = {
            "selected": [label(n) for n in last.get("selected", [])],
            "candidates": [label(n) for n in last.get("candidates", [])],
            "losses": {label(n): float(v) for n, v in last.get("losses", {}).items()},
        }
        for key in ("d", "m"):
            if key in last:
                report.strategy[f"selection-{key}"] = float(last[key])
        report.times_selected = {label(n): float(c) for n, c in
                                 getattr(self.selector, "times_selected", {}).items()}

    def _parse_train(self, message: Message) -> TrainReply:
        node = message.metadata.src_node_id
        return parse_train_reply(message, self._global, self.codec,
                                 self._codec_seeds.get(node, 0),
                                 self._tau_sent.get(node, int(self.schedule.tau)),
                                 self.local_solver)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, aggregate the accepted updates, apply to the global model."""
        report = self._report(server_round)
        report.schedule_tau = int(self.schedule.tau)
        accepted: list[TrainReply] = self._collect(
            replies, report.train_dropped,
            self._parse_train, "aggregate_train",
        )
        dense = float(dense_bytes(self._global))
        for node, sent in self._down_bytes.items():
            report.traffic.setdefault(self._label(node), {})["bytes-down"] = float(sent)
        for reply in accepted:
            report.train[reply.site] = dict(reply.metrics)
            self._sizes[reply.node_id] = reply.num_examples
            self._last_losses[reply.node_id] = reply.train_loss
            traffic = report.traffic.setdefault(reply.site, {})
            traffic["bytes-up"] = float(reply.wire_bytes)
            traffic["uplink-ratio"] = dense / max(reply.wire_bytes, 1)
        ups = [t["bytes-up"] for t in report.traffic.values() if "bytes-up" in t]
        downs = [t["bytes-down"] for t in report.traffic.values() if "bytes-down" in t]
        report.strategy.update({"bytes-up": float(sum(ups)), "bytes-down": float(sum(downs)),
                                "dense-bytes": dense})
        if ups:
            report.strategy["uplink-ratio"] = dense * len(ups) / sum(ups)
        report.strategy.update(self.schedule.observe(accepted))
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
        delta, info = self.aggregator.aggregate(accepted)
        report.strategy.update(info)
        updated = [np.asarray(g - d).astype(g.dtype, copy=False)
                   for g, d in zip(self._global, delta)]
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
        nodes = wait_for_nodes(grid, self.min_nodes, self.node_wait_timeout)
        count = min(len(nodes), max(self.min_nodes,
                                    math.ceil(self.fraction_evaluate * len(nodes))))
        return self._messages(nodes[:count], arrays, config, server_round,
                              MessageType.EVALUATE)

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

    # --------------------------------------------------------------- checkpoint
    def snapshot(self) -> dict:
        """The strategy's state to checkpoint (plug-ins and what it learnt of the sites)."""
        return {"aggregator": self.aggregator, "schedule": self.schedule,
                "selector": self.selector, "sizes": dict(self._sizes),
                "last_losses": dict(self._last_losses), "site_of": dict(self._site_of)}

    def restore(self, state: dict) -> None:
        """Continue from a :meth:`snapshot`."""
        self.aggregator, self.schedule = state["aggregator"], state["schedule"]
        self.selector = state["selector"]
        self._sizes, self._last_losses = dict(state["sizes"]), dict(state["last_losses"])
        self._site_of = dict(state["site_of"])

    # -------------------------------------------------------------------- loop
    def _is_valid(self, stage: str, message: Message) -> bool:
        """Whether a reply counts towards the quorum (same checks as aggregation)."""
        try:
            if stage == "train":
                self._parse_train(message)
            else:
                parse_evaluate_reply(message)
        except InvalidReplyError:
            return False
        return True

    def _exchange(self, grid: Grid, messages: Iterable[Message], report: RoundReport,
                  stage: str) -> list[Message]:
        collected = collect_replies(grid, messages, self.policy,
                                    lambda m: self._is_valid(stage, m), self._late_ids)
        for late in collected.late:
            name = site_name(late) if late.has_content() else self._label(
                late.metadata.src_node_id)
            report.late_arrivals.append(name)
            log(WARNING, "%s: late reply from %s (an earlier round) dropped", stage, name)
        report.missing[stage] = len(collected.missing)
        return collected.replies

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
        first_round: int = 1,
    ) -> Result:
        """Run rounds ``first_round .. num_rounds`` under the round policy.

        Same contract as :meth:`Strategy.start` (``timeout`` is ignored: the
        :class:`RoundPolicy` bounds every wait), plus ``on_round_end``, called
        with the round's :class:`RoundReport` and the new global arrays after
        each round, and ``first_round`` (> 1 when resuming from a checkpoint).
        """
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        train_config = train_config or ConfigRecord()
        evaluate_config = evaluate_config or ConfigRecord()
        result = Result()
        arrays = initial_arrays
        for server_round in range(first_round, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %d/%d]", server_round, num_rounds)
            started = time.monotonic()
            report = self._report(server_round)
            replies = self._exchange(
                grid, self.configure_train(server_round, arrays, train_config, grid),
                report, "train")
            new_arrays, train_metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                arrays = result.arrays = new_arrays
            if train_metrics is not None:
                result.train_metrics_clientapp[server_round] = train_metrics
            replies = self._exchange(
                grid, self.configure_evaluate(server_round, arrays, evaluate_config, grid),
                report, "evaluate")
            eval_metrics = self.aggregate_evaluate(server_round, replies)
            if eval_metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = eval_metrics
            if evaluate_fn is not None:
                central = evaluate_fn(server_round, arrays)
                if central is not None:
                    result.evaluate_metrics_serverapp[server_round] = central
            report.seconds = time.monotonic() - started
            if on_round_end is not None:
                on_round_end(report, arrays)
        result.arrays = arrays
        return result
