"""Linear CT intensity windows: Hounsfield units to [0, 1]."""

from __future__ import annotations

import numpy as np

__all__ = ["CTPA_LEVEL", "CTPA_WIDTH", "window_ct"]

#: CT pulmonary angiography window: level 100 HU, width 700 HU, i.e. [-250, 450] HU.
CTPA_LEVEL = 100.0
CTPA_WIDTH = 700.0


def window_ct(hu: np.ndarray, level: float = CTPA_LEVEL, width: float = CTPA_WIDTH) -> np.ndarray:
    """Map Hounsfield units to [0, 1] with a linear window.

    ``out = clip((hu - (level - width / 2)) / width, 0, 1)``. The default is a
    CTPA (pulmonary-angiography) window, level 100 HU and width 700 HU, so
    ``[-250, 450]`` HU maps to ``[0, 1]``: contrast-filled arteries
    (~250-450 HU) are bright, clot (~20-60 HU) is mid-grey like soft tissue,
    lung parenchyma and air saturate at 0 and bone at 1.

    Parameters
    ----------
    hu : np.ndarray
        Hounsfield units, any shape.
    level : float, optional
        Window centre in HU.
    width : float, optional
        Window width in HU, > 0.

    Returns
    -------
    np.ndarray
        ``float32`` values in ``[0, 1]``, same shape.

    Raises
    ------
    ValueError
        If ``width`` is not positive.
    """
    if not width > 0:
        raise ValueError(f"window width must be > 0, got {width}")
    low = level - width / 2.0
    out = (np.asarray(hu, dtype=np.float32) - np.float32(low)) / np.float32(width)
    return np.clip(out, 0.0, 1.0, out=out)
