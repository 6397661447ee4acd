"""Malicious sites in the in-process engine (``app/engine/attacks.py``) against the real strategy:
three scripted sites, one of which lies in its replies."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, \
    RecordDict

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, VirtualSite
from app.engine.attacks import SiteAttack, attacking_site, label_flipped_copy
from app.server_app import build_strategy
from strategies.wire.errors import ConfigError
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1

INITIAL = [np.zeros(4, np.float32), np.array(0, np.int64)]


def _round(attack: SiteAttack | None, **run_config):
    """One round on three scripted sites (each update: x_local = x_global + 1), site-0
    attacking; the new global float array and the round's report."""
    sites = [VirtualSite({"site-name": f"site-{i}"}, ScriptedSite(f"site-{i}", num_examples=10))
             for i in range(3)]
    if attack is not None:
        sites[0] = attacking_site(sites[0], attack)
    config = RunConfig.from_mapping({"min-nodes": 3, "node-wait-timeout": 5, **run_config})
    strategy = build_strategy(config)
    result = strategy.start(grid=InProcessGrid(sites, run_id=42),
                            initial_arrays=ArrayRecord(INITIAL), num_rounds=1)
    return result.arrays.to_numpy_ndarrays()[0], strategy.reports[1]


def test_honest_sites_move_the_model_by_their_update():
    weights, report = _round(None, **{"strategy.defence": "none"})
    np.testing.assert_allclose(weights, np.ones(4))
    assert sorted(report.train) == ["site-0", "site-1", "site-2"]


def test_a_boosted_update_takes_fedavg_over_without_a_defence():
    weights, _ = _round(SiteAttack(scale=1000.0), **{"strategy.defence": "none"})
    np.testing.assert_allclose(weights, np.full(4, (1000 + 1 + 1) / 3), rtol=1e-6)


def test_norm_bound_at_three_sites_bounds_the_boosted_update():
    weights, _ = _round(SiteAttack(scale=1000.0), **{"strategy.defence": "norm-bound",
                                                     "norm-bound.kappa": 3.0})
    # every update is scaled to at most kappa = 3 x the round's median norm (that of ones)
    np.testing.assert_allclose(weights, np.full(4, (3 + 1 + 1) / 3), rtol=1e-5)


def test_a_sign_flip_and_a_claimed_example_count_reach_the_aggregator():
    weights, report = _round(SiteAttack(scale=-1.0, claim_examples=80),
                             **{"strategy.defence": "none", "federation.max-size-ratio": 0.0})
    # example-weighted: 80 x (-1) + 10 + 10 over 100 (no relative cap: the first claim is the
    # site's cap)
    np.testing.assert_allclose(weights, np.full(4, (-80 + 10 + 10) / 100), rtol=1e-6)
    assert report.train["site-0"]["num-examples"] == 80


def test_noise_replaces_the_update_seeded_by_the_round():
    attack = SiteAttack(noise_std=2.0, seed=7)
    weights, _ = _round(attack, **{"strategy.defence": "none"})
    noise = attack.update_vector(np.zeros(4, np.float32), 1)
    np.testing.assert_allclose(weights, -(noise - 1 - 1) / 3, rtol=1e-5)
    assert not np.allclose(noise, attack.update_vector(np.zeros(4, np.float32), 2))


def test_a_non_finite_update_is_dropped_by_the_reply_intake():
    weights, report = _round(SiteAttack(non_finite=True), **{"strategy.defence": "none"})
    np.testing.assert_allclose(weights, np.ones(4))
    assert list(report.train_dropped) == ["site-0"]
    assert sorted(report.train) == ["site-1", "site-2"]


def test_forged_evaluate_metrics_reach_the_report():
    _, report = _round(SiteAttack(report_metrics={"val-dice": 0.99}))
    assert report.evaluate["site-0"]["val-dice"] == pytest.approx(0.99)
    assert report.evaluate["site-1"]["val-dice"] == pytest.approx(0.5)


def test_attacks_are_checked():
    with pytest.raises(ConfigError, match="noise_std"):
        SiteAttack(noise_std=-1.0)
    with pytest.raises(ConfigError, match="claim_examples"):
        SiteAttack(claim_examples=-3)
    with pytest.raises(ConfigError, match="exclude"):
        SiteAttack(noise_std=1.0, non_finite=True)


def test_a_label_flipped_copy_flips_the_training_labels_only(tmp_path):
    site = tmp_path / "hospital-00"
    (site / "images").mkdir(parents=True)
    (site / "images" / "a.png").write_bytes(b"png")
    (site / "images.csv").write_text("image_id,split,image,labels\n"
                                     "a,train,images/a.png,1\nb,train,images/b.png,0;1\n"
                                     "c,val,images/c.png,1\n")
    out = label_flipped_copy(site, tmp_path / "flipped")
    assert (out / "images.csv").read_text().splitlines() == [
        "image_id,split,image,labels", "a,train,images/a.png,0", "b,train,images/b.png,1;0",
        "c,val,images/c.png,1"]
    assert (out / "images" / "a.png").read_bytes() == b"png"
    with pytest.raises(ConfigError, match="exists"):
        label_flipped_copy(site, out)


# The attacks of issue #29, on one train / evaluate exchange of a site whose model has a
# BatchNorm layer: the honest reply packs its buffers raw as the ClientApp does.
BN_MODEL = {"conv.weight": np.full(3, 0.5, np.float32),
            "bn.running_mean": np.zeros(2, np.float32),
            "bn.running_var": np.array([1.0, 3.0], np.float32),
            "bn.num_batches_tracked": np.array(4, np.int64)}
BN_DELTA = [np.full(3, 0.1, np.float32), np.full(2, 0.2, np.float32),
            np.full(2, 0.3, np.float32), np.array(-1, np.int64)]


def _exchange(attack: SiteAttack, kind: str = "train") -> tuple[Message, Message]:
    """The honest and the attacked reply of one site to a ``kind`` instruction."""
    from app.engine.attacks import attacking_handler
    from strategies.rounds.instructions import pack_arrays, record_of
    from strategies.wire import message_keys as keys
    from strategies.wire.update_codec import pack_update

    instruction = Message(RecordDict({
        keys.ARRAYS: pack_arrays(record_of(BN_MODEL)),
        keys.CONFIG: ConfigRecord({keys.CODEC: "none", keys.SERVER_ROUND: 1})}),
        dst_node_id=7, message_type=kind)

    def honest(message: Message, context: Context) -> Message:
        content = RecordDict({keys.SITE: ConfigRecord({keys.SITE_NAME: "site-0"}),
                              keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 10, keys.STEPS: 8,
                                                          "val-auc": 0.7})})
        if kind == "train":
            content[keys.DELTA] = record_of(pack_update(BN_DELTA, "none", raw={1, 2}))
        return Message(content, reply_to=message)

    context = Context(run_id=42, node_id=7, node_config={}, state=RecordDict(), run_config={})
    return (honest(instruction, context),
            attacking_handler(attack, honest)(instruction, context))


def _delta(reply: Message) -> dict[str, np.ndarray]:
    from strategies.rounds.instructions import named_arrays

    return named_arrays(reply.content["delta"])


def test_a_poisoned_running_var_drives_the_mean_variance_negative():
    honest, attacked = _exchange(SiteAttack(poison_running_var=4.0))
    sent, kept = _delta(attacked), _delta(honest)
    # k (v + 1) with v the global running_var the instruction carried (array 2: raw-2)
    np.testing.assert_allclose(sent["raw-2"], 4.0 * (np.array([1.0, 3.0]) + 1.0))
    assert sent["raw-2"].dtype == np.float32
    # with 2 equal sites the plain mean update makes the new global variance negative
    new_var = BN_MODEL["bn.running_var"] - (sent["raw-2"] + kept["raw-2"]) / 2
    assert (new_var < 0).all()
    for key in ("payload", "raw-1", "raw-3"):  # weights, running mean, counter: honest
        np.testing.assert_array_equal(sent[key], kept[key])


def test_a_non_finite_buffer_leaves_the_payload_honest():
    honest, attacked = _exchange(SiteAttack(non_finite_buffer=True))
    sent, kept = _delta(attacked), _delta(honest)
    assert np.isnan(sent["raw-1"]).all() and np.isnan(sent["raw-2"]).all()
    np.testing.assert_array_equal(sent["payload"], kept["payload"])
    np.testing.assert_array_equal(sent["raw-3"], kept["raw-3"])  # the integer counter


def test_a_long_site_name_is_declared_in_every_reply():
    name = "x" * 300
    for kind in ("train", "evaluate"):
        honest, attacked = _exchange(SiteAttack(site_name=name), kind)
        assert attacked.content["site"]["name"] == name
        assert honest.content["site"]["name"] == "site-0"


def test_a_step_lie_changes_the_reported_steps_only():
    honest, attacked = _exchange(SiteAttack(claim_steps=1))
    assert attacked.content["metrics"]["steps"] == 1
    assert honest.content["metrics"]["steps"] == 8
    assert attacked.content["metrics"]["num-examples"] == 10
    np.testing.assert_array_equal(_delta(attacked)["payload"], _delta(honest)["payload"])


def test_a_metric_lie_changes_the_evaluate_reply():
    _, attacked = _exchange(SiteAttack(report_metrics={"val-auc": 1e6}), "evaluate")
    assert attacked.content["metrics"]["val-auc"] == 1e6


def test_buffer_attacks_need_buffers():
    def no_buffers(message, context):
        from strategies.wire.update_codec import pack_update
        content = RecordDict({"metrics": MetricRecord({"num-examples": 1})})
        content["delta"] = ArrayRecord({k: Array(v) for k, v in
                                        pack_update([np.ones(2, np.float32)], "none").items()})
        return Message(content, reply_to=message)

    from app.engine.attacks import attacking_handler
    from strategies.rounds.instructions import pack_arrays, record_of

    instruction = Message(RecordDict({"arrays": pack_arrays(record_of({"w": np.ones(2)})),
                                      "config": ConfigRecord({})}),
                          dst_node_id=7, message_type="train")
    context = Context(run_id=42, node_id=7, node_config={}, state=RecordDict(), run_config={})
    for attack, rule in ((SiteAttack(non_finite_buffer=True), "raw float"),
                         (SiteAttack(poison_running_var=2.0), "running_var")):
        with pytest.raises(ConfigError, match=rule):
            attacking_handler(attack, no_buffers)(instruction, context)
    with pytest.raises(ConfigError, match="claim_steps"):
        SiteAttack(claim_steps=-1)
    with pytest.raises(ConfigError, match="poison_running_var"):
        SiteAttack(poison_running_var=float("nan"))
