r"""The statistics every benchmark summary shares: means and sds over seeds, ratios, goals, tables.

One definition each, so that two summaries cannot disagree on what a figure means:

* :func:`mean` and :func:`sd` are over *all* the values given: a ``None``
  among them (a seed that never reached the target, a run without a metric)
  makes the result ``None``. Pass :func:`defined` ``(values)`` to average over
  the values that exist instead (to-target figures over the seeds that reached
  it).
* :func:`sd` is the **sample** standard deviation (``n - 1`` in the
  denominator). **A single seed has no sd: it is ``None``** (JSON ``null``),
  never ``0.0``, which would claim a measured spread of zero; :func:`pm`
  renders it by leaving the ``± sd`` out.
* :func:`ratio` is ``None`` when either side is missing or zero.

Example
-------
>>> mean_sd([1.0, 3.0])
(2.0, 1.4142135623730951)
>>> mean_sd([0.9])
(0.9, None)
>>> pm(0.8, 0.1414, ".3f"), pm(0.9, None, ".3f"), pm(None, None, ".3f", "never")
('0.800 ± 0.141', '0.900', 'never')
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence

import numpy as np

__all__ = ["defined", "mean", "sd", "mean_sd", "over_seeds", "tail_mean", "ratio",
           "at_least", "pm", "group", "markdown_table"]


def defined(values: Iterable[float | None]) -> list[float]:
    """The values that are not ``None``, in order.

    Examples
    --------
    >>> defined([1.0, None, 3.0])
    [1.0, 3.0]
    """
    return [v for v in values if v is not None]


def mean(values: Iterable[float | None]) -> float | None:
    """Arithmetic mean; ``None`` for no values or when any value is ``None``.

    Examples
    --------
    >>> mean([1, 2]), mean([]), mean([1.0, None])
    (1.5, None, None)
    """
    values = list(values)
    return None if not values or None in values else statistics.fmean(values)


def sd(values: Iterable[float | None]) -> float | None:
    """Sample standard deviation; ``None`` under two values or when any value is ``None``.

    Examples
    --------
    >>> sd([1.0, 3.0]), sd([1.0])
    (1.4142135623730951, None)
    """
    values = list(values)
    return None if len(values) < 2 or None in values else statistics.stdev(values)


def mean_sd(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """``(mean(values), sd(values))``.

    Examples
    --------
    >>> mean_sd([2.0, 4.0])
    (3.0, 1.4142135623730951)
    """
    values = list(values)
    return mean(values), sd(values)


def over_seeds(rows: Sequence[dict], keys: Iterable[str]) -> dict:
    """Per key, the mean and sd over ``rows`` of its defined values (``key``, ``key_sd``).

    Examples
    --------
    >>> over_seeds([{"t": 2.0}, {"t": None}, {"t": 4.0}], ["t"])
    {'t': 3.0, 't_sd': 1.4142135623730951}
    """
    out = {}
    for key in keys:
        out[key], out[f"{key}_sd"] = mean_sd(defined(r[key] for r in rows))
    return out


def tail_mean(values: Sequence[float | None], tail: int) -> float:
    """Mean of the last ``tail`` values that exist (``None`` or NaN: a round without
    evaluation); NaN when none does.

    Examples
    --------
    >>> tail_mean([0.1, 0.5, None, 0.7], 3)
    0.6
    """
    with warnings.catch_warnings():  # all missing: NaN, not a RuntimeWarning
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(np.asarray(values[-tail:], dtype=float)))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``; ``None`` when either is missing or zero.

    Examples
    --------
    >>> ratio(10.0, 2.0), ratio(10.0, None), ratio(0.0, 2.0)
    (5.0, None, None)
    """
    return numerator / denominator if numerator and denominator else None


def at_least(value: float | None, bound: float) -> bool:
    """The goal check: ``value`` exists and reaches ``bound`` (missed when it is ``None``).

    Examples
    --------
    >>> at_least(5.2, 5.0), at_least(4.9, 5.0), at_least(None, 5.0)
    (True, False, False)
    """
    return value is not None and value >= bound


def pm(value: float | None, spread: float | None, fmt: str, missing: str = "n/a",
       sign: str = "±") -> str:
    """``"mean ± sd"`` in ``fmt``; the mean alone without an sd; ``missing`` without a mean.

    Examples
    --------
    >>> pm(0.81234, 0.0456, ".3f"), pm(12.0, None, ".0f"), pm(None, 1.0, ".1f")
    ('0.812 ± 0.046', '12', 'n/a')
    >>> pm(0.5, 0.01, ".2f", sign="+-")
    '0.50 +- 0.01'
    """
    if value is None:
        return missing
    return format(value, fmt) + ("" if spread is None else f" {sign} {format(spread, fmt)}")


def group(rows: Iterable[dict], key: Callable[[dict], Hashable]) -> dict[Hashable, list[dict]]:
    """``rows`` grouped by ``key(row)``, groups and rows in first-seen order (the arms).

    Examples
    --------
    >>> group([{"m": "a", "s": 0}, {"m": "b", "s": 0}, {"m": "a", "s": 1}], lambda r: r["m"])
    {'a': [{'m': 'a', 's': 0}, {'m': 'a', 's': 1}], 'b': [{'m': 'b', 's': 0}]}
    """
    out: dict[Hashable, list[dict]] = {}
    for row in rows:
        out.setdefault(key(row), []).append(row)
    return out


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table as docs/BENCHMARKS.md holds them: header, ``|---|`` rule, rows.

    Examples
    --------
    >>> print(markdown_table(["set", "mean"], [["a", "0.5"]]))
    | set | mean |
    |---|---|
    | a | 0.5 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
