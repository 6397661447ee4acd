"""The egress filter lets every genuine reply through: a filter that breaks real federations
is worse than none (issue #44, item 3).

Each federation of :data:`tests.app.egress_runs.RUNS` runs the product's own sites under
one option set (codecs qsgd / topk / topk per layer / fp16 / randk / the cross-site
fine-tune's none, a compressed downlink, Power-of-Choice queries, personalisation,
DP-SGD, PruneFL's squared gradients, SCAFFOLD with FedBN's raw statistics, the four
SecAgg+ stages, split learning vanilla and U-shaped, PSI and pvFed); every reply is
judged as the site runtime judges it, and every metric any of them sends is declared
in the one table (:mod:`strategies.rounds.reply_intake`).
"""

from __future__ import annotations

import pytest

from strategies.rounds.reply_intake import declared
from strategies.wire import message_keys as keys
from tests.app.egress_runs import RUNS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Per run, (message type, stage, a config key the instruction must hold or None): what the run
#: must have exercised for its verdicts to mean something.
EXERCISED = {
    "compressed": [("train", "", keys.DOWNLINK_BASE), ("evaluate", "", keys.EVAL_SPLIT)],
    "query": [("query", "", None), ("train", "", None)],
    "pruned": [("train", "", keys.PRUNING_VERSION)],
    "scaffold": [("train", "", keys.CONTROL_VARIATES)],
    "secagg": [("train", stage, None) for stage in keys.SECAGG_STAGES],
    "split": [(keys.VERTICAL_MESSAGE_TYPE, stage, None) for stage in
              ("describe", "split-train", "split-eval-forward", "split-eval-finish")],
    "split-u": [(keys.VERTICAL_MESSAGE_TYPE, "split-head", None)],
    "pvfed": [(keys.VERTICAL_MESSAGE_TYPE, stage, None) for stage in
              ("psi-request", "psi-step", "pvfed-local", "pvfed-round")],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_genuine_reply_passes(egress_run, name):
    capture = egress_run(name)
    refused = [(x.message.metadata.message_type, x.stage, x.verdict.rule, x.verdict.detail)
               for x in capture.exchanges if not x.verdict.passed]
    assert capture.exchanges and not refused
    for kind, stage, key in EXERCISED[name]:
        assert capture.of(kind, stage, lambda x, k=key: k is None or k in x.config), (kind, stage)


def test_the_compressed_downlink_and_the_squared_gradients_were_checked(egress_run):
    compressed = egress_run("compressed").of(
        "train", where=lambda x: x.config.get(keys.DOWNLINK_BASE, 0) > 0)
    reports = egress_run("pruned").of("train", where=lambda x: bool(
        x.config.get(keys.PRUNING_REPORT)))
    assert compressed and reports
    assert all(keys.PRUNING_SQGRAD in x.reply.content[keys.DELTA] for x in reports)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_metric_the_product_sends_is_declared(egress_run, name):
    names = {metric for x in egress_run(name).exchanges if x.reply.has_content()
             for metric in x.reply.content.metric_records[keys.METRICS]}
    assert names and not [metric for metric in names if declared(metric) is None]
