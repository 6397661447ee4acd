r"""Error feedback on both links against the book's eq. 3.9, on quadratics with a known optimum.

The book's chapter 3, eq. 3.9 (double compression): the aggregator compresses the
averaged compressed updates again, :math:`x_{t+1} = x_t + C(\frac1m \sum_i C(\Delta^{(i)}))`,
and, with error feedback at both the parties and the aggregator (§3.3.1.2, eq. 3.13 and
the remark after it), every compressor keeps what it dropped,
:math:`e_{t+1} = e_t + g_t - C(e_t + g_t)`. Here the product's own pieces play both
sides: each site's :class:`~strategies.compression.ErrorFeedback` on its uplink
(top-k), the server's :class:`~strategies.downlink.ServerDownlink` on the downlink (top-k
with the server's residual), and the site's
:func:`~strategies.wire.downlink_receive.receive` of the step. Site ``i`` minimises
:math:`f_i(x) = \frac12 \|x - c_i\|^2` by ``TAU`` gradient steps from the model it holds,
so the federation's optimum is :math:`\bar c`, the mean of the :math:`c_i`.

Property checks (they held before issue 50's fix and guard the paths): the residual
identity on every link and round, the telescoped sums (transmitted + residual = true),
the sites' reference within the server residual of the global model, and convergence to
:math:`\bar c`.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.compression import ErrorFeedback, decode
from strategies.downlink import ServerDownlink
from strategies.rounds.instructions import named_arrays
from strategies.wire.downlink_header import PAYLOAD_KEY
from strategies.wire.downlink_receive import receive
from strategies.wire.downlink_reference import Reference

SITES, SIZE, TAU, LR, ROUNDS = 4, 400, 5, 0.02, 300
#: What TAU gradient steps of rate LR on f_i keep of the distance to c_i.
KEEP = (1.0 - LR) ** TAU
#: fp16 values in the top-k payload: the identities hold to this (relative to the entry).
FP16 = 1e-6


def _residual(feedback: ErrorFeedback) -> np.ndarray:
    """The residual ``e`` (zero before the first compressed step)."""
    return feedback.residual if feedback.residual.size else np.zeros(SIZE, np.float32)


def _record(x: np.ndarray) -> ArrayRecord:
    return ArrayRecord({"w": Array(x.astype(np.float32))})


def _federation(uplink: str, downlink: str, rounds: int = ROUNDS, seed: int = 0):
    """Rounds of FedAvg with both links compressed; checks the identities of every round.

    Returns the optimum, the global model averaged over the second half of the rounds,
    the sites' final reference and, per site, the sums
    of the true and the transmitted updates and the final residual.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (SITES, SIZE)).astype(np.float32)
    x = np.zeros(SIZE, np.float32)
    server = ServerDownlink(downlink, seed=seed)
    feedback = [ErrorFeedback(uplink) for _ in range(SITES)]
    held: list[Reference | None] = [None] * SITES
    true_sums = np.zeros((SITES, SIZE), np.float64)
    sent_sums = np.zeros((SITES, SIZE), np.float64)
    down_true, down_sent = np.zeros(SIZE, np.float64), np.zeros(SIZE, np.float64)
    previous, tail = None, np.zeros(SIZE, np.float64)
    for t in range(1, rounds + 1):
        server_residual = _residual(server.feedback).copy()
        down = server.prepare(t, _record(x), list(range(SITES)))
        for node in range(SITES):
            header = down.headers[node]
            held[node] = receive(named_arrays(down.arrays[node]), header, held[node])
            server.acknowledge(node, held[node].version)
        reference = server.reference.vector()
        if previous is not None:  # a compressed step: the server's residual identity
            header = down.headers[0]
            step = decode(down.arrays[0][PAYLOAD_KEY].numpy(), header.codec, SIZE,
                          seed=header.seed)
            u = x - previous
            np.testing.assert_allclose(server.feedback.residual, server_residual + u - step,
                                       atol=FP16 * (1 + np.abs(u).max()))
            np.testing.assert_array_equal(reference, previous_reference + step)
            down_true += u
            down_sent += step
        np.testing.assert_allclose(reference + _residual(server.feedback), x,
                                   atol=1e-5 * (1 + np.abs(x).max()))
        updates = []
        for i in range(SITES):
            start = held[i].vector()
            np.testing.assert_array_equal(start, reference)  # every site holds x_hat
            local = centres[i] + KEEP * (start - centres[i])  # TAU steps on f_i
            delta = (start - local).astype(np.float32)  # x_global - x_local
            before = _residual(feedback[i]).copy()
            sent = decode(feedback[i].step(delta), uplink, SIZE)
            np.testing.assert_allclose(feedback[i].residual, before + delta - sent,
                                       atol=FP16 * (1 + np.abs(delta).max()))
            true_sums[i] += delta
            sent_sums[i] += sent
            updates.append(sent)
        previous, previous_reference = x, reference
        x = (x - np.mean(updates, axis=0)).astype(np.float32)
        if t > rounds // 2:
            tail += x / (rounds - rounds // 2)
    residuals = np.stack([f.residual for f in feedback])
    return (centres.mean(axis=0), tail, server.reference.vector(), true_sums, sent_sums,
            residuals, (down_true, down_sent, server.feedback.residual))


@pytest.mark.parametrize("uplink, downlink", [("topk:0.1", "topk:0.1"),
                                              ("topk:0.05", "topk:0.02")])
def test_residuals_keep_exactly_what_each_link_dropped(uplink, downlink):
    """Telescoped over the rounds: what a link transmitted plus its final residual is what
    it should have sent (e_T = sum g_t - sum C(e_t + g_t)), on every site and the server."""
    _, _, _, true_sums, sent_sums, residuals, down = _federation(uplink, downlink, rounds=30)
    assert np.linalg.norm(residuals) > 1e-3  # lossy: something was held back
    np.testing.assert_allclose(sent_sums + residuals, true_sums, atol=1e-4)
    down_true, down_sent, server_residual = down
    assert np.linalg.norm(server_residual) > 1e-4
    np.testing.assert_allclose(down_sent + server_residual, down_true, atol=1e-4)


@pytest.mark.parametrize("uplink, downlink, tolerance", [
    ("topk:0.1", "none", 0.02),  # eq. 3.13: EF on the uplink only
    ("none", "topk:0.05", 1e-3),  # the server's EF alone
    ("topk:0.1", "topk:0.1", 0.1),  # eq. 3.9 with EF at both ends
])
def test_double_compression_converges_to_the_known_optimum(uplink, downlink, tolerance):
    """EF on either link, and on both (eq. 3.9), reaches the mean of the sites' optima.

    With heterogeneous sites a top-k uplink's residuals keep re-sending each site's own
    pull at the optimum, so the iterates circle it; their average over the second half of
    the run (the bound of eq. 3.14 is on an average too) is checked, relative to the
    starting distance. The step is small on purpose (``1 - KEEP`` = 0.1 of the distance
    per round): at 0.67 a round the stale reference of the compressed downlink made the
    run diverge (EF acts as a delay), a property of the algorithm, not of its code.
    """
    optimum, average, reference, *_ = _federation(uplink, downlink)
    start = np.linalg.norm(optimum)
    assert start / np.sqrt(SIZE) > 0.3
    assert np.linalg.norm(average - optimum) < tolerance * start
    if uplink == "none":  # nothing circles: the reference the sites hold converges too
        assert np.linalg.norm(reference - optimum) < tolerance * start
