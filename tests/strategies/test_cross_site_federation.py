"""The end-of-federation test evaluation names the federation (issue 16, item 3).

A FedBN site keys its normalisation layers by federation: a test-split evaluate
message without it reaches the site under another key, and the site reports no
personalised test metric. Every test-split message, of the global row and of the
fine-tuned rows, carries the federation id, as the rounds' evaluate messages do.
"""

from __future__ import annotations

import pytest
from flwr.app import MessageType

from strategies.wire import message_keys as keys
from tests.strategies.test_cross_site import Site, _run

pytestmark = pytest.mark.usefixtures("server_identity")


def test_every_test_split_message_names_the_federation():
    a, b = Site("a", 0.0, 1.0), Site("b", 0.5, 2.0)
    result = _run({3: a, 2: b}, k=2)
    assert len(result.rows) == 3
    for site in (a, b):
        tests = [m for m in site.received if m.metadata.message_type == MessageType.EVALUATE]
        assert len(tests) == 3  # the global row and the two fine-tuned rows
        assert all(m.content[keys.CONFIG][keys.FEDERATION] == "fed-1" for m in tests)
        assert all(m.content[keys.CONFIG][keys.EVAL_SPLIT] == "test" for m in tests)
