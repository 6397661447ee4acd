"""What a site's round returns: plain numpy arrays and python numbers, no Flower records."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Metrics", "SiteReply"]

#: A reply's metrics: plain python ints and floats, never NaN (undefined ones are left out).
Metrics = dict[str, int | float]


@dataclass(frozen=True)
class SiteReply:
    """One answer of a site (the ClientApp adapter turns it into a Flower reply).

    Attributes
    ----------
    metrics : dict of str to int or float
        The reply's metrics (:mod:`strategies.message_keys` names).
    site : dict of str to str
        The site's record: its name and its policy's fingerprint.
    update : dict of str to numpy.ndarray or None
        A train reply's packed update (:func:`strategies.update_codec.pack_update`);
        ``None`` for evaluate and query.
    """

    metrics: Metrics
    site: dict[str, str]
    update: dict[str, np.ndarray] | None = None
