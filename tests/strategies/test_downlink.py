"""Downlink compression with server error feedback: the invariant, sites in sync, resyncs."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.compression import CodecError, decode
from strategies.downlink import DownlinkCodecError, ServerDownlink, check_downlink_codec
from strategies.rounds.instructions import named_arrays
from strategies.wire.downlink_header import DownlinkHeader, PAYLOAD_KEY
from strategies.wire.downlink_receive import DownlinkSyncError, receive
from strategies.wire.downlink_reference import Reference

NAMES = ("conv.weight", "conv.bias", "bn.running_var", "bn.num_batches_tracked")


def _model(rng: np.random.Generator, batches: int) -> ArrayRecord:
    return ArrayRecord({
        NAMES[0]: Array(rng.normal(size=(6, 50)).astype(np.float32)),
        NAMES[1]: Array(rng.normal(size=6).astype(np.float32)),
        NAMES[2]: Array(rng.uniform(0.5, 2.0, size=6).astype(np.float32)),
        NAMES[3]: Array(np.array(batches, dtype=np.int64)),
    })


def _globals(rounds: int, seed: int = 0) -> list[ArrayRecord]:
    """A global model moving by a random aggregated update every round."""
    rng = np.random.default_rng(seed)
    models = [_model(rng, 0)]
    for t in range(1, rounds):
        step = _model(rng, 0).to_numpy_ndarrays()
        arrays = [a - 0.05 * s if a.dtype.kind == "f" else np.asarray(a + 10)
                  for a, s in zip(models[-1].to_numpy_ndarrays(), step)]
        arrays[2] = np.abs(arrays[2]) + 0.1  # a variance stays positive
        models.append(ArrayRecord(dict(zip(NAMES, (Array(a) for a in arrays)))))
    return models


class Site:
    """A site's downlink state: its reference, stored packed as on its disk."""

    def __init__(self) -> None:
        self.stored: dict | None = None

    def take(self, arrays: ArrayRecord, header: DownlinkHeader) -> Reference:
        held = None if self.stored is None else Reference.from_packed(self.stored)
        reference = receive(named_arrays(arrays), header, held)
        self.stored = reference.packed()
        return reference


def _round(server: ServerDownlink, t: int, model: ArrayRecord, sites: dict[int, Site],
           restarted: frozenset[int] = frozenset()) -> dict[int, DownlinkHeader]:
    """One round: prepare, each site receives (a restarted one raises), acks the version."""
    down = server.prepare(t, model, sorted(sites))
    for node, site in sites.items():
        if node in restarted:
            with pytest.raises(DownlinkSyncError, match="holds no reference"):
                site.take(down.arrays[node], down.headers[node])
            continue
        reference = site.take(down.arrays[node], down.headers[node])
        assert reference.checksum() == server.reference.checksum()
        for mine, theirs in zip(reference.arrays, server.reference.arrays):
            np.testing.assert_array_equal(mine, theirs)
        server.acknowledge(node, float(reference.version))
    return down.headers


def test_server_error_feedback_invariant():
    """sum of decoded steps + server residual == sum of the true aggregated updates."""
    server, models = ServerDownlink("topk:0.05", seed=3), _globals(12)
    first_model = Reference.of(named_arrays(models[0]), 1)
    sent = np.zeros(server_size := first_model.vector().size, np.float32)
    _round(server, 1, models[0], {5: Site()})
    first = server.reference.vector()
    for t in range(2, 13):
        down = server.prepare(t, models[t - 1], [5])
        header = down.headers[5]
        assert header.base == t - 1
        sent += decode(down.arrays[5][PAYLOAD_KEY].numpy(), header.codec, server_size,
                       seed=header.seed)
        server.acknowledge(5, float(t))
    true = Reference.of(named_arrays(models[-1]), 0).vector() - first_model.vector()
    assert np.linalg.norm(server.feedback.residual) > 0.1  # lossy: the residual is not zero
    np.testing.assert_allclose(sent + server.feedback.residual, true, atol=1e-5)
    np.testing.assert_allclose(server.reference.vector() - first, sent, atol=1e-5)


@pytest.mark.parametrize("spec", ["topk:0.1", "topk:0.1:layer"])
def test_sites_reconstruct_the_reference_over_rounds_and_after_a_restart(spec):
    server, models = ServerDownlink(spec), _globals(9)
    sites = {1: Site(), 2: Site()}
    headers = _round(server, 1, models[0], sites)
    assert all(h.dense for h in headers.values())  # nobody holds anything: dense, exact
    np.testing.assert_array_equal(server.reference.vector(),
                                  Reference.of(named_arrays(models[0]), 1).vector())
    for t in range(2, 6):
        headers = _round(server, t, models[t - 1], sites)
        assert [h.base for h in headers.values()] == [t - 1, t - 1]
    assert int(server.reference.arrays[3]) == 40  # integer buffers travel raw, exact
    sites[2] = Site()  # site 2 restarted without its state dir
    _round(server, 6, models[5], sites, restarted=frozenset({2}))
    headers = _round(server, 7, models[6], sites)  # no ack from 2: a dense snapshot
    assert headers[1].base == 6 and headers[2].dense
    headers = _round(server, 8, models[7], sites)
    assert [h.base for h in headers.values()] == [7, 7]


def test_a_node_left_out_of_a_round_gets_a_snapshot_of_the_reference():
    server, models = ServerDownlink("fp16"), _globals(4)
    a, b = Site(), Site()
    _round(server, 1, models[0], {1: a, 2: b})
    _round(server, 2, models[1], {1: a})
    headers = _round(server, 3, models[2], {1: a, 2: b})
    assert headers[1].base == 2 and headers[2].dense
    assert server.last.dense == 1


def test_checksum_mismatch_refused_then_dense_resync():
    server, models = ServerDownlink("topk:0.1"), _globals(4)
    site = Site()
    _round(server, 1, models[0], {1: site})
    _round(server, 2, models[1], {1: site})
    drifted = dict(site.stored)
    drifted["model"] = drifted["model"].copy()
    drifted["model"][0] ^= 1  # one flipped bit of the first weight, same version
    site.stored = drifted
    down = server.prepare(3, models[2], [1])
    assert down.headers[1].base == 2
    with pytest.raises(DownlinkSyncError, match="checksum"):
        site.take(down.arrays[1], down.headers[1])
    server.acknowledge(1, None)  # the error reply acknowledges nothing
    headers = _round(server, 4, models[3], {1: site})
    assert headers[1].dense


def test_step_against_another_version_refused():
    server, models = ServerDownlink("topk:0.1"), _globals(3)
    site = Site()
    _round(server, 1, models[0], {1: site})
    down = server.prepare(2, models[1], [1])
    stale = DownlinkHeader(**{**down.headers[1].__dict__, "base": 7})
    with pytest.raises(DownlinkSyncError, match="applies to version 7"):
        site.take(down.arrays[1], stale)


@pytest.mark.parametrize("spec", ["sign", "qsgd:16", "randk:0.1"])
def test_downlink_refuses_codecs_that_can_break_normalisation_statistics(spec):
    with pytest.raises(DownlinkCodecError, match="strategy.downlink-codec"):
        check_downlink_codec(spec)


def test_downlink_codec_spec_checked():
    assert check_downlink_codec("topk:0.01") == "topk:0.01"
    assert not ServerDownlink("none").active
    with pytest.raises(CodecError):
        check_downlink_codec("topk")
