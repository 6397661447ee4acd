"""Declarative malicious sites for the in-process engine: :class:`SiteAttack`.

A Byzantine hospital runs the product's ClientApp and then lies in its reply.
:func:`attacking_site` gives a :class:`~app.engine.virtual_site.VirtualSite` a
handler that calls the site's real handler (the ClientApp by default) and
rewrites what it answers, so the server meets the attack exactly where a real
one would arrive: in a reply that goes through the reply intake, the size caps,
the defence and the aggregator.

Update attacks (train replies) decode the site's packed update with the product's
own codec functions (:func:`strategies.compression.decode`, the instruction's
``codec`` and ``codec-seed``), change the flat update vector ``v`` and encode it
again:

* ``scale = k``: ``k v`` (``k = 1000``: a boosted update; ``k = -1``: sign flip);
* ``noise_std = s``: ``s z`` with ``z ~ N(0, I)`` instead of ``v`` (norm about
  ``s sqrt(d)``), drawn from ``(seed, server round)``;
* ``non_finite``: NaN and inf in turn in place of the values (written into the
  payload's raw float32 section: the product's encoder refuses them; codec ``none`` only);
* ``claim_examples = N``: the reply's ``num-examples`` says ``N``.

``report_metrics`` overwrites metrics of the site's evaluate replies (a site
that flatters the model or talks it down). A data attack needs no handler:
:func:`label_flipped_copy` writes a copy of a classification site folder with its
training labels flipped (``y -> 1 - y``), which the honest ClientApp then trains on.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from app.engine.virtual_site import Handler, VirtualSite, default_handler
from strategies import message_keys as keys
from strategies.compression import decode, encode
from strategies.errors import ConfigError
from strategies.model_packing import named_arrays, record_of
from strategies.seeds import derive_seed
from strategies.update_codec import PAYLOAD_KEY

__all__ = ["SiteAttack", "attacking_handler", "attacking_site", "label_flipped_copy"]

#: Bytes of the payload's common header (magic, version, codec id, d: ``<BBBI``).
_HEADER_BYTES = 7
#: Salt of the attack's noise seed (``derive_seed(seed, round, salt)``).
_NOISE_SALT = 0xA77AC


@dataclass(frozen=True)
class SiteAttack:
    """What one malicious site does to its honest replies (the default: nothing).

    Attributes
    ----------
    scale : float
        Factor on the update vector (``-1``: sign flip, ``1000``: boosted).
    noise_std : float
        When positive, the update is replaced by Gaussian noise of this standard
        deviation per entry.
    non_finite : bool
        The update's values are NaN / inf (codec ``none`` only).
    claim_examples : int
        When positive, the ``num-examples`` the train replies claim.
    report_metrics : Mapping[str, float]
        Metrics of the evaluate replies replaced by these values (``val-auc``...).
    seed : int
        Seed of the noise (with the server round).
    """

    scale: float = 1.0
    noise_std: float = 0.0
    non_finite: bool = False
    claim_examples: int = 0
    report_metrics: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.scale):
            raise ConfigError(f"SiteAttack.scale must be finite, got {self.scale}")
        if not (math.isfinite(self.noise_std) and self.noise_std >= 0):
            raise ConfigError(f"SiteAttack.noise_std must be finite and >= 0, got "
                              f"{self.noise_std}")
        if self.noise_std > 0 and self.non_finite:
            raise ConfigError("SiteAttack: noise_std and non_finite exclude each other")
        if self.claim_examples < 0:
            raise ConfigError(f"SiteAttack.claim_examples must be >= 0, got "
                              f"{self.claim_examples}")

    @property
    def changes_update(self) -> bool:
        """Whether a train reply's update is rewritten (else only its metrics are)."""
        return self.scale != 1.0 or self.noise_std > 0 or self.non_finite

    def update_vector(self, v: np.ndarray, server_round: int) -> np.ndarray:
        """The attacked flat update (float32) of an honest ``v`` (``non_finite`` aside)."""
        if self.noise_std > 0:
            rng = np.random.default_rng(derive_seed(self.seed, server_round, _NOISE_SALT))
            return (self.noise_std * rng.standard_normal(v.size)).astype(np.float32)
        return (self.scale * v).astype(np.float32)


def attacking_site(site: VirtualSite, attack: SiteAttack) -> VirtualSite:
    """A copy of ``site`` whose replies go through ``attack`` (its faults and node kept)."""
    return dataclasses.replace(site, handler=attacking_handler(attack, site.handler),
                               context=None)


def attacking_handler(attack: SiteAttack, handler: Handler | None = None) -> Handler:
    """``handler`` (the product's ClientApp when ``None``) with ``attack`` on its replies."""

    def answer(message: Message, context: Context) -> Message:
        honest = (handler or default_handler())(message, context)
        if honest.has_error():
            return honest
        kind = message.metadata.message_type
        if kind == "train":
            return _attacked_train(attack, message, honest)
        if kind == "evaluate" and attack.report_metrics:
            metrics = {**dict(honest.content[keys.METRICS]), **attack.report_metrics}
            return _reply(message, honest, {keys.METRICS: MetricRecord(metrics)})
        return honest

    return answer


def _attacked_train(attack: SiteAttack, instruction: Message, honest: Message) -> Message:
    """The train reply ``honest`` after ``attack`` (a new Message; ``honest`` untouched)."""
    records: dict = {}
    if attack.claim_examples:
        metrics = dict(honest.content[keys.METRICS])
        records[keys.METRICS] = MetricRecord({**metrics, keys.NUM_EXAMPLES: attack.claim_examples})
    if attack.changes_update:
        config = instruction.content.config_records.get(keys.CONFIG, ConfigRecord())
        spec = str(config.get(keys.CODEC, "none"))
        seed = int(config.get(keys.CODEC_SEED, 0))
        arrays = named_arrays(honest.content[keys.DELTA])
        payload = arrays[PAYLOAD_KEY]
        size = int(np.frombuffer(payload[3:_HEADER_BYTES].tobytes(), "<u4")[0])
        if attack.non_finite:
            arrays[PAYLOAD_KEY] = _non_finite_payload(payload, spec, size)
        else:
            vector = attack.update_vector(decode(payload, spec, size, seed),
                                          int(config.get(keys.SERVER_ROUND, 0)))
            arrays[PAYLOAD_KEY] = encode(vector, spec, seed)
        records[keys.DELTA] = record_of(arrays)
    return _reply(instruction, honest, records) if records else honest


def _non_finite_payload(payload: np.ndarray, spec: str, size: int) -> np.ndarray:
    """A codec-``none`` payload of ``size`` values, NaN and inf in turn."""
    if spec != "none":
        raise ConfigError(f"SiteAttack.non_finite needs strategy.codec = 'none', not {spec!r}")
    forged = np.array(payload, dtype=np.uint8)
    values = np.where(np.arange(size) % 2, np.nan, np.inf).astype("<f4")
    forged[_HEADER_BYTES:] = values.view(np.uint8)
    return forged


def _reply(instruction: Message, honest: Message, records: Mapping) -> Message:
    """A reply to ``instruction`` holding ``honest``'s records with ``records`` replaced."""
    content = RecordDict({name: honest.content[name] for name in honest.content})
    for name, record in records.items():
        content[name] = record
    return Message(content, reply_to=instruction)


def label_flipped_copy(site_dir: Path, out: Path, splits: tuple[str, ...] = ("train",)) -> Path:
    """Copy the classification site folder ``site_dir`` to ``out``, labels of ``splits`` flipped.

    The folder's ``images.csv`` (``image_id,split,image,labels``; ``labels`` 0/1
    values, ``;``-separated) is rewritten with ``1 - y`` for the rows of
    ``splits``; everything else is copied as it is. Returns ``out``.

    Raises
    ------
    ConfigError
        ``site_dir`` holds no ``images.csv`` (not a classification site), or
        ``out`` exists already.
    """
    manifest = Path(site_dir) / "images.csv"
    if not manifest.is_file():
        raise ConfigError(f"{manifest}: no such manifest (label flipping needs a "
                          "classification site folder)")
    if Path(out).exists():
        raise ConfigError(f"{out}: exists already (label_flipped_copy writes a new folder)")
    shutil.copytree(site_dir, out, ignore=shutil.ignore_patterns(".fedmed-*"))
    with manifest.open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames or [], list(reader)
    for row in rows:
        if row["split"] in splits:
            row["labels"] = ";".join(str(1 - int(y)) for y in row["labels"].split(";"))
    with (Path(out) / "images.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return Path(out)
