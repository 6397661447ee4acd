"""The egress filter refuses what the product's sites never send, naming the rule (issue #44,
item 3): each rule with a genuine reply of the product's own site that passes and a
malicious variant of it, as an approved but malicious app bundle would send it."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
from flwr.app import (Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord,
                      RecordDict)

from app.site_errors import error_reply
from app.site_runtime import egress_filter
from app.site_runtime.audit_record import decision_of
from app.site_runtime.egress_filter import EgressFilter, refusal_reply
from app.site_runtime.egress_refusal import EgressRefusal, EgressVerdict
from clients.site.policy import PolicyRefusal
from strategies.rounds.withheld import refused_rule
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import PAYLOAD_KEY
from tests.app.egress_runs import Exchange

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def replaced(x: Exchange, **records) -> Message:
    """``x``'s reply with ``records`` replaced or added (``None``: removed)."""
    content = RecordDict(dict(x.reply.content.items()))
    for name, record in records.items():
        if record is None:
            del content[name]
        else:
            content[name] = record
    return Message(content, reply_to=x.message)


def metrics(x: Exchange, **values) -> Message:
    """``x``'s reply with metric ``name`` set to ``value`` (``name_with_dashes`` as
    ``name-with-dashes``)."""
    record = dict(x.reply.content[keys.METRICS])
    record.update({name.replace("_", "-"): value for name, value in values.items()})
    return replaced(x, metrics=MetricRecord(record))


def delta(x: Exchange, **arrays) -> Message:
    """``x``'s reply with arrays of its ``delta`` replaced or added (numpy or Array)."""
    record = dict(x.reply.content[keys.DELTA].items())
    record.update({name.replace("_", "-"): value if isinstance(value, Array) else Array(value)
                   for name, value in arrays.items()})
    return replaced(x, delta=ArrayRecord(record))


def verdict(x: Exchange, reply: Message, egress: EgressFilter | None = None) -> EgressVerdict:
    """The filter's verdict on ``reply`` to ``x``'s message (the run's filter by default)."""
    return (egress or EgressFilter()).check(x.message, reply, x.context, x.policy)


@pytest.fixture(scope="module")
def compressed(egress_run):
    return egress_run("compressed")


@pytest.fixture(scope="module")
def dense_train(compressed) -> Exchange:
    """A train exchange of round 1 (a dense snapshot): a fresh filter can judge it."""
    return compressed.of("train", where=lambda x: x.config.get(keys.DOWNLINK_BASE) == 0)[0]


def test_an_extra_array_is_refused(dense_train):
    assert verdict(dense_train, dense_train.reply).passed
    refused = verdict(dense_train, delta(dense_train, notes=np.zeros(8, np.float32)))
    assert refused.rule == "egress.array-name" and "notes" not in refused.detail


def test_a_float_weight_sent_raw_is_refused(dense_train):
    # the 2.5D U-Net has no normalisation statistics: its weights go through the codec only
    refused = verdict(dense_train, delta(dense_train, raw_0=np.zeros(3, np.float32)))
    assert refused.rule == "egress.array-name"


def test_an_extra_record_is_refused(dense_train):
    refused = verdict(dense_train, replaced(dense_train, notes=ConfigRecord({"a": "b"})))
    assert refused.rule == "egress.record-keys"


def test_a_raw_statistic_of_another_shape_is_refused(egress_run):
    x = egress_run("scaffold").of("train")[0]  # FedBN: the running statistics travel raw
    raw = sorted(name for name in x.reply.content[keys.DELTA].keys() if name.startswith("raw-"))
    assert raw and verdict(x, x.reply).passed
    statistic = x.reply.content[keys.DELTA][raw[0]].numpy()
    refused = verdict(x, delta(x, **{raw[0].replace("-", "_"): statistic.reshape(1, -1)}))
    assert refused.rule == "egress.array-shape"


def test_an_array_whose_bytes_disagree_with_its_shape_is_refused(dense_train):
    payload = dense_train.reply.content[keys.DELTA][PAYLOAD_KEY]
    stream = io.BytesIO()
    np.save(stream, np.concatenate([payload.numpy(), np.zeros(64, np.uint8)]))
    lying = Array(dtype="uint8", shape=tuple(payload.shape), stype="numpy.ndarray",
                  data=stream.getvalue())
    assert verdict(dense_train, delta(dense_train, payload=lying)).rule == "egress.array-shape"


def test_a_payload_one_byte_longer_than_its_codec_declares_is_refused(dense_train):
    payload = dense_train.reply.content[keys.DELTA][PAYLOAD_KEY].numpy()  # qsgd:16:b64
    longer = np.concatenate([payload, np.zeros(1, np.uint8)])
    refused = verdict(dense_train, delta(dense_train, payload=longer))
    assert refused.rule == "egress.payload" and "qsgd:16:b64" in refused.detail


def test_ten_times_the_declared_bytes_are_refused(compressed):
    final = compressed.of("train", where=lambda x: x.config.get(keys.CODEC) == "none")[0]
    payload = final.reply.content[keys.DELTA][PAYLOAD_KEY].numpy()  # the cross-site fine-tune
    assert compressed.egress.check(final.message, final.reply, final.context, final.policy).passed
    refused = compressed.egress.check(final.message, delta(final, payload=np.tile(payload, 10)),
                                      final.context, final.policy)
    assert refused.rule == "egress.bytes"


def test_a_compressed_downlink_reply_needs_the_dense_model_seen_before(compressed):
    step = compressed.of("train", where=lambda x: x.config.get(keys.DOWNLINK_BASE, 0) > 0)[0]
    assert step.verdict.passed  # the run's filter saw the federation's dense snapshot
    assert verdict(step, step.reply).rule == "egress.model-unknown"


def test_text_as_a_metric_name_is_refused(dense_train):
    refused = verdict(dense_train, metrics(dense_train, **{"patient-0042-positive": 1.0}))
    assert refused.rule == "egress.metric-name" and "0042" not in refused.detail


def test_a_declared_metric_another_message_type_sends_is_refused(dense_train):
    assert verdict(dense_train, metrics(dense_train, val_dice=0.5)).rule == "egress.metric-name"


@pytest.mark.parametrize(("name", "value"), [
    ("train-loss", -1.0), ("num-examples", 2.5), ("train-loss", [1.0, 2.0]),
    ("downlink-version", 99)])
def test_a_metric_out_of_range_is_refused(dense_train, name, value):
    assert verdict(dense_train, metrics(dense_train, **{name: value})).rule == \
        "egress.metric-range"


def test_an_evaluate_reply_names_its_own_split_only(compressed):
    x = compressed.of("evaluate", where=lambda x: "personalised-val-dice" in
                      x.reply.content[keys.METRICS])[0]  # finetune: personalised metrics too
    assert verdict(x, x.reply).passed
    assert verdict(x, metrics(x, test_dice=0.5)).rule == "egress.metric-name"
    assert verdict(x, metrics(x, personalised_val_dice=1.5)).rule == "egress.metric-range"


def test_more_steps_than_tau_are_refused(dense_train):
    tau = dense_train.config[keys.LOCAL_STEPS]
    assert verdict(dense_train, metrics(dense_train, steps=tau)).passed
    assert verdict(dense_train, metrics(dense_train, steps=tau + 1)).rule == "egress.steps"


@pytest.mark.parametrize("site", [
    {"name": "hospital-99"}, {"policy": "0" * 16}, {"note": "patient 42 is positive"},
    {"withheld": "min-val-items,patient-42"}])
def test_text_in_the_site_record_is_refused(dense_train, site):
    record = {**dict(dense_train.reply.content[keys.SITE]), **site}
    assert verdict(dense_train, replaced(dense_train, site=ConfigRecord(record))).rule == \
        "egress.text"


def test_withheld_rules_pass_in_an_evaluate_reply_only(compressed, dense_train):
    x = compressed.of("evaluate")[0]
    for exchange in (x, dense_train):
        record = {**dict(exchange.reply.content[keys.SITE]),
                  keys.WITHHELD: "min-val-items,evaluate-trains"}
        result = verdict(exchange, replaced(exchange, site=ConfigRecord(record)))
        assert result.passed == (exchange is x)


def test_a_query_reply_is_held_to_its_loss_and_count(egress_run):
    x = egress_run("query").of("query")[0]
    assert verdict(x, x.reply).passed
    assert verdict(x, metrics(x, train_loss=0.5)).rule == "egress.metric-name"
    assert verdict(x, replaced(x, delta=ArrayRecord())).rule == "egress.record-keys"


def test_sanitised_error_replies_pass_and_free_text_is_refused(dense_train):
    x = dense_train
    refusal = error_reply(x.message, x.context, PolicyRefusal("max-local-steps", "20 > 10"))
    failure = error_reply(x.message, x.context, ValueError("/data/study-0042 unreadable"))
    assert verdict(x, refusal).passed and verdict(x, failure).passed
    site = x.reply.content[keys.SITE][keys.SITE_NAME]
    for code, reason in [
            (keys.POLICY_REFUSAL_CODE, f"site {site}: policy rule max-local-steps (refused): "
                                       "patient 42"),
            (keys.POLICY_REFUSAL_CODE, f"site {site}: policy rule patient-42 (refused)"),
            (4000, f"site {site}: PatientFortyTwo (details in the site's log)"),
            (4000, f"site hospital-99: ValueError (details in the site's log)"),
            (9999, f"site {site}: ValueError (details in the site's log)")]:
        malicious = Message(Error(code=code, reason=reason), reply_to=x.message)
        assert verdict(x, malicious).rule == "egress.error", reason


def test_a_reply_with_other_metadata_is_refused(dense_train):
    reply = replaced(dense_train)
    reply.metadata.group_id = "patient 42"
    assert verdict(dense_train, reply).rule == "egress.metadata"


def test_an_instruction_that_does_not_parse_refuses_its_reply(dense_train):
    message = copy.deepcopy(dense_train.message)
    message.content[keys.CONFIG] = ConfigRecord({**dense_train.config, keys.LOCAL_STEPS: "many"})
    result = EgressFilter().check(message, dense_train.reply, dense_train.context,
                                  dense_train.policy)
    assert result.rule == "egress.instruction"


def test_the_filter_fails_closed(dense_train, monkeypatch):
    def broken(*_):
        raise RuntimeError("a bug in the filter")
    monkeypatch.setattr(egress_filter, "check_metrics", broken)
    assert verdict(dense_train, dense_train.reply).rule == "egress.unchecked"


def test_the_refusal_names_the_rule_for_the_audit_and_the_server(dense_train):
    result = verdict(dense_train, metrics(dense_train, steps=10_000))
    site = dense_train.reply.content[keys.SITE][keys.SITE_NAME]
    refusal = refusal_reply(dense_train.message, site, result)
    assert refusal.error.code == keys.EGRESS_REFUSAL_CODE and not refusal.has_content()
    assert refusal.error.reason.startswith(f"site {site}: policy rule egress.steps (refused): ")
    assert decision_of(refusal) == ("refused", "egress.steps", keys.EGRESS_REFUSAL_CODE)
    assert refused_rule(refusal.error.reason) == "egress.steps"
    assert EgressFilter().refusal(dense_train.message, dense_train.context, result).error.reason \
        == refusal.error.reason


def test_a_detail_never_carries_a_path():
    assert EgressRefusal("egress.text", "read /data/study-0042").detail == \
        "a ConfigRecord value that is not one of its key's bounded, validated values " \
        "(site name, policy fingerprint, rule names, protocol entries)"
