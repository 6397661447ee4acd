"""The runtime fetches, the worker never holds PACS credentials: the site's cohort synced outside the sandbox.

A site whose dataset is a cohort in its PACS is started with the cohort file instead of
a data folder (``make supernode DATA=/abs/cohort.toml``, ``fedmed site start --data``):
its node config then names the file (``cohort``, :data:`~app.config.site_config.COHORT`)
and, as ``data-path``, the folder the sync writes, ``<state-dir>/pacs/<name>``
(:func:`clients.pacs.sync.store_dir`). The hospital's runtime, never the app's worker,
syncs it (:func:`sync_site`):

* when the site node starts (:func:`start_sync`), and again at the first message of each
  federation (:class:`CohortSyncs`), so a study added to the PACS joins the next
  federation;
* only with a PACS the site policy lists (``[pacs] endpoints``, refused: ``pacs.endpoints``,
  before anything is contacted), and only a cohort of at most ``[pacs] max-cohort``
  studies as the query finds them (refused: ``pacs.max-cohort``, right after the query,
  before any instance is fetched, the store left as it was; the dataset refused for the
  whole federation);
* each sync appends a ``pacs-sync`` record to the site's audit log: counts and bytes, no
  identifier (:meth:`~app.site_runtime.site_audit.SiteAudit.pacs_sync`).

The worker is handed the synced folder read-only, as any data folder
(:mod:`app.site_runtime.sandbox`; a node run as root gives it to the worker's uid, as it
gives the worker's state folder, so that the sandboxed worker can read it), and a node
config without ``cohort``
(:func:`~app.site_runtime.worker_view.worker_context`): the cohort file and the PACS
credentials it names stay outside its view. A PACS that is down, or a cohort file that no
longer reads, leaves the last synced folder as it was (logged); the next sync retries.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.config.site_config import COHORT
from app.site_runtime.sandbox import SandboxLimits, worker_owner
from app.site_runtime.site_audit import SiteAudit
from app.site_runtime.worker_view import chown_tree
from app.tooling.errors import FlowerProcessError
from clients.pacs.cohort import load_cohort
from clients.pacs.errors import CohortError, PacsError
from clients.pacs.sync import SyncReport, store_dir, sync_cohort
from clients.site.policy import PolicyRefusal, SitePolicy
from clients.site.privacy_ledger import dataset_id

__all__ = ["cohort_file", "sync_site", "start_sync", "CohortSyncs"]

log = logging.getLogger("fedmed.site_runner")


def cohort_file(node_config: Mapping[str, Any]) -> Path | None:
    """The node config's cohort file (None: the site's data is a folder)."""
    value = str(node_config.get(COHORT, ""))
    return Path(value) if value else None


def _counts(report: SyncReport) -> dict[str, int | float]:
    return {"studies-in-pacs": report.studies_in_pacs, "synced": report.synced,
            "fetched-studies": report.fetched_studies,
            "fetched-instances": report.fetched_instances, "fetched-bytes": report.fetched_bytes,
            "removed": report.removed, "skipped": len(report.skipped),
            "seconds": round(report.seconds, 3)}


def _owner(policy: SitePolicy, limits: SandboxLimits | None) -> tuple[int, int] | None:
    """Who must own the synced folder for the worker to read it (None: the runtime)."""
    return worker_owner(limits) if limits is not None and policy.sandbox == "on" else None


def sync_site(cohort_path: Path, state_dir: Path, policy: SitePolicy,
              audit: SiteAudit | None, limits: SandboxLimits | None = None) -> SyncReport:
    """Sync the cohort of ``cohort_path`` into ``state_dir`` under ``policy``'s ``[pacs]``
    rules; audit it (see the module docstring); ``limits``: the sandbox's (its worker uid
    is given the synced folder when the node runs as root).

    Raises
    ------
    PolicyRefusal
        ``pacs.endpoints`` (nothing was contacted) or ``pacs.max-cohort``.
    CohortError
        The cohort file, its credentials or its label CSV is wrong.
    PacsError
        The PACS cannot be used; what was synced before stays.
    """
    cohort = load_cohort(cohort_path)
    dataset = {"dataset": dataset_id(store_dir(cohort, state_dir))}

    def record(counts: dict[str, Any]) -> None:
        if audit is not None:
            audit.pacs_sync({**dataset, **counts})

    try:
        policy.pacs.check_endpoint(cohort.endpoint)
    except PolicyRefusal as refusal:
        log.warning("PACS sync refused: %s (cohort file %s names %s)", refusal, cohort.path,
                    cohort.endpoint)
        record({"refused": refusal.rule})
        raise
    found: list[int] = []

    def check_size(studies: int) -> None:  # after the query, before any instance is fetched
        found.append(studies)
        policy.pacs.check_cohort(studies)

    try:
        report = sync_cohort(cohort, state_dir, check_size=check_size)
    except PacsError as exc:
        record({"failed": type(exc).__name__})
        raise
    except PolicyRefusal as refusal:
        log.warning("PACS sync of cohort %s refused: %s", cohort.name, refusal)
        record({"studies-in-pacs": found[-1], "refused": refusal.rule})
        raise
    record(_counts(report))
    owner = _owner(policy, limits)
    if owner is not None:
        chown_tree(store_dir(cohort, state_dir), *owner)
    return report


def start_sync(node_config: Mapping[str, Any], state_dir: Path, policy: SitePolicy,
               audit: SiteAudit | None, limits: SandboxLimits | None = None
               ) -> SyncReport | None:
    """The sync when the site node starts (None: no cohort, or the PACS is not answering,
    logged: the node serves the last synced folder and syncs again at the next federation).

    Raises
    ------
    FlowerProcessError
        A rule refuses the cohort, or the cohort file is wrong: one line, the node stops.
    """
    path = cohort_file(node_config)
    if path is None:
        return None
    try:
        return sync_site(path, state_dir, policy, audit, limits)
    except (PolicyRefusal, CohortError) as exc:
        raise FlowerProcessError(f"site_node: {exc}") from None
    except PacsError as exc:
        log.warning("site node: the PACS sync at start failed (%s); the last synced cohort "
                    "stays", exc)
        return None


class CohortSyncs:
    """The sync at the first message of each federation, and its refusal for the others
    (``limits``: the sandbox's, see :func:`sync_site`)."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits
        self._runs: dict[int, PolicyRefusal | None] = {}

    def for_run(self, run_id: int, node_config: Mapping[str, Any], state_dir: Path,
                policy: SitePolicy, audit: SiteAudit | None) -> PolicyRefusal | None:
        """Sync the node config's cohort if ``run_id`` is a new federation; the refusal that
        holds for every message of the federation (None: its messages may proceed)."""
        path = cohort_file(node_config)
        if path is None:
            return None
        if run_id not in self._runs:
            refusal = None
            try:
                sync_site(path, state_dir, policy, audit, self.limits)
            except PolicyRefusal as exc:
                refusal = exc
            except (CohortError, PacsError) as exc:
                log.warning("PACS sync for federation run %d failed (%s); the last synced "
                            "cohort stays", run_id, exc)
            self._runs[run_id] = refusal
        return self._runs[run_id]
