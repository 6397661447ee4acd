"""The in-process FedAvg loop of ``bench/compression_fedavg.py``, on the product's wire format.

Every update goes through the product's own site/server code, so the bytes
are the bytes a site would really send:

* site ``i`` in round ``r`` trains from the global weights ``x`` and forms
  ``delta_i = x - x_local_i`` (numpy arrays of the ``state_dict``, in order,
  in the global model's dtypes, as ``app/client_app.py`` does);
* it packs it with :func:`strategies.update_codec.pack_update` (codec seed
  ``derive_seed(seed, r, i)``), through one
  :class:`strategies.compression.ErrorFeedback` per site kept across rounds
  for the ``+EF`` variants, BatchNorm buffers raw as the ClientApp sends them;
* bytes up = :func:`strategies.wire_bytes.wire_size` of the reply's
  ``ArrayRecord``; bytes down = ``wire_size`` of the dense global record (the
  downlink is not compressed), or, with ``instructions`` or a downlink codec,
  of each site's real train instruction (:mod:`downlink_sites`: the product's
  messages, a compressed downlink with the server's error feedback, each site
  training from the model it reconstructs);
* the server decodes with :func:`strategies.update_codec.unpack_update`,
  aggregates with :func:`strategies.aggregation.fedavg_delta` and sets
  ``x <- x - Delta``.

Local training per (round, site) uses :func:`round_seeds.round_seed` (salt
``0x7EA1``), the same for every codec config. A config with warm-up rounds
encodes and decodes round ``r`` with the product's
:meth:`strategies.rounds.instructions.Uplink.codec_for` (the kept fraction of
Deep Gradient Compression's schedule, :mod:`strategies.codecs.warmup`), the
error-feedback residual carried over as the ClientApp does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from downlink_sites import SiteDownlink
from model_arrays import load_arrays, state_arrays
from round_seeds import round_seed
from strategies.aggregation import fedavg_delta
from strategies.compression import ErrorFeedback, derive_seed, flatten, parse_spec
from strategies.downlink import check_downlink_codec
from strategies.rounds.instructions import Uplink
from strategies.update_codec import pack_update, unpack_update
from strategies.weighted_mean import weighted_mean
from strategies.wire_bytes import wire_size

__all__ = ["CodecConfig", "CONFIGS", "parse_config", "TRAIN_SALT", "train_seed", "SiteTrace",
           "FederationResult", "run_federation"]

log = logging.getLogger("compression_fedavg")

#: Salt of :func:`train_seed` (kept so published runs reproduce).
TRAIN_SALT = 0x7EA1


@dataclass(frozen=True)
class CodecConfig:
    """One codec setting: the uplink spec, error feedback, the downlink spec, warm-up rounds."""

    spec: str
    error_feedback: bool
    downlink: str = "none"
    warmup_rounds: int = 0

    @property
    def _options(self) -> str:
        down = f" down={self.downlink}" if parse_spec(self.downlink).name != "none" else ""
        return down + (f" warmup={self.warmup_rounds}" if self.warmup_rounds else "")

    @property
    def name(self) -> str:
        if parse_spec(self.spec).name == "none":
            return "none" + self._options
        return f"{self.spec}{'+ef' if self.error_feedback else ''}" + self._options

    @property
    def label(self) -> str:
        if parse_spec(self.spec).name == "none":
            return "dense fp32 (none)" + self._options
        return f"{self.spec} {'+EF' if self.error_feedback else 'no EF'}" + self._options


CONFIGS: tuple[CodecConfig, ...] = (
    CodecConfig("none", False),
    CodecConfig("topk:0.1", True),
    CodecConfig("topk:0.1", False),
    CodecConfig("topk:0.01", True),
    CodecConfig("topk:0.01", False),
    CodecConfig("topk:0.001", True),
    CodecConfig("topk:0.001", False),
    CodecConfig("qsgd:16", True),
    CodecConfig("sign", True),
)


def parse_config(text: str) -> CodecConfig:
    """``"topk:0.01+ef"`` -> ``CodecConfig("topk:0.01", True)``; ``"none"`` -> dense.

    Options follow, separated by spaces (as :attr:`CodecConfig.name` writes
    them): ``down=<downlink spec>`` and ``warmup=<rounds>``, e.g.
    ``"topk:0.01+ef down=topk:0.01 warmup=4"``.

    Raises
    ------
    ValueError
        For an unknown option or a warm-up that is not an integer (a
        ``CodecError``, a ``ValueError`` too, for a spec that does not parse).
    """
    first, *options = text.split()
    ef = first.lower().endswith("+ef")
    spec = first[:-3] if ef else first
    parse_spec(spec)  # validates
    settings: dict = {}
    for option in options:
        key, _, value = option.partition("=")
        if key == "down":
            settings["downlink"] = check_downlink_codec(value)
        elif key == "warmup" and value.isdigit():
            settings["warmup_rounds"] = int(value)
        else:
            raise ValueError(f"config {text!r}: option {option!r} is not 'down=<spec>' or "
                             "'warmup=<rounds>'")
    return CodecConfig(spec, ef and parse_spec(spec).name != "none", **settings)


def train_seed(seed: int, round_index: int, site: int) -> int:
    """Seed of site ``site``'s local training in round ``round_index`` (same for every config)."""
    return round_seed(seed, round_index, site, TRAIN_SALT)


def _dense_record(keys: Sequence[str], arrays: Sequence[np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in zip(keys, arrays)})


def _carried(feedback: ErrorFeedback | None, spec: str) -> ErrorFeedback | None:
    """A feedback for ``spec`` holding ``feedback``'s residual (``None`` stays ``None``)."""
    if feedback is None:
        return None
    carried = ErrorFeedback(spec)
    carried.load_state(feedback.state())
    return carried



@dataclass
class SiteTrace:
    """Per-round flat vectors of one site (for checks, not written to JSON)."""

    true_deltas: list[np.ndarray] = field(default_factory=list)
    decoded: list[np.ndarray] = field(default_factory=list)
    residuals: list[np.ndarray] = field(default_factory=list)
    packed: list[dict[str, np.ndarray]] = field(default_factory=list)
    codec_seeds: list[int] = field(default_factory=list)


@dataclass
class FederationResult:
    """Per-round curves of one config (index 0 of ``metrics`` = the initial model)."""

    config: str
    label: str
    spec: str
    error_feedback: bool
    metrics: dict[str, list[float]] = field(default_factory=dict)
    bytes_up: list[list[int]] = field(default_factory=list)        # [round][site]
    payload_bytes: list[list[int]] = field(default_factory=list)   # codec payload only
    bytes_down: list[int] = field(default_factory=list)            # per site, per round
    bytes_down_sites: list[list[int]] = field(default_factory=list)  # [round][site]
    bytes_plain_record: list[list[int]] = field(default_factory=list)  # plain ArrayRecord(list)
    dense_fp32_bytes: int = 0                                      # codec-free float32 count
    train_loss: list[float] = field(default_factory=list)
    residual_norm: list[float] = field(default_factory=list)       # mean over sites, after round
    decode_error: list[float] = field(default_factory=list)        # ||decoded - sent z|| / ||z||
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    traces: list[SiteTrace] | None = None


def run_federation(task, config: CodecConfig, rounds: int, steps: int, seed: int,
                   cache: dict | None = None, trace: bool = False, instructions: bool = False,
                   stop: Callable[[dict[str, list[float]]], bool] | None = None
                   ) -> FederationResult:
    """FedAvg for ``rounds`` rounds with the uplink codec ``config``.

    ``cache`` (a dict shared by the configs of one task) keeps round 1's local
    results, which do not depend on the codec (round 1's downlink is the
    global model itself, compressed or not). ``trace`` keeps every site's
    true delta, decoded delta, residual and packed arrays per round.
    ``instructions`` (implied by a downlink codec) sends the model through the
    product's train instructions (:class:`downlink_sites.SiteDownlink`).
    ``stop``, given the metric curves after a round, ends the run early.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    model = task.build_model()
    keys = list(model.state_dict().keys())
    x = state_arrays(model)
    # As the ClientApp: buffers (BatchNorm running statistics) are sent raw.
    parameters = {name for name, _ in model.named_parameters()}
    raw = frozenset(i for i, key in enumerate(keys) if key not in parameters)
    n = [task.num_examples(i) for i in range(task.num_sites)]
    feedback = [ErrorFeedback(config.spec) if config.error_feedback else None
                for _ in range(task.num_sites)]
    res = FederationResult(config.name, config.label, config.spec, config.error_feedback,
                           traces=[SiteTrace() for _ in range(task.num_sites)] if trace else None)
    res.dense_fp32_bytes = 4 * int(sum(a.size for a in x))
    uplink = Uplink(codec=config.spec, error_feedback=config.error_feedback, seed=seed,
                    codec_warmup_rounds=config.warmup_rounds)
    sender = (SiteDownlink(uplink, config.downlink, task.num_sites, steps)
              if instructions or parse_spec(config.downlink).name != "none" else None)

    def measure() -> None:
        load_arrays(model, x)
        for k, v in task.evaluate(model).items():
            res.metrics.setdefault(k, []).append(float(v))

    measure()
    for r in range(1, rounds + 1):
        spec = uplink.codec_for(r)
        if sender is None:
            downs = [wire_size(_dense_record(keys, x))] * task.num_sites
            starts = [x] * task.num_sites
        else:
            starts, downs = sender.send(r, keys, x)
        if config.warmup_rounds:  # the round's spec, the residual carried over (the ClientApp)
            feedback = [_carried(f, spec) for f in feedback]
        decoded_all, ups, payloads, plain, losses, errs = [], [], [], [], [], []
        for i in range(task.num_sites):
            cached = cache.get((r, i)) if (cache is not None and r == 1) else None
            if cached is None:
                load_arrays(model, starts[i])
                loss = task.train_site(model, i, steps, train_seed(seed, r, i))
                local = state_arrays(model)
                # delta = x_received - x_local in the global model's dtypes (as the ClientApp)
                delta = [np.asarray(g - l, dtype=g.dtype) for g, l in zip(starts[i], local)]
                if cache is not None and r == 1:
                    cache[(r, i)] = ([d.copy() for d in delta], loss)
            else:
                delta, loss = [d.copy() for d in cached[0]], cached[1]
            losses.append(loss)
            codec_seed = derive_seed(seed, r, i)
            z_before = (feedback[i].residual.copy() if feedback[i] is not None
                        and feedback[i].residual.size else None)
            packed = pack_update(delta, spec, codec_seed, feedback[i], raw=raw)
            record = ArrayRecord({k: Array(v) for k, v in packed.items()})
            ups.append(wire_size(record))
            payloads.append(int(packed["payload"].size))
            plain.append(wire_size(ArrayRecord(list(delta))))
            # server side: decode what the record carries
            received = {k: record[k].numpy() for k in record.keys()}
            decoded = unpack_update(received, x, spec, codec_seed)
            decoded_all.append(decoded)
            true_vec = flatten([delta[j] for j in range(len(delta)) if j not in raw
                                and np.issubdtype(delta[j].dtype, np.floating)])
            dec_vec = flatten([decoded[j] for j in range(len(decoded)) if j not in raw
                               and np.issubdtype(decoded[j].dtype, np.floating)])
            z = true_vec if z_before is None else true_vec + z_before
            errs.append(float(np.linalg.norm(dec_vec - z) / max(np.linalg.norm(z), 1e-30)))
            if trace:
                t = res.traces[i]
                t.true_deltas.append(true_vec)
                t.decoded.append(dec_vec)
                t.residuals.append(feedback[i].state() if feedback[i] is not None
                                   else np.zeros_like(true_vec))
                t.packed.append({k: v.copy() for k, v in packed.items()})
                t.codec_seeds.append(codec_seed)
        agg = fedavg_delta(decoded_all, n)
        x = [np.asarray(g - d).astype(g.dtype, copy=False) for g, d in zip(x, agg)]
        res.bytes_up.append(ups)
        res.payload_bytes.append(payloads)
        res.bytes_plain_record.append(plain)
        res.bytes_down.append(int(np.mean(downs)) if sender else downs[0])
        res.bytes_down_sites.append(list(downs))
        res.train_loss.append(weighted_mean(zip(losses, n)))
        res.decode_error.append(float(np.mean(errs)))
        res.residual_norm.append(float(np.mean(
            [np.linalg.norm(f.residual) for f in feedback])) if config.error_feedback else 0.0)
        measure()
        log.info("%-6s %-18s round %2d  %s  up %8.0f B/site  loss %.4f", task.name,
                 config.label, r, "  ".join(f"{k} {v[-1]:.3f}" for k, v in res.metrics.items()
                                            if k in task.metrics),
                 np.mean(ups), res.train_loss[-1])
        if stop is not None and stop(res.metrics):
            break
    res.seconds = time.perf_counter() - started
    res.cpu_seconds = time.process_time() - cpu_started
    return res

