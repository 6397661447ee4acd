"""A site's declared name is checked when it first replies (issue #29, found 4).

A name becomes part of MLflow metric names (``site/<name>/...``): one longer than
MLflow allows stopped all tracking. A name over 64 characters, or with a
character other than letters, digits, ``_``, ``-`` and ``.``, is refused: the
reply is dropped with the rule, recorded under ``node-<id>``, and never bound.
"""

from __future__ import annotations

import pytest

from strategies.rounds.site_book import SITE_NAME_MAX_LENGTH, SiteBook, site_name_problem
from tests.strategies.test_federated_strategy import _train_metrics, make_strategy
from tests.strategies.test_trust_boundary import _delta, _round

pytestmark = pytest.mark.usefixtures("server_identity")


@pytest.mark.parametrize("name", ["h" * (SITE_NAME_MAX_LENGTH + 1), "h" * 300, "a b",
                                  "a/b", "a:b", "ä", "..", "a\nb"])
def test_a_badly_named_site_is_dropped_with_the_rule_and_never_bound(name):
    strategy = make_strategy(min_nodes=1)
    _round(strategy, 1, [8, 2], {8: (_delta(0.0), _train_metrics(10), "good-site_1.a"),
                                 2: (_delta(5.0), _train_metrics(10), name)})
    report = strategy.reports[1]
    assert list(report.train) == ["good-site_1.a"]
    assert list(report.train_dropped) == ["node-2"]
    assert "site name rule" in report.train_dropped["node-2"]
    assert strategy.sites.names == {8: "good-site_1.a"}


def test_the_rule_names_length_and_characters():
    assert site_name_problem("h" * SITE_NAME_MAX_LENGTH) is None
    assert "at most 64" in site_name_problem("h" * 65)
    assert "letters, digits" in site_name_problem("a b")
    book = SiteBook()
    assert "site name rule" in book.identity_problem(3, "x" * 300)
    assert book.names == {}
    assert book.label_reply(3, "x" * 300) == "node-3"
