"""The pruning section's checks, the combinations refused, and the mask surviving a checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from strategies.plugins.pruning.prunefl import PruneFL, PruningOptions
from strategies.plugins.registries import PRUNINGS, build, default_sections
from strategies.plugins.run_settings import RunSettings
from strategies.rounds.checkpoint import decode_tree, encode_tree
from strategies.wire.plugin_options import PluginError

SETTINGS = RunSettings(local_steps=5, num_rounds=3, fraction_train=1.0, min_nodes=1, seed=0,
                       optimizer="sgd")


@pytest.mark.parametrize(("values", "message"), [
    ({"mode": "channels"}, "'pruning.mode' must be one of \\['unstructured', 'structured'\\]"),
    ({"initial-density": 0.0}, "'pruning.initial-density' must be in \\(0, 1\\]"),
    ({"initial-density": 1.5}, "'pruning.initial-density' must be in \\(0, 1\\]"),
    ({"max-density": 0.2},
     "'pruning.max-density' must be in \\[pruning.initial-density = 0.3, 1\\]"),
    ({"max-density": 1.2}, "'pruning.max-density' must be in"),
    ({"decrease-fraction": 1.0}, "'pruning.decrease-fraction' must be a float in \\[0, 1\\)"),
    ({"interval": -1}, "'pruning.interval' must be an int >= 0"),
    ({"time-per-weight": 0.0}, "'pruning.time-per-weight' must be > 0"),
    ({"time-constant": -1.0}, "'pruning.time-constant' must be a float >= 0"),
    ({"report-codec": "sign"}, "'pruning.report-codec' must be one of none, fp16, topk"),
    ({"report-codec": "qsgd:8"}, "'pruning.report-codec' must be one of none, fp16, topk"),
    ({"report-codec": "zip"}, "'pruning.report-codec' is not a codec spec"),
    ({"stop-round": -2}, "'pruning.stop-round' must be an int >= 0"),
    ({"measure-time": 1}, "'pruning.measure-time' must be a bool"),
    ({"ratio": 1}, "unknown run config key 'pruning.ratio'"),
])
def test_bad_options_name_the_key(values, message):
    with pytest.raises(PluginError, match=message):
        PruningOptions.from_section(values)


def test_good_options_build_the_plugin_with_them():
    options = PruningOptions.from_section({"mode": "structured", "interval": 0,
                                           "report-codec": "topk:0.1", "initial-density": 0.2})
    pruning = build(PRUNINGS, "prunefl", {**default_sections(), "pruning": options}, SETTINGS)
    assert isinstance(pruning, PruneFL) and pruning.active
    assert (pruning.mode, pruning.interval, pruning.report_codec) == ("structured", 0, "topk:0.1")
    assert pruning.initial_density == 0.2 and pruning.version == 0 and pruning.masks == {}
    none = build(PRUNINGS, "none", default_sections(), SETTINGS)
    assert not none.active and none.mode == "" and none.version == 0 and none.masks == {}
    assert not none.report_due(5) and none.observe(5, {}, None, 1.0) == {}


@pytest.mark.parametrize(("mode", "change", "message"), [
    ("unstructured", {"secure_aggregation": "secagg+"},
     "'strategy.secure-aggregation' = 'secagg\\+'.*SecAgg\\+ masks updates of one fixed length"),
    ("structured", {"personalisation": "fedbn"},
     "'pruning.mode' = 'structured' is refused with 'personalisation.method' = 'fedbn'"),
    ("structured", {"privacy": True},
     "'pruning.mode' = 'structured' is refused with DP-SGD \\('privacy.noise-multiplier' > 0\\)"),
])
def test_refused_combinations_name_the_keys(mode, change, message):
    sections = {**default_sections(), "pruning": PruningOptions(mode=mode)}
    with pytest.raises(PluginError, match=message):
        build(PRUNINGS, "prunefl", sections, replace(SETTINGS, **change))
    build(PRUNINGS, "none", sections, replace(SETTINGS, **change))  # no pruning: no refusal


@pytest.mark.parametrize("change", [{"personalisation": "fedbn"}, {"privacy": True},
                                    {"personalisation": "finetune"}])
def test_unstructured_pruning_serves_fedbn_dp_and_finetuning(change):
    build(PRUNINGS, "prunefl", default_sections(), replace(SETTINGS, **change))


def test_the_mask_and_its_version_survive_a_checkpoint():
    structure = {"mode": "unstructured", "groups": [{"name": "w", "array": "w"}]}
    model = {"w": np.arange(12.0).reshape(3, 4), "b": np.ones(3)}
    pruning = PruneFL(interval=1, measure_time=True)
    pruning.initialise(model, structure)
    pruning.observe(1, model, {"w": np.ones((3, 4)), "b": np.ones(3)}, seconds=3.0)
    assert pruning.version == 2
    tree, arrays = encode_tree({"pruning": pruning})
    # What the checkpoint file holds: JSON and the arrays (np.savez).
    tree = json.loads(json.dumps(tree))
    fresh = PruneFL(interval=1, measure_time=True)
    restored = decode_tree(tree, {k: np.array(v) for k, v in arrays.items()},
                           template={"pruning": fresh})["pruning"]
    assert restored is fresh and fresh.version == 2
    assert list(fresh.masks) == list(pruning.masks) == ["w"]
    np.testing.assert_array_equal(fresh.masks["w"], pruning.masks["w"])
    assert fresh.masks["w"].dtype == bool
    assert fresh.history == pruning.history and fresh.structure == pruning.structure
    fresh.initialise({"w": np.zeros((3, 4)), "b": np.ones(3)}, structure)  # resumed: no-op
    np.testing.assert_array_equal(fresh.masks["w"], pruning.masks["w"])
