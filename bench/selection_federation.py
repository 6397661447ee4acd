"""The in-process federation of ``bench/selection_powd.py``: sites, selector context, one round.

Site ``i`` holds a slice of PneumoniaMNIST's training images; the global model
is the product's :class:`models.small_cnn.SmallCNN` (conv8-pool-conv16-pool-
fc32-fc2, 26,434 parameters, no normalisation so FedAvg of the state dict is
exact). A round: the product's selector plug-in
(``strategies.plugins.registries.SELECTORS``) picks ``m`` sites, each trains ``tau``
plain SGD steps from the global model and returns ``delta = x_global -
x_local``; :func:`strategies.aggregation.fedavg_delta` and ``x <- x - Delta``.

:class:`Federation` is also the selector's context: ``sizes``,
``last_losses`` (``rpow-d``) and ``query_losses(candidates, subset)`` (the
current global model's loss on each candidate's data, ``pow-d`` / ``cpow-d``;
every example forwarded is counted as an extra query forward pass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from model_arrays import load_arrays, state_arrays
from models.small_cnn import SmallCNN
from strategies.aggregation import fedavg_delta
from strategies.plugins.registries import SELECTORS

__all__ = ["build_model", "Federation", "run_round", "make_selector", "make_federation",
           "run_method"]


def build_model() -> nn.Module:
    """conv3x3(8)-ReLU-pool-conv3x3(16)-ReLU-pool-fc(32)-ReLU-fc(2) for 28x28 inputs."""
    return SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2)


@dataclass
class Federation:
    """Sites, global model and the selector context (``sizes``, ``last_losses``,
    ``query_losses``)."""

    site_x: list[torch.Tensor]
    site_y: list[torch.Tensor]
    seed: int
    lr: float
    tau: int
    batch_size: int
    model: nn.Module
    global_weights: list[np.ndarray] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    last_losses: dict[int, float] = field(default_factory=dict)
    query_forward_passes: int = 0
    query_log: list[dict] = field(default_factory=list)
    _subsets: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sizes = {i: int(len(y)) for i, y in enumerate(self.site_y)}
        if not self.global_weights:
            self.global_weights = state_arrays(self.model)

    @property
    def node_ids(self) -> list[int]:
        return list(range(len(self.site_y)))

    # -- losses of the current global model -------------------------------- #
    @torch.no_grad()
    def _mean_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.model.eval()
        total = 0.0
        for start in range(0, len(y), 256):
            logits = self.model(x[start:start + 256])
            total += float(nn.functional.cross_entropy(logits, y[start:start + 256],
                                                       reduction="sum"))
        return total / len(y)

    def subset_indices(self, site: int, subset: int) -> np.ndarray:
        """Fixed seeded subset of ``subset`` examples of a site (all if it has fewer)."""
        key = (site, subset)
        if key not in self._subsets:
            n = self.sizes[site]
            rng = np.random.default_rng([self.seed, 7919, site])
            self._subsets[key] = (np.arange(n) if subset >= n
                                  else np.sort(rng.choice(n, size=subset, replace=False)))
        return self._subsets[key]

    def query_losses(self, candidates: list[int], subset: int) -> dict[int, float]:
        """Loss of the current global model on each candidate's training data
        (all of it if ``subset == 0``, else a fixed subset); counts the forward passes."""
        load_arrays(self.model, self.global_weights)
        out: dict[int, float] = {}
        for c in candidates:
            x, y = self.site_x[c], self.site_y[c]
            if subset:
                idx = torch.from_numpy(self.subset_indices(c, subset))
                x, y = x[idx], y[idx]
            out[int(c)] = self._mean_loss(x, y)
            self.query_forward_passes += int(len(y))
        self.query_log.append({"candidates": [int(c) for c in candidates], "subset": subset,
                               "losses": dict(out)})
        return out

    @torch.no_grad()
    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        load_arrays(self.model, self.global_weights)
        self.model.eval()
        correct = 0
        for start in range(0, len(y), 256):
            pred = self.model(x[start:start + 256]).argmax(1)
            correct += int((pred == y[start:start + 256]).sum())
        return correct / len(y)

    # -- local training ------------------------------------------------------ #
    def local_train(self, site: int, server_round: int) -> tuple[list[np.ndarray], float]:
        """``tau`` SGD steps from the global model; returns ``(delta, mean train loss)``."""
        load_arrays(self.model, self.global_weights)
        self.model.train()
        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        x, y = self.site_x[site], self.site_y[site]
        n = len(y)
        rng = np.random.default_rng([self.seed, server_round, site])
        order, pos, losses = rng.permutation(n), 0, []
        for _ in range(self.tau):
            take = min(self.batch_size, n)
            if pos + take > n:
                order, pos = rng.permutation(n), 0
            idx = torch.from_numpy(order[pos:pos + take])
            pos += take
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        local = state_arrays(self.model)
        delta = [g - w for g, w in zip(self.global_weights, local)]
        return delta, float(np.mean(losses))


def run_round(fed: Federation, selector, server_round: int) -> dict:
    """Select, train the selected sites, FedAvg; returns what happened."""
    queries_before = len(fed.query_log)
    passes_before = fed.query_forward_passes
    selected = [int(s) for s in selector.select(server_round, fed.node_ids, fed)]
    deltas, counts = [], []
    for site in selected:
        delta, loss = fed.local_train(site, server_round)
        deltas.append(delta)
        counts.append(fed.sizes[site])
        fed.last_losses[site] = loss
    update = fedavg_delta(deltas, counts)
    fed.global_weights = [g - u for g, u in zip(fed.global_weights, update)]
    queries = fed.query_log[queries_before:]
    return {
        "selected": selected,
        "queried": [c for q in queries for c in q["candidates"]],
        "query_losses": {c: v for q in queries for c, v in q["losses"].items()},
        "query_forward_passes": fed.query_forward_passes - passes_before,
        "d": getattr(selector, "last", {}).get("d"),
    }


def make_selector(method: str, cfg: dict, seed: int):
    """The product's selector plug-in for a benchmark method (``adaptive-d`` is ``pow-d`` with d=0)."""
    m, d, rounds = cfg["m"], cfg["d"], cfg["rounds"]
    if method == "uniform":
        return SELECTORS.create("uniform", m=m, seed=seed)
    if method == "pow-d":
        return SELECTORS.create("pow-d", m=m, d=d, num_rounds=rounds, seed=seed)
    if method == "cpow-d":
        return SELECTORS.create("cpow-d", m=m, d=d, num_rounds=rounds,
                                subset=cfg["cpow_subset"], seed=seed)
    if method == "rpow-d":
        return SELECTORS.create("rpow-d", m=m, d=d, num_rounds=rounds, seed=seed)
    if method == "adaptive-d":
        return SELECTORS.create("pow-d", m=m, d=0, num_rounds=rounds, seed=seed)
    raise ValueError(f"unknown method {method!r}")


def make_federation(data: dict, split: list[np.ndarray], cfg: dict, seed: int) -> Federation:
    """Sites from the index split, a seeded initial model, the run's lr / tau / batch size."""
    torch.manual_seed(seed)
    x = torch.from_numpy(data["train_x"])
    y = torch.from_numpy(data["train_y"])
    return Federation(site_x=[x[torch.from_numpy(s)] for s in split],
                      site_y=[y[torch.from_numpy(s)] for s in split], seed=seed, lr=cfg["lr"],
                      tau=cfg["tau"], batch_size=cfg["batch_size"], model=build_model())


def run_method(method: str, data: dict, split: list[np.ndarray], cfg: dict, seed: int) -> dict:
    """One federation of ``cfg['rounds']`` rounds; the validation curve and counts."""
    started = time.perf_counter()
    fed = make_federation(data, split, cfg, seed)
    selector = make_selector(method, cfg, seed)
    val_x, val_y = torch.from_numpy(data["val_x"]), torch.from_numpy(data["val_y"])
    test_x, test_y = torch.from_numpy(data["test_x"]), torch.from_numpy(data["test_y"])
    initial = fed.accuracy(val_x, val_y)
    curve, passes, ds, picks, test_tail = [], [], [], [], []
    counts = np.zeros(len(split), dtype=int)
    for r in range(1, cfg["rounds"] + 1):
        info = run_round(fed, selector, r)
        counts[info["selected"]] += 1
        passes.append(info["query_forward_passes"])
        ds.append(info["d"])
        picks.append(info["selected"])
        curve.append(fed.accuracy(val_x, val_y))
        if r > cfg["rounds"] - cfg["final_window"]:
            test_tail.append(fed.accuracy(test_x, test_y))
    return {
        "seed": seed,
        "initial_val_accuracy": initial,
        "val_accuracy": curve,
        "test_accuracy": test_tail[-1],
        "test_accuracy_last_rounds": test_tail,
        "query_forward_passes": int(sum(passes)),
        "query_forward_passes_per_round": passes,
        "train_forward_backward_examples": int(cfg["rounds"] * cfg["m"] * cfg["tau"]
                                               * cfg["batch_size"]),
        "d_per_round": ds if method != "uniform" else None,
        "times_selected": counts.tolist(),
        "selected_per_round": picks,
        "wall_s": time.perf_counter() - started,
    }
