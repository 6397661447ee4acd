"""A site's side of SCAFFOLD: its control variate ``c_i``, the corrected steps, ``Delta c_i`` out.

A train instruction with ``control-variates = "scaffold"``
(:mod:`strategies.rounds.control_variate_round`) carries the server's ``c`` as the payload
``scaffold-c`` of its arrays, encoded with the downlink codec it names
(``control-variates-codec``). The site

* keeps its own ``c_i`` in its state store (``state-dir``/<federation>/``scaffold-ci``), so it
  survives a restart of the SuperNode or of the site's worker; a site without one (its first
  round, a new state dir) starts from 0 (:func:`received_control`);
* trains with ``grad <- grad + c - c_i`` (:class:`~clients.training.scaffold.ScaffoldCorrection`);
* computes option II's ``c_i^+`` from the steps it actually ran (:meth:`SiteControl.updated`),
  saves it and sends ``Delta c_i = c_i^+ - c_i`` with its update as ``scaffold-dc``, encoded with
  the round's uplink codec and codec seed through its own error-feedback residual
  (``scaffold-ef-residual``, apart from the update's, :func:`control_reply`).

The vectors run over the model's floating-point arrays in model order; the normalisation
buffers among them (running statistics, not parameters) hold 0. SCAFFOLD doubles what leaves
the site per round: the site policy's ``share-control-variates`` may refuse it
(:mod:`clients.site.policy_check`).

In the site's round this is the :class:`SiteScaffold` feature
(:class:`~clients.site.site_feature.SiteFeature`) of a train instruction whose
:class:`ControlInstruction` names ``scaffold``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from clients.site.site_feature import LocalTraining, SiteFeature, config_value
from clients.site.state_store import SiteStateStore
from clients.training.scaffold import ScaffoldCorrection, option_two
from strategies.wire import message_keys as keys
from strategies.wire.codecs import ErrorFeedback, decode, encode, flatten, parse_spec
from strategies.wire.errors import ConfigError, SiteError
from strategies.wire.local_solver import LocalSolver
from strategies.wire.model_layout import float_positions

if TYPE_CHECKING:
    from clients.site.instruction import Instruction, SiteRunSettings
    from clients.site.site import Site

__all__ = ["CONTROL_NAME", "RESIDUAL_NAME", "ControlInstruction", "ControlVariateError",
           "SiteControl", "SiteScaffold", "control_reply", "received_control", "split_control"]

#: The site's control variate ``c_i`` in its state store.
CONTROL_NAME = "scaffold-ci"
#: The error-feedback residual of ``Delta c_i`` in its state store.
RESIDUAL_NAME = "scaffold-ef-residual"


class ControlVariateError(SiteError):
    """A SCAFFOLD instruction without a usable ``c``, or one the site's training cannot serve."""


@dataclass(frozen=True)
class ControlInstruction:
    """The control-variate entries of an instruction.

    Attributes
    ----------
    control_variates : str
        ``scaffold`` when the instruction carries SCAFFOLD's ``c`` (``control-variates``);
        "" otherwise.
    control_codec : str
        The codec ``c`` was sent with (``control-variates-codec``).
    """

    KEYS: ClassVar[frozenset[str]] = frozenset({keys.CONTROL_VARIATES, keys.CONTROL_CODEC})

    control_variates: str = ""
    control_codec: str = "none"

    @classmethod
    def from_config(cls, kind: str, config: Mapping[str, Any]) -> ControlInstruction | None:
        """The control-variate entries of any kind of message; ``None`` without any.

        Raises
        ------
        ConfigError
            For a value of the wrong type, or a method other than ``scaffold``.
        """
        if keys.CONTROL_VARIATES not in config and keys.CONTROL_CODEC not in config:
            return None
        control = config_value(config, keys.CONTROL_VARIATES, str, "")
        if control not in ("", "scaffold"):
            raise ConfigError(f"instruction key {keys.CONTROL_VARIATES!r} = {control!r}: "
                              "expected 'scaffold' or none; request refused")
        return cls(control_variates=control,
                   control_codec=config_value(config, keys.CONTROL_CODEC, str, "none"))


def split_control(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray],
                                                             np.ndarray | None]:
    """The instruction's model arrays, and the ``scaffold-c`` payload (None when absent)."""
    model = {name: value for name, value in arrays.items() if name != keys.CONTROL_C}
    payload = arrays.get(keys.CONTROL_C)
    return model, None if payload is None else np.asarray(payload)


@dataclass(frozen=True)
class SiteControl:
    """One round's control variates at a site, over the model's float arrays.

    Attributes
    ----------
    c, c_i : numpy.ndarray
        The server's ``c`` (as received) and the site's ``c_i``, flat float32.
    names : list of str
        The model's float arrays, in model order (the vectors' segments).
    shapes : list of tuple
        Their shapes.
    """

    c: np.ndarray
    c_i: np.ndarray
    names: list[str]
    shapes: list[tuple[int, ...]]

    def _split(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        out, start = {}, 0
        for name, shape in zip(self.names, self.shapes):
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = vector[start:start + size].reshape(shape)
            start += size
        return out

    def hooks(self, parameters: Collection[str]) -> ScaffoldCorrection:
        """The step hooks adding ``c - c_i`` to the gradients of ``parameters``."""
        correction = self._split(self.c - self.c_i)
        return ScaffoldCorrection({name: value for name, value in correction.items()
                                   if name in parameters})

    def updated(self, moved: Mapping[str, np.ndarray], parameters: Collection[str],
                steps_norm: float, lr: float) -> np.ndarray:
        """Option II's ``c_i^+`` from ``moved`` = ``x - y`` by array name (0 at the buffers)."""
        c, c_i = self._split(self.c), self._split(self.c_i)
        return flatten([option_two(c_i[name], c[name], moved[name], steps_norm, lr)
                        if name in parameters else np.zeros(shape, np.float32)
                        for name, shape in zip(self.names, self.shapes)])


def received_control(payload: np.ndarray | None, instruction: Instruction,
                     global_arrays: Mapping[str, np.ndarray], state_dir: Path,
                     optimizer: str = "sgd", private: bool = False) -> SiteControl:
    """The round's ``c`` (decoded) and the site's saved ``c_i`` (0 when it holds none of
    this size).

    Raises
    ------
    ControlVariateError
        When the instruction carries no ``c`` or one that does not decode, or the run's
        ``optimizer`` is not ``sgd`` or it trains ``private`` (DP-SGD): the coordinator
        refuses those runs (:mod:`strategies.plugins.control_variates.scaffold`).
    """
    if optimizer != "sgd" or private:
        raise ControlVariateError(
            f"SCAFFOLD needs optimizer = \"sgd\" without DP-SGD (got optimizer = {optimizer!r}"
            f"{', DP-SGD' if private else ''}); request refused")
    values = list(global_arrays.values())
    floats = float_positions(values)
    names = [list(global_arrays)[i] for i in floats]
    shapes = [tuple(values[i].shape) for i in floats]
    sizes = [values[i].size for i in floats]
    if payload is None:
        raise ControlVariateError(f"a SCAFFOLD instruction without '{keys.CONTROL_C}'; "
                                  "request refused")
    try:
        c = decode(payload, instruction.control_codec, sum(sizes), segments=sizes)
    except ValueError as exc:
        raise ControlVariateError(f"'{keys.CONTROL_C}' does not decode ({exc}); request "
                                  "refused") from None
    held = SiteStateStore(state_dir).load(instruction.federation, CONTROL_NAME)
    c_i = held if held is not None and held.size == c.size else np.zeros(c.size, np.float32)
    return SiteControl(np.asarray(c, np.float32), np.asarray(c_i, np.float32), names, shapes)


def control_reply(control: SiteControl, c_i_plus: np.ndarray, instruction: Instruction,
                  state_dir: Path) -> np.ndarray:
    """Save ``c_i^+`` and return ``Delta c_i = c_i^+ - c_i`` encoded with the round's codec and
    codec seed, through the site's own error feedback when the codec is lossy."""
    store = SiteStateStore(state_dir)
    delta = np.asarray(c_i_plus, np.float32) - control.c_i
    sizes = [int(np.prod(shape, dtype=np.int64)) for shape in control.shapes]
    spec, seed = instruction.codec, instruction.codec_seed
    if parse_spec(spec).name != "none" and instruction.error_feedback:
        feedback = ErrorFeedback(spec)
        saved = store.load(instruction.federation, RESIDUAL_NAME)
        if saved is not None and saved.size == delta.size:
            feedback.load_state(saved)
        payload = feedback.step(delta, seed=seed, segments=sizes)
        store.save(instruction.federation, RESIDUAL_NAME, feedback.state())
    else:
        payload = encode(delta, spec, seed=seed, segments=sizes)
    store.save(instruction.federation, CONTROL_NAME, np.asarray(c_i_plus, np.float32))
    return payload


class SiteScaffold(SiteFeature):
    """SCAFFOLD at the site for one train message: ``c`` in, corrected steps, ``Delta c_i`` out.

    Parameters
    ----------
    instruction : Instruction
        The train instruction (its ``c`` codec, uplink codec and seed, federation).
    state_dir : Path
        The site's state dir (``c_i`` and the residual of ``Delta c_i``).
    """

    def __init__(self, instruction: Instruction, state_dir: Path) -> None:
        self.instruction, self.state_dir = instruction, state_dir
        self.payload: np.ndarray | None = None
        self.control: SiteControl | None = None
        self.c_i_plus: np.ndarray | None = None

    @classmethod
    def of(cls, instruction: Instruction, site: Site, run: SiteRunSettings) -> SiteScaffold | None:
        """The feature of a train message naming ``control-variates = "scaffold"``."""
        part = instruction.part(ControlInstruction)
        if instruction.kind != "train" or part is None or not part.control_variates:
            return None
        return cls(instruction, site.state_dir)

    def receive(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays without ``scaffold-c`` (:func:`split_control`), kept for training."""
        model, self.payload = split_control(arrays)
        return model

    @contextmanager
    def training(self, local: LocalTraining) -> Iterator[None]:
        """Steps corrected by ``c - c_i`` (:func:`received_control`, :meth:`SiteControl.hooks`).

        Raises
        ------
        ControlVariateError
            As :func:`received_control`.
        """
        self.control = received_control(self.payload, self.instruction, local.global_arrays,
                                        self.state_dir, local.run.optimizer,
                                        local.run.privacy.enabled)
        local.step_hooks.append(self.control.hooks(local.parameters))
        yield

    def outgoing(self, delta: dict[str, np.ndarray], local: LocalTraining
                 ) -> dict[str, np.ndarray]:
        """``delta`` unchanged; option II's ``c_i^+`` from ``x - y`` and the steps actually run
        (read before any other feature changes the update)."""
        assert self.control is not None and local.result is not None  # the steps ran
        run = local.run
        solver = LocalSolver(optimizer=run.optimizer, momentum=run.momentum, lr=local.lr,
                             proximal_mu=run.proximal_mu)
        self.c_i_plus = self.control.updated(delta, local.parameters,
                                             solver.a_norm(local.result.steps_done), local.lr)
        return delta

    def reply(self) -> dict[str, np.ndarray]:
        """``Delta c_i`` encoded (``scaffold-dc``, :func:`control_reply`), ``c_i^+`` saved."""
        assert self.control is not None and self.c_i_plus is not None
        return {keys.CONTROL_DELTA: control_reply(self.control, self.c_i_plus, self.instruction,
                                                  self.state_dir)}
