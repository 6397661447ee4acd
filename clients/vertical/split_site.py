"""The site's stages of split learning: cut activations out, cut gradients in, its own evaluation.

Split learning (Vepakomma et al., "Split learning for health", arXiv:1812.00564, 2018;
the book's chapter 4) over sites that hold different patients of the same imaging task
(horizontal data, no private set intersection; Poirot et al., "Split learning for
collaborative deep learning in healthcare", arXiv:1912.12115, 2019, on chest X-rays).
The site holds the network's first ``vertical.cut`` blocks (``bottom``) and, U-shaped
(``splitnn-u``), its last ``vertical.head-layers`` blocks (``head``); the coordinator
the rest (:mod:`app.vertical.split_flow`). Stages, one message each:

``split-train``
    Optionally loads the site part the message carries (``part/*``: the start of the
    site's turn). Then, if the message carries ``gradient-<j>`` (dL_j/da1_j, the
    gradient of batch j's mean loss at the cut), back-propagates each through the
    bottom, its forward pass recomputed from the saved batch (same indices, same
    seed), one optimiser step per batch. Then, if ``batches`` > 0, draws that many
    class-balanced batches (``batch-size``) and replies ``activation-<j>`` =
    bottom(x_j); the vanilla SplitNN also sends ``label-<j>`` (only where the policy
    says ``[vertical] share-labels = true``, else refused: rule
    ``vertical.share-labels``). With ``return-part`` it replies its part (``part/*``)
    and ``num-examples``.
``split-head`` (U-shaped)
    Gets a2_j = middle(a1_j), computes head(a2_j) and the loss with its own labels,
    steps the head once on the mean gradient, replies ``gradient-<j>`` = dL_j/da2_j
    and ``train-loss``; the labels never leave the site.
``split-eval-forward`` / ``split-eval-finish``
    Loads the part the coordinator sends (the round's averaged or last part), replies
    ``activation-val`` / ``activation-test`` of its val and test splits (bottom in
    eval mode), then gets ``output-<split>`` back (vanilla: the logits; U-shaped: a2,
    the site finishes with its head) and replies ``<split>-auc``, ``<split>-loss``,
    ``<split>-accuracy`` and ``<split>-examples``: evaluation never needs the labels
    at the coordinator. But it scores outputs the coordinator chose against the site's
    labels, so each call is counted per dataset (``vertical.max-evaluations``, all
    federations together) and a split of fewer than ``min-val-items`` items is refused.

*Labels.* The site trains with the labels :func:`_training_labels` gives: its own where
they may leave (``share-labels = true``) and no label DP is set; with
``vertical.label-dp-epsilon`` finite, randomised-response labels drawn once per dataset
(:mod:`clients.vertical.label_dp`; Ghazi et al., NeurIPS 2021), which every gradient,
loss and batch draw is then computed from. U-shaped training with private labels and no
label DP is refused (rule ``vertical.label-dp-epsilon``): the per-example dL/da2 projected
on the head weights the coordinator sent reads off each label.

*Batching and staleness.* One message carries ``vertical.batches-per-message`` (k)
batches, their activations all computed with the site weights w_t of the message. Every
part steps once per batch, so a round is ``local-steps`` steps of each part, as in the
SplitNN; but batch j's gradient comes back for an activation computed at w_t and is
back-propagated through the bottom at w_{t+j} (the forward recomputed at the current
weights): it is up to k - 1 site steps stale, as the U-shaped head's dL/da2 is for an
a2 the coordinator computed before its own steps. With k = 1 this is exactly the
SplitNN of the paper; k trades that staleness for k times fewer messages. The
recomputed pass leaves the normalisation statistics as the first pass left them
(:func:`~models.split_network.buffers_kept`). Everything that crosses is float32.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from clients.site.policy import PolicyRefusal
from clients.site.policy_check import check_training
from clients.site.query_budget import EVALUATIONS, QUERY_COUNTS, take_request
from clients.site.site_round import sized_request
from clients.training.classification import logit_metrics
from clients.training.trainer import positive_share_weights
from clients.training.site_task import EVAL_SPLITS
from clients.vertical.label_dp import check_label_rules, site_noisy_labels
from clients.vertical.split_model import U_SHAPED, batch_key, part_arrays, tensor_of
from clients.vertical.split_state import SplitSiteState, open_state, save_state
from clients.vertical.stages import VerticalReply, VerticalRequest
from models.split_network import buffers_kept
from strategies.wire.errors import SiteError
from strategies.wire.seeds import site_seed

__all__ = ["split_train", "split_head", "split_eval_forward", "split_eval_finish"]


def _training_labels(request: VerticalRequest) -> torch.Tensor:
    """``(N, L)`` labels the site trains with: its own, or with ``vertical.label-dp-epsilon``
    finite its randomised-response labels, drawn once per dataset
    (:func:`~clients.vertical.label_dp.site_noisy_labels`; Ghazi et al., NeurIPS 2021)."""
    site = request.site
    data = site.task().require_training()
    stored = getattr(data, "labels", None)
    labels = torch.stack(list(stored) if stored is not None
                         else [data[i][1] for i in range(len(data))]).float()
    epsilon = site.rules.label_dp_epsilon
    if math.isinf(epsilon):
        return labels
    noisy = site_noisy_labels(site.site.state_dir, site.data_path,
                              labels.reshape(len(labels), -1).numpy(), epsilon)
    return torch.from_numpy(noisy).reshape(labels.shape)


def _images(request: VerticalRequest, indices: np.ndarray) -> torch.Tensor:
    """Training examples ``indices`` as one batch of inputs on the site's device."""
    data = request.site.task().require_training()
    return torch.stack([data[int(i)][0] for i in indices]).to(request.site.compute.device)


def _rows(labels: torch.Tensor, indices: np.ndarray, device: torch.device) -> torch.Tensor:
    """The labels of training examples ``indices`` on ``device``."""
    return labels[torch.from_numpy(np.asarray(indices, np.int64))].to(device)


def _draw(request: VerticalRequest, count: int, state: SplitSiteState,
          labels: torch.Tensor) -> None:
    """Draw ``count`` class-balanced batches of training indices (the run's positive share of
    ``labels``, the ones the site trains with: under label DP the noisy ones, so that how
    often an item is drawn says nothing more of its label), seeded by the run seed, the
    round, the message's ``step`` and the site."""
    site = request.site
    data = site.task().require_training()
    step = request.config.get("step", 0)
    seed = site_seed(site.seed, request.server_round, f"{site.name}/split/{step}")
    positives = torch.nonzero(labels.reshape(len(labels), -1).amax(1) > 0).flatten().tolist()
    weights = positive_share_weights(len(data), positives,
                                     site.settings.positive_fraction).numpy()
    rng = torch.Generator().manual_seed(seed)
    state.pending = torch.multinomial(torch.from_numpy(weights), count * site.settings.batch_size,
                                      replacement=True, generator=rng).view(count, -1).numpy()
    state.seeds = (seed + torch.arange(count)).numpy()


def _step(optimiser: torch.optim.Optimizer, output: torch.Tensor, gradient: torch.Tensor) -> None:
    """One optimiser step of the part that computed ``output``, on the gradient it got back."""
    optimiser.zero_grad(set_to_none=True)
    output.backward(gradient.to(output.device))
    optimiser.step()


def _backward_bottom(request: VerticalRequest, state: SplitSiteState) -> None:
    """Back-propagate each returned cut gradient through the bottom (its forward recomputed at
    the current weights), one step per batch; the statistics as the first pass left them."""
    if not len(state.pending):
        raise SiteError("split learning: gradients came for no pending batch (stage out of order)")
    with buffers_kept(state.split.bottom.train()) as bottom:
        for j, (indices, seed) in enumerate(zip(state.pending, state.seeds)):
            gradient = tensor_of(request.arrays, batch_key("gradient", j))
            x = _images(request, indices)
            torch.manual_seed(int(seed))
            activation = bottom(x)
            if activation.shape != gradient.shape:
                raise SiteError(f"split learning: gradient-{j} has shape {tuple(gradient.shape)}, "
                                f"the cut activation {tuple(activation.shape)}")
            _step(state.optimisers["bottom"], activation, gradient)
    state.pending, state.seeds = state.pending[:0], state.seeds[:0]


def _check_training(request: VerticalRequest, count: int) -> None:
    """The policy's training rules (:func:`~clients.site.policy_check.check_training`) for the
    ``count`` batches a message asks for: task and sizes, ``min-batch-size``, the local-step
    bounds, and ``dp.required`` (split learning has no DP-SGD: such a site refuses it)."""
    site = request.site
    check_training(site.site.policy,
                   sized_request(site.task_name, site.settings, local_steps=count))


def split_train(request: VerticalRequest) -> VerticalReply:
    """Stage ``split-train``: the site part in, the returned gradients applied, the next batches'
    cut activations out (see the module docstring).

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.share-labels``: the vanilla SplitNN needs the labels at the
        coordinator and the site's policy does not let them leave; rule
        ``vertical.label-dp-epsilon``: U-shaped with private labels and no label DP
        (:func:`~clients.vertical.label_dp.check_label_rules`); a training rule of the
        policy (:func:`_check_training`).
    SiteError
        No site part, gradients for no pending batch, a gradient of the wrong shape.
    """
    site, options = request.site, request.options
    count = int(request.config.get("batches", 0))
    vanilla = options.method != U_SHAPED
    if count:
        check_label_rules(site.rules, options.method)
        _check_training(request, count)
    state = open_state(request)
    if batch_key("gradient", 0) in request.arrays:
        _backward_bottom(request, state)
    reply = VerticalReply(metrics={"num-examples": len(site.task().require_training())})
    if count:
        if len(state.pending):
            raise SiteError("split learning: new batches asked before the pending ones' gradients")
        labels = _training_labels(request)
        _draw(request, count, state, labels)
        bottom = state.split.bottom.train()
        for j, (indices, seed) in enumerate(zip(state.pending, state.seeds)):
            x = _images(request, indices)
            torch.manual_seed(int(seed))
            with torch.no_grad():
                reply.arrays[batch_key("activation", j)] = bottom(x).float().cpu().numpy()
            if vanilla:
                reply.arrays[batch_key("label", j)] = _rows(labels, indices, torch.device("cpu")).numpy()
    if request.config.get("return-part", False):
        reply.arrays.update(part_arrays(state.part))
    save_state(request, state)
    return reply


def split_head(request: VerticalRequest) -> VerticalReply:
    """Stage ``split-head`` (U-shaped): the head's forward, the loss with the site's labels, one
    step of the head; replies dL_j/da2_j per pending batch and the message's mean loss.

    The loss is the one of the labels the site trains with (:func:`_training_labels`):
    under ``vertical.label-dp-epsilon`` the randomised-response ones, so dL_j/da2_j, which
    gives the coordinator each label it is computed from, is epsilon-label-DP.

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.label-dp-epsilon`` (:func:`~clients.vertical.label_dp.check_label_rules`).
    SiteError
        The method is not U-shaped, or no batch is pending.
    """
    if request.options.method != U_SHAPED:
        raise SiteError(f"split learning: stage 'split-head' is U-shaped only, not "
                        f"{request.options.method!r}")
    check_label_rules(request.site.rules, request.options.method)
    state = open_state(request)
    if not len(state.pending):
        raise SiteError("split learning: 'split-head' for no pending batch (stage out of order)")
    head, loss_fn = state.split.head.train(), request.site.task().loss_fn()
    reply, losses, labels = VerticalReply(), [], _training_labels(request)
    for j, indices in enumerate(state.pending):
        y = _rows(labels, indices, request.site.compute.device)
        received = tensor_of(request.arrays, batch_key("output", j)).to(y.device).requires_grad_()
        loss = loss_fn(head(received), y)
        _step(state.optimisers["head"], loss, torch.ones(()))
        reply.arrays[batch_key("gradient", j)] = received.grad.cpu().numpy()
        losses.append(float(loss.detach()))
    reply.metrics["train-loss"] = sum(losses) / len(losses)
    save_state(request, state)
    return reply


def split_eval_forward(request: VerticalRequest) -> VerticalReply:
    """Stage ``split-eval-forward``: the part in, the val and test splits' cut activations out."""
    state = open_state(request)
    task, device = request.site.task(), request.site.compute.device
    bottom, reply = state.split.bottom.eval(), VerticalReply()
    for split in EVAL_SPLITS:
        data = task.eval_set(split)
        if data is None or not len(data):
            continue
        x = torch.stack([data[i][0] for i in range(len(data))])
        with torch.no_grad():
            out = [bottom(chunk.to(device)).float().cpu() for chunk in x.split(64)]
        reply.arrays[batch_key("activation", split)] = torch.cat(out).numpy()
    save_state(request, state)
    return reply


def _check_evaluation(request: VerticalRequest, scored: list[str]) -> None:
    """The policy's evaluation rules, before any label is read: every scored split holds at
    least ``min-val-items`` items, and the dataset's count of evaluations
    (:func:`~clients.site.query_budget.take_request`, all federations together) is below
    ``vertical.max-evaluations``: each answer scores outputs the coordinator chose
    against the site's labels, a label oracle if unbounded."""
    site = request.site
    task, policy = site.task(), site.site.policy
    for split in scored:
        data = task.eval_set(split)
        items = 0 if data is None else len(data)
        if items < policy.min_val_items:
            raise PolicyRefusal("min-val-items", f"split {split!r} holds {items} items, fewer "
                                f"than the policy's {policy.min_val_items}: its metrics would "
                                "tell the coordinator of too few labels")
    take_request(site.site.state_dir / QUERY_COUNTS, site.data_path, EVALUATIONS,
                 site.rules.max_evaluations, "vertical.max-evaluations")


def split_eval_finish(request: VerticalRequest) -> VerticalReply:
    """Stage ``split-eval-finish``: the coordinator's outputs in, the site's metrics out
    (``<split>-auc``, ``-loss``, ``-accuracy``, ``-examples``; AUC left out where undefined).

    Raises
    ------
    PolicyRefusal
        Rule ``min-val-items`` (a scored split is too small) or ``vertical.max-evaluations``
        (the dataset has had that many evaluations scored), :func:`_check_evaluation`.
    SiteError
        Outputs for a split the site does not have, or of another length.
    """
    scored = [split for split in EVAL_SPLITS if batch_key("output", split) in request.arrays]
    if not scored:
        return VerticalReply()
    _check_evaluation(request, scored)
    task = request.site.task()
    u_shaped = request.options.method == U_SHAPED
    head = open_state(request).split.head.eval() if u_shaped else None
    reply = VerticalReply()
    for split in scored:
        name = batch_key("output", split)
        data = task.eval_set(split)
        if data is None or not len(data):
            raise SiteError(f"split learning: {name} for split {split!r}, which has no items")
        labels = torch.stack([data[i][1] for i in range(len(data))])
        out = tensor_of(request.arrays, name)
        if head is not None:
            with torch.no_grad():
                out = head(out.to(request.site.compute.device)).float().cpu()
        if len(out) != len(labels):
            raise SiteError(f"split learning: {name} has {len(out)} rows, split {split!r} "
                            f"{len(labels)} items")
        result = logit_metrics(out, labels)
        reply.metrics.update({f"{split}-{name}": value for name, value in result.metrics.items()})
        reply.metrics.update({f"{split}-loss": result.loss, f"{split}-examples": len(labels)})
    return reply
