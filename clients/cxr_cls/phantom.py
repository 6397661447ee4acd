"""The synthetic frontal chest radiograph (PA) of the chest X-ray hospitals, with or without a pneumothorax.

Painted in attenuation units, dense = bright: the chest silhouette with neck,
mediastinum and spine, the heart to the patient's left, two lungs with
low-frequency parenchymal texture, posterior ribs and clavicles, and in each
lung a vessel tree (the lung markings). A pneumothorax is drawn with its three
radiographic signs (Zarogoulidis et al., J. Thorac. Dis. 2014): a collapsed
lung, a darker region without vessel markings, and a thin bright visceral
pleural line. See :mod:`clients.cxr_cls.synthetic` for the hospitals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clients.cxr_cls.synthetic import SiteProfile

__all__ = ["SyntheticRadiograph", "synthesize_radiograph"]


@dataclass(frozen=True, eq=False)
class SyntheticRadiograph:
    """One synthesized radiograph before it is written.

    Attributes
    ----------
    image : np.ndarray
        ``float32`` ``(size, size)`` display values in [0, 1], dense = bright.
    positive : bool
        Whether it has a pneumothorax.
    pneumothorax : np.ndarray
        ``float32`` soft mask of the pneumothorax (all zero when negative).
    aerated_lung : np.ndarray
        ``float32`` soft mask of the lung that still has markings.
    pleural_line : np.ndarray
        ``float32`` profile of the visceral pleural line (all zero when negative).
    markings : np.ndarray
        ``float32`` vessel markings added to the attenuation (zero outside the aerated lung).
    """

    image: np.ndarray
    positive: bool
    pneumothorax: np.ndarray
    aerated_lung: np.ndarray
    pleural_line: np.ndarray
    markings: np.ndarray


def _soft_inside(level: np.ndarray, edge: float) -> np.ndarray:
    """Soft indicator of ``level < 0`` with a transition ``edge`` wide (partial volume)."""
    return np.clip(0.5 - level / edge, 0.0, 1.0)


def _ellipse_level(x: np.ndarray, y: np.ndarray, cx: float, cy: float, ax: float, ay_up: float, ay_down: float):
    """Approximate signed distance to an egg-shaped ellipse (different upper/lower half-heights)."""
    ay = np.where(y < cy, ay_up, ay_down)
    rho = np.sqrt(((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2)
    return (rho - 1.0) * np.minimum(ax, ay)


def _blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur (edge-replicated), ``sigma`` in pixels; identity when < 0.05."""
    if sigma < 0.05:
        return image
    radius = max(1, int(np.ceil(3 * sigma)))
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    taps /= taps.sum()
    out = image
    for axis in (0, 1):
        padded = np.pad(out, [(radius, radius) if a == axis else (0, 0) for a in (0, 1)], mode="edge")
        n = out.shape[axis]
        out = sum(w * np.take(padded, np.arange(k, k + n), axis=axis) for k, w in enumerate(taps))
    return out


def _vessel_segments(
    rng: np.random.Generator, hilum: tuple[float, float], side: int, reach: Callable[[float], float]
) -> list[tuple]:
    """Branching vessel tree of one lung: ``(x0, y0, x1, y1, width, amplitude)`` segments.

    Seven primary branches fan out from the hilum (up, lateral, down), each
    ~35 % of the distance ``reach(theta)`` from the hilum to the lung edge in
    its direction; each splits in two three times, shorter (x0.65-0.8) and
    thinner (x0.7) at each level, so the tree fills the lung up to its edge.
    The amplitude fades linearly from the hilum to 30 % at the lung edge.
    """
    segments = []
    stack = []
    for angle in np.linspace(-100.0, 85.0, 7) + rng.uniform(-8.0, 8.0, 7):
        theta = float(np.deg2rad(angle if side > 0 else 180.0 - angle))
        span = reach(theta)
        stack.append((hilum[0], hilum[1], theta, span * rng.uniform(0.3, 0.4), 0.024, 0, span))
    while stack:
        x0, y0, theta, length, width, depth, span = stack.pop()
        x1, y1 = x0 + length * np.cos(theta), y0 + length * np.sin(theta)
        r = np.hypot(0.5 * (x0 + x1) - hilum[0], 0.5 * (y0 + y1) - hilum[1])
        fade = max(0.3, 1.0 - 0.7 * r / span)
        segments.append((x0, y0, x1, y1, width, 0.15 * fade))
        if depth < 3:
            for sign in (-1.0, 1.0):
                turn = np.deg2rad(sign * rng.uniform(15.0, 35.0))
                stack.append((x1, y1, theta + turn, length * rng.uniform(0.65, 0.8), width * 0.7, depth + 1, span))
    return segments


def _ray_reach(level: Callable[[np.ndarray, np.ndarray], np.ndarray], start: tuple[float, float]) -> Callable:
    """``theta -> distance`` from ``start`` to where ``level`` turns positive along the ray (marched)."""
    steps = np.linspace(0.0, 1.5, 301)

    def reach(theta: float) -> float:
        inside = level(start[0] + steps * np.cos(theta), start[1] + steps * np.sin(theta)) < 0
        outside = np.flatnonzero(~inside)
        return float(steps[outside[0]]) if len(outside) else float(steps[-1])

    return reach


def _draw_segments(shape: tuple[int, int], segments: list[tuple]) -> np.ndarray:
    """Sum of Gaussian-profile lines ``amp * exp(-(d / width)^2)`` (normalised coordinates in [-1, 1])."""
    size = shape[0]
    out = np.zeros(shape, dtype=np.float64)
    pixel = 2.0 / size
    for x0, y0, x1, y1, width, amp in segments:
        if amp <= 0:
            continue
        width = max(width, 0.6 * pixel)
        reach = 3.0 * width
        c0 = max(0, int((min(x0, x1) - reach + 1) / pixel))
        c1 = min(size, int((max(x0, x1) + reach + 1) / pixel) + 2)
        r0 = max(0, int((min(y0, y1) - reach + 1) / pixel))
        r1 = min(size, int((max(y0, y1) + reach + 1) / pixel) + 2)
        if c0 >= c1 or r0 >= r1:
            continue
        xs = (np.arange(c0, c1) + 0.5) * pixel - 1.0
        ys = (np.arange(r0, r1) + 0.5) * pixel - 1.0
        px, py = xs[None, :], ys[:, None]
        dx, dy = x1 - x0, y1 - y0
        t = np.clip(((px - x0) * dx + (py - y0) * dy) / max(dx * dx + dy * dy, 1e-12), 0.0, 1.0)
        dist2 = (px - x0 - t * dx) ** 2 + (py - y0 - t * dy) ** 2
        out[r0:r1, c0:c1] += amp * np.exp(-dist2 / width**2)
    return out


def _texture(rng: np.random.Generator, size: int, scale_px: float) -> np.ndarray:
    """Zero-mean, unit-std low-frequency random field (blurred white noise)."""
    field = _blur(rng.standard_normal((size, size)), scale_px)
    return (field - field.mean()) / (field.std() + 1e-12)


def synthesize_radiograph(
    rng: np.random.Generator, size: int, profile: SiteProfile, positive: bool
) -> SyntheticRadiograph:
    """Paint one frontal chest radiograph (nothing is written).

    Parameters
    ----------
    rng : np.random.Generator
        Source of all randomness (anatomy, pneumothorax, noise).
    size : int
        Side in pixels (>= 32).
    profile : SiteProfile
        The hospital's acquisition profile.
    positive : bool
        Draw a pneumothorax (apical-lateral, in a random lung, 22-40 % collapse).
        The random stream is consumed identically either way: the same ``rng``
        state gives the same patient, anatomy and noise with and without it.

    Returns
    -------
    SyntheticRadiograph
        The display image and the ground-truth masks.
    """
    if size < 32:
        raise ValueError(f"size must be >= 32, got {size}")
    c = (np.arange(size) + 0.5) / size * 2.0 - 1.0
    y, x = np.meshgrid(c, c, indexing="ij")
    edge = 2.0 / size  # one pixel
    scale = rng.uniform(0.9, 1.05)
    sx, sy = rng.uniform(-0.04, 0.04, 2)

    shoulders = sy - 0.78 + 0.25 * (x - sx) ** 2  # the top of the trunk slopes down laterally
    body = _soft_inside(np.maximum(np.abs(x - sx) - 0.9, shoulders - y), 3 * edge)
    body = np.maximum(body, _soft_inside(np.abs(x - sx) - 0.2, 2 * edge) * (y < sy - 0.6))
    mediastinum = _soft_inside(np.abs(x - sx) - 0.11 * scale, 3 * edge)
    heart = _soft_inside(
        _ellipse_level(x, y, sx + 0.16 * scale, sy + 0.3 * scale, 0.3 * scale, 0.22 * scale, 0.25 * scale), 3 * edge
    )

    lungs, aerated, ptx, pleura = (np.zeros((size, size)) for _ in range(4))
    # Drawn for negatives too, so that the same stream gives the same patient with
    # and without a pneumothorax (counterfactual pairs for tests and figures).
    ptx_side = int(rng.choice([-1, 1]))
    keep = 1.0 - rng.uniform(0.22, 0.4)
    vessels = np.zeros((size, size))
    for side in (-1, 1):
        ax = 0.3 * scale * rng.uniform(0.93, 1.07)
        up, down = 0.55 * scale * rng.uniform(0.95, 1.05), 0.42 * scale * rng.uniform(0.95, 1.05)
        cx, cy = sx + side * 0.43 * scale, sy - 0.08 * scale
        lung = _soft_inside(_ellipse_level(x, y, cx, cy, ax, up, down), edge) * (1.0 - heart)
        aerated_lung = lung
        if positive and side == ptx_side:
            # The lung collapses towards its medial base: scale the lung about that anchor.
            anchor_x, anchor_y = cx - side * 0.7 * ax, cy + 0.6 * down
            ux, uy = anchor_x + (x - anchor_x) / keep, anchor_y + (y - anchor_y) / keep
            level = _ellipse_level(ux, uy, cx, cy, ax, up, down) * keep
            aerated_lung = lung * _soft_inside(level, edge)
            ptx = lung - aerated_lung
            pleura = lung * np.exp(-((level / (0.75 * edge)) ** 2))
        lungs += lung
        aerated += aerated_lung
        hilum = (cx - side * 0.55 * ax, cy + 0.12 * scale)
        reach = _ray_reach(lambda px, py: _ellipse_level(px, py, cx, cy, ax, up, down), hilum)
        vessels += _draw_segments((size, size), _vessel_segments(rng, hilum, side, reach))

    ribs = np.zeros((size, size))
    for side in (-1, 1):
        ax_abs = np.abs(x - sx)
        inside = _soft_inside(ax_abs - 0.82 * scale, 3 * edge) * (ax_abs > 0.08)
        for k in range(8):
            yk = sy - 0.62 * scale + k * 0.135 * scale
            centre = yk + 0.45 * (ax_abs - 0.1) ** 2 - 0.05 * (ax_abs - 0.1)
            band = np.exp(-(((y - centre) / (0.028 * scale)) ** 2))
            ribs += band * inside * ((x - sx) * side > 0) * _soft_inside(y - sy - 0.45 * scale, 0.15)
    clavicle_y = sy - 0.66 * scale + 0.12 * np.abs(x - sx)
    clavicles = np.exp(-(((y - clavicle_y) / (0.03 * scale)) ** 2)) * (np.abs(x - sx) < 0.55 * scale)

    contrast = profile.lung_contrast * rng.uniform(0.92, 1.08)
    texture = _texture(rng, size, size / 24.0)
    markings = np.minimum(vessels, 0.22) * aerated
    attenuation = (
        0.04
        + body * 0.52
        + body * mediastinum * 0.17
        - lungs * 0.30 * contrast
        + heart * body * 0.12
        + aerated * 0.02 * texture
        + ribs * 0.09
        + clavicles * 0.12
        + markings
        - ptx * 0.05 * contrast
        + pleura * 0.13
    )
    gamma = profile.gamma * rng.uniform(0.92, 1.08)
    display = np.clip(attenuation, 0.0, 1.0) ** gamma
    display = _blur(display, profile.blur_px * size / 128.0)
    display = display + rng.normal(0.0, profile.noise, display.shape)
    f32 = np.float32
    return SyntheticRadiograph(
        image=np.clip(display, 0.0, 1.0).astype(f32),
        positive=bool(positive),
        pneumothorax=ptx.astype(f32),
        aerated_lung=aerated.astype(f32),
        pleural_line=pleura.astype(f32),
        markings=markings.astype(f32),
    )


# --------------------------------------------------------------------------- files
