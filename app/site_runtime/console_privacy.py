"""The console's Privacy page: epsilon spent and left per dataset, and its curve over time.

Each folder of ``<state-dir>/privacy/`` is one dataset's ledger
(:mod:`clients.site.privacy_ledger`). The epsilon shown is exactly
:meth:`PrivacyLedger.epsilon` at the policy's ``dp.delta`` (or
:data:`~app.site_runtime.privacy_budget.DEFAULT_DELTA` when the policy bounds none, as
``make privacy-budget`` shows it), counted with the accountant of the ledger's latest
entry (the one its runs use; RDP for an empty ledger).

The chart is the cumulative epsilon after each entry (at most :data:`MAX_POINTS`
points, evenly spread, the last one always included), drawn as inline SVG,
server-side. It is computed in one pass with Opacus's RDP analysis (Mironov 2017:
the RDP of a composition is the sum of the entries' RDP, so each prefix adds one
term; ``RDPAccountant`` recomputes every term for every prefix, quadratic in the
entries): for an RDP ledger its last point is the ledger's epsilon to the last bit.
A PRV ledger's curve is that RDP upper bound too (PRV composes numerically, seconds
per prefix), and the page says so. Epsilon and curve are cached by the ledger's
``history.json`` size and mtime.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from app.site_runtime.privacy_budget import DEFAULT_DELTA
from clients.site.policy import SitePolicy
from clients.site.privacy_ledger import ADMIN_LOG_NAME, PRIVACY_DIR, LedgerEntry, PrivacyLedger
from clients.training.dp_accountants import DEFAULT_ACCOUNTANT
from clients.training.opacus_loader import opacus
from strategies.wire.errors import FedMedError

__all__ = ["MAX_POINTS", "PrivacyView", "chart_svg", "policy_delta"]

#: The most points of one dataset's epsilon curve.
MAX_POINTS = 200
_WIDTH, _HEIGHT, _PAD = 640, 200, 40


def policy_delta(policy: SitePolicy | None) -> float:
    """The delta epsilon is shown at: the policy's ``dp.delta`` when below 1, else the default."""
    return policy.dp.delta if policy is not None and policy.dp.delta < 1 else DEFAULT_DELTA


def _rdp_curve(entries: list[LedgerEntry], delta: float) -> list[tuple[str, float]]:
    """``(time, cumulative RDP epsilon)`` after each of up to :data:`MAX_POINTS` entries."""
    analysis = opacus("accountants.analysis.rdp")
    orders = opacus("accountants.rdp").RDPAccountant.DEFAULT_ALPHAS
    per_step: dict[tuple[float, float], Any] = {}
    total: Any = 0
    curve = []
    for entry in entries:
        if entry.steps > 0:
            key = (entry.sample_rate, entry.noise_multiplier)
            if key not in per_step:
                per_step[key] = analysis.compute_rdp(q=key[0], noise_multiplier=key[1], steps=1,
                                                     orders=orders)
            total = total + per_step[key] * entry.steps
        spent = analysis.get_privacy_spent(orders=orders, rdp=total, delta=delta)[0] \
            if per_step else 0.0
        curve.append((entry.time, float(spent)))
    count = min(len(curve), MAX_POINTS)
    ends = sorted({math.ceil((i + 1) * len(curve) / count) for i in range(count)})
    return [curve[end - 1] for end in ends]


def chart_svg(points: list[tuple[str, float]], budget: float) -> str:
    """An SVG line chart of cumulative epsilon by entry (the budget as a dashed line).

    The x axis is the entry's rank (times are irregular); its first and last
    times label the axis. Returns "" for no points. Only numbers and the ledger's
    own ISO times go into the markup.
    """
    if not points:
        return ""
    top = max([eps for _, eps in points] + ([budget] if math.isfinite(budget) else []))
    top = top if top > 0 else 1.0
    span = max(len(points) - 1, 1)

    def xy(i: int, eps: float) -> str:
        x = _PAD + (_WIDTH - 2 * _PAD) * i / span
        y = _HEIGHT - _PAD - (_HEIGHT - 2 * _PAD) * eps / top
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(i, eps) for i, (_, eps) in enumerate(points))
    parts = [f'<svg class="chart" viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" '
             f'xmlns="http://www.w3.org/2000/svg" aria-label="cumulative epsilon">',
             f'<line class="axis" x1="{_PAD}" y1="{_HEIGHT - _PAD}" x2="{_WIDTH - _PAD}" '
             f'y2="{_HEIGHT - _PAD}"/>',
             f'<line class="axis" x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_HEIGHT - _PAD}"/>',
             f'<text x="4" y="{_PAD}">{top:.3g}</text>',
             f'<text x="4" y="{_HEIGHT - _PAD}">0</text>',
             f'<text x="{_PAD}" y="{_HEIGHT - 12}">{_safe(points[0][0])}</text>',
             f'<text x="{_WIDTH - _PAD}" y="{_HEIGHT - 12}" text-anchor="end">'
             f'{_safe(points[-1][0])}</text>']
    if math.isfinite(budget):
        y = _HEIGHT - _PAD - (_HEIGHT - 2 * _PAD) * budget / top
        parts.append(f'<line class="budget" x1="{_PAD}" y1="{y:.1f}" x2="{_WIDTH - _PAD}" '
                     f'y2="{y:.1f}"/><text x="{_WIDTH - _PAD}" y="{y - 4:.1f}" '
                     f'text-anchor="end">budget {budget:.3g}</text>')
    parts.append(f'<polyline class="epsilon" points="{line}"/></svg>')
    return "".join(parts)


def _safe(text: str) -> str:
    return "".join(c for c in str(text) if c.isalnum() or c in "-:+.TZ ")


class PrivacyView:
    """Every dataset's ledger of one state dir, with a curve cache.

    Parameters
    ----------
    state_dir : Path
        The site's state dir.
    """

    def __init__(self, state_dir: Path) -> None:
        self.folder = Path(state_dir) / PRIVACY_DIR
        self._cache: dict[str, tuple[tuple[Any, ...], float, list[tuple[str, float]]]] = {}
        self._lock = threading.Lock()

    def spent_and_curve(self, ledger: PrivacyLedger,
                         delta: float) -> tuple[float, list[tuple[str, float]]]:
        """The ledger's epsilon and curve, recomputed only when its history changed."""
        try:
            stat = ledger.history_path.stat()
            key: tuple[Any, ...] = (stat.st_size, stat.st_mtime_ns, ledger.accountant, delta)
        except FileNotFoundError:
            return 0.0, []
        with self._lock:
            cached = self._cache.get(ledger.folder.name)
            if cached is None or cached[0] != key:
                cached = (key, ledger.epsilon(delta), _rdp_curve(ledger.entries, delta))
                self._cache[ledger.folder.name] = cached
            return cached[1], cached[2]

    def _dataset(self, folder: Path, policy: SitePolicy | None, delta: float) -> dict[str, Any]:
        try:
            probe = PrivacyLedger(folder, DEFAULT_ACCOUNTANT)
            accountant = probe.entries[-1].accountant if probe.entries else DEFAULT_ACCOUNTANT
            ledger = PrivacyLedger(folder, accountant)
            spent, curve = self.spent_and_curve(ledger, delta)
            allowance = ledger.allowance()
        except (FedMedError, OSError, ValueError) as exc:
            return {"dataset": folder.name, "error": str(exc)}
        max_epsilon = policy.dp.max_epsilon if policy is not None else math.inf
        budget = max_epsilon + allowance
        left = max(budget - spent, 0.0) if math.isfinite(budget) else math.inf
        return {"dataset": folder.name, "error": "", "accountant": accountant, "delta": delta,
                "entries": len(ledger.entries),
                "reserved": sum(1 for e in ledger.entries if e.reservation),
                "epsilon": spent, "epsilon_text": f"{spent:.4g}",
                "max_epsilon": max_epsilon, "allowance": allowance, "budget": budget,
                "left": left, "left_text": "no limit" if math.isinf(left) else f"{left:.4g}",
                "budget_text": "no limit" if math.isinf(budget) else f"{budget:.4g}",
                "chart": chart_svg(curve, budget), "curve_exact": accountant == "rdp"}

    def datasets(self, policy: SitePolicy | None) -> list[dict[str, Any]]:
        """One row per dataset folder (an unreadable ledger: its row carries ``error``)."""
        delta = policy_delta(policy)
        folders = sorted(p for p in self.folder.glob("*") if p.is_dir())
        return [self._dataset(folder, policy, delta) for folder in folders]

    def admin_log(self) -> list[str]:
        """The lines of ``budget-admin.log`` (resets, extensions), oldest first."""
        try:
            return (self.folder / ADMIN_LOG_NAME).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            return [f"{ADMIN_LOG_NAME}: unreadable ({exc})"]
