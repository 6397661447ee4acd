"""bench/pruning_speed.py on a tiny network: the three variants measured, the pruned ones smaller."""

from __future__ import annotations

import json

import pruning_speed


def test_each_variant_is_measured_and_structured_is_the_smaller_network(tmp_path):
    output = tmp_path / "speed.json"
    assert pruning_speed.main(["--tasks", "cxr-cls", "--image-size", "16", "--batch", "2",
                               "--steps", "1", "--repeats", "1", "--device", "cpu",
                               "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    (run,) = report["runs"]
    (row,) = run["rows"]
    variants = row["variants"]
    assert sorted(variants) == sorted(pruning_speed.VARIANTS)
    assert variants["dense"]["train_speedup"] == 1.0
    assert variants["unstructured"]["params"] == variants["dense"]["params"]  # masked, not cut
    assert variants["structured"]["params"] < variants["dense"]["params"]
    assert variants["structured"]["flops"] < variants["dense"]["flops"]
    assert all(v["train_samples_per_s"] > 0 and v["predict_samples_per_s"] > 0
               for v in variants.values())
    # a second run on the same device with the same arguments replaces the first
    pruning_speed.main(["--tasks", "cxr-cls", "--image-size", "16", "--batch", "2", "--steps",
                        "1", "--repeats", "1", "--device", "cpu", "--output", str(output)])
    assert len(json.loads(output.read_text())["runs"]) == 1
