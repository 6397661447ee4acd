"""The egress filter holds SecAgg+ stages and vertical stages to their protocols (issue #44,
item 3): genuine stage replies of the product's sites pass, altered ones are refused naming
the rule; nothing but the protocol's entries, of the protocol's sizes, leaves."""

from __future__ import annotations

import copy

import numpy as np
import private_set_intersection.python as psi
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

from app.site_runtime.egress_filter import EgressFilter
from strategies.wire import message_keys as keys
from tests.app.egress_runs import Capture, Exchange
from tests.app.test_egress_filter import metrics, replaced, verdict

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def secagg(x: Exchange, **entries) -> ConfigRecord:
    """``x``'s ``secagg`` record with ``entries`` replaced (``key_c`` as ``key-c``)."""
    record = dict(x.reply.content[keys.SECAGG])
    record.update({name.replace("_", "-"): value for name, value in entries.items()})
    return ConfigRecord(record)


def vertical(x: Exchange, **arrays) -> ArrayRecord:
    """``x``'s ``vertical`` arrays with ``arrays`` replaced or added (numpy)."""
    record = dict(x.reply.content[keys.VERTICAL].items())
    record.update({name: Array(np.ascontiguousarray(value)) for name, value in arrays.items()})
    return ArrayRecord(record)


def judged(capture: Capture, x: Exchange, reply) -> str | None:
    """The rule the run's filter (which saw the federation's earlier messages) names."""
    return capture.egress.check(x.message, reply, x.context, x.policy).rule


@pytest.fixture(scope="module")
def rounds(egress_run) -> Capture:
    return egress_run("secagg")


def test_setup_sends_two_distinct_public_keys_only(rounds):
    x = rounds.of("train", keys.SECAGG_SETUP)[0]
    assert verdict(x, x.reply).passed
    key = x.reply.content[keys.SECAGG][keys.SECAGG_KEY_C]
    for record in (secagg(x, key_s=key), secagg(x, key_c=key + b"\x00"),
                   secagg(x, note=b"patient 42")):
        assert verdict(x, replaced(x, secagg=record)).rule == "egress.text"


def test_share_keys_sends_one_ciphertext_per_peer_of_the_protocols_size(rounds):
    x = rounds.of("train", keys.SECAGG_SHARE_KEYS)[0]
    assert verdict(x, x.reply).passed
    ciphertexts = list(x.reply.content[keys.SECAGG][keys.SECAGG_CIPHERTEXTS])
    peers = list(x.reply.content[keys.SECAGG][keys.SECAGG_SHARE_TO])
    for record in (secagg(x, ciphertexts=[ciphertexts[0] + b"42", *ciphertexts[1:]]),
                   secagg(x, ciphertexts=ciphertexts[1:]), secagg(x, share_to=peers[::-1]),
                   secagg(x, commitment=b"patient 42")):
        assert verdict(x, replaced(x, secagg=record)).rule == "egress.text"


def test_unmask_sends_shares_of_the_survivors_and_itself_only(rounds):
    x = rounds.of("train", keys.SECAGG_UNMASK)[0]
    assert verdict(x, x.reply).passed
    entries = x.reply.content[keys.SECAGG]
    owners = list(entries[keys.SECAGG_SEED_SHARES_OF])
    outsider = x.config[keys.SECAGG_PARTICIPANTS] + 1
    shares = list(entries[keys.SECAGG_SEED_SHARES])
    for record in (secagg(x, seed_shares_of=sorted([*owners, outsider]),
                          seed_shares=[*shares, shares[0]]),
                   secagg(x, key_shares_of=[owners[0]], key_shares=[shares[0]]),
                   secagg(x, seed_shares=[shares[0][:-1], *shares[1:]])):
        assert verdict(x, replaced(x, secagg=record)).rule == "egress.text"


def test_collect_sends_the_masked_vector_of_its_size_and_no_residual_norm(rounds):
    x = rounds.of("train", keys.SECAGG_COLLECT)[0]
    assert verdict(x, x.reply).passed
    masked = x.reply.content[keys.DELTA][keys.SECAGG_MASKED].numpy()
    shorter = ArrayRecord({keys.SECAGG_MASKED: Array(masked[:-1].copy())})
    assert verdict(x, replaced(x, delta=shorter)).rule == "egress.array-shape"
    assert verdict(x, metrics(x, residual_norm=1.0)).rule == "egress.metric-name"
    assert verdict(x, replaced(x, secagg=ConfigRecord({"a": 1}))).rule == "egress.record-keys"


def test_a_vertical_site_names_only_its_declared_department(egress_run):
    capture = egress_run("pvfed")
    x = capture.of(keys.VERTICAL_MESSAGE_TYPE, "describe")[0]
    assert verdict(x, x.reply).passed
    info = dict(x.reply.content[keys.SITE])
    for record in ({**info, "department": "patient-42"}, {**info, "note": "x"},
                   {"department": info["department"]}):
        assert verdict(x, replaced(x, site=ConfigRecord(record))).rule == "egress.text"


def test_psi_replies_are_canonical_psi_messages_of_curve_points(egress_run):
    capture = egress_run("pvfed")
    request = capture.of(keys.VERTICAL_MESSAGE_TYPE, "psi-request")[0]
    data = request.reply.content[keys.VERTICAL]["request"].numpy()
    assert verdict(request, request.reply).passed
    for altered in (np.concatenate([data, np.frombuffer(b"\x90\x03\x05", np.uint8)]),
                    np.frombuffer(b"patient 42", np.uint8)):
        reply = replaced(request, vertical=vertical(request, request=altered))
        assert verdict(request, reply).rule == "egress.array-shape"
    step = capture.of(keys.VERTICAL_MESSAGE_TYPE, "psi-step",
                      lambda x: "response-0" in x.reply.content[keys.VERTICAL])[0]
    assert verdict(step, step.reply).passed
    response = psi.Response()
    response.ParseFromString(step.reply.content[keys.VERTICAL]["response-0"].numpy().tobytes())
    del response.encrypted_elements[-1]
    fewer = np.frombuffer(response.SerializeToString(), np.uint8)
    reply = replaced(step, vertical=vertical(step, **{"response-0": fewer}))
    assert verdict(step, reply).rule == "egress.array-shape"
    assert verdict(step, metrics(step, psi_size=24)).rule == "egress.metric-range"


def test_a_pvfed_encoder_has_one_row_per_aligned_patient(egress_run):
    capture = egress_run("pvfed")
    x = capture.of(keys.VERTICAL_MESSAGE_TYPE, "pvfed-local")[0]
    assert judged(capture, x, x.reply) is None
    embedding = x.reply.content[keys.VERTICAL]["embedding.weight"].numpy()
    extra = np.concatenate([embedding, embedding[:1]])
    assert judged(capture, x, replaced(x, vertical=vertical(
        x, **{"embedding.weight": extra}))) == "egress.array-shape"
    assert verdict(x, x.reply).rule == "egress.model-unknown"  # a filter that missed the PSI


def test_split_learning_sends_its_batches_gradients_and_part_only(egress_run):
    capture = egress_run("split-u")
    train = capture.of(keys.VERTICAL_MESSAGE_TYPE, "split-train",
                       lambda x: "activation-0" in x.reply.content[keys.VERTICAL])[0]
    assert judged(capture, train, train.reply) is None
    activation = train.reply.content[keys.VERTICAL]["activation-0"].numpy()
    labels = np.ones((activation.shape[0], 1), np.float32)  # U-shaped: labels stay at the site
    assert judged(capture, train, replaced(train, vertical=vertical(
        train, **{"label-0": labels}))) == "egress.array-name"
    assert judged(capture, train, replaced(train, vertical=vertical(
        train, **{"activation-0": activation[:-1]}))) == "egress.array-shape"
    head = capture.of(keys.VERTICAL_MESSAGE_TYPE, "split-head")[0]
    gradient = head.reply.content[keys.VERTICAL]["gradient-0"].numpy()
    assert judged(capture, head, head.reply) is None
    assert judged(capture, head, replaced(head, vertical=vertical(
        head, **{"gradient-0": gradient.reshape(1, -1)}))) == "egress.array-shape"


def test_split_evaluation_counts_the_rows_it_was_sent(egress_run):
    capture = egress_run("split")
    x = capture.of(keys.VERTICAL_MESSAGE_TYPE, "split-eval-finish",
                   lambda x: "test-examples" in x.reply.content[keys.METRICS])[0]
    assert verdict(x, x.reply).passed
    rows = int(x.reply.content[keys.METRICS]["test-examples"])
    assert verdict(x, metrics(x, test_examples=rows + 1)).rule == "egress.metric-range"
    assert verdict(x, replaced(x, metrics=MetricRecord({"test-auc": 2.0}))).rule == \
        "egress.metric-range"


def test_a_vertical_reply_to_an_unknown_stage_is_refused(egress_run):
    x = egress_run("split").of(keys.VERTICAL_MESSAGE_TYPE, "describe")[0]
    message = copy.deepcopy(x.message)
    message.content[keys.CONFIG] = ConfigRecord({**x.config, keys.VERTICAL_STAGE: "exfiltrate"})
    assert EgressFilter().check(message, x.reply, x.context, x.policy).rule == \
        "egress.instruction"
