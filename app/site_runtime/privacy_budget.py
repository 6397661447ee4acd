"""The hospital admin's privacy-budget command: show, reset or extend a dataset's epsilon ledger.

The site keeps one privacy ledger per dataset (:mod:`clients.site.privacy_ledger`,
``<state-dir>/privacy/<dataset-id>/``) that every federation and message draws
from; no server string can reset it. Only this command, run by the hospital on
its own machine, can::

    make privacy-budget STATE=/abs/state DATA=/abs/site [POLICY=/abs/policy.toml]
                        [RESET="reason"] [EXTEND=<epsilon> [REASON="text"]]
    python -m app.site_runtime.privacy_budget --state /abs/state [--data /abs/site]
        [--policy /abs/policy.toml] [--reset REASON | --extend EPSILON [--reason TEXT]]

* show (default): per dataset, the entries, the epsilon spent (at the policy's
  ``dp.delta``, counted with ``--accountant``, RDP by default: the upper bound),
  the budget (the policy's ``dp.max-epsilon`` plus the admin's allowance) and what
  is left; without ``--data`` every dataset of the state dir;
* ``--reset REASON``: archives the dataset's history under its ``archive/`` (never
  deleted) and starts afresh;
* ``--extend EPSILON``: adds ``EPSILON`` to the dataset's allowance, on top of the
  policy's ``dp.max-epsilon``.

A reset or an extension appends a line to ``<state-dir>/privacy/budget-admin.log``,
a ``budget-reset`` / ``budget-extended`` record to the site's audit log
(:mod:`app.site_runtime.site_audit`) and logs it. Errors name the path; the exit status is 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from app.site_runtime.site_audit import audit_event
from clients.site.policy import SitePolicy, load_policy
from clients.site.privacy_ledger import PRIVACY_DIR, PrivacyLedger, dataset_id
from clients.training.dp_accountants import ACCOUNTANTS
from strategies.wire.errors import FedMedError

__all__ = ["main", "ledger_summary"]

log = logging.getLogger("app.site_runtime.privacy_budget")

#: The delta epsilon is shown at when the policy bounds none (``dp.delta = 1``).
DEFAULT_DELTA = 1e-5


def ledger_summary(ledger: PrivacyLedger, policy: SitePolicy | None, delta: float) -> str:
    """One dataset's lines: entries by federation and kind, epsilon spent, budget, left."""
    spent = ledger.epsilon(delta)
    lines = [f"dataset {ledger.folder.name} ({ledger.folder}): {len(ledger.entries)} entries, "
             f"epsilon spent {spent:.4g} (delta {delta:g}, accountant {ledger.accountant})"]
    counts: dict[tuple[str, str], int] = {}
    for entry in ledger.entries:
        counts[entry.federation, entry.kind] = counts.get((entry.federation, entry.kind),
                                                          0) + entry.steps
    lines += [f"  {federation}: {kind}, {steps} DP-SGD steps"
              for (federation, kind), steps in sorted(counts.items())]
    allowance = ledger.allowance()
    if policy is None:
        lines.append(f"  budget: the policy's dp.max-epsilon + allowance {allowance:g} "
                     "(pass --policy to see what is left)")
    else:
        budget = ledger.budget(policy.dp.max_epsilon)
        left = max(budget - spent, 0.0) if math.isfinite(budget) else math.inf
        lines.append(f"  budget {budget:g} (policy dp.max-epsilon {policy.dp.max_epsilon:g} + "
                     f"allowance {allowance:g}), left {left:.4g}")
    return "\n".join(lines)


def _folder(path: str, what: str) -> Path:
    folder = Path(path).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"{what} {folder}: no such folder")
    return folder


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.site_runtime.privacy_budget",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", required=True, help="the site's state-dir (absolute)")
    parser.add_argument("--data", help="the site's data folder (its dataset's ledger)")
    parser.add_argument("--policy", help="the site policy (shows the budget and what is left)")
    parser.add_argument("--accountant", default="rdp", choices=ACCOUNTANTS.names(),
                        help="accountant the epsilon is shown with (default rdp: upper bound)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--reset", metavar="REASON", help="archive the history, start afresh")
    action.add_argument("--extend", metavar="EPSILON", type=float,
                        help="add EPSILON to the dataset's budget")
    parser.add_argument("--reason", default="no reason given",
                        help="why the budget is extended (written to the admin log)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; 0 on success, 2 with the error on stderr."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        state = _folder(args.state, "state dir")
        policy = load_policy(args.policy) if args.policy else None
        delta = policy.dp.delta if policy is not None and policy.dp.delta < 1 else DEFAULT_DELTA
        if args.data is None:
            if args.reset is not None or args.extend is not None:
                raise ValueError("--reset and --extend need --data (the dataset's folder)")
            folders = sorted(p for p in (state / PRIVACY_DIR).glob("*") if p.is_dir())
            ledgers = [PrivacyLedger(folder, args.accountant) for folder in folders]
            if not ledgers:
                print(f"no privacy ledger under {state / PRIVACY_DIR}")
        else:
            data = _folder(args.data, "data folder")
            ledgers = [PrivacyLedger(state / PRIVACY_DIR / dataset_id(data), args.accountant)]
            if args.reset is not None:
                log.warning("%s", ledgers[0].reset(args.reset))
                audit_event(state, {"kind": "budget-reset", "dataset": ledgers[0].folder.name,
                                    "epsilon": None, "reason": args.reset, "by": "cli"})
            elif args.extend is not None:
                log.warning("%s", ledgers[0].extend(args.extend, args.reason))
                audit_event(state, {"kind": "budget-extended",
                                    "dataset": ledgers[0].folder.name,
                                    "epsilon": args.extend, "reason": args.reason, "by": "cli"})
        for ledger in ledgers:
            print(ledger_summary(ledger, policy, delta))
    except (FedMedError, OSError, ValueError) as exc:
        print(f"privacy-budget: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
