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
* ``claim_examples = N``: the reply's ``num-examples`` says ``N``;
* ``claim_steps = N``: the reply's ``steps`` says ``N`` (FedNova weighs an update by
  ``1 / ||a_i||_1``, which the server computes from the steps: a site claiming 1 of 8
  steps gets about 8x its weight).

Normalisation-statistics attacks rewrite the update's raw arrays (``raw-<i>``:
buffers travel uncompressed, :mod:`strategies.wire.update_codec`), the array at
position ``i`` of the global model the instruction carries (its packed
``arrays``: names and order, :mod:`strategies.wire.model_layout`):

* ``poison_running_var = k``: every BatchNorm ``running_var`` update becomes
  ``k (v + 1)``, ``v`` the global variance received. Under an example-weighted mean
  where the site weighs ``p`` the new variance is about ``v - p k (v + 1)`` plus the
  honest part: ``k = 2 / p`` makes it about ``-v - 2`` (the issue's found 3);
* ``non_finite_buffer``: NaN in every raw float array (statistics), the
  compressed payload left honest.

``report_metrics`` overwrites metrics of the site's evaluate replies (a site
that flatters the model or talks it down); ``site_name`` replaces the name every
reply's ``site`` record declares (e.g. 300 characters: longer than MLflow's metric
names allow). A data attack needs no handler:
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
from strategies.compression import decode, encode
from strategies.rounds.instructions import named_arrays, record_of
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from strategies.wire.model_layout import PackedModelError, unpack_model
from strategies.wire.seeds import derive_seed
from strategies.wire.model_layout import PAYLOAD_KEY, RAW_PREFIX

__all__ = ["SiteAttack", "attacking_handler", "attacking_site", "label_flipped_copy"]

#: Bytes of the payload's common header (magic, version, codec id, d: ``<BBBI``).
_HEADER_BYTES = 7
#: Salt of the attack's noise seed (``derive_seed(seed, round, salt)``).
_NOISE_SALT = 0xA77AC
#: How a BatchNorm layer names its running variance in a torch state dict.
_RUNNING_VAR = "running_var"


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
    claim_steps : int
        When positive, the ``steps`` the train replies claim (FedNova's ``a-norm``).
    poison_running_var : float
        When positive, ``k``: every BatchNorm ``running_var`` update is ``k (v + 1)``
        (``v``: the global variance received).
    non_finite_buffer : bool
        NaN in every raw float array of the update (normalisation statistics).
    report_metrics : Mapping[str, float]
        Metrics of the evaluate replies replaced by these values (``val-auc``...).
    site_name : str
        When not empty, the name every reply's ``site`` record declares.
    seed : int
        Seed of the noise (with the server round).
    """

    scale: float = 1.0
    noise_std: float = 0.0
    non_finite: bool = False
    claim_examples: int = 0
    claim_steps: int = 0
    poison_running_var: float = 0.0
    non_finite_buffer: bool = False
    report_metrics: Mapping[str, float] = field(default_factory=dict)
    site_name: str = ""
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
        if self.claim_steps < 0:
            raise ConfigError(f"SiteAttack.claim_steps must be >= 0, got {self.claim_steps}")
        if not (math.isfinite(self.poison_running_var) and self.poison_running_var >= 0):
            raise ConfigError(f"SiteAttack.poison_running_var must be finite and >= 0, got "
                              f"{self.poison_running_var}")

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
        records: dict = {}
        if kind == "train":
            records = _train_records(attack, message, honest)
        elif kind == "evaluate" and attack.report_metrics:
            metrics = {**dict(honest.content[keys.METRICS]), **attack.report_metrics}
            records[keys.METRICS] = MetricRecord(metrics)
        if attack.site_name and keys.SITE in honest.content:
            site = dict(honest.content[keys.SITE])
            records[keys.SITE] = ConfigRecord({**site, keys.SITE_NAME: attack.site_name})
        return _reply(message, honest, records) if records else honest

    return answer


def _train_records(attack: SiteAttack, instruction: Message, honest: Message) -> dict:
    """The records of the train reply ``honest`` that ``attack`` replaces (``honest`` untouched)."""
    records: dict = {}
    claims = {name: value for name, value in ((keys.NUM_EXAMPLES, attack.claim_examples),
                                              (keys.STEPS, attack.claim_steps)) if value}
    if claims:
        records[keys.METRICS] = MetricRecord({**dict(honest.content[keys.METRICS]), **claims})
    buffers = attack.poison_running_var > 0 or attack.non_finite_buffer
    if not (attack.changes_update or buffers):
        return records
    arrays = named_arrays(honest.content[keys.DELTA])
    if attack.changes_update:
        arrays[PAYLOAD_KEY] = _attacked_payload(attack, instruction, arrays[PAYLOAD_KEY])
    if attack.non_finite_buffer:
        arrays.update(_non_finite_buffers(arrays))
    if attack.poison_running_var > 0:
        arrays.update(_poisoned_variances(attack.poison_running_var, instruction, arrays))
    records[keys.DELTA] = record_of(arrays)
    return records


def _attacked_payload(attack: SiteAttack, instruction: Message,
                      payload: np.ndarray) -> np.ndarray:
    """The packed update vector after ``attack``'s scale, noise or non-finite values."""
    config = instruction.content.config_records.get(keys.CONFIG, ConfigRecord())
    spec = str(config.get(keys.CODEC, "none"))
    seed = int(config.get(keys.CODEC_SEED, 0))
    size = int(np.frombuffer(payload[3:_HEADER_BYTES].tobytes(), "<u4")[0])
    if attack.non_finite:
        return _non_finite_payload(payload, spec, size)
    vector = attack.update_vector(decode(payload, spec, size, seed),
                                  int(config.get(keys.SERVER_ROUND, 0)))
    return encode(vector, spec, seed)


def _non_finite_buffers(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every raw float array of a packed update, all NaN."""
    raw = {key: np.full_like(array, np.nan) for key, array in arrays.items()
           if key.startswith(RAW_PREFIX) and np.issubdtype(array.dtype, np.floating)}
    if not raw:
        raise ConfigError("SiteAttack.non_finite_buffer: the update has no raw float array "
                          "(a model without normalisation statistics)")
    return raw


def _poisoned_variances(k: float, instruction: Message,
                        arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``raw-<i>`` -> ``k (v + 1)`` for each BatchNorm ``running_var`` ``v`` of the global model."""
    try:
        model = unpack_model(named_arrays(instruction.content[keys.ARRAYS]))
    except PackedModelError as exc:
        raise ConfigError("SiteAttack.poison_running_var reads the global model from the "
                          "instruction: it needs strategy.downlink-codec = 'none'") from exc
    poisoned = {}
    for i, (name, value) in enumerate(model.items()):
        key = f"{RAW_PREFIX}{i}"
        if name.endswith(_RUNNING_VAR) and key in arrays:
            poisoned[key] = (k * (np.asarray(value) + 1.0)).astype(arrays[key].dtype)
    if not poisoned:
        raise ConfigError("SiteAttack.poison_running_var: the update has no raw "
                          f"'{_RUNNING_VAR}' array (a model without BatchNorm)")
    return poisoned


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
