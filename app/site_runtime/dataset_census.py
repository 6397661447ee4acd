"""The runtime's own count of a site's dataset, with the hospital's installed code.

Two of the site's guarantees depend on how much data it holds, and neither may rest
on the number the uploaded app reports:

* the privacy ledger's charge (:mod:`app.site_runtime.runtime_ledger`): DP-SGD's
  Poisson sampling rate ``q = 1 / (examples // batch size)`` (Abadi et al. 2016,
  Sec. 3.1; Opacus's rate, :func:`clients.training.private_training.poisson_sample_rate`);
* ``min-val-items``: below it an evaluate reply carries only counts.

So the runtime loads the task's data once per (task, data folder, sizes, manifest)
with its own copy of the task code (the same loader the worker's genuine app uses:
the same items skipped, the same examples), keeps the counts, and writes the data
report the console shows (:mod:`clients.site.data_report`) from that load: the
hospital sees its runtime's view, not the app's. The counts are kept in memory and in
``<state-dir>/runtime/census.json`` (keyed by a digest of the task, the resolved data
folder, the sizes and the manifest's bytes), so a restarted node does not decode again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from clients.registry import task_class
from clients.site.atomic_file import write_atomic
from clients.site.data_report import write_data_report
from clients.training.site_task import TaskSettings
from strategies.wire.errors import SiteError

__all__ = ["CENSUS_NAME", "DatasetCounts", "DatasetCensus"]

log = logging.getLogger("fedmed.site_runner")

#: The counts, in the runtime's folder (:func:`app.site_runtime.worker_view.runtime_dir`).
CENSUS_NAME = "census.json"
_SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class DatasetCounts:
    """What the runtime counted of one dataset at one set of sizes."""

    #: Training examples (slabs for a 2.5D task): DP-SGD's sampling rate is over these.
    train_examples: int
    #: Studies per split (``train``, ``val``, ``test``).
    studies: dict[str, int]


class DatasetCensus:
    """The runtime's counts of the site's datasets (see the module docstring).

    Parameters
    ----------
    folder : Path
        The runtime's own folder (never visible to the worker).
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / CENSUS_NAME
        self._known: dict[str, DatasetCounts] = {}
        if self.path.is_file():
            try:
                saved = json.loads(self.path.read_text(encoding="utf-8"))
                self._known = {key: DatasetCounts(int(row["train_examples"]),
                                                  {k: int(v) for k, v in row["studies"].items()})
                               for key, row in saved.items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("dataset census %s is unreadable (%s): counting again", self.path,
                            type(exc).__name__)

    @staticmethod
    def key(task: str, data_path: Path, sizes: TaskSettings) -> str:
        """The digest a count is kept under (the manifest's bytes included)."""
        manifest = Path(data_path) / task_class(task).manifest_name
        try:
            listed = manifest.read_bytes()
        except OSError:
            listed = b""
        text = json.dumps([task, str(Path(data_path).resolve()), asdict(sizes)], sort_keys=True,
                          default=str)
        return hashlib.sha256(text.encode() + b"\0" + listed).hexdigest()

    def counts(self, task: str, data_path: Path, sizes: TaskSettings,
               state_dir: Path) -> DatasetCounts:
        """The counts of ``task`` at ``data_path`` with ``sizes``, loaded on first use.

        The first use also writes the console's data report into ``state_dir``.

        Raises
        ------
        SiteDataError, ManifestError, StudyError
            As the task's loader: the site cannot be counted (the message fails).
        """
        key = self.key(task, data_path, sizes)
        if key not in self._known:
            started = time.monotonic()
            loaded = task_class(task)(Path(data_path), sizes)
            counts = DatasetCounts(
                0 if loaded.train_set is None else len(loaded.train_set),
                {split: loaded.split_studies(split) for split in _SPLITS})
            try:
                write_data_report(loaded, data_path, state_dir)
            except OSError as exc:
                log.warning("the data report cannot be written (%s)", type(exc).__name__)
            self._known[key] = counts
            self._save()
            log.info("site runtime counted %s at %s: %d training examples, studies %s "
                     "(%.1f s)", task, Path(data_path).name, counts.train_examples,
                     counts.studies, time.monotonic() - started)
        return self._known[key]

    def _save(self) -> None:
        text = json.dumps({key: asdict(value) for key, value in self._known.items()},
                          sort_keys=True).encode()
        try:
            write_atomic(self.path, lambda handle: handle.write(text))
        except OSError as exc:
            raise SiteError(f"dataset census {self.path}: cannot be written "
                            f"({exc.strerror})") from exc
