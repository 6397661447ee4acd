"""After the last round: the selected model on every site's test split, and the cross-site matrix.

The federation's model is chosen on the sites' ``val`` splits; its held-out
performance is measured once, at the end, on their ``test`` splits (issue 15,
item 4):

1. every connected site evaluates the selected model ``x`` on its test split
   (an evaluate message whose config says ``eval-split = "test"``): per-site and
   example-weighted test metrics;
2. with ``k > 0`` fine-tune steps, each site trains ``k`` local steps from ``x``
   (a train message with ``local-steps = k``, no codec, no error feedback,
   ``server-round = num_rounds + 1``) and its reply's update gives its locally
   adapted model ``x_i = x - delta_i``;
3. every site evaluates every ``x_i`` on its test split.

The result is the cross-site evaluation matrix ``M[r, c]`` = the task's main
test metric of model ``r`` (``"global"`` or ``"<site>-finetuned"``) at site
``c``, as in the cross-site validation of Roth et al. (2020), "Federated
learning for breast density classification: a real-world implementation",
DART/MICCAI workshops: the diagonal of the fine-tuned rows shows what local
adaptation gains at home, the off-diagonal cells what it costs elsewhere.
A cell is NaN where the site did not answer; where its policy withheld the
metric (a reply that names the rule, or a policy refusal such as
``share-finetuned-model`` for a fine-tune, which still gives the site's row) the
result records the rule (``CrossSiteResult.withheld``) and the table says
``withheld by site policy (<rule>)`` (:mod:`strategies.rounds.withheld`).

Every exchange is the round's own (:func:`strategies.rounds.instructions.exchange`:
the round policy and a :class:`ReplyIntake`), so one bad or silent site is
recorded with its reason and left out, never fatal. A site with only test data
has no train split: its fine-tune request fails (no row) but it is a column. Test replies are not capped
by the sites' validation sizes (another split); the weighted means use the
counts the sites report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from logging import INFO
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies.aggregation import apply_update
from strategies.rounds.instructions import (TrainPlan, Uplink, exchange, site_messages,
                                            wait_for_nodes)
from strategies.rounds.reply_intake import (InvalidReplyError, MetricsReply, Reply, ReplyIntake,
                                            parse_metrics_reply)
from strategies.rounds.round_metrics import example_weighted_metrics
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.site_book import SiteBook
from strategies.rounds.withheld import refused_rule, withheld_text
from strategies.wire import message_keys as keys
from strategies.wire.local_solver import LocalSolver

if TYPE_CHECKING:
    from strategies.rounds.federated_strategy import FederatedStrategy

__all__ = ["GLOBAL_ROW", "FINETUNED", "NO_TEST_ITEMS", "CrossSiteResult", "CrossSiteSetup",
           "cross_site_evaluation", "held_out_messages", "parse_test_reply"]

GLOBAL_ROW = "global"
FINETUNED = "-finetuned"
TEST_SPLIT = "test"
NO_TEST_ITEMS = "no item in the test split"


@dataclass(frozen=True)
class CrossSiteSetup:
    """What the evaluation borrows from the federation's strategy.

    Attributes
    ----------
    policy : RoundPolicy
        Deadline, quorum and timeout of every exchange.
    sites : SiteBook
        The federation's site names and identities (a reply under another
        node's name is dropped).
    uplink : Uplink
        The federation id and time budget sent with the fine-tune instruction
        (its codec and error feedback are turned off).
    solver : LocalSolver
        The sites' local optimiser (for the train reply's a-norm).
    node_wait_timeout : float
        Seconds to wait for at least one connected site.
    """

    policy: RoundPolicy
    sites: SiteBook
    uplink: Uplink
    solver: LocalSolver
    node_wait_timeout: float

    @classmethod
    def of(cls, strategy: FederatedStrategy) -> CrossSiteSetup:
        """The setup of a :class:`~strategies.rounds.federated_strategy.FederatedStrategy`."""
        return cls(policy=strategy.policy, sites=strategy.sites, uplink=strategy.uplink,
                   solver=strategy.local_solver, node_wait_timeout=strategy.node_wait_timeout)


@dataclass
class CrossSiteResult:
    """The end-of-federation test evaluation.

    Attributes
    ----------
    metric : str
        The matrix's metric (``test-<main metric>``).
    sites : dict[str, dict[str, float]]
        Per site, its test metrics of the selected model.
    weighted : dict[str, float]
        Example-weighted test metrics (``num-examples`` is the total).
    rows, columns : list[str]
        Matrix labels: ``"global"`` then ``"<site>-finetuned"``; the sites.
    matrix : numpy.ndarray
        ``len(rows) x len(columns)``; NaN where there is no value.
    dropped : dict[str, str]
        ``"<stage>/<site>"`` (stage ``test``, ``finetune`` or a row) -> why
        that site's reply was left out.
    withheld : dict[str, str]
        ``"<stage>/<site>"`` -> the policy rules under which that site withheld its
        metrics (or refused its fine-tune: a ``finetune`` stage).
    """

    metric: str
    sites: dict[str, dict[str, float]] = field(default_factory=dict)
    weighted: dict[str, float] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    dropped: dict[str, str] = field(default_factory=dict)
    withheld: dict[str, str] = field(default_factory=dict)

    def withheld_cells(self) -> dict[tuple[int, int], str]:
        """``(row, column)`` -> the rules under which that cell's site withheld it: its
        row's fine-tune refused, or its metrics withheld at evaluation."""
        cells: dict[tuple[int, int], str] = {}
        for i, row in enumerate(self.rows):
            refused = self.withheld.get(f"finetune/{row.removesuffix(FINETUNED)}")
            stage = TEST_SPLIT if row == GLOBAL_ROW else row
            for j, column in enumerate(self.columns):
                rules = (refused if row != GLOBAL_ROW else None) or self.withheld.get(
                    f"{stage}/{column}")
                if rules and np.isnan(self.matrix[i, j]):
                    cells[i, j] = rules
        return cells

    def table(self) -> dict[str, list]:
        """The matrix as columns of a table: ``model`` then one column per site; a withheld
        cell holds ``withheld by site policy (<rule>)``, not NaN."""
        notes = self.withheld_cells()
        out: dict[str, list] = {"model": list(self.rows)}
        for j, column in enumerate(self.columns):
            out[column] = [withheld_text(notes[i, j]) if (i, j) in notes else float(v)
                           for i, v in enumerate(self.matrix[:, j])]
        return out


def parse_test_reply(message: Message, *, node_id: int | None = None) -> MetricsReply:
    """Validate a test-split evaluate reply; a site with no test item is dropped as such.

    A site without test items answers ``num-examples = 0`` (no error); that
    reply carries no metric and is recorded with :data:`NO_TEST_ITEMS`.

    Raises
    ------
    InvalidReplyError
        With the reason the reply is unusable.
    """
    record = message.content.get(keys.METRICS) if message.has_content() else None
    if isinstance(record, MetricRecord) and record.get(keys.NUM_EXAMPLES) == 0:
        raise InvalidReplyError(NO_TEST_ITEMS)
    return parse_metrics_reply(message, node_id=node_id)


def held_out_messages(node_ids: list[int], arrays: ArrayRecord, server_round: int,
                      federation: str = "") -> list[Message]:
    """Evaluate messages asking each node for ``arrays``'s metrics on its test split.

    ``federation`` keys the site's personalised state (FedBN's layers): with it a
    site also reports its personalised model's ``personalised-test-<metric>``.
    """
    config = {keys.EVAL_SPLIT: TEST_SPLIT, **({keys.FEDERATION: federation} if federation else {})}
    return site_messages(node_ids, arrays, ConfigRecord(config), server_round,
                         MessageType.EVALUATE)


class _Exchanges:
    """The evaluation's exchanges with the connected ``nodes``, all in round ``server_round``.

    ``dropped`` collects ``"<stage>/<site>"`` -> reason, ``withheld`` the same key ->
    the policy rules a site withheld under (a policy refusal is withheld, not
    dropped); ``labels`` the name each replying node is recorded under (a site whose
    replies were all dropped is still a column).
    """

    def __init__(self, grid: Grid, setup: CrossSiteSetup, nodes: list[int],
                 server_round: int) -> None:
        self.grid, self.setup, self.nodes, self.server_round = grid, setup, nodes, server_round
        self.dropped: dict[str, str] = {}
        self.withheld: dict[str, str] = {}
        self.labels: dict[int, str] = {}

    def send(self, messages: list[Message], stage: str, parse: Callable[..., Reply]
             ) -> list[Reply]:
        """One exchange of ``messages``; the accepted replies (the others in ``dropped``)."""
        book = self.setup.sites
        expected = {m.metadata.dst_node_id: book.label(m.metadata.dst_node_id)
                    for m in messages}
        taken = exchange(self.grid, messages, self.setup.policy,
                         ReplyIntake(f"cross-site {stage}", book, parse, expected)).taken
        for node, label in taken.labels.items():
            self.labels.setdefault(node, label)
        self.withheld.update({f"{stage}/{site}": rules for site, rules in taken.withheld.items()})
        for site, reason in taken.dropped.items():
            rule = refused_rule(reason)
            (self.withheld if rule else self.dropped)[f"{stage}/{site}"] = rule or reason
        return taken.accepted

    def test_row(self, arrays: ArrayRecord, stage: str) -> list[MetricsReply]:
        """Every node's test metrics of ``arrays``."""
        messages = held_out_messages(self.nodes, arrays, self.server_round,
                                     self.setup.uplink.federation)
        return self.send(messages, stage, parse_test_reply)

    def finetuned(self, arrays: ArrayRecord, steps: int) -> dict[str, ArrayRecord]:
        """Each site's model after ``steps`` local steps from ``arrays`` (``x - delta_i``)."""
        uplink = replace(self.setup.uplink, codec="none", error_feedback=False)
        plan = TrainPlan.for_round(self.nodes, steps, uplink, self.server_round)
        names, reference = list(arrays.keys()), arrays.to_numpy_ndarrays()
        messages = site_messages(self.nodes, arrays, ConfigRecord(), self.server_round,
                                 MessageType.TRAIN, lambda node: plan.settings(node, uplink))
        parse = partial(plan.parse_reply, reference=reference, solver=self.setup.solver)
        models: dict[str, ArrayRecord] = {}
        for reply in self.send(messages, "finetune", parse):
            updated, failure = apply_update(reference, reply.delta, names)
            if updated is None:
                self.dropped[f"finetune/{reply.site}"] = failure
                continue
            models[reply.site] = ArrayRecord({k: Array(v) for k, v in zip(names, updated)})
        return models

    def columns(self) -> list[str]:
        """The connected sites' names (bound name, else the name recorded, else ``node-<id>``)."""
        book = self.setup.sites
        return sorted({book.names.get(n) or self.labels.get(n) or book.label(n)
                       for n in self.nodes})


def cross_site_evaluation(grid: Grid, setup: CrossSiteSetup, arrays: ArrayRecord,
                          main_metric: str, finetune_steps: int, server_round: int,
                          on_stage: Callable[[str], None] | None = None) -> CrossSiteResult:
    """Test metrics of ``arrays`` at every connected site, and the cross-site matrix.

    Parameters
    ----------
    grid : Grid
        The federation's grid.
    setup : CrossSiteSetup
        Policy, site book, uplink and solver of the federation.
    arrays : ArrayRecord
        The selected model (best round, else final).
    main_metric : str
        The task's main metric without prefix (``dice``): the matrix holds
        ``test-<main_metric>``.
    finetune_steps : int
        Local steps ``k`` of the fine-tuned rows; 0 gives the global row only.
    server_round : int
        Round number sent with every message (``num_rounds + 1``: fresh seeds).
    on_stage : callable, optional
        Called with a progress line before each exchange (default: logged).
    """
    if finetune_steps < 0:
        raise ValueError(f"finetune_steps must be >= 0, got {finetune_steps}")
    nodes = wait_for_nodes(grid, 1, setup.node_wait_timeout)
    setup.sites.connected = set(nodes)
    note = on_stage or (lambda line: log(INFO, "%s", line))
    exchanges = _Exchanges(grid, setup, nodes, server_round)
    result = CrossSiteResult(metric=f"{TEST_SPLIT}-{main_metric}", dropped=exchanges.dropped,
                             withheld=exchanges.withheld)
    note(f"cross-site: {len(nodes)} sites evaluate the selected model on their test split")
    replies = exchanges.test_row(arrays, TEST_SPLIT)
    result.sites = {reply.site: dict(reply.metrics) for reply in replies}
    result.weighted = example_weighted_metrics(replies)
    rows = {GLOBAL_ROW: result.sites}
    if finetune_steps:
        note(f"cross-site: each site fine-tunes {finetune_steps} local steps")
        for site, model in sorted(exchanges.finetuned(arrays, finetune_steps).items()):
            row = f"{site}{FINETUNED}"
            note(f"cross-site: every site evaluates {row}")
            rows[row] = {reply.site: dict(reply.metrics)
                         for reply in exchanges.test_row(model, row)}
        refused = [key.split("/", 1)[1] for key in exchanges.withheld
                   if key.startswith("finetune/")]
        rows.update({f"{site}{FINETUNED}": {} for site in refused})
        rows = {GLOBAL_ROW: rows.pop(GLOBAL_ROW), **dict(sorted(rows.items()))}
    result.rows = list(rows)
    result.columns = sorted(set(exchanges.columns()) | {s for c in rows.values() for s in c})
    result.matrix = np.array([[cells.get(column, {}).get(result.metric, np.nan)
                               for column in result.columns] for cells in rows.values()],
                             dtype=float).reshape(len(result.rows), len(result.columns))
    return result
