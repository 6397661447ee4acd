"""The peer benchmark's parts: the plain Flower app's ClientApp on a tiny site, its data
(the items the product reads), the round timing read from both apps' logs, the summary.

(The benchmark itself runs two Ray federations: minutes, not a CI test.)
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.config import parse_config_args
from PIL import Image

from clients.cxr_cls.data import load_site
from clients.cxr_cls.manifest import ManifestRow, write_manifest

APP_DIR = Path(__file__).resolve().parents[2] / "bench" / "peer_flower_app"
if str(APP_DIR) not in sys.path:  # as Flower puts an unpacked app bundle on the path
    sys.path.insert(0, str(APP_DIR))

SPLITS = ("train",) * 4 + ("val",) * 2 + ("test",) * 2


def _bench():
    return importlib.import_module("peer_flower")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One site ``hospital-00``: 8 radiographs of 28 px (4 train, 2 val, 2 test), labels 0/1."""
    root = tmp_path_factory.mktemp("peer")
    site = root / "hospital-00"
    (site / "images").mkdir(parents=True)
    rng = np.random.default_rng(3)
    rows = []
    for i, split in enumerate(SPLITS):
        path = site / "images" / f"img-{i}.png"
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), mode="L").save(path)
        rows.append(ManifestRow(f"img-{i}", split, path, str(i % 2)))
    write_manifest(site, rows)
    return root


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_the_plain_app_reads_the_items_the_product_reads(data_root: Path, split: str) -> None:
    from peerapp.task import load_split

    plain = load_split(data_root / "hospital-00", split, 32)
    items, _ = load_site(data_root / "hospital-00", split, 32, 1)
    images, labels = plain.tensors
    assert images.shape == (len(items), 1, 32, 32)
    np.testing.assert_allclose(images[:, 0].numpy(), np.stack([i.image for i in items]),
                               atol=1e-6)
    np.testing.assert_array_equal(labels.numpy(), np.stack([i.labels for i in items]))


def _context(data_root: Path) -> Context:
    run_config = {"data-root": str(data_root), "image-size": 32, "batch-size": 2,
                  "local-steps": 3, "momentum": 0.9}
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 1},
                   state=RecordDict(), run_config=run_config)


def _instruction(kind: str, state: dict) -> Message:
    content = RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord({"lr": 0.01})})
    message_type = MessageType.TRAIN if kind == "train" else MessageType.EVALUATE
    return Message(content, dst_node_id=7, message_type=message_type)


def test_the_plain_client_app_trains_and_evaluates_its_partition(data_root: Path,
                                                                 site_identity) -> None:
    from peerapp import client_app
    from peerapp.task import Net

    torch.manual_seed(0)
    state = Net().state_dict()
    reply = client_app.train(_instruction("train", state), _context(data_root))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == 4 and math.isfinite(metrics["train_loss"])
    assert metrics["train-seconds"] >= 0
    trained = reply.content["arrays"].to_torch_state_dict()
    assert list(trained) == list(state)
    assert any(not torch.equal(trained[k], state[k]) for k in state)

    reply = client_app.evaluate(_instruction("evaluate", trained), _context(data_root))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == 2 and 0.0 <= metrics["eval_acc"] <= 1.0
    assert math.isfinite(metrics["eval_loss"]) and "arrays" not in reply.content


def test_the_final_model_is_scored_on_the_pooled_test_items(data_root: Path) -> None:
    from peerapp.task import Net

    bench = _bench()
    state = {k: v.numpy() for k, v in Net().state_dict().items()}
    auc = bench.pooled_test_auc(state, data_root, bench.PeerConfig())
    assert auc in (0.0, 0.5, 1.0)  # two test items, one of each class


def test_run_configs_parse_as_flower_parses_them(tmp_path: Path) -> None:
    bench = _bench()
    config = bench.PeerConfig(rounds=2, steps=7)
    values = bench.flower_run_config(config, tmp_path / "a b", tmp_path / "m.pt")
    assert parse_config_args([bench.run_config_string(values)]) == values
    app_defaults = (APP_DIR / "pyproject.toml").read_text()
    assert all(f"\n{key} = " in app_defaults for key in values)  # Flower drops unknown keys
    overrides = bench.product_overrides(config, tmp_path / "ckpt")
    pairs = dict(item.split("=", 1) for item in overrides[1::2])
    assert overrides[::2] == ["-c"] * len(pairs)
    assert pairs["num-server-rounds"] == "2" and pairs["local-steps"] == "7"
    assert pairs["min-nodes"] == "3" and pairs["checkpoint-dir"] == str(tmp_path / "ckpt")


def _log(entries: list[tuple[float, str]]) -> list[tuple[float, str]]:
    return [(t, f"INFO :      {text}\n") for t, text in entries]


def test_round_ends_are_read_from_both_apps_logs() -> None:
    bench = _bench()
    flower = _log([(1.0, "🎊 Successfully started run 5"), (9.0, "[ROUND 1/3]"),
                   (20.0, "\t└──> Aggregated MetricRecord: {'train_loss': 0.6, "
                          "'train-seconds': 4.5}"),
                   (25.0, "[ROUND 2/3]"), (31.0, "[ROUND 3/3]"),
                   (38.0, "Strategy execution finished in 29.00s")])
    product = _log([(2.0, "🎊 Successfully started run 6"),
                    (30.0, "Round 1/3: train loss 0.6 | auc 0.7 | 12.0 s"),
                    (37.0, "Round 2/3: train loss 0.5"), (45.0, "Round 3/3: train loss 0.4")])
    assert bench.round_ends("flower", flower) == {1: 25.0, 2: 31.0, 3: 38.0}
    assert bench.flower_train_seconds(flower) == [4.5]
    assert bench.timing("flower", flower, 3) == {
        "seconds_per_round": 6.5, "seconds_per_round_each": [6.0, 7.0],
        "startup_seconds": 24.0, "launch_to_first_round_seconds": 25.0}
    assert bench.timing("product", product, 3)["seconds_per_round_each"] == [7.0, 8.0]
    assert bench.timing("product", product, 3)["startup_seconds"] == 28.0
    with pytest.raises(RuntimeError, match="rounds missing"):
        bench.timing("product", product[:-1], 3)


def test_the_summary_holds_both_runs_their_ratios_and_earlier_repeats(tmp_path: Path) -> None:
    bench = _bench()
    runs = [{"app": "flower", "seconds_per_round": 4.0, "startup_seconds": 20.0,
             "final_auc": 0.8, "peak_rss_mb": 1000.0},
            {"app": "product", "seconds_per_round": 5.0, "startup_seconds": 30.0,
             "final_auc": 0.81, "peak_rss_mb": 1500.0}]
    result = bench.summary(runs, bench.PeerConfig())
    assert result["ratio_seconds_per_round"] == 1.25
    assert result["ratio_startup_seconds"] == 1.5 and result["ratio_peak_rss_mb"] == 1.5
    assert result["setup"]["rounds"] == 5 and result["setup"]["task"] == "cxr-cls"
    out = tmp_path / "peer.json"
    out.write_text(json.dumps(result))
    again = bench.summary_with_previous(bench.summary(runs, bench.PeerConfig()), out)
    assert again["repeats"] == [{k: result[k] for k in result if k != "setup"}]
    other = bench.summary_with_previous(bench.summary(runs, bench.PeerConfig(rounds=2)), out)
    assert "repeats" not in other
