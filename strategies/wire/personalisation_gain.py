"""What personalisation gains: each personalised metric minus the global model's.

A site evaluating under personalisation replies, beside the global model's
``<split>-<metric>``, its personalised model's ``personalised-<split>-<metric>``
(:mod:`clients.training.personalisation`); the difference ``personalised-gain-<split>-<metric>``
= personalised - global is what MLflow shows per site (``site/<s>/...``) and for the
round's example-weighted values (``eval/...``). For a loss a negative gain is an
improvement.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["GAIN", "PERSONALISED", "personalisation_gains"]

#: Prefix of a personalised metric (``personalised-val-dice``).
PERSONALISED = "personalised-"
#: Prefix of its difference to the global metric (``personalised-gain-val-dice``).
GAIN = "personalised-gain-"


def personalisation_gains(values: Mapping[str, float]) -> dict[str, float]:
    """``{personalised-gain-<m>: personalised-<m> - <m>}`` for every ``<m>`` with both values.

    Empty when ``values`` holds no personalised metric (``personalisation.method = "none"``).
    """
    return {f"{GAIN}{name[len(PERSONALISED):]}": value - values[name[len(PERSONALISED):]]
            for name, value in values.items()
            if name.startswith(PERSONALISED) and not name.startswith(GAIN)
            and name[len(PERSONALISED):] in values}
