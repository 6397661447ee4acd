r"""Warm-up of the kept fraction over the first rounds (Deep Gradient Compression [1]_, §3.3).

DGC starts training with little sparsity and raises it exponentially
(75%, 93.75%, 98.4375%, 99.6%, then 99.9%) so that the first, large updates are
not cut to a sliver while error feedback has nothing accumulated yet. Here,
for a spec with a kept fraction ``f`` (``topk``, ``randk``) and ``W`` warm-up
rounds, round ``t`` (1-based) keeps

.. math:: f_t = f^{\,t/(W+1)} \quad (1 \le t \le W), \qquad f_t = f \quad (t > W),

the geometric interpolation from dense (``f_0 = 1``) to the target: for
``f = 0.001`` and ``W = 4`` that is 25.1%, 6.3%, 1.6%, 0.40%, then 0.1%, DGC's
schedule. The server computes the round's spec and sends it in the train
instruction (run config ``strategy.codec-warmup-rounds``); the site encodes
and the server decodes with it, so nothing else carries the round.

References
----------
.. [1] Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression: Reducing the
   Communication Bandwidth for Distributed Training", ICLR 2018.
"""

from __future__ import annotations

from dataclasses import replace

from strategies.wire.codecs.errors import CodecError
from strategies.wire.codecs.spec import CodecSpec, parse_spec

__all__ = ["check_warmup", "warmup_spec"]


def check_warmup(spec: str | CodecSpec, warmup_rounds: int) -> CodecSpec:
    """``spec`` parsed; :class:`CodecError` unless ``warmup_rounds >= 0`` and, when
    positive, the codec keeps a fraction (``topk``, ``randk``)."""
    parsed = parse_spec(spec)
    if isinstance(warmup_rounds, bool) or not isinstance(warmup_rounds, int) or warmup_rounds < 0:
        raise CodecError(f"strategy.codec-warmup-rounds must be an int >= 0, got {warmup_rounds!r}")
    if warmup_rounds and parsed.fraction is None:
        raise CodecError(f"strategy.codec-warmup-rounds = {warmup_rounds} needs a codec that keeps "
                         f"a fraction ('topk:<f>', 'randk:<f>'), got {str(parsed)!r}")
    return parsed


def warmup_spec(spec: str | CodecSpec, server_round: int, warmup_rounds: int) -> CodecSpec:
    """The spec of round ``server_round`` (1-based): ``f ** (t / (W + 1))`` while ``t <= W``.

    Parameters
    ----------
    spec : str or CodecSpec
        The run's codec spec (its fraction is the target ``f``).
    server_round : int
        The round, from 1.
    warmup_rounds : int
        ``W``; 0 leaves every round at ``spec``.

    Returns
    -------
    CodecSpec
        ``spec`` itself after the warm-up (and for ``W = 0`` or a codec without a
        fraction, which :func:`check_warmup` refuses in a run config), else ``spec``
        with the round's fraction (its per-tensor option kept).
    """
    parsed = parse_spec(spec)
    if parsed.fraction is None or not 1 <= server_round <= warmup_rounds:
        return parsed
    target = float(parsed.fraction)
    return replace(parsed, fraction=target ** (server_round / (warmup_rounds + 1)))
