"""Strategy state as JSON plus named arrays, restored onto the run's own objects.

:func:`encode_tree` turns a strategy snapshot (dicts, lists, numbers, numpy
arrays and scalars, numpy random generators, plug-in objects) into a JSON tree
and a dict of arrays (for ``np.savez``). :func:`decode_tree` reverses it
*onto a template*: an object's attributes are set on the object of the same
class that the run config built, so reading state never constructs a class the
file names (unlike pickle, where a file can run code). A node's kind:

===========  ===============================================
``list``     ``{"t": "list", "v": [node, ...]}`` (also ``tuple``, ``set``, ``frozenset``)
``dict``     ``{"t": "dict", "v": [[key, node], ...]}`` (keys keep int/str)
``array``    ``{"t": "array", "v": "<name in the arrays>"}``
``np``       ``{"t": "np", "dtype": "int64", "v": 3}`` (a numpy scalar)
``rng``      ``{"t": "rng", "v": <bit_generator.state>}``
``object``   ``{"t": "object", "type": "module.Class", "v": {attr: node}}``
===========  ===============================================

None, bool, int, float and str are themselves.

A class whose objects lost an attribute declares it in ``retired_state`` (attribute ->
its neutral value): an older checkpoint's attribute is skipped while it holds that value
(a feature it did not use), refused as unknown otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strategies.wire.errors import FederationError

__all__ = ["StateTreeError", "decode_tree", "encode_tree"]

_PLAIN = (type(None), bool, int, float, str)
_SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
_BIT_GENERATORS = ("PCG64", "PCG64DXSM")  # states of plain ints (JSON)


class StateTreeError(FederationError):
    """Saved strategy state that does not fit the run's objects."""


def _type_name(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def encode_tree(value: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """The JSON tree of ``value`` and the arrays it refers to by name."""
    arrays: dict[str, np.ndarray] = {}

    def encode(v: Any, where: str) -> Any:
        if isinstance(v, _PLAIN) and not isinstance(v, np.generic):
            return v
        if isinstance(v, np.ndarray):
            name = str(len(arrays))
            arrays[name] = v
            return {"t": "array", "v": name}
        if isinstance(v, np.generic):
            return {"t": "np", "dtype": v.dtype.str, "v": v.item()}
        if isinstance(v, (list, tuple, set, frozenset)):
            kind = next(k for k, t in _SEQUENCES.items() if isinstance(v, t))
            items = sorted(v, key=repr) if kind in ("set", "frozenset") else v
            return {"t": kind, "v": [encode(x, f"{where}[{i}]") for i, x in enumerate(items)]}
        if isinstance(v, dict):
            return {"t": "dict", "v": [[encode(k, where), encode(x, f"{where}[{k!r}]")]
                                       for k, x in v.items()]}
        if isinstance(v, np.random.Generator):
            if type(v.bit_generator).__name__ not in _BIT_GENERATORS:
                raise StateTreeError(f"{where}: cannot checkpoint a "
                                     f"{type(v.bit_generator).__name__} generator")
            return {"t": "rng", "v": v.bit_generator.state}
        if hasattr(v, "__dict__") and not isinstance(v, type):
            return {"t": "object", "type": _type_name(v),
                    "v": {k: encode(x, f"{where}.{k}") for k, x in vars(v).items()}}
        raise StateTreeError(f"{where}: cannot checkpoint a {type(v).__name__}")

    return encode(value, "state"), arrays


def _generator(state: dict, template: Any, where: str) -> np.random.Generator:
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise StateTreeError(f"{where}: unknown bit generator {name!r}")
    rng = template if isinstance(template, np.random.Generator) else np.random.Generator(
        getattr(np.random, name)())
    try:
        rng.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as exc:
        raise StateTreeError(f"{where}: bad random state ({exc})") from exc
    return rng


def decode_tree(node: Any, arrays: dict[str, np.ndarray], template: Any = None,
                where: str = "state") -> Any:
    """The value ``node`` describes, restored onto ``template`` where it holds objects.

    Raises
    ------
    StateTreeError
        Naming the path (``state['schedule']._smoother``) of a node that is
        malformed, refers to a missing array, or is an object whose template is
        missing or of another class.
    """
    if isinstance(node, _PLAIN):
        return node
    if not isinstance(node, dict) or "t" not in node or "v" not in node:
        raise StateTreeError(f"{where}: malformed state node")
    kind, value = node["t"], node["v"]
    if kind == "array":
        if value not in arrays:
            raise StateTreeError(f"{where}: array {value!r} missing")
        return arrays[value]
    if kind == "np":
        return np.dtype(node["dtype"]).type(value)
    if kind in _SEQUENCES:
        items = [decode_tree(x, arrays, None, f"{where}[{i}]") for i, x in enumerate(value)]
        return items if kind == "list" else _SEQUENCES[kind](items)
    if kind == "dict":
        out = {}
        for key_node, item in value:
            key = decode_tree(key_node, arrays, None, where)
            sub = template.get(key) if isinstance(template, dict) else None
            out[key] = decode_tree(item, arrays, sub, f"{where}[{key!r}]")
        return out
    if kind == "rng":
        return _generator(value, template, where)
    if kind == "object":
        return _restore_object(node, arrays, template, where)
    raise StateTreeError(f"{where}: unknown state kind {kind!r}")


def _neutral(value: Any, neutral: Any) -> bool:
    """``value`` is the plain value ``neutral`` (None, a number, a string)."""
    return value is None if neutral is None else (isinstance(value, _PLAIN)
                                                  and value == neutral)


def _restore_object(node: dict, arrays: dict[str, np.ndarray], template: Any,
                    where: str) -> Any:
    attrs = node["v"]
    if template is None:  # inspection only: the attributes, no object built
        return {k: decode_tree(x, arrays, None, f"{where}.{k}") for k, x in attrs.items()}
    if _type_name(template) != node.get("type"):
        raise StateTreeError(f"{where}: saved {node.get('type')}, the run config builds "
                             f"{_type_name(template)}")
    current = vars(template)
    retired = getattr(template, "retired_state", {})
    attrs = {k: x for k, x in attrs.items() if k in current or k not in retired
             or not _neutral(decode_tree(x, arrays, None, f"{where}.{k}"), retired[k])}
    unknown = sorted(set(attrs) - set(current))
    if unknown:
        raise StateTreeError(f"{where}: attributes {unknown} unknown to {_type_name(template)}")
    for key, item in attrs.items():
        object.__setattr__(template, key,
                           decode_tree(item, arrays, current[key], f"{where}.{key}"))
    return template
