"""The site's one privacy ledger: the epsilon spent on one dataset, by every federation and message.

DP-SGD's privacy loss composes over every step ever run on the same patients,
whichever federation, app or message asked for it (train, the cross-site
fine-tune, an evaluate message's personalisation adaptation). The coordinator
chooses federation ids, so the ledger is keyed by what the hospital owns: its
state dir and its data folder, ``<state-dir>/privacy/<dataset-id>/`` with
``dataset-id`` = the first 16 hex digits of the SHA-256 of the resolved data
folder (:func:`dataset_id`), never a federation's folder.

The ledger keeps the mechanism's history, not a running epsilon: one entry per
run of ``steps`` steps with noise multiplier ``sigma`` and Poisson sampling rate
``q`` (the history of Opacus's accountants), with the federation, the kind of
computation, the accountant of the run and the UTC time, for an audit
(``history.json``, written atomically by :mod:`clients.site.atomic_file`; JSON,
never a pickle). The cumulative epsilon is recomputed from the whole history by
the accountant (RDP: Mironov, "Renyi differential privacy", CSF 2017, composition
of the sampled Gaussian mechanism, Mironov, Talwar & Zhang 2019; PRV: Gopi, Lee &
Wutschitz, NeurIPS 2021), so it is exact, not a sum of per-round epsilons (which
would overstate it).

Before a computation trains, :meth:`PrivacyLedger.reserve` checks, under a lock
that every process of the site takes (``fcntl.flock``), that the history plus its
planned steps stays within the budget, and appends those steps as a reservation;
after it, :meth:`PrivacyLedger.settle` replaces them with the steps it ran. So two
computations that start together (two federations) cannot both spend the last of
the budget, and a process that dies mid-training leaves its planned steps counted.

The budget is the policy's ``dp.max-epsilon`` plus the allowance a hospital admin
added (``allowance.json``); only the admin command
(:mod:`app.site_runtime.privacy_budget`) resets the history (archived under
``archive/``, never deleted) or extends the budget, and each such act appends a
line to ``<state-dir>/privacy/budget-admin.log``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clients.root_logging import root_logging_kept
from clients.site.atomic_file import write_atomic
from clients.site.policy import PolicyRefusal
from clients.training.dp_accountants import ACCOUNTANTS
from strategies.wire.errors import SiteError

__all__ = ["PRIVACY_DIR", "ADMIN_LOG_NAME", "LedgerEntry", "LedgerError", "PrivacyLedger",
           "Step", "dataset_id"]

#: The folder of the site's ledgers under its state dir (never expired with federation state).
PRIVACY_DIR = "privacy"
#: The history of one dataset's ledger, in its folder.
HISTORY_NAME = "history.json"
#: The epsilon a hospital admin added to the policy's budget, in the ledger's folder.
ALLOWANCE_NAME = "allowance.json"
#: The admin's acts (resets, extensions) on every ledger of the site, one line each.
ADMIN_LOG_NAME = "budget-admin.log"
#: Where a reset moves the history it ends.
ARCHIVE_DIR = "archive"
#: The lock file that makes a reservation's check-and-append one step across processes.
LOCK_NAME = "ledger.lock"

#: ``(noise multiplier, sample rate, steps)``, one row of an accountant's history.
Step = tuple[float, float, int]


class LedgerError(SiteError):
    """A ledger file is unreadable or malformed (the site refuses to train rather than guess)."""


def dataset_id(data_path: str | Path) -> str:
    """The ledger's key of a site data folder: 16 hex digits of SHA-256 of its resolved path."""
    return hashlib.sha256(str(Path(data_path).resolve()).encode()).hexdigest()[:16]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class LedgerEntry:
    """One computation's DP-SGD steps on the dataset (one row of the history)."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    #: The federation that asked (the server's string: for the audit, never a key).
    federation: str
    #: ``train``, ``cross-site`` or ``evaluate-adapt``.
    kind: str
    #: The run's accountant (the epsilon is recounted with the asking run's).
    accountant: str
    #: UTC, ISO 8601.
    time: str
    #: Non-empty while the entry is a computation's planned steps, reserved before it
    #: trains (:meth:`PrivacyLedger.reserve`) and counted as spent until settled.
    reservation: str = ""

    def step(self) -> Step:
        """The accountant's row."""
        return self.noise_multiplier, self.sample_rate, self.steps

    def to_json(self) -> dict[str, Any]:
        """The entry as ``history.json`` holds it (dashed keys)."""
        return {key.replace("_", "-"): value for key, value in asdict(self).items()}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> LedgerEntry:
        """An entry of ``history.json``; ``KeyError``/``TypeError``/``ValueError`` if malformed."""
        return cls(float(row["noise-multiplier"]), float(row["sample-rate"]), int(row["steps"]),
                   str(row["federation"]), str(row["kind"]), str(row["accountant"]),
                   str(row["time"]), str(row.get("reservation", "")))


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LedgerError(f"privacy ledger {path}: unreadable {what} ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise LedgerError(f"privacy ledger {path}: {what} is not JSON ({exc})") from exc


def _write_json(path: Path, value: Any) -> None:
    text = json.dumps(value, indent=1, allow_nan=False).encode()
    write_atomic(path, lambda handle: handle.write(text))


class PrivacyLedger:
    """The privacy history of one site's dataset, all federations together.

    Parameters
    ----------
    folder : Path
        The ledger's folder (:meth:`of_site`: ``<state-dir>/privacy/<dataset-id>``).
    accountant : str
        Opacus accountant that turns the history into epsilon, one of
        :data:`~clients.training.dp_accountants.ACCOUNTANTS`: the asking run's
        ``privacy.accountant``, the one its training used (no default, so that
        the budget is never counted with another accountant than the reported
        epsilon). The history is the same for every accountant.

    Raises
    ------
    LedgerError
        When ``history.json`` or ``allowance.json`` exists but is malformed.
    """

    def __init__(self, folder: Path, accountant: str) -> None:
        self.folder = Path(folder)
        self.accountant = accountant
        self.entries: list[LedgerEntry] = self._load_entries()

    @classmethod
    def of_site(cls, state_dir: str | Path, data_path: str | Path,
                accountant: str) -> PrivacyLedger:
        """The ledger of the dataset in ``data_path`` at the site whose state dir is ``state_dir``."""
        return cls(Path(state_dir) / PRIVACY_DIR / dataset_id(data_path), accountant)

    @property
    def history_path(self) -> Path:
        """``history.json`` of this ledger."""
        return self.folder / HISTORY_NAME

    @property
    def admin_log(self) -> Path:
        """The site's ``budget-admin.log`` (beside every dataset's ledger)."""
        return self.folder.parent / ADMIN_LOG_NAME

    def _load_entries(self) -> list[LedgerEntry]:
        if not self.history_path.exists():
            return []
        saved = _read_json(self.history_path, "history")
        try:
            return [LedgerEntry.from_json(row) for row in saved["entries"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise LedgerError(f"privacy ledger {self.history_path}: malformed entry "
                              f"({exc!r})") from None

    def allowance(self) -> float:
        """The epsilon a hospital admin added to the policy's ``dp.max-epsilon`` (0: none)."""
        path = self.folder / ALLOWANCE_NAME
        if not path.exists():
            return 0.0
        value = _read_json(path, "allowance").get("epsilon")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise LedgerError(f"privacy ledger {path}: 'epsilon' must be a number >= 0, "
                              f"got {value!r}")
        return float(value)

    def budget(self, max_epsilon: float) -> float:
        """The dataset's budget: the policy's ``max_epsilon`` plus the admin's allowance."""
        return max_epsilon + self.allowance()

    def epsilon(self, delta: float, planned: Sequence[Step] = ()) -> float:
        """Cumulative epsilon at ``delta`` of the history, plus ``planned`` steps if given.

        0 for an empty history (nothing spent).
        """
        history = [entry.step() for entry in self.entries] + list(planned)
        history = [(s, q, n) for s, q, n in history if n > 0]
        if not history:
            return 0.0
        with root_logging_kept():  # importing Opacus calls logging.basicConfig
            accountant = ACCOUNTANTS.get(self.accountant)()
        accountant.history = history
        return float(accountant.get_epsilon(delta=delta))

    def check(self, planned: Step, delta: float, max_epsilon: float) -> float:
        """The epsilon after ``planned``; refuse if it would exceed the budget.

        Raises
        ------
        PolicyRefusal
            Rule ``dp.max-epsilon``, when the history plus ``planned`` would spend
            more than :meth:`budget` of ``max_epsilon``.
        """
        after = self.epsilon(delta, [planned])
        budget = self.budget(max_epsilon)
        if math.isfinite(budget) and after > budget:
            raise PolicyRefusal("dp.max-epsilon",
                                f"this computation would bring the epsilon spent on the "
                                f"site's data to {after:.3g} (delta {delta:g}), over the "
                                f"site's budget {budget:g}; spent so far, all federations "
                                f"together: {self.epsilon(delta):.3g}")
        return after

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the ledger's lock (``fcntl.flock``: every process of the site), re-reading it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / LOCK_NAME).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self.entries = self._load_entries()
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _save(self) -> None:
        _write_json(self.history_path, {"dataset": self.folder.name,
                                        "entries": [e.to_json() for e in self.entries]})

    def reserve(self, planned: Step, delta: float, max_epsilon: float, federation: str,
                kind: str) -> str:
        """Check ``planned`` (:meth:`check`) and reserve it, in one step under the lock.

        Two computations that start together (two federations, two processes) cannot
        both pass a check that only one of them fits: the first one's planned steps
        count as spent until :meth:`settle` replaces them with what it ran.

        Returns
        -------
        str
            The reservation's id.

        Raises
        ------
        PolicyRefusal
            Rule ``dp.max-epsilon``, as :meth:`check`.
        """
        with self._locked():
            self.check(planned, delta, max_epsilon)
            reservation = uuid.uuid4().hex
            sigma, q, steps = planned
            self.entries.append(LedgerEntry(float(sigma), float(q), int(steps), federation, kind,
                                            self.accountant, _now(), reservation))
            self._save()
        return reservation

    def settle(self, reservation: str, steps: Sequence[Step], federation: str,
               kind: str) -> None:
        """Replace reservation ``reservation`` with the steps the computation ran.

        The steps are recorded even if the reservation is gone (an admin reset the
        ledger meanwhile). A computation that failed before its result left the site
        settles with no steps: nothing of it was released. A process that died keeps
        its reservation (counted as spent: the ledger errs on the side of the patients).
        """
        with self._locked():
            self.entries = [e for e in self.entries if e.reservation != reservation]
            self._append(steps, federation, kind)
            self._save()

    def _append(self, steps: Sequence[Step], federation: str, kind: str) -> None:
        time = _now()
        self.entries.extend(LedgerEntry(float(s), float(q), int(n), federation, kind,
                                        self.accountant, time)
                            for s, q, n in steps if n > 0)

    def record(self, steps: Sequence[Step], federation: str, kind: str) -> None:
        """Append the steps a computation ran (its accountant's history) and save atomically."""
        with self._locked():
            self._append(steps, federation, kind)
            self._save()

    def _log_admin(self, line: str) -> str:
        text = f"{_now()} dataset {self.folder.name}: {line}"
        self.admin_log.parent.mkdir(parents=True, exist_ok=True)
        with self.admin_log.open("a", encoding="utf-8") as log:
            log.write(text + "\n")
        return text

    def extend(self, epsilon: float, reason: str) -> str:
        """Add ``epsilon`` to the allowance (a hospital admin's act); returns the log line.

        Raises
        ------
        LedgerError
            For an ``epsilon`` that is not a positive finite number.
        """
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise LedgerError(f"privacy ledger {self.folder}: an extension must be a positive "
                              f"epsilon, got {epsilon!r}")
        total = self.allowance() + epsilon
        _write_json(self.folder / ALLOWANCE_NAME, {"epsilon": total, "time": _now()})
        return self._log_admin(f"budget extended by epsilon {epsilon:g} (allowance now "
                               f"{total:g}): {reason}")

    def reset(self, reason: str) -> str:
        """Archive the history under ``archive/`` and start afresh; returns the log line.

        Raises
        ------
        LedgerError
            For an empty ``reason`` (a reset must say why).
        """
        if not reason.strip():
            raise LedgerError(f"privacy ledger {self.folder}: a reset needs a reason")
        with self._locked():
            return self._reset(reason)

    def _reset(self, reason: str) -> str:
        archived = "nothing to archive"
        if self.history_path.exists():
            stamp = _now().replace(":", "").replace("+0000", "Z")
            target = self.folder / ARCHIVE_DIR / f"history-{stamp}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            for n in range(1, 1000):  # two resets within a second: never overwrite
                if not target.exists():
                    break
                target = target.with_name(f"history-{stamp}-{n}.json")
            self.history_path.replace(target)
            archived = f"history archived to {target}"
        spent = len(self.entries)
        self.entries = []
        return self._log_admin(f"ledger reset ({spent} entries; {archived}): {reason}")
