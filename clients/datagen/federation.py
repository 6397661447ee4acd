"""What the synthetic hospital generators share: site folders, per-hospital seeds, the federation loop.

Each generator (:mod:`clients.pe_seg.synthetic`, :mod:`clients.cxr_cls.synthetic`,
:mod:`clients.ct3d_cls.synthetic`) draws its own hospital profiles and writes one
hospital with its own function; this module

* checks a hospital profile (:func:`check_profile`) and draws hospital
  characteristics that differ between sites (:func:`profile_rng`, :func:`stratified`),
* claims a site folder for generated data (:func:`claim_site_dir`: the
  ``SYNTHETIC.txt`` marker, replacing an earlier synthetic hospital, refusing
  any non-empty folder it did not mark),
* derives hospital ``i``'s seed from the federation seed
  (:func:`strategies.wire.seeds.hospital_seed`),
* writes the hospitals one after the other (:func:`write_federation`,
  :class:`SyntheticFederation`).

The generators' command line is :mod:`clients.datagen.generator_cli`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from strategies.wire.seeds import hospital_seed

__all__ = [
    "MARKER_NAME",
    "hospital_name",
    "SiteProfile",
    "check_profile",
    "ProfileCheck",
    "profile_rng",
    "stratified",
    "Spread",
    "spread_over_sites",
    "claim_site_dir",
    "write_federation",
    "SyntheticFederation",
]

#: File that marks a site folder as generated data (so it may be overwritten).
MARKER_NAME = "SYNTHETIC.txt"


@dataclass(frozen=True)
class SiteProfile:
    """The base of every task's synthetic hospital profile.

    A task's generator subclasses it with its acquisition characteristics and
    checks them in ``__post_init__`` (:class:`ProfileCheck`).

    Attributes
    ----------
    name : str
        Site name, e.g. ``"hospital-00"`` (the site folder's name).
    """

    name: str


P = TypeVar("P", bound=SiteProfile)


def hospital_name(index: int) -> str:
    """The name (and site folder) of synthetic hospital ``index``: ``hospital-00``, ``hospital-01``, ..."""
    return f"hospital-{index:02d}"


def check_profile(name: str, problems: Sequence[str]) -> None:
    """Refuse the hospital profile ``name`` if its ``__post_init__`` found ``problems``.

    Raises
    ------
    ValueError
        ``hospital profile '<name>': <problem>; <problem>...`` when ``problems`` is not empty.
    """
    if problems:
        raise ValueError(f"hospital profile {name!r}: " + "; ".join(problems))


class ProfileCheck:
    """The checks of a hospital profile's ``__post_init__``, chained; :meth:`done` refuses a bad profile.

    Example: ``ProfileCheck(self.name).at_least("noise_hu", self.noise_hu, 0).done()``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.problems: list[str] = []

    def require(self, ok: bool, problem: str) -> ProfileCheck:
        """Record ``problem`` unless ``ok``."""
        if not ok:
            self.problems.append(problem)
        return self

    def at_least(self, field: str, value: float, minimum: float) -> ProfileCheck:
        """``value >= minimum``."""
        return self.require(value >= minimum, f"{field} must be >= {minimum}, got {value}")

    def fraction(self, field: str, value: float, *, open_interval: bool = False) -> ProfileCheck:
        """``value`` in ``(0, 1)`` (``open_interval``) or ``[0, 1]``."""
        if open_interval:
            return self.require(0.0 < value < 1.0, f"{field} must be in (0, 1), got {value}")
        return self.require(0.0 <= value <= 1.0, f"{field} must be in [0, 1], got {value}")

    def increasing(self, field: str, pair: tuple[float, float], minimum: float | None = None) -> ProfileCheck:
        """``(low, high)`` with ``low <= high``, and ``low >= minimum`` (``low > 0`` when ``minimum`` is None)."""
        low, high = pair
        if minimum is None:
            return self.require(0 < low <= high, f"{field} must be an increasing positive range, got {pair}")
        return self.require(minimum <= low <= high, f"{field} must be an increasing range >= {minimum}, got {pair}")

    def done(self) -> None:
        """Raise the problems found (:func:`check_profile`)."""
        check_profile(self.name, self.problems)


def profile_rng(num_sites: int, seed: int, salt: int) -> np.random.Generator:
    """The random stream of a federation's hospital profiles, ``SeedSequence([seed, salt])``.

    Raises
    ------
    ValueError
        If ``num_sites < 1``.
    """
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    return np.random.default_rng(np.random.SeedSequence([seed, salt]))


def stratified(rng: np.random.Generator, num_sites: int, count: int) -> list[np.ndarray]:
    """``count`` characteristics in [0, 1), each stratified over the sites.

    For each characteristic, site ``i`` gets a random position in its own
    ``1/num_sites`` slice of the range (sites shuffled independently per
    characteristic), so any two sites differ in every characteristic.
    """
    return [(rng.permutation(num_sites) + rng.uniform(0.15, 0.85, num_sites)) / num_sites for _ in range(count)]


@dataclass(frozen=True)
class Spread:
    """How one hospital characteristic varies over a federation: ``low + width * u``, u in [0, 1).

    ``digits`` None keeps a whole number, ``low + int(width * u)``; else the value is
    rounded to ``digits`` decimals.
    """

    low: float
    width: float
    digits: int | None = None

    def at(self, u: float) -> float:
        """The characteristic at position ``u`` of its range."""
        if self.digits is None:
            return self.low + int(self.width * u)
        return round(self.low + self.width * float(u), self.digits)


def spread_over_sites(rng: np.random.Generator, num_sites: int,
                      spreads: Mapping[str, Spread]) -> list[dict[str, float]]:
    """Each site's value of every characteristic in ``spreads`` (in its order), each
    stratified over the sites (:func:`stratified`), so any two sites differ in all of them."""
    positions = stratified(rng, num_sites, len(spreads))
    return [{name: spread.at(u[i]) for (name, spread), u in zip(spreads.items(), positions)}
            for i in range(num_sites)]


def claim_site_dir(site_dir: Path, data_dir: str, marker_text: str) -> Path:
    """Prepare ``site_dir`` for a synthetic hospital and return ``site_dir / data_dir``.

    The generator writes only into site folders it created: a folder that
    does not exist yet or is empty, or one marked ``SYNTHETIC.txt`` by an
    earlier run (whose ``data_dir``, a folder or a file, is then removed). The folder is created
    and marked (``SYNTHETIC.txt`` holding ``marker_text``).

    Raises
    ------
    FileExistsError
        If ``site_dir`` holds anything (a real site's ``dicom/``, ``images.csv``,
        ...) but no ``SYNTHETIC.txt``: the message names the folder.
    """
    site_dir = Path(site_dir)
    marked = (site_dir / MARKER_NAME).is_file()
    if not marked and site_dir.exists() and (not site_dir.is_dir() or any(site_dir.iterdir())):
        raise FileExistsError(
            f"{site_dir}: not a synthetic hospital (no {MARKER_NAME}) and not empty; refusing to overwrite "
            "a folder this generator did not create"
        )
    data = site_dir / data_dir
    if marked and data.is_dir():
        shutil.rmtree(data)
    elif marked and data.exists():
        data.unlink()
    site_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / MARKER_NAME).write_text(marker_text, encoding="utf-8")
    return data


def write_federation(
    root: Path,
    profiles: Sequence[P],
    write_hospital: Callable[[Path, P, int], Path],
    seed: int,
    *,
    salt: Sequence[int] = (),
    on_site: Callable[[int, P, Path], None] | None = None,
) -> list[Path]:
    """Write one hospital per profile, ``root / profile.name``, in order.

    Hospital ``i`` is written as ``write_hospital(root / profile.name, profile,
    hospital_seed(seed, i, salt))``; ``on_site(i, profile, site_dir)`` is called
    after each. Returns the site folders, in order.
    """
    root = Path(root)
    sites = []
    for i, profile in enumerate(profiles):
        site_dir = write_hospital(root / profile.name, profile, hospital_seed(seed, i, salt))
        if on_site is not None:
            on_site(i, profile, site_dir)
        sites.append(site_dir)
    return sites


@dataclass(frozen=True)
class SyntheticFederation(Generic[P]):
    """A task's synthetic federation writer: ``generate_federation(root, num_sites, seed, image_size)``.

    Hospital ``i`` uses ``profiles(num_sites, seed)[i]`` and the seed
    ``SeedSequence([seed, i, *salt])`` (:func:`strategies.wire.seeds.hospital_seed`) and is written
    by ``write_site(site_dir, profile, seed, image_size=...)`` (a task's ``generate_site``:
    it claims ``root / profile.name`` with :func:`claim_site_dir`, so a folder it did not
    write raises ``FileExistsError``, writes the hospital and returns the folder), or, when
    ``in_profile`` is set, with the image size put into its profile by
    ``in_profile(profile, image_size)`` (``None`` keeps the profiles' sizes).
    ``root`` is created; ``on_site(index, profile, site_dir)`` is called after
    each hospital (:func:`write_federation`). Returns the site folders, in order.

    Attributes
    ----------
    profiles : callable
        ``(num_sites, seed)`` -> the hospital profiles.
    write_site : callable
        Writes one hospital.
    image_size : int or None
        Default image size (pixels) of ``__call__``.
    salt : tuple of int
        Task salt of the hospital seeds.
    in_profile : callable, optional
        Puts an image size into a profile (the size is a profile field).
    """

    profiles: Callable[[int, int], Sequence[P]]
    write_site: Callable[..., Path]
    image_size: int | None
    salt: tuple[int, ...] = ()
    in_profile: Callable[[P, int], P] | None = None

    def __call__(self, root: Path, num_sites: int = 3, seed: int = 0, image_size: int | None = -1, *,
                 on_site: Callable[[int, P, Path], None] | None = None) -> list[Path]:
        size = self.image_size if image_size == -1 else image_size
        profiles = list(self.profiles(num_sites, seed))
        if self.in_profile is None:
            write = partial(self.write_site, image_size=size)
        else:
            write = self.write_site
            if size is not None:
                profiles = [self.in_profile(profile, int(size)) for profile in profiles]
        return write_federation(root, profiles, write, seed, salt=self.salt, on_site=on_site)
