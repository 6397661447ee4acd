"""What a site's round returns: plain numpy arrays and python numbers, no Flower records."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Metrics", "ProtocolEntries", "SiteReply"]

#: A reply's metrics: plain python ints and floats, never NaN (undefined ones are left out).
Metrics = dict[str, int | float]
#: A SecAgg+ stage's reply entries: ints, floats, bytes and lists of ints or bytes.
ProtocolEntries = dict[str, int | float | bytes | list[int] | list[bytes]]


@dataclass(frozen=True)
class SiteReply:
    """One answer of a site (the ClientApp adapter turns it into a Flower reply).

    Attributes
    ----------
    metrics : dict of str to int or float
        The reply's metrics (:mod:`strategies.wire.message_keys` names).
    site : dict of str to str
        The site's record: its name and its policy's fingerprint.
    update : dict of str to numpy.ndarray or None
        A train reply's packed update (:func:`strategies.wire.update_codec.pack_update`), or
        a SecAgg+ collect reply's masked vector (``secagg-masked``); ``None`` for
        evaluate, query and the other SecAgg+ stages.
    secagg : dict or None
        A SecAgg+ stage's protocol entries (:mod:`clients.site.secure_round`; the
        adapter sends them as the ``secagg`` record); ``None`` otherwise.
    """

    metrics: Metrics
    site: dict[str, str]
    update: dict[str, np.ndarray] | None = None
    secagg: ProtocolEntries | None = None
