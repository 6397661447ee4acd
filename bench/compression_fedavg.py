"""Update compression in FedAvg: uplink bytes on the real wire format vs final model quality.

The accuracy half of the compression issue (the throughput half is
``bench/codec_throughput.py``). FedAvg runs in-process (a benchmark, not the
product path: no Flower processes, no SuperLink), but every update goes through
the product's own site/server code, so the bytes are the bytes a site would
really send:

* site ``i`` in round ``r`` trains from the global weights ``x`` and forms
  ``delta_i = x - x_local_i`` (numpy arrays of the ``state_dict``, in order, in
  the global model's dtypes, as ``app/client_app.py`` does);
* it packs it with :func:`strategies.update_codec.pack_update` (``spec``, codec
  seed ``derive_seed(seed, r, i)``), through one
  :class:`strategies.compression.ErrorFeedback` per site kept across rounds for
  the ``+EF`` variants (EF-SGD: ``z = e + delta``, send ``C(z)``,
  ``e <- z - decode(C(z))``), or without feedback for ``no EF``;
* bytes up = :func:`strategies.wire_bytes.wire_size` of
  ``flwr.app.ArrayRecord({k: Array(v) for k, v in packed.items()})``, the
  record the ClientApp puts in its reply (the reply's metrics and site records
  are not counted);
* the server decodes with :func:`strategies.update_codec.unpack_update` (from
  the arrays of that record), aggregates with
  :func:`strategies.aggregation.fedavg_delta` (``p_i = n_i / sum_j n_j``) and
  sets ``x <- x - Delta``;
* bytes down = ``wire_size`` of the dense global
  ``ArrayRecord({name: Array(v)})``: the **downlink is not compressed** (the
  product sends the dense global model to every site every round).

The dense fp32 baseline is codec ``none`` (the update as one raw float32
payload, integer buffers raw). For reference the plain
``ArrayRecord(list of the delta's arrays)`` (one Flower ``Array`` per tensor,
what a product without the codec layer would send) is measured too.

Tasks
-----
``pe-seg``
    PE segmentation on 3 synthetic hospitals (``data/synthetic-seed0``, read
    only, or ``clients.pe_seg.synthetic.generate_federation(seed=0,
    image_size=96)`` into a temp dir): :class:`clients.pe_seg.task.PESegTask`
    (2.5D MONAI residual U-Net, 207,508 parameters, instance norm: no buffers;
    DiceCE loss, local Adam lr 3e-3, beta1 0.9, batch 8, 32 px slabs),
    default 8 rounds x 30 local steps; metric = validation Dice (3D Dice per
    validation study, mean over studies, example-weighted over sites as the
    product's ``aggregate_evaluate``). The budget stops dense training early
    (Dice ~0.15, still rising; the product demo needs ~600+ steps at 64 px
    for 0.3), so this is the early-training regime.
``cxr-cnn``
    PneumoniaMNIST (``../shared/data/cxr2d/pneumoniamnist_balanced.npz``, real
    28x28 chest X-rays, pneumonia vs normal; skipped with a message if absent),
    the training split (2428) dealt IID (or ``--cxr-split dirichlet``, alpha
    0.5) to 4 sites by the product's partitioners, the product's
    :class:`models.small_cnn.SmallCNN` (3 x conv-BN-ReLU-maxpool + linear,
    widths 32/64/64, 56,481 trainable parameters). The BatchNorm
    running means/variances are float buffers of the ``state_dict``; as in the
    product's ClientApp they travel raw (uncompressed), with the
    ``num_batches_tracked`` counters, and only the trainable weights are encoded. Local Adam lr 1e-3, batch 16,
    default 8 rounds x 15 steps; metrics = test accuracy (logit > 0, a
    non-finite output counts as wrong) and ROC AUC (MONAI, as the product) on the
    468 test images.
``cxr-cnn-gn``
    The same with GroupNorm (8 groups) instead of BatchNorm: no buffers, so
    the update is exactly the trainable weights. A control that separates the
    codecs' effect from what lossy compression does to BatchNorm statistics.

Configs (all on every task, one run): ``none``; ``topk:0.1``, ``topk:0.01``,
``topk:0.001`` each with and without error feedback; ``qsgd:16 +EF``;
``sign +EF``. Every config starts from the same initial model and uses the same
training seeds per (round, site); hyper-parameters are fixed per task and not
tuned per codec. Because round 1 starts from the same weights with the same
seeds for every config, its local training is identical across configs and is
computed once and reused (the codec then runs on it per config).

Summary per config: mean uplink bytes per site per round, downlink bytes per
site per round, uplink ratio = dense fp32 bytes / uplink bytes, final metric =
mean of the last ``--tail`` (2) rounds, relative difference vs dense
``(m - m_dense) / m_dense``. Targets of the issue:
(a) ``topk:0.01 +EF`` sends >= 100x fewer uplink bytes than dense fp32 and its
final metric is at most 2% (relative) below dense (better is fine);
(b) error feedback beats no EF at equal bytes: for each top-k fraction, the
``+EF`` final metric is higher than the ``no EF`` one (the bytes of the pair
are reported: same ``k``, only the index gaps differ).

Also per round: train loss, the mean relative decode error
``||decode(C(z)) - z|| / ||z||`` of what was sent, the mean EF residual norm,
the codec payload size alone, and for the CNN the number of negative BN
running variances in the global model and the fraction of non-finite outputs.

Bytes notes: Flower content-addresses the Arrays of a record, so identical
tensors (e.g. GroupNorm weights never touched by a sparse update) are sent and
counted once: that is why the dense downlink size varies slightly by config.

Limits: one seed; small models, few rounds (the CPU budget); the synthetic PE
validation has 2-3 studies per site, so its Dice moves by a few hundredths
from round to round; a 2% criterion is finer than that noise (see the printed
round-to-round change of the dense run).

Usage::

    .venv/bin/python bench/compression_fedavg.py   # all three tasks: ~330 s of CPU (1 core)
    .venv/bin/python bench/compression_fedavg.py --tasks cxr-cnn --configs none "topk:0.01+ef"

Modules: the FedAvg loop on the wire format is ``bench/compression_loop.py``,
the two federations ``bench/compression_tasks.py``, the summary and targets
``bench/compression_summary.py``.

Single-threaded: ``OMP_NUM_THREADS`` etc. are set before torch is imported and
``torch.set_num_threads(1)``. Results: ``bench/results/compression_fedavg.json``.
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

import flwr  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from compression_loop import CONFIGS, CodecConfig, parse_config, run_federation  # noqa: E402
from compression_summary import markdown_table, summarise, tail_mean, targets_text  # noqa: E402
from compression_tasks import CXRTask, PETask  # noqa: E402
from pe_sites import find_pe_sites  # noqa: E402
from pneumoniamnist import DEFAULT_PATH, load_pneumoniamnist  # noqa: E402

__all__ = ["TASKS", "run_task", "main"]

DEFAULT_OUTPUT = BENCH / "results" / "compression_fedavg.json"
DEFAULT_CXR = DEFAULT_PATH
TASKS = ("pe-seg", "cxr-cnn", "cxr-cnn-gn")


def run_task(task, configs: Sequence[CodecConfig], rounds: int, steps: int, seed: int,
             tail: int) -> dict:
    """Every config on ``task`` (round 1's local training shared), its summary and curves."""
    cache: dict = {}
    results = []
    for cfg in configs:
        res = run_federation(task, cfg, rounds, steps, seed, cache=cache)
        results.append(res)
        finals = "  ".join(f"{m} {tail_mean(res.metrics[m], tail):.3f}" for m in task.metrics)
        print(f"[{task.name}] {cfg.label:<20} {res.seconds:6.1f} s "
              f"({res.cpu_seconds:.0f} s CPU)  up "
              f"{np.mean(res.bytes_up):>10,.0f} B/site/round  {finals}", flush=True)
    summary = summarise(task.name, task.metrics, results, tail)
    curves = {}
    for r in results:
        d = asdict(r)
        d.pop("traces")
        curves[r.config] = d
    model = task.build_model()
    params = {"parameters": int(sum(v.numel() for v in model.state_dict().values())),
              "trainable_parameters": int(sum(p.numel() for p in model.parameters())),
              "float_tensors": int(sum(v.is_floating_point() for v in model.state_dict().values())),
              "integer_tensors": int(sum(not v.is_floating_point()
                                         for v in model.state_dict().values()))}
    return {"setup": {"rounds": rounds, "local_steps": steps, **params, **task.describe()},
            "summary": summary, "curves": curves}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS),
                        help="cxr-cnn: the CNN with BatchNorm (as specified); cxr-cnn-gn: the "
                             "same CNN with GroupNorm, no buffers in the update (control)")
    parser.add_argument("--configs", nargs="+", default=None,
                        help="subset, e.g. none topk:0.01+ef topk:0.01 (default: all nine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tail", type=int, default=2, help="final = mean of the last N rounds")
    parser.add_argument("--pe-rounds", type=int, default=8)
    parser.add_argument("--pe-steps", type=int, default=30)
    parser.add_argument("--pe-image-size", type=int, default=32)
    parser.add_argument("--pe-lr", type=float, default=3e-3)
    parser.add_argument("--pe-data-root", type=Path, default=None,
                        help="folder with hospital-00..02 (default: data/synthetic-seed0 if "
                             "present, else generated into a temp dir)")
    parser.add_argument("--cxr-rounds", type=int, default=8)
    parser.add_argument("--cxr-steps", type=int, default=15)
    parser.add_argument("--cxr-batch-size", type=int, default=16)
    parser.add_argument("--cxr-sites", type=int, default=4)
    parser.add_argument("--cxr-split", choices=["iid", "dirichlet"], default="iid")
    parser.add_argument("--cxr-lr", type=float, default=1e-3)
    parser.add_argument("--cxr-data", type=Path, default=DEFAULT_CXR)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    configs = [parse_config(c) for c in args.configs] if args.configs else list(CONFIGS)

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(message)s")
    for name in ("clients", "clients.pe_seg.task", "clients.training.trainer"):
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(1)
    start, cpu_start = time.perf_counter(), time.process_time()
    out: dict = {
        "benchmark": "compression_fedavg",
        "description": __doc__.split("\n\n")[0],
        "bytes": ("up = wire_size(ArrayRecord({k: Array(v) for k, v in pack_update(...)})) per "
                  "site per round (the update record only); down = wire_size of the dense "
                  "global ArrayRecord (downlink NOT compressed); ratio = mean up of codec "
                  "'none' / mean up of the config; plain_arrayrecord_bytes = "
                  "wire_size(ArrayRecord(list of the delta arrays)), one Array per tensor."),
        "final_metric": f"mean of the last {args.tail} rounds",
        "targets": {"a": "topk:0.01+ef uplink ratio >= 100 and final metric >= dense * 0.98",
                    "b": "for every top-k fraction, +EF final metric > no-EF final metric"},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "configs": [c.name for c in configs],
        "tasks": {},
    }
    tables = []
    with tempfile.TemporaryDirectory(prefix="compression-fedavg-") as tmp:
        for name in args.tasks:
            t0, c0 = time.perf_counter(), time.process_time()
            if name == "pe-seg":
                sites, source = find_pe_sites(args.pe_data_root, Path(tmp), args.seed)
                task = PETask(sites, image_size=args.pe_image_size, lr=args.pe_lr)
                result = run_task(task, configs, args.pe_rounds, args.pe_steps, args.seed,
                                  args.tail)
                result["setup"]["data"] = source
            else:
                if not args.cxr_data.is_file():
                    msg = f"skipped: {args.cxr_data} not found (real data is optional)"
                    print(f"[{name}] {msg}")
                    out["tasks"][name] = {"skipped": msg}
                    continue
                task = CXRTask(load_pneumoniamnist(args.cxr_data), num_sites=args.cxr_sites,
                               split=args.cxr_split, seed=args.seed, lr=args.cxr_lr,
                               batch_size=args.cxr_batch_size,
                               norm="gn" if name == "cxr-cnn-gn" else "bn", name=name)
                result = run_task(task, configs, args.cxr_rounds, args.cxr_steps, args.seed,
                                  args.tail)
                result["setup"]["data"] = str(args.cxr_data)
            result["seconds"] = time.perf_counter() - t0
            result["cpu_seconds"] = time.process_time() - c0
            out["tasks"][name] = result
            table = (f"\n### {name}: {result['setup']['rounds']} rounds x "
                     f"{result['setup']['local_steps']} local steps, "
                     f"{result['setup']['num_sites']} sites, {result['setup']['parameters']:,} "
                     f"state_dict entries ({result['seconds']:.0f} s, "
                     f"{result['cpu_seconds']:.0f} s CPU)\n\n"
                     + markdown_table(result["summary"]) + "\n\n"
                     + targets_text(result["summary"]))
            tables.append(table)
            print(table, flush=True)
    out["wall_seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = time.process_time() - cpu_start
    out["versions"] = {"python": platform.python_version(), "numpy": np.__version__,
                       "torch": torch.__version__, "flwr": flwr.__version__,
                       "platform": platform.platform(), "torch_threads": torch.get_num_threads()}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nwall time {out['wall_seconds']:.0f} s ({out['cpu_seconds']:.0f} s CPU); "
          f"results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
