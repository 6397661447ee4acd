"""The coordinator's side of split learning: its part of the network, its optimiser, the batches.

Split learning (Vepakomma et al., "Split learning for health", arXiv:1812.00564, 2018;
the book's chapter 4) over sites holding different patients of one imaging task (no
private set intersection; Poirot et al., arXiv:1912.12115, 2019, held chest X-ray
performance constant from 1 to 50 clients). The coordinator builds the task's network
from the run seed, cuts it (``vertical.cut``, ``vertical.head-layers``;
:func:`~clients.vertical.split_model.cut_task_network`), keeps the middle (U-shaped,
``splitnn-u``) or the rest (vanilla, ``splitnn``) and hands the site part (bottom, and the
U-shaped head) to the sites; the site side is :mod:`clients.vertical.split_site`.

Each of ``num-server-rounds`` rounds, every site trains ``local-steps`` batches
(``batch-size``), ``vertical.batches-per-message`` batches per message:

* vanilla: a site's message brings the batches' cut activations a1_j and labels y_j; the
  coordinator, batch after batch, computes the loss of ``rest(a1_j)``, back-propagates,
  steps its optimiser (one step per batch) and returns dL_j/da1_j with the site's next
  message, which also asks for the next batches;
* U-shaped: the coordinator returns a2_j = middle(a1_j) (stage ``split-head``, to one site
  after another); the site finishes with its head and labels and sends dL_j/da2_j; the
  coordinator back-propagates each through the middle from the a1_j it kept (the forward
  recomputed at its current weights, the normalisation statistics counted once), one step
  per batch, and returns dL_j/da1_j. Staleness of batched messages: :mod:`clients.vertical.split_site`.

``vertical.split-mode = "sequential"``: the sites work in turn, the site part handed from
one to the next through the coordinator (the book's vanilla synchronisation, sec. 19.1.1.1).
``"parallel"`` (SplitFed, Thapa et al., "SplitFed: when federated learning meets split
learning", AAAI 2022): every site trains its own copy of the site part at once and the
coordinator processes their batches in node order with its one part (SplitFedV1's server
parts are one per client, averaged; here one part sees every batch, as in SplitFedV2);
after the round the sites' parts are averaged FedAvg-style, weighted by their training
examples (:func:`~strategies.aggregation.fedavg_delta`). The round ends with an
evaluation: each site's val and test splits through the whole split network, the
coordinator's outputs back to the site, which computes its own AUC (labels never needed
here). Per round ``ctx.log`` gets ``<department>/val-auc``, ``test-auc``, ``train-loss``
... and ``seconds`` since the first round began; the bytes are the context's traffic
counter (``Traffic.by_stage`` tells training from evaluation). Activations and gradients
are float32. Training needs every site's answer (a dropped one stops the run, naming the
site: :mod:`app.vertical.messages`); a site whose evaluation reply is unusable is left out
of that round's metrics, its reason logged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from app.vertical.federation import VerticalContext, VerticalResult
from app.vertical.messages import StageAnswer
from clients.registry import task_class
from clients.training.trainer import select_device
from clients.training.site_task import make_optimizer
from clients.vertical.split_state import OPTIMISER, load_optimisers, optimiser_tensors
from clients.vertical.split_model import (PART, U_SHAPED, batch_key, cut_task_network,
                                          part_arrays, tensor_of)
from models.split_network import buffers_kept
from strategies.aggregation import fedavg_delta
from strategies.wire.errors import ReplyError
from strategies.wire.seeds import round_seed

__all__ = ["run_split", "message_sizes"]

Arrays = dict[str, np.ndarray]


def message_sizes(local_steps: int, per_message: int) -> list[int]:
    """Batches of each message of a site's round: ``per_message`` each, the rest last."""
    full, rest = divmod(local_steps, per_message)
    return [per_message] * full + ([rest] if rest else [])


@dataclass
class _Coordinator:
    """The coordinator's part of the network, its optimiser and what it has seen this round."""

    ctx: VerticalContext
    middle: nn.Module
    optimiser: torch.optim.Optimizer
    loss_fn: nn.Module
    device: torch.device
    #: The shape of one item's activation at the cut.
    cut_shape: tuple[int, ...] = ()
    losses: dict[int, list[float]] = field(default_factory=dict)

    def activation(self, answer: StageAnswer, j: int | str) -> torch.Tensor:
        """Batch ``j``'s cut activation from a site's answer, on the coordinator's device.

        Raises
        ------
        ReplyError
            Missing, not finite, or not of the cut's shape per item (named with the site).
        """
        tensor = tensor_of(answer.arrays, batch_key("activation", j), ReplyError)
        if tuple(tensor.shape[1:]) != self.cut_shape:
            raise ReplyError(f"split learning: {self.site(answer)}'s activation-{j} has items of "
                             f"shape {tuple(tensor.shape[1:])}, the cut's are {self.cut_shape}")
        return tensor.to(self.device)

    def labels(self, answer: StageAnswer, j: int) -> torch.Tensor:
        """Batch ``j``'s labels (vanilla), each in [0, 1], one row per activation row."""
        labels = tensor_of(answer.arrays, batch_key("label", j), ReplyError)
        if labels.numel() and not bool(((labels >= 0) & (labels <= 1)).all()):
            raise ReplyError(f"split learning: {self.site(answer)}'s label-{j} is not in [0, 1]")
        return labels.to(self.device)

    def site(self, answer: StageAnswer) -> str:
        """The department of the site that sent ``answer``, for errors."""
        return self.ctx.department(answer.node_id)

    def vanilla_step(self, answers: Mapping[int, StageAnswer], count: int) -> dict[int, Arrays]:
        """Finish every batch's pass, one optimiser step each; dL_j/da1_j per site."""
        gradients: dict[int, Arrays] = {}
        self.middle.train()
        for node, answer in answers.items():
            gradients[node] = {}
            for j in range(count):
                received = self.activation(answer, j).requires_grad_()
                labels = self.labels(answer, j)
                if len(labels) != len(received):
                    raise ReplyError(f"split learning: {self.site(answer)}'s label-{j} has "
                                     f"{len(labels)} rows for {len(received)} activations")
                loss = self.loss_fn(self.middle(received), labels)
                self.optimiser.zero_grad(set_to_none=True)
                loss.backward()
                self.optimiser.step()
                gradients[node][batch_key("gradient", j)] = received.grad.cpu().numpy()
                self.losses.setdefault(node, []).append(float(loss.detach()))
        return gradients

    def u_step(self, answers: Mapping[int, StageAnswer], count: int,
               server_round: int) -> dict[int, Arrays]:
        """Site after site: a2 = middle(a1) to its head; each dL/da2 back through the middle (its
        forward recomputed at the current weights), one step per batch; dL_j/da1_j per site.

        The sites' head stages go one after another so that a returned dL/da2 is at most
        ``count - 1`` coordinator steps stale (all sites at once: up to sites x count - 1;
        measured on PneumoniaMNIST, that cost the U-shaped variant 3 points of test AUC).
        """
        return {node: self._u_site(node, answer, count, server_round)
                for node, answer in answers.items()}

    def _u_site(self, node: int, answer: StageAnswer, count: int, server_round: int) -> Arrays:
        """One site's batches of a U-shaped exchange (see :meth:`u_step`)."""
        self.middle.train()
        received = [self.activation(answer, j) for j in range(count)]
        with torch.no_grad():
            outputs = {batch_key("output", j): self.middle(a1).float().cpu().numpy()
                       for j, a1 in enumerate(received)}
        head = self.ctx.send("split-head", {node: ({}, outputs)}, server_round)[node]
        gradients: Arrays = {}
        with buffers_kept(self.middle):
            for j, a1 in enumerate(received):
                back = tensor_of(head.arrays, batch_key("gradient", j), ReplyError)
                leaf = a1.requires_grad_()
                out = self.middle(leaf)
                if back.shape != out.shape:
                    raise ReplyError(f"split learning: {self.site(head)}'s gradient-{j} has shape "
                                     f"{tuple(back.shape)}, not {tuple(out.shape)}")
                self.optimiser.zero_grad(set_to_none=True)
                out.backward(back.to(self.device))
                self.optimiser.step()
                gradients[batch_key("gradient", j)] = leaf.grad.cpu().numpy()
        self.losses.setdefault(node, []).append(_metric(head, "train-loss", self.site(head)))
        return gradients

    def turn(self, nodes: list[int], part: Arrays, server_round: int) -> dict[int, StageAnswer]:
        """The sites of ``nodes`` train their round from ``part``; their last answers
        (their parts and training examples)."""
        ctx = self.ctx
        u_shaped = ctx.options.method == U_SHAPED
        sizes = message_sizes(ctx.config.local_steps, ctx.options.batches_per_message)
        answers = ctx.send("split-train", {n: ({"batches": sizes[0], "step": 0}, part)
                                           for n in nodes}, server_round)
        for g, count in enumerate(sizes):
            gradients = (self.u_step(answers, count, server_round) if u_shaped
                         else self.vanilla_step(answers, count))
            last = g + 1 == len(sizes)
            entries = {"batches": 0 if last else sizes[g + 1], "step": g + 1, "return-part": last}
            answers = ctx.send("split-train", {n: (entries, gradients[n]) for n in nodes},
                               server_round)
        return answers

    @torch.no_grad()
    def evaluate(self, part: Arrays, server_round: int) -> dict[int, dict[str, float]]:
        """Every site's val and test splits through the split network; each site's metrics."""
        nodes = self.ctx.nodes
        forward = self.ctx.send("split-eval-forward", {n: ({}, part) for n in nodes}, server_round,
                                required=False)
        self.middle.eval()
        outputs: dict[int, Arrays] = {}
        for node, answer in forward.items():
            outputs[node] = {}
            for name in answer.arrays:
                split = name.removeprefix(batch_key("activation", ""))
                chunks = self.activation(answer, split).split(64)
                outputs[node][batch_key("output", split)] = torch.cat(
                    [self.middle(chunk).float().cpu() for chunk in chunks]).numpy()
        finish = self.ctx.send("split-eval-finish", {n: ({}, outputs[n]) for n in outputs},
                               server_round, required=False)
        return {node: {k: float(v) for k, v in answer.metrics.items()}
                for node, answer in finish.items()}


def _metric(answer: StageAnswer, name: str, site: str) -> float:
    """Metric ``name`` of a site's answer.

    Raises
    ------
    ReplyError
        If the answer lacks it (naming the site).
    """
    if name not in answer.metrics:
        raise ReplyError(f"split learning: {site}'s reply has no metric {name!r}")
    return float(answer.metrics[name])


def _averaged(answers: Mapping[int, StageAnswer]) -> Arrays:
    """The sites' parts averaged, weighted by their training examples (FedAvg)."""
    nodes = list(answers)
    names = sorted(k for k in answers[nodes[0]].arrays if k.startswith(PART))
    for node in nodes:
        if sorted(k for k in answers[node].arrays if k.startswith(PART)) != names:
            raise ReplyError(f"split learning: node {node}'s site part has other tensors")
    mean = fedavg_delta([[answers[n].arrays[k] for k in names] for n in nodes],
                        [int(_metric(answers[n], "num-examples", f"node {n}")) for n in nodes])
    return dict(zip(names, mean))


def _part_of(answer: StageAnswer) -> Arrays:
    return {k: v for k, v in answer.arrays.items() if k.startswith(PART)}


def _optimiser_arrays(optimiser: torch.optim.Optimizer) -> Arrays:
    """The coordinator optimiser's per-parameter state (momentum buffers, Adam's moments)
    as ``optimiser/middle/<i>/<name>`` arrays, as a site keeps its own
    (:func:`clients.vertical.split_state.optimiser_tensors`)."""
    return {k: v.numpy().copy() for k, v in optimiser_tensors({"middle": optimiser}).items()}


def _restore(coordinator: _Coordinator, arrays: Arrays) -> Arrays:
    """Put a checkpoint's middle weights and optimiser state back; the site part it kept."""
    middle = {k.removeprefix("middle/"): torch.from_numpy(np.array(v))
              for k, v in arrays.items() if k.startswith("middle/")}
    coordinator.middle.load_state_dict(middle)
    load_optimisers({"middle": coordinator.optimiser},
                    {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()
                     if k.startswith(OPTIMISER)})
    return {k: v for k, v in arrays.items() if k.startswith(PART)}


def run_split(ctx: VerticalContext) -> VerticalResult:
    """Split learning over ``ctx.nodes`` (see the module docstring); the sites' last metrics and
    the trained network's parts (``middle/*`` at the coordinator, ``part/*`` the sites').

    Each round starts from torch's seed for that round (the run seed's), and ends with
    a checkpoint of the coordinator's part, its optimiser's state and the site part
    (:meth:`VerticalContext.save_round`), so a resumed federation continues as the
    uninterrupted one would.
    """
    task, settings = task_class(ctx.config.task), ctx.config.task_settings()
    torch.manual_seed(ctx.seed)
    split = cut_task_network(task.model_for_run(settings), ctx.options)
    device = select_device().device
    split.middle.to(device)
    with torch.no_grad():
        cut_shape = tuple(split.bottom.eval()(torch.from_numpy(task.example_input(settings))).shape)
    coordinator = _Coordinator(ctx, split.middle, make_optimizer(
        ctx.config.optimizer, split.middle.parameters(), ctx.config.lr, ctx.config.momentum),
        task.loss_fn(), device, cut_shape[1:])
    part = part_arrays(split.site_part())
    kept, state = ctx.resumed_state()
    site_metrics: dict[str, dict[str, float]] = dict(state.get("site-metrics", {}))
    if state:
        part = _restore(coordinator, kept)
    sequential = ctx.options.split_mode == "sequential"
    started = time.monotonic()
    for server_round in range(ctx.first_round, ctx.config.num_server_rounds + 1):
        torch.manual_seed(round_seed(ctx.seed, server_round, 0))
        coordinator.losses.clear()
        turns = [[node] for node in ctx.nodes] if sequential else [list(ctx.nodes)]
        returned: dict[int, StageAnswer] = {}
        for nodes in turns:
            returned.update(coordinator.turn(nodes, part, server_round))
            if sequential:
                part = _part_of(returned[nodes[0]])
        if not sequential:
            part = _averaged(returned)
        evaluated = coordinator.evaluate(part, server_round)
        site_metrics = {}
        for node, metrics in evaluated.items():
            losses = coordinator.losses.get(node, [])
            if losses:
                metrics["train-loss"] = float(np.mean(losses))
            site_metrics[ctx.department(node)] = metrics
        ctx.log_sites(server_round, site_metrics, {"seconds": time.monotonic() - started})
        ctx.save_round(server_round, {**_middle_arrays(split.middle), **part,
                                      **_optimiser_arrays(coordinator.optimiser)}, {},
                       site_metrics)
    return VerticalResult(site_metrics, {**_middle_arrays(split.middle), **part})


def _middle_arrays(middle: nn.Module) -> Arrays:
    """The coordinator's part by ``middle/<state-dict name>`` (weights and buffers)."""
    return {f"middle/{k}": v.detach().cpu().numpy() for k, v in middle.state_dict().items()}
