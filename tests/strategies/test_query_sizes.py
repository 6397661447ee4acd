"""Power-of-Choice's query sizes are capped like the update's (issue #45, found 7).

A ``pow-d`` round first asks candidates for the global model's loss (a Flower ``query``);
the reply's ``num-examples`` (the site's training-set size) becomes the site's first
declaration, and the next rounds draw their candidates with probability proportional to
those sizes (Cho, Wang, Joshi 2022, Alg. 1). A site answering ``num-examples = 1e15`` (and
a high loss) was a candidate, and so trained, in every round after its first answer. Now the
selector weighs each site by its size held to the site book's relative cap
(:meth:`SiteBook.capped_sizes`, the rule the updates are weighted by).
"""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, MessageType

from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys
from tests.strategies.scripted_grid import scripted_grid
from tests.strategies.test_federated_strategy import _global_record, _reply

pytestmark = pytest.mark.usefixtures("server_identity")

LIAR, ROUNDS = 2, 30
HONEST = (3, 4, 5, 6)


def _query_answer(message: Message) -> Message:
    """Honest sites: 10 examples, loss 1; the liar: 1e15 examples, loss 5 (chosen whenever
    it is a candidate)."""
    node = message.metadata.dst_node_id
    assert message.metadata.message_type == MessageType.QUERY
    lying = node == LIAR
    return _reply(message, None, {keys.NUM_EXAMPLES: 10**15 if lying else 10,
                                  keys.QUERY_LOSS: 5.0 if lying else 1.0}, f"site-{node}")


def _liar_share(max_size_ratio: float = 3.0) -> float:
    """The share of rounds 2..ROUNDS in which the liar was a candidate (pow-d, m 1, d 2 of 5)."""
    grid = scripted_grid(dict.fromkeys((LIAR, *HONEST), _query_answer))
    strategy = FederatedStrategy(
        aggregator=AGGREGATORS.create("fedavg"), schedule=SCHEDULES.create("fixed", tau0=2),
        selector=SELECTORS.create("pow-d", m=1, d=2, seed=3), min_nodes=5,
        node_wait_timeout=1, max_size_ratio=max_size_ratio,
        policy=RoundPolicy(deadline=0.5, quorum=2, timeout=1.0, poll_interval=0.01))
    drawn = 0
    for server_round in range(1, ROUNDS + 1):
        strategy.configure_train(server_round, _global_record(), ConfigRecord(), grid)
        drawn += server_round > 1 and f"site-{LIAR}" in (
            strategy.reports[server_round].selection["candidates"])
    assert strategy.sites.sizes[LIAR] == 10**15  # its first declaration, kept as its cap
    return drawn / (ROUNDS - 1)


def test_a_huge_query_size_does_not_make_the_liar_a_candidate_every_round():
    uncapped = _liar_share(max_size_ratio=0.0)  # the relative cap off: what every run did
    assert uncapped > 0.95  # every round once the liar answered a query (round 1 or 2)
    share = _liar_share()
    # weighted as min(3 x 10, 40) = 30 against 4 x 10: a candidate of 2 drawn with
    # probability 3/7 + 4/7 x 1/2 = 0.71 (honest: 2/5)
    assert share < 0.85, share


def test_the_selector_weighs_sizes_held_to_the_relative_cap():
    book = SiteBook(sizes={1: 10, 2: 10**15, 3: 30, 4: 20})
    assert book.capped_sizes() == {1: 10, 2: 60, 3: 30, 4: 20}  # min(3 x median 20, sum 60)
    assert SiteBook(sizes={1: 10, 2: 10**15}, max_size_ratio=0.0).capped_sizes()[2] == 10**15
