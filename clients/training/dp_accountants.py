"""The privacy accountants a run may choose and a site policy may allow, by name.

DP-SGD's privacy loss over a history of ``(noise multiplier, sample rate,
steps)`` is turned into the epsilon of (epsilon, delta)-DP by one of Opacus's
accountants:

- ``"rdp"``: Renyi DP of the sampled Gaussian mechanism (Mironov, "Renyi
  differential privacy", CSF 2017; Mironov, Talwar & Zhang 2019), composed over
  the steps and converted to (epsilon, delta); an upper bound, the looser one.
- ``"prv"``: privacy random variables composed numerically by FFT (Gopi, Lee &
  Wutschitz, "Numerical composition of differential privacy", NeurIPS 2021); a
  tighter estimate, accurate to Opacus's ``eps_error`` (0.01).

The run config's ``privacy.accountant`` picks one (training and the site's
privacy ledger then use the same); a site policy's ``dp.accountants`` lists the
ones the site accepts. :data:`ACCOUNTANTS` registers Opacus's classes by dotted
path, so that the site policy, which light processes read, lists the names
without loading Opacus (:func:`clients.training.opacus_loader.opacus` imports it
on first use, keeping the root logger).
"""

from __future__ import annotations

from strategies.wire.registry import Registry
from strategies.wire.run_keys import RUN_KEYS

__all__ = ["ACCOUNTANTS", "DEFAULT_ACCOUNTANT"]

#: Opacus accountant classes (``opacus.accountants.IAccountant``) by name.
ACCOUNTANTS: Registry[type] = Registry("privacy accountant", "privacy.accountant")
ACCOUNTANTS.add_path("rdp", "opacus.accountants:RDPAccountant")
ACCOUNTANTS.add_path("prv", "opacus.accountants:PRVAccountant")

#: The accountant of a run config without ``privacy.accountant`` (the run-config table's).
DEFAULT_ACCOUNTANT: str = str(RUN_KEYS["privacy.accountant"].default)
