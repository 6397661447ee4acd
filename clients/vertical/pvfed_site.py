"""The site's side of pvFed (Nishikawa et al., "pvFed", IEEJ Trans. 2024): two stages.

``pvfed-local`` (once, after the patient alignment)
    The site trains its **local model** (its own task's network,
    ``vertical.local-epochs``, the run config's optimiser, learning rate and batch
    size) on its training patients among the aligned ones, keeping the epoch of
    best validation AUC: its *local best* (``local-val-auc``, ``local-test-auc``).
    The model's **feature extractor** (the model without its last ``nn.Linear``,
    :func:`models.pvfed.split_output_layer`) maps every aligned patient, whatever
    its split (features need no label), to a vector of width ``f``; the **local
    encoder**, an ID encoder (patient position -> vector), is distilled to mimic
    those vectors with the Euclidean loss (``vertical.encoder-epochs``,
    ``vertical.encoder-lr``). The reply carries the local encoder's weights.

``pvfed-round`` (each round, with the coordinator's global encoder)
    ``g = global_encoder(patient)``; the **redefined output layer**, ``nn.Linear(d_g + f,
    labels)`` on ``[g, extractor(x)]``, is trained with the extractor frozen
    (``vertical.head-epochs``, kept at its best validation AUC): ``pvfed-val-auc``,
    ``pvfed-test-auc``. The paper does not say how the new layer starts; here it
    starts as the local output layer (weights 0 on ``g``), and the start competes in
    the validation choice, so pvFed's validation AUC is never below the local best's. With ``pvfed-encode`` true (every round but the last) the
    local encoder is trained again ("然后, 再次训练本地编码器") and sent again.

The width choice: the local encoder mimics the extractor's output itself, width
``f`` (the paper: "模仿这些模型的特征提取层的输出"), not a projection to
``vertical.dim``; the coordinator's aggregation reduces the concatenation to
``vertical.dim`` (``mean`` needs equal widths, strategies/vertical/pvfed_aggregation.py).
Because the extractor stays frozen ("特征提取器组件保持不变"), its outputs are the
same every round: a round continues both distillations from where they stopped,
which the paper repeats "until the clients' accuracy converges".

What leaves the site: **the local encoder's weights are one vector per aligned
patient** (an embedding table, N x ``vertical.hidden``, and a linear map to the
extractor's ``f`` outputs), i.e. a learned summary of the site's data about each
shared patient; never the patients' ids, inputs or labels. A site answers only
where its policy allows vertical federations (``[vertical] allowed``, checked by
:func:`clients.vertical.stages.answer_vertical`) and after an alignment it did not
refuse (``vertical.min-intersection``, :func:`clients.vertical.alignment.load_alignment`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from clients.registry import task_class
from clients.vertical.alignment import load_alignment
from clients.vertical.pvfed_state import LocalState, PvFedState
from clients.vertical.pvfed_training import FitSettings, auc, fit_classifier, outputs
from clients.vertical.site_data import aligned_data
from clients.vertical.stages import VerticalReply, VerticalRequest, VerticalSite
from models.pvfed import (IdEncoder, encoder_arrays, encoder_from_arrays, fit_id_encoder,
                          split_output_layer)
from strategies.wire.errors import SiteError
from strategies.wire.seeds import site_seed

__all__ = ["ENCODE", "pvfed_local", "pvfed_round"]

#: Config entry of ``pvfed-round``: train the local encoder again and send it.
ENCODE = "pvfed-encode"


def _seed(site: VerticalSite, server_round: int, purpose: str) -> int:
    """The seed of one of the site's pvFed fits (:func:`strategies.wire.seeds.site_seed`)."""
    return site_seed(site.seed, server_round, f"pvfed-{purpose}:{site.name}")


def _fit_settings(site: VerticalSite, epochs: int, seed: int) -> FitSettings:
    return FitSettings(epochs=epochs, batch_size=site.settings.batch_size, lr=site.lr,
                       optimizer=site.optimizer, momentum=site.momentum, seed=seed)


def _defined(metrics: dict[str, float | None]) -> dict[str, float]:
    """The defined metrics (an undefined AUC is omitted, never NaN)."""
    return {name: float(value) for name, value in metrics.items() if value is not None}


def _distil(request: VerticalRequest, encoder: IdEncoder, features: np.ndarray,
            state: PvFedState) -> VerticalReply:
    """Train the local encoder on ``features``, keep it, reply with its weights."""
    losses = fit_id_encoder(encoder, features, request.options.encoder_epochs,
                            request.options.encoder_lr)
    arrays = encoder_arrays(encoder)
    state.save_encoder(arrays)
    return VerticalReply(arrays=arrays, metrics={"encoder-loss": losses[-1]},
                         info={"department": request.site.department})


def pvfed_local(request: VerticalRequest) -> VerticalReply:
    """Stage ``pvfed-local``: local model, its extractor's outputs, the local encoder.

    Raises
    ------
    PolicyRefusal
        ``vertical.min-intersection`` if the site refused the alignment.
    SiteError
        No alignment yet, aligned patients the task no longer loads, no training patient.
    """
    site, options = request.site, request.options
    ids = load_alignment(site.state_dir)
    task = site.task()
    data = aligned_data(task, ids)
    seed = _seed(site, 0, "local")
    torch.manual_seed(seed)
    model = task.build_model().to(site.compute.device)
    outputs(model, data.inputs[:2])  # a lazily sized layer takes its shape before the optimiser
    try:
        split_output_layer(model)  # a model without an output Linear is refused before training
        fitted = fit_classifier(model, task.loss_fn(), data.split("train"), data.split("val"),
                                _fit_settings(site, options.local_epochs, seed))
    except ValueError as exc:
        raise SiteError(f"pvFed local model of {site.department} (task {site.task_name}): "
                        f"{exc}") from exc
    extractor, output = split_output_layer(model)
    features = outputs(extractor, data.inputs).flatten(1).numpy()
    local = _defined({"local-val-auc": fitted.val_auc,
                      "local-test-auc": auc(model, *data.split("test"))})
    state = PvFedState(site.state_dir)
    state.save_local(model, output, features, data.labels.numpy(), data.positions, local)
    encoder = IdEncoder(len(ids), options.hidden, features.shape[1],
                        seed=_seed(site, 0, "encoder"))
    reply = _distil(request, encoder, features, state)
    reply.metrics.update(local, patients=len(ids), **{"feature-width": features.shape[1]})
    return reply


def _global_vectors(request: VerticalRequest, patients: int) -> np.ndarray:
    """The global encoder's vectors of the aligned patients.

    Raises
    ------
    SiteError
        If the arrays are not an ID encoder of ``patients`` patients with finite outputs.
    """
    try:
        encoder = encoder_from_arrays(request.arrays)
    except ValueError as exc:
        raise SiteError(f"pvfed-round: the global encoder: {exc}") from exc
    if encoder.num_ids != patients:
        raise SiteError(f"pvfed-round: a global encoder of {encoder.num_ids} patients; this "
                        f"site aligned {patients}")
    vectors = encoder.vectors()
    if not np.isfinite(vectors).all():
        raise SiteError("pvfed-round: the global encoder gives non-finite vectors")
    return vectors


def _redefined_output_layer(local: LocalState, global_width: int) -> nn.Linear:
    """``nn.Linear(d_g + f, labels)`` starting as the local model's output layer.

    The weights on the ``f`` features and the bias are the local output layer's, those
    on the ``d_g`` global entries 0: training starts from the local best's predictions
    (epoch 0 of :func:`~clients.vertical.pvfed_training.fit_classifier`) and moves only
    where the global vectors help on the training patients.
    """
    weight, bias = (torch.as_tensor(local.output[name]) for name in ("weight", "bias"))
    head = nn.Linear(global_width + weight.shape[1], weight.shape[0])
    with torch.no_grad():
        head.weight.zero_()
        head.weight[:, global_width:] = weight
        head.bias.copy_(bias)
    return head


def _retrain_head(request: VerticalRequest, local: LocalState,
                  vectors: np.ndarray) -> tuple[nn.Linear, dict[str, float]]:
    """The redefined output layer on ``[g, features]``, at its best validation AUC."""
    site = request.site
    joint = torch.as_tensor(np.concatenate([vectors, local.features], axis=1))
    labels = torch.as_tensor(local.labels)
    seed = _seed(site, request.server_round, "head")
    head = _redefined_output_layer(local, vectors.shape[1])
    index = {split: torch.as_tensor(local.positions[split]) for split in local.positions}
    fitted = fit_classifier(head, task_class(site.task_name).loss_fn(),
                            (joint[index["train"]], labels[index["train"]]),
                            (joint[index["val"]], labels[index["val"]]),
                            _fit_settings(site, request.options.head_epochs, seed), keep_start=True)
    metrics = _defined({"pvfed-val-auc": fitted.val_auc,
                        "pvfed-test-auc": auc(head, joint[index["test"]], labels[index["test"]])})
    return head, {**metrics, "head-inputs": joint.shape[1]}


def pvfed_round(request: VerticalRequest) -> VerticalReply:
    """Stage ``pvfed-round``: the redefined output layer on the global encoder's vectors.

    Config ``pvfed-encode`` (bool, default false): train the local encoder again and send it.

    Raises
    ------
    PolicyRefusal
        ``vertical.min-intersection`` if the site refused the alignment.
    SiteError
        Before ``pvfed-local``, or a global encoder that does not fit the aligned patients.
    """
    site = request.site
    load_alignment(site.state_dir)  # a refused alignment refuses every per-patient stage
    state = PvFedState(site.state_dir)
    local = state.load_local()
    head, metrics = _retrain_head(request, local, _global_vectors(request, len(local.features)))
    state.save_head(head)
    reply = VerticalReply(info={"department": site.department})
    if bool(request.config.get(ENCODE, False)):
        encoder = encoder_from_arrays(state.load_encoder())
        reply = _distil(request, encoder, local.features, state)
    reply.metrics.update(local.metrics, **metrics)
    return reply
