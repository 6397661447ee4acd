"""A numerical contrast chest-CT phantom with pulmonary emboli (pure NumPy).

The phantom is built in millimetres on the voxel grid of an axial CT series,
in DICOM LPS axes (columns to the patient's left, rows to posterior, slices
ascending to superior), and painted tissue by tissue with partial-volume
(soft, one-pixel-wide) edges:

=========================  ===========================================
structure                  Hounsfield units
=========================  ===========================================
air outside the body       -1000
subcutaneous fat           ~ -100
soft tissue, mediastinum   ~ 40 (heart ~ 60)
lungs                      ~ -850 with low-frequency texture
vertebra                   ~ 350 (cortex ~ 700)
aorta                      ~ 150 + 0.35 x contrast (a bright distractor)
pulmonary arteries         ~ 150 + contrast (e.g. 300-450)
emboli (clot)              ~ 20-60, only inside the pulmonary arteries
=========================  ===========================================

The pulmonary arterial tree is a set of curved tapering tubes (quadratic
Bezier centre lines): a trunk rising from the heart, left and right main
arteries running mostly in-plane to the hila, three lobar branches per lung
running up and down through the slices, and a few smaller lung vessels.
Emboli are ellipsoids elongated along a vessel's centre line, clipped to
the vessel lumen, so each is a filling defect fully inside a vessel. The tree
is placed in normalised slice coordinates, so every study shows all of it
whatever its slice count and spacing. Sizes are exaggerated relative to
anatomy so that a small 2D U-Net at 64-96 px can learn the task quickly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Phantom", "Vessel", "synthesize_ctpa_phantom", "CLOT_HU", "PA_BASE_HU"]

#: HU of contrast-filled pulmonary arteries before the site-specific enhancement.
PA_BASE_HU = 150.0
#: Range of clot attenuation (HU).
CLOT_HU = (20.0, 60.0)
_SEGMENTS_PER_VESSEL = 10


@dataclass(frozen=True)
class Vessel:
    """A tapering tube along a quadratic Bezier centre line (LPS mm).

    Attributes
    ----------
    start, control, end : np.ndarray
        Bezier control points ``(x, y, z)`` in mm.
    radius_start, radius_end : float
        Lumen radius (mm) at both ends (linear taper).
    name : str
        Label, for debugging.
    """

    start: np.ndarray
    control: np.ndarray
    end: np.ndarray
    radius_start: float
    radius_end: float
    name: str

    def point(self, s: float | np.ndarray) -> np.ndarray:
        """Centre-line point(s) at parameter ``s`` in [0, 1]."""
        s = np.asarray(s, dtype=np.float64)[..., None]
        return (1 - s) ** 2 * self.start + 2 * s * (1 - s) * self.control + s**2 * self.end

    def tangent(self, s: float) -> np.ndarray:
        """Unit tangent of the centre line at ``s``."""
        d = 2 * (1 - s) * (self.control - self.start) + 2 * s * (self.end - self.control)
        return d / np.linalg.norm(d)

    def radius(self, s: float | np.ndarray) -> np.ndarray:
        """Lumen radius (mm) at ``s``."""
        return self.radius_start + (self.radius_end - self.radius_start) * np.asarray(s, dtype=np.float64)


@dataclass(frozen=True, eq=False)
class Phantom:
    """A synthetic CTPA volume and its ground truth.

    Attributes
    ----------
    hu : np.ndarray
        ``float32`` ``(z, y, x)`` Hounsfield units, noise included, clipped to [-1024, 3071].
    pe_mask : np.ndarray
        ``uint8`` ``(z, y, x)``, 1 inside emboli.
    vessel_mask : np.ndarray
        ``uint8`` ``(z, y, x)``, 1 inside the pulmonary arteries (emboli included).
    num_emboli : int
        Number of emboli painted.
    """

    hu: np.ndarray
    pe_mask: np.ndarray
    vessel_mask: np.ndarray
    num_emboli: int


class _Grid:
    """Voxel-centre coordinates (mm) of a ``(z, y, x)`` grid, centred in-plane."""

    def __init__(self, shape: tuple[int, int, int], spacing: tuple[float, float, float]) -> None:
        nz, ny, nx = shape
        dz, dy, dx = spacing
        self.shape = shape
        self.pixel = min(dy, dx)
        self.x = ((np.arange(nx) - (nx - 1) / 2) * dx).astype(np.float32)
        self.y = ((np.arange(ny) - (ny - 1) / 2) * dy).astype(np.float32)
        self.z = (np.arange(nz) * dz).astype(np.float32)
        self.fov = float(min(nx * dx, ny * dy))
        self.z_extent = float(max((nz - 1) * dz, dz))
        self.X = self.x[None, None, :]
        self.Y = self.y[None, :, None]

    def z_at(self, t: float) -> float:
        """Physical z (mm) of normalised slice coordinate ``t`` in [0, 1]."""
        return t * self.z_extent

    def window(self, lo: np.ndarray, hi: np.ndarray) -> tuple[slice, slice, slice] | None:
        """Index window ``(z, y, x)`` of the voxels inside the box [lo, hi] (x, y, z mm)."""
        out = []
        for axis, a, b in ((self.z, lo[2], hi[2]), (self.y, lo[1], hi[1]), (self.x, lo[0], hi[0])):
            i0, i1 = np.searchsorted(axis, a, "left"), np.searchsorted(axis, b, "right")
            if i1 <= i0:
                return None
            out.append(slice(int(i0), int(i1)))
        return out[0], out[1], out[2]


def _texture(grid: _Grid, rng: np.random.Generator, num_waves: int) -> np.ndarray:
    """Zero-mean low-frequency texture: a sum of random plane waves, wavelengths 8-25 mm.

    ``cos(a(x, y) + b(z)) = cos a cos b - sin a sin b`` turns the sum into one
    matrix product of per-slice and in-plane factors.
    """
    nz, ny, nx = grid.shape
    in_plane = np.empty((2 * num_waves, ny * nx), dtype=np.float32)
    through = np.empty((nz, 2 * num_waves), dtype=np.float32)
    for m in range(num_waves):
        k = rng.normal(size=3)
        k *= 2 * np.pi / rng.uniform(8.0, 25.0) / np.linalg.norm(k)
        a = (grid.X * k[0] + grid.Y * k[1]).reshape(-1) + rng.uniform(0, 2 * np.pi)
        b = grid.z * k[2]
        in_plane[2 * m], in_plane[2 * m + 1] = np.cos(a), np.sin(a)
        through[:, 2 * m], through[:, 2 * m + 1] = np.cos(b), -np.sin(b)
    return (through @ in_plane).reshape(grid.shape)


def _soft(signed_distance: np.ndarray, pixel: float) -> np.ndarray:
    """Partial-volume occupancy from a signed distance (mm, negative inside)."""
    return np.clip(0.5 - signed_distance / pixel, 0.0, 1.0).astype(np.float32)


def _ellipse(grid: _Grid, cx: float, cy: float, a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """Occupancy of an axial ellipse (semi-axes may vary per slice, shape ``(z, 1, 1)``)."""
    q = np.sqrt(((grid.X - cx) / a) ** 2 + ((grid.Y - cy) / b) ** 2)
    return _soft((q - 1.0) * np.minimum(a, b), grid.pixel)


def _paint(hu: np.ndarray, occupancy: np.ndarray, value: np.ndarray | float) -> None:
    """Alpha-composite ``value`` over ``hu`` in place."""
    hu += occupancy * (value - hu)


def _paint_vessel(alpha: np.ndarray, grid: _Grid, vessel: Vessel) -> None:
    """Max-composite the partial-volume occupancy of a vessel into ``alpha``."""
    s = np.linspace(0.0, 1.0, _SEGMENTS_PER_VESSEL + 1)
    points = vessel.point(s)
    radii = vessel.radius(s)
    for a, b, ra, rb in zip(points[:-1], points[1:], radii[:-1], radii[1:]):
        margin = max(ra, rb) + grid.pixel
        window = grid.window(np.minimum(a, b) - margin, np.maximum(a, b) + margin)
        if window is None:
            continue
        wz, wy, wx = window
        X = grid.x[wx][None, None, :] - a[0]
        Y = grid.y[wy][None, :, None] - a[1]
        Z = grid.z[wz][:, None, None] - a[2]
        ab = (b - a).astype(np.float32)
        u = np.clip((X * ab[0] + Y * ab[1] + Z * ab[2]) / float(ab @ ab), 0.0, 1.0)
        d = np.sqrt((X - u * ab[0]) ** 2 + (Y - u * ab[1]) ** 2 + (Z - u * ab[2]) ** 2)
        occupancy = _soft(d - (ra + u * (rb - ra)), grid.pixel)
        region = alpha[wz, wy, wx]
        np.maximum(region, occupancy, out=region)


def _arterial_tree(grid: _Grid, rng: np.random.Generator) -> tuple[list[Vessel], list[Vessel]]:
    """Pulmonary arteries: (large vessels that may hold emboli, small lung vessels)."""
    F = grid.fov

    def at(x: float, y: float, t: float) -> np.ndarray:
        jitter = rng.normal(0.0, [0.012 * F, 0.012 * F, 0.03])
        return np.array([(x * F + jitter[0]), (y * F + jitter[1]), grid.z_at(t + jitter[2])])

    r_trunk = rng.uniform(19.0, 23.0)
    r_main = rng.uniform(13.5, 16.5)
    r_lobar = rng.uniform(9.0, 11.0)
    bifurcation = at(0.0, -0.04, 0.55)
    right_hilum = at(-0.19, -0.01, 0.58)
    left_hilum = at(0.19, 0.03, 0.60)
    large = [
        Vessel(at(0.05, -0.16, -0.02), at(0.05, -0.09, 0.30), bifurcation, r_trunk, 0.9 * r_trunk, "trunk"),
        Vessel(bifurcation, at(-0.09, -0.06, 0.60), right_hilum, r_main, 0.85 * r_main, "right"),
        Vessel(bifurcation, at(0.10, 0.04, 0.68), left_hilum, r_main, 0.85 * r_main, "left"),
    ]
    for hilum, side in ((right_hilum, -1.0), (left_hilum, 1.0)):
        large += [
            Vessel(hilum, at(side * 0.21, -0.04, 0.80), at(side * 0.22, -0.02, 1.02), r_lobar, 0.8 * r_lobar, "upper"),
            Vessel(hilum, at(side * 0.25, -0.08, 0.45), at(side * 0.27, -0.11, 0.28), r_lobar, 0.8 * r_lobar, "middle"),
            Vessel(hilum, at(side * 0.21, 0.06, 0.30), at(side * 0.21, 0.11, -0.02), r_lobar, 0.8 * r_lobar, "lower"),
        ]
    small: list[Vessel] = []
    lobar = large[3:]
    for _ in range(int(rng.integers(6, 11))):
        parent = lobar[int(rng.integers(len(lobar)))]
        start = parent.point(rng.uniform(0.4, 0.9))
        side = np.sign(start[0]) or 1.0
        direction = np.array([side * rng.uniform(0.4, 1.0), rng.uniform(-0.7, 0.7), rng.uniform(-0.8, 0.8)])
        direction /= np.linalg.norm(direction)
        length = rng.uniform(25.0, 45.0)
        end = start + length * direction
        control = (start + end) / 2 + rng.normal(0.0, 5.0, 3)
        radius = rng.uniform(2.5, 4.5)
        small.append(Vessel(start, control, end, radius, 0.7 * radius, "small"))
    return large, small


def _embolus(grid: _Grid, vessel: Vessel, rng: np.random.Generator) -> tuple[tuple[slice, ...], np.ndarray] | None:
    """Occupancy of one ellipsoidal embolus along ``vessel`` (window, values) or None if off-grid."""
    s = rng.uniform(0.2, 0.8)
    centre = vessel.point(s)
    axis = vessel.tangent(s)
    r_vessel = float(vessel.radius(s))
    r_cross = min(max(r_vessel * rng.uniform(0.55, 0.85), 2.0 * grid.pixel), r_vessel)
    r_long = r_cross * rng.uniform(1.5, 3.0)
    margin = r_long + grid.pixel
    window = grid.window(centre - margin, centre + margin)
    if window is None:
        return None
    wz, wy, wx = window
    X = grid.x[wx][None, None, :] - centre[0]
    Y = grid.y[wy][None, :, None] - centre[1]
    Z = grid.z[wz][:, None, None] - centre[2]
    along = X * axis[0] + Y * axis[1] + Z * axis[2]
    across = np.sqrt(np.maximum(X**2 + Y**2 + Z**2 - along**2, 0.0))
    q = np.sqrt((along / r_long) ** 2 + (across / r_cross) ** 2)
    return window, _soft((q - 1.0) * r_cross, grid.pixel)


def synthesize_ctpa_phantom(
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    contrast_hu: float,
    noise_hu: float,
    rng: np.random.Generator,
    with_pe: bool = True,
) -> Phantom:
    """Synthesize one contrast chest CT (CTPA-like) volume with or without emboli.

    Parameters
    ----------
    shape : tuple of int
        ``(z, y, x)`` voxels; in-plane should be square.
    spacing : tuple of float
        ``(dz, dy, dx)`` in mm.
    contrast_hu : float
        Arterial enhancement: pulmonary arteries are ``150 + contrast_hu`` HU.
    noise_hu : float
        Standard deviation of the additive Gaussian noise (HU).
    rng : np.random.Generator
        Source of all randomness (the result is a pure function of its state).
    with_pe : bool, optional
        Paint 2-4 emboli (True) or none.

    Returns
    -------
    Phantom
        Volume, PE mask and vessel mask.
    """
    grid = _Grid(shape, spacing)
    F = grid.fov
    t = (grid.z / grid.z_extent)[:, None, None]
    hu = np.full(shape, -1000.0, dtype=np.float32)

    body_scale = rng.uniform(0.92, 1.04)
    a_body, b_body = 0.45 * F * body_scale, 0.33 * F * body_scale
    _paint(hu, _ellipse(grid, 0.0, 0.03 * F, a_body, b_body), rng.uniform(-110.0, -90.0))
    fat = rng.uniform(10.0, 16.0)
    _paint(hu, _ellipse(grid, 0.0, 0.03 * F, a_body - fat, b_body - fat), rng.uniform(35.0, 45.0))

    # Lungs: grow towards the middle of the stack, textured parenchyma.
    lung_scale = (0.88 + 0.12 * np.sin(np.pi * np.clip(t, 0, 1))) * body_scale
    texture = _texture(grid, rng, num_waves=10)
    lung_hu = rng.uniform(-870.0, -830.0) + 12.0 * texture
    for side in (-1.0, 1.0):
        lungs = _ellipse(grid, side * 0.19 * F, 0.0, 0.145 * F * lung_scale, 0.22 * F * lung_scale)
        _paint(hu, lungs, lung_hu)

    heart_scale = np.clip(1.0 - t / 0.45, 0.0, 1.0) ** 0.5 + 1e-3
    _paint(hu, _ellipse(grid, 0.06 * F, -0.13 * F, 0.15 * F * heart_scale, 0.10 * F * heart_scale), 60.0)

    spine_r = 0.055 * F
    _paint(hu, _ellipse(grid, 0.0, 0.23 * F, spine_r, spine_r), 700.0)
    _paint(hu, _ellipse(grid, 0.0, 0.23 * F, spine_r - 4.0, spine_r - 4.0), 350.0)
    aorta_hu = PA_BASE_HU + 0.35 * contrast_hu
    _paint(hu, _ellipse(grid, 0.075 * F, 0.15 * F, 0.035 * F, 0.035 * F), aorta_hu)
    ascending = _ellipse(grid, -0.085 * F, -0.09 * F, 0.04 * F, 0.04 * F) * (t <= 0.7)
    _paint(hu, ascending.astype(np.float32), aorta_hu)

    large, small = _arterial_tree(grid, rng)
    alpha = np.zeros(shape, dtype=np.float32)
    for vessel in large + small:
        _paint_vessel(alpha, grid, vessel)
    _paint(hu, alpha, PA_BASE_HU + contrast_hu)

    clot = np.zeros(shape, dtype=np.float32)
    num_emboli = 0
    if with_pe:
        weights = np.array([1.0, 2.0, 2.0] + [0.8] * (len(large) - 3))
        target = int(rng.integers(2, 5))
        for _ in range(10 * target):
            if num_emboli == target:
                break
            vessel = large[int(rng.choice(len(large), p=weights / weights.sum()))]
            embolus = _embolus(grid, vessel, rng)
            if embolus is None:
                continue
            window, occupancy = embolus
            inside = np.minimum(occupancy, alpha[window])  # clipped to the lumen
            if np.count_nonzero(inside >= 0.5) < 8:
                continue
            clot_hu = rng.uniform(*CLOT_HU)
            _paint(hu[window], inside, clot_hu)
            np.maximum(clot[window], inside, out=clot[window])
            num_emboli += 1

    hu += np.float32(noise_hu) * rng.standard_normal(size=shape, dtype=np.float32)
    np.clip(hu, -1024.0, 3071.0, out=hu)
    return Phantom(
        hu=hu,
        pe_mask=(clot >= 0.5).astype(np.uint8),
        vessel_mask=(alpha >= 0.5).astype(np.uint8),
        num_emboli=num_emboli,
    )
