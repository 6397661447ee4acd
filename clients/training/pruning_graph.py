"""Structured pruning units of a model: torch-pruning's dependency groups as plain data.

Removing output channel ``k`` of a convolution also removes ``k`` from everything that
depends on it: its bias, the normalisation layer after it, the next layer's input
channel, the other branch of a residual sum, the concatenations of a dense block. Fang
et al. ("DepGraph: towards any structural pruning", CVPR 2023) find these couplings by
tracing the model; torch-pruning (their library) builds the graph and returns them as
*groups*. :func:`structured_groups` turns each group into the JSON-able form the
coordinator reads (``clients.training.pruning.model_structure``): for every trainable
parameter the group touches, the array, the axis and, for each unit ``k`` of the group,
the index torch-pruning removes for root channel ``k``.

Left out, and logged: the model's output layers (their channels are the predictions),
layers called more than once in a forward pass (recurrent cells, whose weights are
shared over time), groups through a split of a layer's output (an LSTM's gates), groups
through a GroupNorm (DP-SGD's models: a zeroed channel still counts in its group's mean and
variance, a removed one does not, so the coordinator's mask and the site's smaller network
would differ), and groups torch-pruning maps to unequal index counts or to parameters of
unknown layout.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

import torch
import torch_pruning as tp
from torch import nn
from torch.overrides import TorchFunctionMode

from strategies.wire.errors import SiteError

__all__ = ["PruningSurgeryError", "ROOT_TYPES", "dependency_graph", "model_cost",
           "structured_groups"]

log = logging.getLogger(__name__)

#: Layers whose output channels are the roots of structured groups.
ROOT_TYPES = (nn.modules.conv._ConvNd, nn.Linear)
#: Graph nodes whose presence in a group marks a layer's output split into parts (gates).
_SPLITS = (tp.ops.OPTYPE.SPLIT, tp.ops.OPTYPE.UNBIND)


class PruningSurgeryError(SiteError):
    """A pruning mask, structure or surgery does not fit the model; names the layer."""


class _CatSizes(TorchFunctionMode):
    """Records the input widths of every ``torch.cat`` along its dimension, by result."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[object, list[int]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in (torch.cat, torch.concat) and getattr(out, "grad_fn", None) is not None:
            dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
            self.sizes[out.grad_fn] = [int(t.shape[dim]) for t in args[0]]
        return out


class _Graph(tp.DependencyGraph):
    """torch-pruning's graph with each concatenation's input widths read from the trace.

    torch-pruning 1.6.1 infers them by walking back from each input and takes the last
    input of an element-wise node, which for MONAI's shared-slope PReLU is its weight: no
    width, and the graph cannot be built for the U-Net.
    """

    def _trace(self, model, example_inputs, forward_fn, output_transform):
        calls: Counter[nn.Module] = Counter()
        hooks = [m.register_forward_hook(lambda module, i, o: calls.update([module]))
                 for m in model.modules() if isinstance(m, ROOT_TYPES)]
        try:
            with _CatSizes() as cats:
                module2node = super()._trace(model, example_inputs, forward_fn, output_transform)
        finally:
            for hook in hooks:
                hook.remove()
        for node in module2node.values():
            if node.type == tp.ops.OPTYPE.CONCAT and node.grad_fn in cats.sizes:
                node.module.concat_sizes = cats.sizes[node.grad_fn]
        self.reused_layers = [m for m, count in calls.items() if count > 1]
        return module2node


def dependency_graph(model: nn.Module, example_input: torch.Tensor) -> _Graph:
    """torch-pruning's dependency graph of ``model`` traced on ``example_input`` (eval mode).

    The input goes in a one-element tuple: torch-pruning calls ``model(*example_inputs)``
    first, which on a bare batch of one would run the model on the unbatched example.
    """
    training = model.training
    try:
        with torch.enable_grad():
            return _Graph().build_dependency(model, example_inputs=(example_input,),
                                             verbose=False)
    finally:
        model.train(training)


def output_layers(graph: _Graph) -> list[nn.Module]:
    """The root-type layers whose output reaches the model's output through no other one."""
    nodes = list(graph.module2node.values())
    stack = [n for n in nodes if not n.outputs]
    seen, found = set(), []
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if isinstance(node.module, ROOT_TYPES):
            found.append(node.module)
        else:
            stack.extend(node.inputs)
    return found


def split_layers(graph: _Graph) -> list[nn.Module]:
    """The root-type layers whose output is split (an LSTM's gates) before any other such
    layer reads it."""
    found = []
    for module, start in graph.module2node.items():
        if not isinstance(module, ROOT_TYPES):
            continue
        stack, seen = list(start.outputs), set()
        while stack:
            node = stack.pop()
            if node in seen or isinstance(node.module, ROOT_TYPES):
                continue
            seen.add(node)
            if node.type in _SPLITS:
                found.append(module)
                break
            stack.extend(node.outputs)
    return found


def _parameter_axes(module: nn.Module, out_channels: bool, name: str
                    ) -> list[tuple[str, int]] | None:
    """``[(parameter name, axis)]`` that a channel handler on ``module`` cuts; None: unknown."""
    if isinstance(module, nn.modules.conv._ConvNd):
        if module.groups != 1:
            return None
        transposed = bool(module.transposed)
        if out_channels:
            axes = [("weight", 1 if transposed else 0)] + [("bias", 0)] * (module.bias is not None)
        else:
            axes = [("weight", 0 if transposed else 1)]
    elif isinstance(module, nn.Linear):
        axes = [("weight", 0)] + [("bias", 0)] * (module.bias is not None) if out_channels \
            else [("weight", 1)]
    else:  # normalisation layers, PReLU: per-channel vectors
        own = dict(module.named_parameters(recurse=False))
        if any(p.dim() != 1 for p in own.values()):
            return None
        axes = [(key, 0) for key in own]
    return [(f"{name}.{key}" if name else key, axis) for key, axis in axes]


def _group_slices(graph: _Graph, group, names: dict[nn.Module, str],
                  params: dict[str, nn.Parameter]) -> list[dict] | str:
    """The slices of one torch-pruning group, or why it is left out."""
    units = len(group[0].idxs)
    slices = []
    for item in group:
        dep = item.dep
        if dep.target.type in _SPLITS:
            return "its output is split (gates)"
        module = dep.target.module
        if not isinstance(module, nn.Module) or not list(module.parameters(recurse=False)):
            if isinstance(module, nn.Parameter):
                return "it cuts a bare parameter"
            continue
        out = graph.is_out_channel_pruning_fn(dep.handler)
        width = graph.get_out_channels(module) if out else graph.get_in_channels(module)
        if width is None:  # e.g. PReLU with one shared slope: nothing to cut
            continue
        by_root: dict[int, list[int]] = defaultdict(list)
        for idx, root in zip(item.idxs, item.root_idxs):
            by_root[int(root)].append(int(idx))
        counts = {len(by_root.get(k, ())) for k in range(units)}
        if len(counts) != 1 or 0 in counts:
            return f"it maps its {units} channels unevenly onto {names[module]!r}"
        axes = _parameter_axes(module, out, names[module])
        if axes is None:
            return f"layer {names[module]!r} ({type(module).__name__}) has no known channel axes"
        if isinstance(module, nn.GroupNorm):
            return f"GroupNorm {names[module]!r} normalises over several channels"
        for r in range(counts.pop()):
            for array, axis in axes:
                if array in params and params[array].requires_grad:
                    slices.append({"array": array, "axis": axis,
                                   "indices": [by_root[k][r] for k in range(units)]})
    return slices


def structured_groups(model: nn.Module, example_input: torch.Tensor) -> list[dict]:
    """The structured units of ``model``: one group per layer's output channels.

    Each group ``{"name": root layer, "slices": [{"array", "axis", "indices"}, ...]}``: unit
    ``k`` covers ``indices[k]`` along ``axis`` of ``array`` in every slice (trainable
    parameters only, never buffers), exactly what torch-pruning removes for root channel
    ``k``. Groups are in the graph's order, which is deterministic for a model.
    """
    graph = dependency_graph(model, example_input)
    names = {module: name for name, module in model.named_modules()}
    params = dict(model.named_parameters())
    left_out = {names[m]: "output layer" for m in output_layers(graph)}
    left_out.update({names[m]: "called more than once (recurrent)" for m in graph.reused_layers})
    left_out.update({names[m]: "its output is split (gates)" for m in split_layers(graph)})
    modules = dict(model.named_modules())
    ignored, groups = [modules[name] for name in left_out], []
    for group in graph.get_all_groups(ignored_layers=ignored, root_module_types=ROOT_TYPES):
        root = names[group[0].dep.target.module]
        slices = _group_slices(graph, group, names, params)
        if isinstance(slices, str):
            left_out[root] = slices
        elif slices:
            groups.append({"name": root, "slices": slices})
    log.info("structured pruning of %s: %d groups; left out: %s", type(model).__name__,
             len(groups), "; ".join(f"{k} ({v})" for k, v in left_out.items()) or "none")
    return groups


def model_cost(model: nn.Module, example_input: torch.Tensor) -> dict[str, float]:
    """``{"params": parameters, "flops": multiply-accumulates of one forward}`` of ``model`` on
    ``example_input`` (torch-pruning's ``count_ops_and_params``)."""
    training = model.training
    try:
        macs, n_params = tp.utils.count_ops_and_params(model.eval(), example_input)
    finally:
        model.train(training)
    return {"params": float(n_params), "flops": float(macs)}
