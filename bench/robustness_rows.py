"""The attack table's rows and data sets (issue #29): what the bad site does, which settings run.

A row is one (defence, aggregator, attack) of ``bench/robustness.py``. Its
defence is ``"default"`` (the run config does not name ``strategy.defence`` or
``strategy.aggregator``: whatever the product defaults to when the table runs)
or ``"none"`` (``strategy.defence = "none"``, the undefended reference); its
aggregator is the product's default or ``"fednova"`` (``strategy.aggregator =
"fednova"`` with local SGD: FedNova refuses Adam). Each row names the row it is
compared with (``baseline``) and its target (the least ``metric / baseline``):

* ``default/none`` against ``none/none``: the defaults cost at most 1% on a
  clean federation (target 0.99);
* every attack under the defaults against ``default/none`` (target 0.98);
* the FedNova steps lie against FedNova's own clean run (target 0.98).

The attacks (:class:`app.engine.attacks.SiteAttack`, the smallest site, from round 1):
``scaled`` (update x1000), ``sign-flip`` (x-1), ``inflated-n`` (``num-examples``
1e15), ``nan-buffer`` (NaN in the raw normalisation statistics),
``running-var`` (each BatchNorm ``running_var`` update ``k (v + 1)`` with ``k =
2 N / N_bad``, twice the inverse of the site's example share: the example-weighted mean
drives the global variance to about ``-v - 2``), ``long-name`` (its replies
declare a 300-character site name), ``metric-1e6`` (its evaluate replies report
the task metric as 1e6), ``steps-lie`` (its FedNova train replies claim 1 step).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from engine_runs import shared_sites
from clients.datagen.federation import hospital_name

__all__ = ["ATTACKS", "DATA_SETS", "ROWS", "Attack", "DataSet", "Row", "federation_sites",
           "row_overrides", "rows_of"]

#: A site name longer than MLflow allows in a metric name (250 characters).
LONG_NAME = "h" * 300


@dataclass(frozen=True)
class Attack:
    """One bad site: :class:`~app.engine.attacks.SiteAttack` keywords, and two that depend on
    the set (``poison_variance``: ``k`` from the site's share; ``lie_metric``: the task metric)."""

    reply: tuple[tuple[str, object], ...] = ()
    poison_variance: bool = False
    lie_metric: bool = False


ATTACKS: dict[str, Attack] = {
    "none": Attack(),
    "scaled": Attack(reply=(("scale", 1000.0),)),
    "sign-flip": Attack(reply=(("scale", -1.0),)),
    "inflated-n": Attack(reply=(("claim_examples", 10**15),)),
    "nan-buffer": Attack(reply=(("non_finite_buffer", True),)),
    "running-var": Attack(poison_variance=True),
    "long-name": Attack(reply=(("site_name", LONG_NAME),)),
    "metric-1e6": Attack(lie_metric=True),
    "steps-lie": Attack(reply=(("claim_steps", 1),)),
}


@dataclass(frozen=True)
class Row:
    """One row of the table: the attack, the product settings, what it is compared with."""

    attack: str
    defence: str = "default"
    aggregator: str = "default"
    baseline: str | None = None
    target: float | None = None


_DEFAULT_ATTACKS = ("scaled", "sign-flip", "inflated-n", "nan-buffer", "running-var",
                    "long-name", "metric-1e6")
ROWS: dict[str, Row] = {
    "none/none": Row("none", defence="none"),
    "default/none": Row("none", baseline="none/none", target=0.99),
    **{f"default/{a}": Row(a, baseline="default/none", target=0.98) for a in _DEFAULT_ATTACKS},
    "default+fednova/none": Row("none", aggregator="fednova", baseline="default/none"),
    "default+fednova/steps-lie": Row("steps-lie", aggregator="fednova",
                                     baseline="default+fednova/none", target=0.98),
}


@dataclass(frozen=True)
class DataSet:
    """A shared real set dealt to sites by ``clients.datagen shared`` and its task settings.

    Attributes
    ----------
    task, set_name, scheme, alpha
        The converter's ``--task``, ``--set``, ``--scheme`` and ``--alpha``.
    settings : dict
        Run-config keys of the task (image size, batch size, slab slices).
    metric : str
        The task metric of the table (``auc``, ``dice``): ``val-<metric>``.
    sgd_lr : float
        The local SGD learning rate of the FedNova rows (momentum: the run config's).
    description : str
        What the set is, in the report.
    statistics : bool
        Whether the task's model has normalisation statistics (BatchNorm): the
        ``nan-buffer`` and ``running-var`` rows have nothing to attack without them.
    """

    task: str
    set_name: str
    scheme: str
    alpha: float
    metric: str
    sgd_lr: float
    description: str
    settings: dict = field(default_factory=dict)
    statistics: bool = True


DATA_SETS: dict[str, DataSet] = {
    "pneumoniamnist": DataSet(
        "cxr-cls", "pneumoniamnist", "dirichlet", 0.5, "auc", 0.05,
        "PneumoniaMNIST (balanced npz) over Dirichlet(0.5) sites, the cxr-cls task "
        "(small DenseNet with BatchNorm, Adam)", {"image-size": 32, "batch-size": 16}),
    "pe": DataSet(
        "pe-seg", "msd-lung", "iid", 0.5, "dice", 0.05,
        "PE stand-in: MSD Task06 lung-tumour CT patches (manual masks, 48 px, slab 1) over "
        "iid sites, the pe-seg task (2.5D U-Net with instance norm: no running statistics, "
        "so no nan-buffer / running-var rows; Adam)",
        {"image-size": 48, "slab-slices": 1, "batch-size": 16}, statistics=False),
}
#: The attacks on normalisation statistics (rows only where the model has them).
STATISTICS_ATTACKS = ("nan-buffer", "running-var")


def rows_of(data: DataSet) -> list[str]:
    """The rows of the table that apply to ``data``'s model."""
    return [name for name, row in ROWS.items()
            if data.statistics or row.attack not in STATISTICS_ATTACKS]


def row_overrides(row: Row, data: DataSet) -> dict:
    """The run-config keys a row sets beyond the set's (``default``: none of the defence's)."""
    overrides: dict = {} if row.defence == "default" else {"strategy.defence": row.defence}
    if row.aggregator == "fednova":
        overrides.update({"strategy.aggregator": "fednova", "optimizer": "sgd",
                          "lr": data.sgd_lr})
    return overrides


def train_count(site_dir: Path) -> int:
    """The ``train`` rows of a site folder's index (``images.csv`` or ``manifest.csv``)."""
    (index,) = [p for p in Path(site_dir).glob("*.csv") if p.name in ("images.csv",
                                                                     "manifest.csv")]
    with index.open(newline="") as handle:
        return sum(row["split"] == "train" for row in csv.DictReader(handle))


def federation_sites(data: DataSet, sites: int, seed: int, attack: Attack,
                     root: Path) -> tuple[list, str, list[str]]:
    """The set's virtual sites, the smallest attacking; the attacker's and the honest names."""
    from app.engine import VirtualSite  # noqa: PLC0415 - the engine loads Flower
    from app.engine.attacks import SiteAttack, attacking_site  # noqa: PLC0415

    folders = shared_sites(data.task, data.set_name, sites, seed, scheme=data.scheme,
                           alpha=data.alpha, root=root / f"sites-{sites}")
    counts = [train_count(folder) for folder in folders]
    bad = min(range(len(folders)), key=lambda i: counts[i])
    keywords = dict(attack.reply)
    if attack.poison_variance:
        keywords["poison_running_var"] = 2.0 * sum(counts) / max(counts[bad], 1)
    if attack.lie_metric:
        keywords["report_metrics"] = {f"val-{data.metric}": 1e6}
    built = []
    for i, folder in enumerate(folders):
        site = VirtualSite.folder(folder, site_name=hospital_name(i))
        built.append(attacking_site(site, SiteAttack(**keywords)) if i == bad and keywords
                     else site)
    names = [hospital_name(i) for i in range(len(folders))]
    return built, names[bad], [n for i, n in enumerate(names) if i != bad]
