"""Split one labelled data set into federated sites (pure numpy).

Every function returns a list of ``num_sites`` sorted ``int64`` index arrays
that form a partition of ``range(n)``: disjoint, covering every index once.

* :func:`iid_partition` - uniform random split, site sizes differ by at most 1.
* :func:`stratified_iid_partition` - IID split stratified by class: every
  class is dealt out like :func:`iid_partition`, so each site's count of a
  class differs from any other site's by at most 1 (for small sets with a rare
  class, where a uniform split often leaves a site without it).
* :func:`dirichlet_label_partition` - label skew (Hsu et al. 2019, "Measuring
  the effects of non-identical data distribution for federated visual
  classification"): for every class its indices are shared out among the sites
  in proportions drawn from ``Dirichlet(alpha)``; small ``alpha`` gives sites
  dominated by one class, large ``alpha`` approaches IID. The draw is repeated
  until every site holds at least ``min_size`` items.
* :func:`size_skew_partition` - quantity skew: site sizes proportional to
  log-normal draws ``exp(N(0, sigma^2))``, each site at least ``min_size``.

:func:`partition` dispatches on the scheme name (``iid``, ``dirichlet``, ``size``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SCHEMES", "iid_partition", "stratified_iid_partition", "dirichlet_label_partition",
           "size_skew_partition", "partition"]

SCHEMES = ("iid", "dirichlet", "size")


def _check(n: int, num_sites: int, min_size: int = 1) -> None:
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    if n < num_sites * min_size:
        raise ValueError(f"cannot give {num_sites} sites >= {min_size} item(s) each from {n} item(s)")


def _split_by_counts(order: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    bounds = np.cumsum(counts)[:-1]
    return [np.sort(part).astype(np.int64) for part in np.split(order, bounds)]


def _largest_remainder(total: int, shares: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total`` proportional to ``shares`` (largest-remainder rounding)."""
    exact = shares / shares.sum() * total
    counts = np.floor(exact).astype(np.int64)
    rest = total - int(counts.sum())
    if rest > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:rest]] += 1
    return counts


def iid_partition(n: int, num_sites: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random partition of ``range(n)`` into ``num_sites`` near-equal parts.

    Raises
    ------
    ValueError
        If ``num_sites < 1`` or ``n < num_sites`` (a site would be empty).
    """
    _check(n, num_sites, 1)
    return [np.sort(part).astype(np.int64) for part in np.array_split(rng.permutation(n), num_sites)]


def stratified_iid_partition(
    labels: Sequence[int] | np.ndarray, num_sites: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """IID partition stratified by class: per-class counts differ by at most 1 between sites.

    Each class's items are shuffled and split into ``num_sites`` near-equal
    parts; the larger parts go to the sites holding the fewest items so far
    (ties broken at random), so the site totals also differ by at most 1.

    Raises
    ------
    ValueError
        If ``num_sites < 1`` or there are fewer items than sites.
    """
    labels = np.asarray(labels).reshape(-1)
    _check(labels.size, num_sites, 1)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_sites)]
    filled = np.zeros(num_sites, dtype=np.int64)
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        chunks = np.array_split(idx, num_sites)  # larger chunks first
        # the largest chunks go to the sites holding the fewest items so far (random tie-break)
        order = np.lexsort((rng.permutation(num_sites), filled))
        for site, chunk in zip(order, chunks):
            parts[site].append(chunk)
            filled[site] += chunk.size
    if filled.min() < 1:
        raise ValueError(f"cannot give {num_sites} sites >= 1 item each from {labels.size} item(s)")
    return [np.sort(np.concatenate(site)).astype(np.int64) for site in parts]


def dirichlet_label_partition(
    labels: Sequence[int] | np.ndarray,
    num_sites: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Label-skewed partition: per-class site proportions drawn from ``Dirichlet(alpha)``.

    Parameters
    ----------
    labels : array-like of int, shape (n,)
        Class of every item.
    num_sites : int
        Number of sites, >= 1.
    alpha : float
        Dirichlet concentration, > 0 (0.1 strongly skewed, 100 nearly IID).
    rng : np.random.Generator
        Source of randomness (the result is a function of its state).
    min_size : int, optional
        Every site gets at least this many items; proportions are redrawn until so.
    max_tries : int, optional
        Redraws before giving up.

    Raises
    ------
    ValueError
        On a bad ``alpha``/``num_sites``/``min_size``, or when no draw within
        ``max_tries`` gives every site ``min_size`` items (lower ``min_size``
        or raise ``alpha``).
    """
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    _check(n, num_sites, min_size)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_sites)]
        for cls in classes:
            idx = rng.permutation(np.flatnonzero(labels == cls))
            proportions = rng.dirichlet(np.full(num_sites, float(alpha)))
            cuts = (np.cumsum(proportions)[:-1] * idx.size).astype(np.int64)
            for site, chunk in enumerate(np.split(idx, cuts)):
                parts[site].append(chunk)
        sizes = [sum(chunk.size for chunk in site) for site in parts]
        if min(sizes) >= min_size:
            return [np.sort(np.concatenate(site)).astype(np.int64) for site in parts]
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) draw in {max_tries} tries gave all {num_sites} sites "
        f">= {min_size} items (n={n}); lower min_size or raise alpha"
    )


def size_skew_partition(
    n: int, num_sites: int, rng: np.random.Generator, sigma: float = 1.0, min_size: int = 1
) -> list[np.ndarray]:
    """Quantity-skewed partition: site sizes proportional to ``exp(N(0, sigma^2))`` draws.

    Every site first gets ``min_size`` items; the rest is shared out in
    proportion to the log-normal draws (largest-remainder rounding), items
    assigned at random.

    Raises
    ------
    ValueError
        If ``sigma < 0``, ``num_sites < 1`` or ``n < num_sites * min_size``.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    _check(n, num_sites, min_size)
    shares = rng.lognormal(mean=0.0, sigma=sigma, size=num_sites)
    counts = min_size + _largest_remainder(n - num_sites * min_size, shares)
    return _split_by_counts(rng.permutation(n), counts)


def partition(
    scheme: str, labels: Sequence[int] | np.ndarray, num_sites: int, rng: np.random.Generator, **opts
) -> list[np.ndarray]:
    """Partition the items whose classes are ``labels`` by the named ``scheme``.

    ``opts`` go to the scheme's function: ``alpha``, ``min_size``, ``max_tries``
    for ``dirichlet``; ``sigma``, ``min_size`` for ``size``; none for ``iid``.

    Raises
    ------
    ValueError
        On an unknown scheme (the message lists the known ones) or bad options.
    """
    n = int(np.asarray(labels).reshape(-1).size)
    if scheme == "iid":
        if opts:
            raise ValueError(f"scheme 'iid' takes no options, got {sorted(opts)}")
        return iid_partition(n, num_sites, rng)
    if scheme == "dirichlet":
        return dirichlet_label_partition(labels, num_sites, rng=rng, **{"alpha": 0.5, **opts})
    if scheme == "size":
        return size_skew_partition(n, num_sites, rng, **opts)
    raise ValueError(f"unknown partition scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
