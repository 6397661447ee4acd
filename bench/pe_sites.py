"""The synthetic PE hospitals a PE-segmentation benchmark trains on.

Three hospitals ``hospital-00..02``: an existing folder (read only, by default
``data/synthetic-seed0`` when ``make data`` wrote it) or a fresh federation
from the product's generator,
:func:`clients.pe_seg.synthetic.generate_federation` (``image_size=96``),
written into a temporary folder the caller owns.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["EXISTING_DATA", "NUM_SITES", "find_pe_sites"]

#: Where ``make data`` writes the demo federation (seed 0).
EXISTING_DATA = Path(__file__).resolve().parents[1] / "data" / "synthetic-seed0"
#: Hospitals per benchmark federation.
NUM_SITES = 3


def find_pe_sites(data_root: Path | None, tmp: Path, seed: int,
                  num_sites: int = NUM_SITES) -> tuple[list[Path], str]:
    """Site folders and a line saying where they come from.

    ``data_root`` if given (read only); else ``EXISTING_DATA`` if every
    hospital's manifest is there; else ``generate_federation(num_sites, seed,
    image_size=96)`` under ``tmp / "federation"``.
    """
    if data_root is None and all(
            (EXISTING_DATA / f"hospital-{i:02d}" / "manifest.csv").is_file()
            for i in range(num_sites)):
        data_root = EXISTING_DATA
    if data_root is not None:
        sites = [Path(data_root) / f"hospital-{i:02d}" for i in range(num_sites)]
        return sites, f"existing {data_root} (read only)"
    from clients.pe_seg.synthetic import generate_federation

    sites = generate_federation(tmp / "federation", num_sites=num_sites, seed=seed,
                                image_size=96)
    return sites, (f"generate_federation(num_sites={num_sites}, seed={seed}, "
                   "image_size=96) in a temp dir")
