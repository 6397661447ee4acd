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
    only, or ``clients.synthetic_ct.generate_federation(seed=0,
    image_size=96)`` into a temp dir): :class:`clients.pe_seg_task.PESegTask`
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
    0.5) to 4 sites, a small CNN written here (3 x conv-BN-ReLU-maxpool +
    linear, widths 32/64/64, 56,481 trainable parameters). The BatchNorm
    running means/variances are float buffers of the ``state_dict``; as in the
    product's ClientApp they travel raw (uncompressed), with the
    ``num_batches_tracked`` counters, and only the trainable weights are encoded. Local Adam lr 1e-3, batch 16,
    default 8 rounds x 15 steps; metrics = test accuracy (logit > 0, a
    non-finite output counts as wrong) and ROC AUC (rank formula, numpy) on the
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

Single-threaded: ``OMP_NUM_THREADS`` etc. are set before torch is imported and
``torch.set_num_threads(1)``. Results: ``bench/results/compression_fedavg.json``.
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH, ROOT  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import flwr  # noqa: E402
from flwr.app import Array, ArrayRecord  # noqa: E402

from strategies.aggregation import fedavg_delta  # noqa: E402
from strategies.compression import ErrorFeedback, derive_seed, flatten, parse_spec  # noqa: E402
from strategies.update_codec import pack_update, unpack_update  # noqa: E402
from strategies.wire_bytes import wire_size  # noqa: E402
from model_arrays import load_arrays, state_arrays  # noqa: E402

__all__ = [
    "CodecConfig",
    "CONFIGS",
    "parse_config",
    "FederationResult",
    "SiteTrace",
    "state_arrays",
    "load_arrays",
    "train_seed",
    "roc_auc",
    "XrayData",
    "load_pneumoniamnist",
    "split_sites",
    "SmallCNN",
    "CXRTask",
    "PETask",
    "run_federation",
    "summarise",
    "main",
]

log = logging.getLogger("compression_fedavg")

DEFAULT_OUTPUT = BENCH / "results" / "compression_fedavg.json"
EXISTING_PE_DATA = ROOT / "data" / "synthetic-seed0"
DEFAULT_CXR = ROOT.parent / "shared" / "data" / "cxr2d" / "pneumoniamnist_balanced.npz"
NUM_PE_SITES = 3
TASKS = ("pe-seg", "cxr-cnn", "cxr-cnn-gn")


# --------------------------------------------------------------------------- #
# Configs
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class CodecConfig:
    """One uplink codec setting: a codec spec and whether error feedback is on."""

    spec: str
    error_feedback: bool

    @property
    def name(self) -> str:
        if parse_spec(self.spec).name == "none":
            return "none"
        return f"{self.spec}{'+ef' if self.error_feedback else ''}"

    @property
    def label(self) -> str:
        if parse_spec(self.spec).name == "none":
            return "dense fp32 (none)"
        return f"{self.spec} {'+EF' if self.error_feedback else 'no EF'}"


CONFIGS: tuple[CodecConfig, ...] = (
    CodecConfig("none", False),
    CodecConfig("topk:0.1", True),
    CodecConfig("topk:0.1", False),
    CodecConfig("topk:0.01", True),
    CodecConfig("topk:0.01", False),
    CodecConfig("topk:0.001", True),
    CodecConfig("topk:0.001", False),
    CodecConfig("qsgd:16", True),
    CodecConfig("sign", True),
)


def parse_config(text: str) -> CodecConfig:
    """``"topk:0.01+ef"`` -> ``CodecConfig("topk:0.01", True)``; ``"none"`` -> dense."""
    ef = text.lower().endswith("+ef")
    spec = text[:-3] if ef else text
    parse_spec(spec)  # validates
    return CodecConfig(spec, ef and parse_spec(spec).name != "none")


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #
def train_seed(seed: int, round_index: int, site: int) -> int:
    """Seed of site ``site``'s local training in round ``round_index`` (same for every config)."""
    return int(np.random.SeedSequence([seed, round_index, site, 0x7EA1])
               .generate_state(1)[0] & 0x7FFFFFFF)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC by the rank (Mann-Whitney U) formula, ties given their average rank.

    ``AUC = (sum of the positives' ranks - n_pos (n_pos + 1) / 2) / (n_pos n_neg)``.
    """
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both classes")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # average ranks (1-based) over runs of equal scores
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [scores.size]))
    avg = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _dense_record(keys: Sequence[str], arrays: Sequence[np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in zip(keys, arrays)})


# --------------------------------------------------------------------------- #
# Task: PneumoniaMNIST + small CNN
# --------------------------------------------------------------------------- #
@dataclass
class XrayData:
    """Images ``(N, 28, 28)`` uint8 and binary labels ``(N,)``."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def load_pneumoniamnist(path: Path) -> XrayData:
    """The class-balanced PneumoniaMNIST npz of ``../shared/data/cxr2d``."""
    with np.load(path) as z:
        return XrayData(z["train_images"], z["train_labels"].ravel().astype(np.int64),
                        z["test_images"], z["test_labels"].ravel().astype(np.int64))


def split_sites(labels: np.ndarray, num_sites: int, seed: int, mode: str = "iid",
                alpha: float = 0.5) -> list[np.ndarray]:
    """Indices of the training examples of each site.

    ``iid``: a seeded random permutation cut into ``num_sites`` equal parts.
    ``dirichlet``: per class, proportions ``~ Dir(alpha)`` over the sites
    (Hsu et al. 2019), re-drawn until every site has at least 10 examples.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5B17]))
    n = labels.size
    if mode == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(n), num_sites)]
    if mode != "dirichlet":
        raise ValueError(f"split must be 'iid' or 'dirichlet', got {mode!r}")
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(num_sites)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet([alpha] * num_sites))[:-1] * idx.size).astype(int)
            for s, chunk in enumerate(np.split(idx, cuts)):
                parts[s].extend(chunk.tolist())
        if min(len(p) for p in parts) >= 10:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise RuntimeError("could not draw a Dirichlet split with >= 10 examples per site")


class SmallCNN(nn.Module):
    """3 x (conv3x3 - norm - ReLU - maxpool 2) + linear: 28x28 -> one logit.

    ``norm="bn"`` (BatchNorm, the default) has running statistics in its
    ``state_dict``: with ``width=(32, 64, 64)`` 56,481 trainable parameters and
    56,804 ``state_dict`` entries (+ 320 running means/variances and 3 integer
    ``num_batches_tracked``). ``norm="gn"`` (GroupNorm, 8 groups) has no buffers,
    so the update is exactly the trainable parameters.
    """

    def __init__(self, width: Sequence[int] = (32, 64, 64), norm: str = "bn") -> None:
        super().__init__()
        if norm not in ("bn", "gn"):
            raise ValueError(f"norm must be 'bn' or 'gn', got {norm!r}")
        layers: list[nn.Module] = []
        cin = 1
        for cout in width:
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                       nn.BatchNorm2d(cout) if norm == "bn" else nn.GroupNorm(8, cout),
                       nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin * 3 * 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class CXRTask:
    """The PneumoniaMNIST federation: sites' training images, test set, local Adam."""

    metrics = ("accuracy", "auc")

    def __init__(self, data: XrayData, num_sites: int = 4, split: str = "iid",
                 seed: int = 0, lr: float = 1e-3, batch_size: int = 32,
                 width: Sequence[int] = (32, 64, 64), norm: str = "bn",
                 name: str = "cxr-cnn") -> None:
        self.name, self.norm = name, norm
        mean = float(data.train_images.mean()) / 255.0
        std = float(data.train_images.std()) / 255.0

        def norm(images: np.ndarray) -> torch.Tensor:
            x = (images.astype(np.float32) / 255.0 - mean) / std
            return torch.from_numpy(x[:, None])

        parts = split_sites(data.train_labels, num_sites, seed, split)
        images = norm(data.train_images)
        labels = torch.from_numpy(data.train_labels.astype(np.float32))
        self.sites = [(images[p], labels[p]) for p in parts]
        self.site_labels = [data.train_labels[p] for p in parts]
        self.test_x = norm(data.test_images)
        self.test_y = data.test_labels
        self.lr, self.batch_size, self.width = lr, batch_size, tuple(width)
        self.split = split

    @property
    def num_sites(self) -> int:
        return len(self.sites)

    def num_examples(self, site: int) -> int:
        return int(self.sites[site][0].shape[0])

    def build_model(self) -> nn.Module:
        return SmallCNN(self.width, self.norm)

    def train_site(self, model: nn.Module, site: int, steps: int, seed: int) -> float:
        """``steps`` Adam steps on random mini-batches (with replacement across steps)."""
        torch.manual_seed(seed)
        x, y = self.sites[site]
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=self.lr)
        loss_fn = nn.BCEWithLogitsLoss()
        model.train()
        total = 0.0
        for _ in range(steps):
            idx = torch.randint(0, x.shape[0], (self.batch_size,), generator=gen)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx])[:, 0], y[idx])
            loss.backward()
            opt.step()
            total += loss.item()
        return total / max(steps, 1)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Test accuracy and ROC AUC of the global model (eval mode).

        A non-finite logit (e.g. from a negative BatchNorm running variance)
        counts as a wrong prediction and as an uninformative score (0) for the
        AUC; ``nonfinite_fraction`` and ``negative_running_var`` (entries of
        the global model's BN running variances below 0) are reported alongside.
        """
        model.eval()
        logits = torch.cat([model(self.test_x[i:i + 256])[:, 0]
                            for i in range(0, self.test_x.shape[0], 256)]).numpy()
        finite = np.isfinite(logits)
        correct = finite & ((logits > 0).astype(np.int64) == self.test_y)
        negative_var = sum(int((v < 0).sum()) for k, v in model.state_dict().items()
                           if k.endswith("running_var"))
        return {"accuracy": float(np.mean(correct)),
                "auc": roc_auc(np.where(finite, logits, 0.0), self.test_y),
                "nonfinite_fraction": float(np.mean(~finite)),
                "negative_running_var": float(negative_var)}

    def describe(self) -> dict:
        return {"num_sites": self.num_sites, "split": self.split,
                "site_examples": [self.num_examples(i) for i in range(self.num_sites)],
                "site_positive_fraction": [float(np.mean(v)) for v in self.site_labels],
                "test_examples": int(self.test_y.size), "lr": self.lr,
                "batch_size": self.batch_size, "optimizer": "adam", "cnn_width": list(self.width),
                "cnn_norm": self.norm}


# --------------------------------------------------------------------------- #
# Task: PE segmentation (the product's PESegTask)
# --------------------------------------------------------------------------- #
class PETask:
    """Three synthetic hospitals, each a :class:`clients.pe_seg_task.PESegTask`."""

    name = "pe-seg"
    metrics = ("dice",)

    def __init__(self, site_dirs: Sequence[Path], image_size: int = 32, batch_size: int = 8,
                 lr: float = 3e-3, momentum: float = 0.9) -> None:
        from clients.device import select_device
        from clients.pe_seg_task import PESegTask
        from clients.site_task import TaskSettings

        settings = TaskSettings(image_size=image_size, batch_size=batch_size)
        self.tasks = [PESegTask(Path(d), settings) for d in site_dirs]
        self.site_names = [Path(d).name for d in site_dirs]
        self.compute = select_device("cpu")
        self.lr, self.momentum = lr, momentum
        self.image_size, self.batch_size = image_size, batch_size

    @property
    def num_sites(self) -> int:
        return len(self.tasks)

    def num_examples(self, site: int) -> int:
        return len(self.tasks[site].train_set)

    def build_model(self) -> nn.Module:
        return self.tasks[0].build_model()

    def train_site(self, model: nn.Module, site: int, steps: int, seed: int) -> float:
        result = self.tasks[site].train(model, steps, self.lr, self.momentum, self.compute,
                                        seed=seed, optimizer="adam")
        return float(result.mean_loss)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Validation Dice, example-weighted over sites (as the product's aggregate_evaluate)."""
        results = [t.evaluate(model, self.compute) for t in self.tasks]
        n = np.array([r.num_examples for r in results], dtype=np.float64)
        dice = np.array([r.metrics["dice"] for r in results])
        out = {"dice": float(n @ dice / n.sum())}
        out.update({f"dice_{name}": float(d) for name, d in zip(self.site_names, dice)})
        return out

    def describe(self) -> dict:
        return {"num_sites": self.num_sites, "image_size": self.image_size,
                "batch_size": self.batch_size, "lr": self.lr, "adam_beta1": self.momentum,
                "optimizer": "adam", "sites": [{
                    "name": name, "train_slabs": len(t.train_set),
                    "val_slabs": len(t.val_set) if t.val_set else 0,
                    "val_studies": len(t.val_set.study_ids) if t.val_set else 0}
                    for name, t in zip(self.site_names, self.tasks)]}


# --------------------------------------------------------------------------- #
# One federation
# --------------------------------------------------------------------------- #
@dataclass
class SiteTrace:
    """Per-round flat vectors of one site (for checks, not written to JSON)."""

    true_deltas: list[np.ndarray] = field(default_factory=list)
    decoded: list[np.ndarray] = field(default_factory=list)
    residuals: list[np.ndarray] = field(default_factory=list)
    packed: list[dict[str, np.ndarray]] = field(default_factory=list)
    codec_seeds: list[int] = field(default_factory=list)


@dataclass
class FederationResult:
    """Per-round curves of one config (index 0 of ``metrics`` = the initial model)."""

    config: str
    label: str
    spec: str
    error_feedback: bool
    metrics: dict[str, list[float]] = field(default_factory=dict)
    bytes_up: list[list[int]] = field(default_factory=list)        # [round][site]
    payload_bytes: list[list[int]] = field(default_factory=list)   # codec payload only
    bytes_down: list[int] = field(default_factory=list)            # per site, per round
    bytes_plain_record: list[list[int]] = field(default_factory=list)  # plain ArrayRecord(list)
    dense_fp32_bytes: int = 0                                      # codec-free float32 count
    train_loss: list[float] = field(default_factory=list)
    residual_norm: list[float] = field(default_factory=list)       # mean over sites, after round
    decode_error: list[float] = field(default_factory=list)        # ||decoded - sent z|| / ||z||
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    traces: list[SiteTrace] | None = None


def run_federation(task, config: CodecConfig, rounds: int, steps: int, seed: int,
                   cache: dict | None = None, trace: bool = False) -> FederationResult:
    """FedAvg for ``rounds`` rounds with the uplink codec ``config``.

    ``cache`` (a dict shared by the configs of one task) keeps round 1's local
    results, which do not depend on the codec. ``trace`` keeps every site's
    true delta, decoded delta, residual and packed arrays per round.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    model = task.build_model()
    keys = list(model.state_dict().keys())
    x = state_arrays(model)
    # As the ClientApp: buffers (BatchNorm running statistics) are sent raw.
    parameters = {name for name, _ in model.named_parameters()}
    raw = frozenset(i for i, key in enumerate(keys) if key not in parameters)
    n = [task.num_examples(i) for i in range(task.num_sites)]
    feedback = [ErrorFeedback(config.spec) if config.error_feedback else None
                for _ in range(task.num_sites)]
    res = FederationResult(config.name, config.label, config.spec, config.error_feedback,
                           traces=[SiteTrace() for _ in range(task.num_sites)] if trace else None)
    res.dense_fp32_bytes = 4 * int(sum(a.size for a in x))

    def measure() -> None:
        load_arrays(model, x)
        for k, v in task.evaluate(model).items():
            res.metrics.setdefault(k, []).append(float(v))

    measure()
    for r in range(1, rounds + 1):
        down = wire_size(_dense_record(keys, x))
        decoded_all, ups, payloads, plain, losses, errs = [], [], [], [], [], []
        for i in range(task.num_sites):
            cached = cache.get((r, i)) if (cache is not None and r == 1) else None
            if cached is None:
                load_arrays(model, x)
                loss = task.train_site(model, i, steps, train_seed(seed, r, i))
                local = state_arrays(model)
                # delta = x_global - x_local in the global model's dtypes (as the ClientApp)
                delta = [np.asarray(g - l, dtype=g.dtype) for g, l in zip(x, local)]
                if cache is not None and r == 1:
                    cache[(r, i)] = ([d.copy() for d in delta], loss)
            else:
                delta, loss = [d.copy() for d in cached[0]], cached[1]
            losses.append(loss)
            codec_seed = derive_seed(seed, r, i)
            z_before = (feedback[i].residual.copy() if feedback[i] is not None
                        and feedback[i].residual.size else None)
            packed = pack_update(delta, config.spec, codec_seed, feedback[i], raw=raw)
            record = ArrayRecord({k: Array(v) for k, v in packed.items()})
            ups.append(wire_size(record))
            payloads.append(int(packed["payload"].size))
            plain.append(wire_size(ArrayRecord(list(delta))))
            # server side: decode what the record carries
            received = {k: record[k].numpy() for k in record.keys()}
            decoded = unpack_update(received, x, config.spec, codec_seed)
            decoded_all.append(decoded)
            true_vec = flatten([delta[j] for j in range(len(delta)) if j not in raw
                                and np.issubdtype(delta[j].dtype, np.floating)])
            dec_vec = flatten([decoded[j] for j in range(len(decoded)) if j not in raw
                               and np.issubdtype(decoded[j].dtype, np.floating)])
            z = true_vec if z_before is None else true_vec + z_before
            errs.append(float(np.linalg.norm(dec_vec - z) / max(np.linalg.norm(z), 1e-30)))
            if trace:
                t = res.traces[i]
                t.true_deltas.append(true_vec)
                t.decoded.append(dec_vec)
                t.residuals.append(feedback[i].state() if feedback[i] is not None
                                   else np.zeros_like(true_vec))
                t.packed.append({k: v.copy() for k, v in packed.items()})
                t.codec_seeds.append(codec_seed)
        agg = fedavg_delta(decoded_all, n)
        x = [np.asarray(g - d).astype(g.dtype, copy=False) for g, d in zip(x, agg)]
        res.bytes_up.append(ups)
        res.payload_bytes.append(payloads)
        res.bytes_plain_record.append(plain)
        res.bytes_down.append(down)
        res.train_loss.append(float(np.average(losses, weights=n)))
        res.decode_error.append(float(np.mean(errs)))
        res.residual_norm.append(float(np.mean(
            [np.linalg.norm(f.residual) for f in feedback])) if config.error_feedback else 0.0)
        measure()
        log.info("%-6s %-18s round %2d  %s  up %8.0f B/site  loss %.4f", task.name,
                 config.label, r, "  ".join(f"{k} {v[-1]:.3f}" for k, v in res.metrics.items()
                                            if k in task.metrics),
                 np.mean(ups), res.train_loss[-1])
    res.seconds = time.perf_counter() - started
    res.cpu_seconds = time.process_time() - cpu_started
    return res


# --------------------------------------------------------------------------- #
# Summary
# --------------------------------------------------------------------------- #
def _final(values: Sequence[float], tail: int) -> float:
    return float(np.mean(values[-tail:]))


def summarise(task_name: str, metric_names: Sequence[str], results: Sequence[FederationResult],
              tail: int) -> dict:
    """Per-config bytes, ratios, final metrics and the two targets of the issue."""
    by_name = {r.config: r for r in results}
    dense = by_name.get("none")
    dense_up = float(np.mean(dense.bytes_up)) if dense else None
    rows = {}
    for r in results:
        up = float(np.mean(r.bytes_up))
        row = {
            "label": r.label, "spec": r.spec, "error_feedback": r.error_feedback,
            "uplink_bytes_per_site_round": up,
            "payload_bytes_per_site_round": float(np.mean(r.payload_bytes)),
            "downlink_bytes_per_site_round": float(np.mean(r.bytes_down)),
            "plain_arrayrecord_bytes": float(np.mean(r.bytes_plain_record)),
            "dense_fp32_value_bytes": r.dense_fp32_bytes,
            "uplink_ratio_vs_dense": (dense_up / up) if dense_up else None,
            "seconds": r.seconds, "cpu_seconds": r.cpu_seconds,
        }
        for m in metric_names:
            final = _final(r.metrics[m], tail)
            row[f"final_{m}"] = final
            if dense:
                ref = _final(dense.metrics[m], tail)
                row[f"rel_diff_{m}"] = (final - ref) / ref if ref else None
        rows[r.config] = row

    targets: dict = {}
    ef01 = rows.get("topk:0.01+ef")
    if dense and ef01:
        within = {m: ef01[f"rel_diff_{m}"] is not None and ef01[f"rel_diff_{m}"] >= -0.02
                  for m in metric_names}
        targets["a_topk0.01_ef"] = {
            "uplink_ratio": ef01["uplink_ratio_vs_dense"],
            "ratio_met": ef01["uplink_ratio_vs_dense"] >= 100.0,
            "rel_diff": {m: ef01[f"rel_diff_{m}"] for m in metric_names},
            "metric_within_2pct": within,
            "met": bool(ef01["uplink_ratio_vs_dense"] >= 100.0 and all(within.values())),
        }
    pairs = {}
    for frac in ("0.1", "0.01", "0.001"):
        a, b = rows.get(f"topk:{frac}+ef"), rows.get(f"topk:{frac}")
        if a and b:
            pairs[f"topk:{frac}"] = {
                "bytes": {"ef": a["uplink_bytes_per_site_round"],
                          "no_ef": b["uplink_bytes_per_site_round"]},
                "final": {m: {"ef": a[f"final_{m}"], "no_ef": b[f"final_{m}"]}
                          for m in metric_names},
                "ef_better": {m: a[f"final_{m}"] > b[f"final_{m}"] for m in metric_names},
            }
    if pairs:
        targets["b_ef_beats_no_ef"] = {
            "pairs": pairs,
            "met": all(all(p["ef_better"].values()) for p in pairs.values()),
        }
    spread = None
    if dense:
        m0 = metric_names[0]
        v = np.asarray(dense.metrics[m0][1:], dtype=np.float64)
        if v.size > 2:
            spread = float(np.mean(np.abs(np.diff(v[-max(3, tail + 1):]))))
    return {"task": task_name, "tail_rounds": tail, "primary_metric": metric_names[0],
            "configs": rows, "targets": targets,
            "dense_round_to_round_change_last_rounds": spread}


def markdown_table(summary: dict) -> str:
    """The per-config table of one task."""
    metrics = [k[len("final_"):] for k in next(iter(summary["configs"].values()))
               if k.startswith("final_")]
    head = ["config", "up B/site/round", "down B/site/round", "up ratio"]
    for m in metrics:
        head += [f"final {m}", f"rel. diff {m}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in summary["configs"].values():
        cells = [row["label"], f"{row['uplink_bytes_per_site_round']:,.0f}",
                 f"{row['downlink_bytes_per_site_round']:,.0f}",
                 f"{row['uplink_ratio_vs_dense']:.1f}x" if row["uplink_ratio_vs_dense"] else "-"]
        for m in metrics:
            rel = row.get(f"rel_diff_{m}")
            cells += [f"{row[f'final_{m}']:.3f}", f"{rel:+.1%}" if rel is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_text(summary: dict) -> str:
    out = []
    a = summary["targets"].get("a_topk0.01_ef")
    if a:
        rel = ", ".join(f"{m} {v:+.1%}" for m, v in a["rel_diff"].items())
        out.append(f"(a) topk:0.01 +EF: uplink {a['uplink_ratio']:.1f}x fewer bytes "
                   f"(>= 100x: {'met' if a['ratio_met'] else 'NOT met'}); final vs dense {rel} "
                   f"(>= -2%: {'met' if all(a['metric_within_2pct'].values()) else 'NOT met'}) "
                   f"-> {'MET' if a['met'] else 'NOT MET'}")
    b = summary["targets"].get("b_ef_beats_no_ef")
    if b:
        parts = []
        for name, p in b["pairs"].items():
            parts.append(f"{name}: " + ", ".join(
                f"{m} {v['ef']:.3f} vs {v['no_ef']:.3f}" for m, v in p["final"].items())
                + f" ({p['bytes']['ef']:,.0f} vs {p['bytes']['no_ef']:,.0f} B)")
        out.append("(b) EF vs no EF: " + "; ".join(parts)
                   + f" -> {'MET' if b['met'] else 'NOT MET'}")
    if summary.get("dense_round_to_round_change_last_rounds") is not None:
        out.append(f"dense {summary['primary_metric']}: mean |round-to-round change| over the "
                   f"last rounds {summary['dense_round_to_round_change_last_rounds']:.3f} "
                   f"(noise scale of the final numbers)")
    return "\n".join(out)


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def find_pe_sites(data_root: Path | None, tmp: Path, seed: int) -> tuple[list[Path], str]:
    """Existing synthetic hospitals (read only) or freshly generated ones."""
    if data_root is None and all(
            (EXISTING_PE_DATA / f"hospital-{i:02d}" / "manifest.csv").is_file()
            for i in range(NUM_PE_SITES)):
        data_root = EXISTING_PE_DATA
    if data_root is not None:
        sites = [Path(data_root) / f"hospital-{i:02d}" for i in range(NUM_PE_SITES)]
        return sites, f"existing {data_root} (read only)"
    from clients.synthetic_ct import generate_federation

    sites = generate_federation(tmp / "federation", num_sites=NUM_PE_SITES, seed=seed,
                                image_size=96)
    return sites, (f"generate_federation(num_sites={NUM_PE_SITES}, seed={seed}, "
                   "image_size=96) in a temp dir")


def run_task(task, configs: Sequence[CodecConfig], rounds: int, steps: int, seed: int,
             tail: int) -> dict:
    cache: dict = {}
    results = []
    for cfg in configs:
        res = run_federation(task, cfg, rounds, steps, seed, cache=cache)
        results.append(res)
        finals = "  ".join(f"{m} {_final(res.metrics[m], tail):.3f}" for m in task.metrics)
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
    for name in ("clients", "clients.pe_seg_task", "clients.trainer"):
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
