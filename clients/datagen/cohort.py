"""A synthetic multimodal cohort for vertical federations: one patient, three institutions.

The default demo of a vertical federation (pvFed, docs/VERTICAL.md) needs patients
whom several institutions saw, each holding a different modality and its own task.
:func:`write_cohort` writes three site folders under ``out``, named as the simulation's
sites (``hospital-<partition>``; the institution is the ``department`` of the folder's
``vertical-site.toml``)::

    hospital-00/  ct-centre    ct3d-cls: labels.csv + a chest CT per patient (DICOM series or NIfTI)
    hospital-01/  xray-clinic  cxr-cls: images.csv + a frontal radiograph per patient (PNG or DICOM)
    hospital-02/  lab          tabular-cls: table.csv of lab values (a few cells missing)

each with ``vertical-site.toml`` (its ``task`` and ``department``) and the
``SYNTHETIC.txt`` marker. The images and files are the product's own generators and
writers (:mod:`clients.datagen.cohort_sites`), so each task's loader reads them.

**The latent disease state** (the generative model, drawn by :func:`draw_cohort`).
Patient ``i`` has a latent severity of an inflammatory lung disease

.. math::  z_i \\sim \\mathcal{N}(0, 1).

Each institution ``m`` sees it through its own modality, a noisy *view*

.. math::  v_{m,i} = z_i + \\sigma_v\\, \\varepsilon_{m,i}, \\qquad \\varepsilon \\sim \\mathcal{N}(0, 1),

(what its images or lab values show: emphysema in the CT, a consolidation opacity
in the radiograph whose extent grows with :math:`v`, lab values shifted by it),
and records its **own** target, a different but correlated label

.. math::  y_{m,i} = \\mathbb{1}[\\, z_i + \\sigma_y\\, \\eta_{m,i} > \\tau_m \\,],

with independent label noise :math:`\\eta` and its own threshold :math:`\\tau_m`
(:data:`LABEL_THRESHOLDS`): the CT centre's COPD diagnosis, the X-ray clinic's
pneumonia diagnosis, the lab's C-reactive protein above 10 mg/L (CRP is the label,
not a feature). A modality alone is a weak predictor of its own label (the view's
noise :math:`\\sigma_v` exceeds the label's :math:`\\sigma_y`), and the other two
views carry independent information about :math:`z`: averaging ``k`` views divides
the view noise by :math:`\\sqrt{k}`. That is what lets pvFed's global representation
(Nishikawa et al., IEEJ 2024) beat each institution's local-best model.

**Who saw whom.** Each institution independently holds ``round(coverage * n)``
patients (a seeded draw per site), so the sites must be aligned (PSI) before a
vertical round. A patient's ``patient_id`` and split are the same at every site that
holds the patient: train / val / test 60 / 20 / 20, stratified by the latent severity
(patients sorted by :math:`z`, in blocks of five: three train, one val, one test).
Each site writes its rows in its own shuffled order.

Everything is a pure function of ``seed``: the same seed writes the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.datagen.cohort_sites import SITE_WRITERS
from clients.datagen.federation import hospital_name

__all__ = ["SITES", "LABEL_THRESHOLDS", "VIEW_NOISE", "LABEL_NOISE", "MIN_PATIENTS", "Cohort",
           "draw_cohort", "write_cohort"]

#: The institutions in site order: folder / department name -> its task.
SITES = {name: site.task for name, site in SITE_WRITERS.items()}
#: tau_m: each institution's label threshold on the latent severity (prevalences ~40/50/60 %).
LABEL_THRESHOLDS = {"ct-centre": 0.3, "xray-clinic": 0.0, "lab": -0.3}
#: sigma_v: noise of what a modality shows about the latent severity.
VIEW_NOISE = 1.0
#: sigma_y: noise of each institution's own label.
LABEL_NOISE = 0.5
#: The splits of a block of five patients of similar severity (60 / 20 / 20).
_BLOCK = ("train", "train", "train", "val", "test")
#: Fewest patients: every site's val and test splits must hold both classes of its label.
MIN_PATIENTS = 40


@dataclass(frozen=True)
class Cohort:
    """The drawn cohort before anything is written (ground truth; never in a site folder).

    Attributes
    ----------
    seed : int
        The cohort's seed.
    patient_ids : list of str
        ``P0000``, ``P0001``, ... (the id every site uses for the patient).
    severity : np.ndarray
        ``(n,)`` latent severity :math:`z`.
    splits : list of str
        Each patient's split, the same at every site.
    views : dict of str to np.ndarray
        Site -> ``(n,)`` what its modality shows, :math:`v_m`.
    labels : dict of str to np.ndarray
        Site -> ``(n,)`` its own 0/1 label, :math:`y_m`.
    held : dict of str to np.ndarray
        Site -> ``(n,)`` bool, the patients the site holds.
    """

    seed: int
    patient_ids: list[str]
    severity: np.ndarray
    splits: list[str]
    views: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    held: dict[str, np.ndarray]

    def finding(self, site: str, index: int) -> float:
        """What ``site``'s modality shows of patient ``index``: :math:`v_m - \\tau_m` (visible when > 0)."""
        return float(self.views[site][index] - LABEL_THRESHOLDS[site])

    def members(self, site: str) -> list[int]:
        """Indices of the patients ``site`` holds, in the site's own (shuffled, seeded) row order."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x0DE5, list(SITES).index(site)]))
        return rng.permutation(np.flatnonzero(self.held[site])).tolist()


def _severity_splits(severity: np.ndarray, rng: np.random.Generator) -> list[str]:
    """60/20/20 splits stratified by severity: sorted patients in blocks of five, each block shuffled."""
    splits = [""] * severity.size
    order = np.argsort(severity, kind="stable")
    for start in range(0, order.size, len(_BLOCK)):
        block = order[start:start + len(_BLOCK)]
        for index, slot in zip(block, rng.permutation(len(_BLOCK))):
            splits[int(index)] = _BLOCK[int(slot)]
    return splits


def _check_classes(cohort: Cohort) -> None:
    """Refuse a cohort in which a site's split lacks a class of its label (AUC undefined)."""
    for site in SITES:
        for split in ("train", "val", "test"):
            mask = cohort.held[site] & (np.array(cohort.splits) == split)
            classes = set(cohort.labels[site][mask].tolist())
            if classes != {0, 1}:
                raise ValueError(f"cohort: site {site!r} split {split!r} holds labels {sorted(classes)}, "
                                 "not both classes; draw more patients or a larger coverage")


def draw_cohort(patients: int, seed: int, coverage: float = 0.9) -> Cohort:
    """Draw the cohort's latent severities, views, labels, splits and site membership.

    Parameters
    ----------
    patients : int
        Number of patients ``n`` (>= :data:`MIN_PATIENTS`).
    seed : int
        The cohort's seed (``SeedSequence([seed, 0xC0407])``).
    coverage : float
        Share of the patients each site holds, in (0, 1].

    Returns
    -------
    Cohort
        See the module docstring for the model.

    Raises
    ------
    ValueError
        On ``patients`` or ``coverage`` out of range, or when a site's split lacks a class.
    """
    if patients < MIN_PATIENTS:
        raise ValueError(f"patients must be >= {MIN_PATIENTS}, got {patients}")
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC0407]))
    severity = rng.standard_normal(patients)
    views = {site: severity + VIEW_NOISE * rng.standard_normal(patients) for site in SITES}
    labels = {site: (severity + LABEL_NOISE * rng.standard_normal(patients) > tau).astype(np.int64)
              for site, tau in LABEL_THRESHOLDS.items()}
    kept = round(coverage * patients)
    held = {}
    for site in SITES:
        mask = np.zeros(patients, dtype=bool)
        mask[rng.permutation(patients)[:kept]] = True
        held[site] = mask
    cohort = Cohort(seed, [f"P{i:04d}" for i in range(patients)], severity, _severity_splits(severity, rng),
                    views, labels, held)
    _check_classes(cohort)
    return cohort


def write_cohort(shared: Path | None, out: Path, seed: int, coverage: float = 0.9, patients: int = 300,
                 image_size: int = 32, volume_depth: int = 16) -> list[Path]:
    """Write the cohort's three site folders under ``out`` (``hospital-00..02``: the CT centre,
    the X-ray clinic, the lab).

    Parameters
    ----------
    shared : Path or None
        Unused (the cohort is synthetic); the call shape of the vertical sets
        (:data:`clients.datagen.vertical_sets.VERTICAL_SETS`).
    out : Path
        Parent folder of the site folders (created).
    seed : int
        The cohort's seed; the same seed writes the same files.
    coverage : float
        Share of the patients each site holds independently, in (0, 1] (default 0.9).
    patients : int
        Number of patients (default 300: about 220 held by all three at coverage 0.9).
    image_size : int
        Side of the radiographs (>= 32) and in-plane size of the CT volumes (default 32).
    volume_depth : int
        Slices of each CT volume (>= 4, default 16).

    Returns
    -------
    list of Path
        The site folders, in :data:`SITES` order.

    Raises
    ------
    FileExistsError
        When a site folder holds anything but a synthetic site (no ``SYNTHETIC.txt``); the
        sites are written in order, so those before it are written.
    ValueError
        On an argument out of range (:func:`draw_cohort`, the image sizes).
    """
    del shared
    if image_size < 32:
        raise ValueError(f"image_size must be >= 32, got {image_size}")
    if volume_depth < 4:
        raise ValueError(f"volume_depth must be >= 4, got {volume_depth}")
    cohort = draw_cohort(patients, seed, coverage)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [SITE_WRITERS[site].write(out / hospital_name(k), cohort, site,
                                     image_size=image_size, volume_depth=volume_depth)
            for k, site in enumerate(SITES)]
