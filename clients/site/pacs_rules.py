"""The site policy's ``[pacs]`` section: which PACS the runtime may contact, and how much.

::

    [pacs]
    endpoints = ["https://pacs.example.org/dicom-web", "PACS01@10.0.0.5:104"]
    max-cohort = 500      # the most studies the cohort's query may find (inf: no limit)
    write-back = false    # whether results may be stored back into the PACS

An endpoint is a DICOMweb base URL (``http(s)://...``, compared without a trailing
``/``) or a DIMSE peer ``AET@host:port`` (the PACS's called AE title). A policy file
without ``[pacs]`` lets the runtime contact no PACS; a site without a policy file
(simulation) contacts any. The checks raise :class:`~clients.site.policy.PolicyRefusal`
naming ``pacs.endpoints``, ``pacs.max-cohort`` or ``pacs.write-back``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["PacsRules", "PERMISSIVE_PACS", "parse_endpoints"]

_ANY = "*"
_URL = re.compile(r"https?://[^\s/]+(/\S*)?")
_DIMSE = re.compile(r"[\x20-\x3f\x41-\x5b\x5d-\x7e]{1,16}@[^\s@:]+:[0-9]{1,5}")


def _canonical(endpoint: str) -> str:
    return endpoint.rstrip("/") if _URL.fullmatch(endpoint) else endpoint


def parse_endpoints(value: Any, where: str) -> tuple[str, ...]:
    """The ``endpoints`` list, checked; ``ValueError`` naming ``where`` and the bad entry."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of endpoints, got {value!r}")
    for entry in value:
        if entry != _ANY and not (_URL.fullmatch(entry) or _DIMSE.fullmatch(entry)):
            raise ValueError(f"{where}: {entry!r} is neither a DICOMweb URL (http(s)://...) "
                             "nor a DIMSE peer AET@host:port")
    return tuple(sorted({_canonical(entry) for entry in value}))


@dataclass(frozen=True)
class PacsRules:
    """The PACS rules of a site (section ``[pacs]``, see the module docstring)."""

    endpoints: tuple[str, ...] = ()
    max_cohort: float = math.inf
    write_back: bool = False

    def check_endpoint(self, endpoint: str) -> None:
        """Refuse (``pacs.endpoints``) an endpoint the policy does not list."""
        from clients.site.policy import PolicyRefusal  # pylint: disable=C0415 (cycle)
        if _ANY not in self.endpoints and _canonical(endpoint) not in self.endpoints:
            raise PolicyRefusal("pacs.endpoints", "the cohort's PACS endpoint is not one the "
                                "site policy lists in [pacs] endpoints")

    def check_cohort(self, studies: int) -> None:
        """Refuse (``pacs.max-cohort``) a cohort of more studies than the policy allows."""
        from clients.site.policy import PolicyRefusal  # pylint: disable=C0415 (cycle)
        if studies > self.max_cohort:
            raise PolicyRefusal("pacs.max-cohort", f"the cohort holds {studies} studies, more "
                                f"than the policy's max-cohort {int(self.max_cohort)}; the "
                                "dataset is refused")

    def check_write_back(self) -> None:
        """Refuse (``pacs.write-back``) storing results into the PACS unless allowed."""
        from clients.site.policy import PolicyRefusal  # pylint: disable=C0415 (cycle)
        if not self.write_back:
            raise PolicyRefusal("pacs.write-back", "the site policy does not let results be "
                                "stored back into the PACS ([pacs] write-back = false)")


#: What a site without a policy file contacts (simulation): any PACS.
PERMISSIVE_PACS = PacsRules(endpoints=(_ANY,))
