"""Bytes on the wire in words: the round's progress line and the end-of-run summary.

Shared by the ServerApp's progress line (:mod:`app.server_app`) and the summary
after ``make simulate`` (:mod:`app.tooling.federation_summary`).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DENSE_BELOW", "ratio_phrase", "round_traffic"]

# A ratio dense / sent below this is an uncompressed transfer (codec ``none``: the
# payload header and Flower's framing make it slightly below 1).
DENSE_BELOW = 1.05


def ratio_phrase(dense: float, sent: float) -> str:
    """``'dense'`` when ``sent`` bytes are not fewer than ``dense`` (nothing compressed),
    else ``'x<dense/sent> smaller than dense'`` (one decimal below x10)."""
    if sent <= 0:
        return "nothing sent"
    ratio = dense / sent
    if ratio < DENSE_BELOW:
        return "dense"
    return f"x{ratio:.1f} smaller than dense" if ratio < 10 else f"x{ratio:.0f} smaller than dense"


def round_traffic(strategy: Mapping[str, float],
                  traffic: Mapping[str, Mapping[str, float]]) -> str:
    """The bytes part of a round's progress line (``''`` when the round counted none).

    ``strategy`` holds the round's ``bytes-up``, ``bytes-down`` and
    ``dense-bytes`` (one update as dense fp32), ``traffic`` the per-site
    ``bytes-up`` / ``bytes-down`` (:func:`strategies.rounds.traffic.record_traffic`).
    """
    if "bytes-up" not in strategy:
        return ""
    dense = strategy.get("dense-bytes", 0.0)
    ups = sum(1 for t in traffic.values() if "bytes-up" in t)
    downs = sum(1 for t in traffic.values() if "bytes-down" in t)
    return (f" | up {strategy['bytes-up'] / 1e3:.0f} kB "
            f"({ratio_phrase(dense * ups, strategy['bytes-up'])}), "
            f"down {strategy['bytes-down'] / 1e3:.0f} kB "
            f"({ratio_phrase(dense * downs, strategy['bytes-down'])})")
