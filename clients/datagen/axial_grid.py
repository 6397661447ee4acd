"""The scanner geometry of a synthetic axial CT study: slices, pixel size, table position.

The CT generators (:mod:`clients.pe_seg.synthetic`, :mod:`clients.ct3d_cls.synthetic`)
draw each study's grid the same way, in the same order from the study's random
stream, so the same seed gives the same files: the slice count, the slice spacing,
the in-plane pixel (a field of view over the matrix size), the table position of the
first slice and the entropy of the study's DICOM UIDs. The volume is centred
in-plane and axial (rows along +x, columns along +y).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.io.dicom_series import CTVolume

__all__ = ["AXIAL", "AxialGrid", "draw_axial_grid"]

#: DICOM ImageOrientationPatient of an axial slice.
AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


@dataclass(frozen=True)
class AxialGrid:
    """The voxel grid of one synthetic study and the entropy of its UIDs."""

    shape: tuple[int, int, int]  # (slices, rows, columns)
    spacing: tuple[float, float, float]  # (slice step, pixel, pixel) in mm
    origin: tuple[float, float, float]  # (x, y, z) in mm of the first voxel
    uid_seed: int  # entropy of the study's DICOM UIDs

    def volume(self, hu: np.ndarray) -> CTVolume:
        """The study's :class:`CTVolume` holding ``hu`` (shape :attr:`shape`) on this grid."""
        return CTVolume(hu=hu, spacing=self.spacing, origin=self.origin, orientation=AXIAL)


def draw_axial_grid(
    rng: np.random.Generator,
    size: int,
    num_slices: tuple[int, int],
    slice_spacing_mm: tuple[float, float],
    field_of_view_mm: tuple[float, float],
    first_slice_z_mm: tuple[float, float],
) -> AxialGrid:
    """Draw a study's grid: ``size x size`` pixels, the rest from the given ranges.

    In this order from ``rng``: the slice count (inclusive range), the slice
    step (rounded to 0.01 mm), the field of view (the pixel is ``fov / size``,
    rounded to 0.0001 mm), the table position of the first slice (0.01 mm) and
    the UID entropy. The in-plane origin centres the matrix on the scanner axis.
    """
    count = int(rng.integers(num_slices[0], num_slices[1] + 1))
    dz = round(float(rng.uniform(*slice_spacing_mm)), 2)
    pixel = round(float(rng.uniform(*field_of_view_mm)) / size, 4)
    z0 = round(float(rng.uniform(*first_slice_z_mm)), 2)
    corner = round(-(size - 1) / 2 * pixel, 4)
    uid_seed = int(rng.integers(0, 2**62))
    return AxialGrid((count, size, size), (dz, pixel, pixel), (corner, corner, z0), uid_seed)
