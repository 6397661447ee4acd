"""The synthetic chest CT of the 3D classification hospitals, with or without emphysema.

The anatomy is the CTPA phantom of :mod:`clients.datagen.ct_phantom` without
contrast; a positive study gets low-attenuation emphysema clusters
(centrilobular or panlobular, :data:`PATTERNS`) painted into the lung
parenchyma. See :mod:`clients.ct3d_cls.synthetic` for the hospitals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.datagen.ct_phantom import PA_BASE_HU, synthesize_ctpa_phantom
from clients.io.dicom_series import CTVolume

__all__ = ["EMPHYSEMA_HU", "LUNG_MASK_HU", "PATTERNS", "EMPHYSEMA_FRACTION", "SyntheticChestCT",
           "synthesize_chest_ct"]

#: Attenuation range (HU) of emphysematous clusters.
EMPHYSEMA_HU = (-1000.0, -960.0)
#: HU range that is lung parenchyma in the noise-free phantom (air outside is -1000, tissue > -150).
LUNG_MASK_HU = (-995.0, -600.0)
#: Emphysema patterns of positive studies.
PATTERNS = ("centrilobular", "panlobular")
#: Range of the lung fraction covered by emphysema in a positive study.
EMPHYSEMA_FRACTION = (0.08, 0.25)
#: Upper bound on the clusters painted in one study.
_MAX_CLUSTERS = 400
#: Non-contrast blood: the phantom's pulmonary arteries at PA_BASE_HU + this = 40 HU.
_NON_CONTRAST = 40.0 - PA_BASE_HU


@dataclass(frozen=True, eq=False)
class SyntheticChestCT:
    """One synthesized chest CT before it is written.

    Attributes
    ----------
    volume : CTVolume
        Integer HU volume (the values that will be stored) and its DICOM geometry.
    lung_mask : np.ndarray
        ``uint8`` ``(z, y, x)`` lung parenchyma (ground truth; not written).
    emphysema_mask : np.ndarray
        ``uint8`` ``(z, y, x)`` emphysematous voxels (empty for label 0; not written).
    label : int
        1 with emphysema, 0 without.
    pattern : str
        ``"centrilobular"``, ``"panlobular"`` or ``"none"``.
    uid_seed : int
        Entropy for the DICOM UIDs.
    """

    volume: CTVolume
    lung_mask: np.ndarray
    emphysema_mask: np.ndarray
    label: int
    pattern: str
    uid_seed: int

    @property
    def emphysema_fraction(self) -> float:
        """Share of lung voxels labelled emphysema."""
        return float(np.count_nonzero(self.emphysema_mask & self.lung_mask)) / max(
            1, int(np.count_nonzero(self.lung_mask))
        )


def _opening_in_plane(mask: np.ndarray) -> np.ndarray:
    """Binary opening with the in-plane 3x3 cross: removes one-pixel-wide structures."""

    def erode(m: np.ndarray) -> np.ndarray:
        p = np.pad(m, ((0, 0), (1, 1), (1, 1)), constant_values=False)
        return m & p[:, :-2, 1:-1] & p[:, 2:, 1:-1] & p[:, 1:-1, :-2] & p[:, 1:-1, 2:]

    def dilate(m: np.ndarray) -> np.ndarray:
        p = np.pad(m, ((0, 0), (1, 1), (1, 1)), constant_values=False)
        return m | p[:, :-2, 1:-1] | p[:, 2:, 1:-1] | p[:, 1:-1, :-2] | p[:, 1:-1, 2:]

    return dilate(erode(mask))


def _paint_emphysema(
    hu: np.ndarray,
    lung: np.ndarray,
    spacing: tuple[float, float, float],
    pattern: str,
    target_fraction: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Paint low-attenuation clusters inside ``lung`` until they cover ``target_fraction`` of it.

    Each cluster is an ellipsoid with soft (one-voxel) edges, its own HU in
    :data:`EMPHYSEMA_HU`, alpha-composited over the parenchyma and clipped to
    the lung mask (vessels and the chest wall are spared). Returns the
    ``uint8`` emphysema mask (occupancy >= 0.5).
    """
    nz, ny, nx = hu.shape
    dz, dy, dx = spacing
    lung_f = lung.astype(np.float32)
    occupancy = np.zeros(hu.shape, dtype=np.float32)
    candidates = np.argwhere(lung)
    # Zonal predominance: centrilobular in the upper (high z) lung, panlobular in the lower.
    t = candidates[:, 0] / max(nz - 1, 1)
    weights = (0.2 + t) ** 2 if pattern == "centrilobular" else (1.2 - t) ** 2
    weights = weights / weights.sum()
    radius_range = (6.0, 12.0) if pattern == "centrilobular" else (12.0, 24.0)
    lung_voxels = max(1, int(lung.sum()))
    z = (np.arange(nz) * dz)[:, None, None]
    y = (np.arange(ny) * dy)[None, :, None]
    x = (np.arange(nx) * dx)[None, None, :]
    pixel = min(dy, dx)
    covered = 0
    centres = candidates[rng.choice(len(candidates), size=_MAX_CLUSTERS, p=weights)]
    for kz, ky, kx in centres:
        if covered >= target_fraction * lung_voxels:
            break
        centre = np.array([kz * dz, ky * dy, kx * dx])
        radii = rng.uniform(*radius_range) * rng.uniform(0.7, 1.3, size=3)
        window = tuple(
            slice(max(0, int((c - r - s) // s)), min(n, int((c + r + s) // s) + 2))
            for c, r, s, n in zip(centre, radii, (dz, dy, dx), (nz, ny, nx))
        )
        q = np.sqrt(
            ((z[window[0]] - centre[0]) / radii[0]) ** 2
            + ((y[:, window[1]] - centre[1]) / radii[1]) ** 2
            + ((x[:, :, window[2]] - centre[2]) / radii[2]) ** 2
        )
        blob = np.clip(0.5 - (q - 1.0) * radii.min() / pixel, 0.0, 1.0).astype(np.float32)
        blob *= lung_f[window]
        value = np.float32(rng.uniform(*EMPHYSEMA_HU))
        region = hu[window]
        region += blob * (value - region)
        before = np.count_nonzero(occupancy[window] >= 0.5)
        np.maximum(occupancy[window], blob, out=occupancy[window])
        covered += np.count_nonzero(occupancy[window] >= 0.5) - before
    return ((occupancy >= 0.5) & lung).astype(np.uint8)


def synthesize_chest_ct(
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    noise_hu: float,
    rng: np.random.Generator,
    emphysema: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Synthesize one non-contrast chest CT, with or without emphysema (pure NumPy).

    Parameters
    ----------
    shape : tuple of int
        ``(z, y, x)`` voxels (square in-plane).
    spacing : tuple of float
        ``(dz, dy, dx)`` in mm.
    noise_hu : float
        Standard deviation of the additive Gaussian noise (HU).
    rng : np.random.Generator
        Source of all randomness.
    emphysema : bool
        Paint emphysematous clusters (positive class) or not.

    Returns
    -------
    hu : np.ndarray
        ``float32`` ``(z, y, x)`` HU, rounded to integers, in [-1024, 3071].
    lung_mask : np.ndarray
        ``uint8`` lung parenchyma of the noise-free phantom.
    emphysema_mask : np.ndarray
        ``uint8`` emphysematous voxels (all zero without emphysema).
    pattern : str
        ``"centrilobular"``, ``"panlobular"`` or ``"none"``.
    """
    phantom = synthesize_ctpa_phantom(shape, spacing, _NON_CONTRAST, 0.0, rng, with_pe=False)
    hu = phantom.hu
    lung = _opening_in_plane((hu > LUNG_MASK_HU[0]) & (hu < LUNG_MASK_HU[1]))
    pattern = "none"
    emph = np.zeros(shape, dtype=np.uint8)
    if emphysema:
        pattern = PATTERNS[int(rng.integers(len(PATTERNS)))]
        target = float(rng.uniform(*EMPHYSEMA_FRACTION))
        emph = _paint_emphysema(hu, lung, spacing, pattern, target, rng)
    hu += np.float32(noise_hu) * rng.standard_normal(size=shape, dtype=np.float32)
    np.clip(hu, -1024.0, 3071.0, out=hu)
    return np.rint(hu).astype(np.float32), lung.astype(np.uint8), emph, pattern
