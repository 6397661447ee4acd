"""ClientApp: what a hospital's SuperNode runs for each train / evaluate message.

Reads the site from node_config (:class:`app.config.site_config.SiteConfig`), loads the
site's studies once per process, trains tau local steps from the received global
model and replies with the update ``delta = x_global - x_local`` (the sign
convention of DESIGN.md) and metrics. Only weights and aggregate metrics leave
the site: no paths, no per-patient outputs.

Before any study is read, each request is checked against the site policy
(:mod:`clients.site.policy`, path from node_config ``policy-path``); a request
that breaks a rule is refused. Every failure, a refusal included, leaves as a
sanitised error reply (:mod:`app.site_errors`): a fixed code, the exception
type, never its text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from app.config.run_config import RunConfig
from app.config.site_config import SiteConfig
from app.personalisation import SitePersonalisation
from app.site_errors import sanitised
from strategies.seeds import site_seed
from clients.site.decoded_cache import CACHE_DIR_NAME, load_task
from clients.training.device import ComputeDevice, select_device
from clients.training.site_task import SiteTask, TaskSettings
from clients.registry import task_class
from clients.site.policy import SitePolicy
from clients.site.policy_check import (Request, check_evaluate, check_query, check_train,
                                       releases_val_metrics)
from clients.site.last_global import LastGlobal
from clients.site.privacy_ledger import PrivacyLedger
from clients.site.state_store import SiteStateStore
from clients.training.private_training import DpSettings, poisson_sample_rate
from strategies import message_keys as keys
from strategies.compression import ErrorFeedback, parse_spec
from strategies.downlink_header import DownlinkHeader
from strategies.downlink_receive import receive
from strategies.downlink_reference import Reference
from strategies.model_packing import PackedModelError, unpack_arrays
from strategies.errors import ConfigError
from strategies.update_codec import pack_update

app = ClientApp()
log = logging.getLogger("clients.site")

# Progress lines of the site trainers (the root logger stays at Flower's level).
_progress = logging.getLogger("clients")
if not _progress.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    _progress.addHandler(_handler)
    _progress.setLevel(logging.INFO)

#: Per evaluation split: the reply's loss and studies-count keys (metrics are ``<split>-<name>``).
_SPLIT_KEYS = {"val": (keys.VAL_LOSS, keys.VAL_STUDIES), "test": (keys.TEST_LOSS, keys.TEST_STUDIES)}

_TASKS: dict[tuple[str, str, TaskSettings], SiteTask] = {}
_COMPUTE: list[ComputeDevice] = []


def _compute() -> ComputeDevice:
    if not _COMPUTE:
        _COMPUTE.append(select_device())
    return _COMPUTE[0]


def _request(config: RunConfig, instruction: ConfigRecord) -> Request:
    """What ``instruction`` (with the run config's defaults) asks, in the policy's terms."""
    sizes = config.task_settings()
    return Request(task=config.task, image_size=sizes.image_size, batch_size=sizes.batch_size,
                   codec=str(instruction.get(keys.CODEC, "none")),
                   local_steps=int(instruction.get(keys.LOCAL_STEPS, config.local_steps)),
                   time_budget=float(instruction.get(keys.TIME_BUDGET, config.time_budget)),
                   loss_subset=int(instruction.get(keys.LOSS_SUBSET, 0)),
                   dp_noise_multiplier=config.dp_noise_multiplier,
                   dp_max_grad_norm=config.dp_max_grad_norm, dp_delta=config.dp_delta,
                   dp_accountant=config.dp_accountant)


def _instruction(msg: Message) -> ConfigRecord:
    """The server's instruction in ``msg`` (an empty one when it sent none)."""
    return msg.content[keys.CONFIG] if keys.CONFIG in msg.content else ConfigRecord()


def _admit(msg: Message, context: Context, check: Callable[[SitePolicy, Request], None]
           ) -> tuple[RunConfig, SiteConfig, SitePolicy]:
    """Parse the configs, read the site policy and check the request: before any data is read.

    Raises :class:`~clients.site.policy.PolicyRefusal` naming the broken rule.
    """
    config = RunConfig.from_mapping(context.run_config)
    site = SiteConfig.from_node_config(context.node_config, config.data_root, config.site_policy)
    policy = site.policy()
    instruction = _instruction(msg)
    check(policy, _request(config, instruction))
    return config, site, policy


def _site_task(config: RunConfig, site: SiteConfig) -> SiteTask:
    """The site's task, loaded once per process.

    A new process (in deployment: every message) takes the decoded data from
    the site's disk cache under ``state-dir`` unless node_config says
    ``cache-decoded = false`` (:mod:`clients.site.decoded_cache`).
    """
    settings = config.task_settings()
    key = (config.task, str(site.data_path), settings)
    if key not in _TASKS:
        cache_dir = site.state_dir / CACHE_DIR_NAME if site.cache_decoded else None
        _TASKS[key] = load_task(task_class(config.task), site.data_path, settings, cache_dir,
                                exclude=[site.state_dir])
    return _TASKS[key]


def _site_record(site: SiteConfig, policy: SitePolicy) -> ConfigRecord:
    return ConfigRecord({keys.SITE_NAME: site.name, keys.SITE_POLICY: policy.fingerprint})


def _federation(instruction: ConfigRecord, context: Context) -> str:
    """The federation the site's state is keyed by: the server's (MLflow run id), else the run's."""
    return str(instruction.get(keys.FEDERATION, "")) or f"run-{context.run_id}"


def _encode_update(delta: list[np.ndarray], instruction: ConfigRecord, site: SiteConfig,
                   context: Context, raw: frozenset[int] = frozenset()
                   ) -> tuple[dict[str, np.ndarray], float]:
    """Pack the update with the round's codec; keep the error-feedback residual.

    The residual ``e`` (EF-SGD: z = e + delta, send C(z), e <- z - decode(C(z)))
    lives in ``context.state`` for this SuperNode process and on the site's disk
    (``state-dir``/<federation>/), so it survives a SuperNode restart. Returns
    the arrays to send and ||e||_2 after this round. ``raw`` are the positions
    of the model's buffers (normalisation statistics), sent uncompressed.
    """
    spec = str(instruction.get(keys.CODEC, "none"))
    seed = int(instruction.get(keys.CODEC_SEED, 0))
    lossy = parse_spec(spec).name != "none"
    if not (lossy and bool(instruction.get(keys.ERROR_FEEDBACK, True))):
        return pack_update(delta, spec, seed, raw=raw), 0.0
    federation = _federation(instruction, context)
    state_key = f"ef-residual:{federation}"
    store = SiteStateStore(site.state_dir)
    feedback = ErrorFeedback(spec)
    if state_key in context.state:
        feedback.load_state(context.state[state_key].to_numpy_ndarrays()[0])
    else:
        saved = store.load(federation, "ef-residual")
        if saved is not None:
            feedback.load_state(saved)
    arrays = pack_update(delta, spec, seed, feedback, raw=raw)
    residual = feedback.state()
    context.state[state_key] = ArrayRecord([residual])
    store.save(federation, "ef-residual", residual)
    return arrays, float(np.linalg.norm(residual))


def _received_global(msg: Message, instruction: ConfigRecord, site: SiteConfig,
                     context: Context) -> tuple[ArrayRecord, dict[str, int]]:
    """The global model of a train instruction and the reply's downlink metric.

    Without downlink entries the packed model as sent. With them
    (:mod:`strategies.downlink_receive`) the site's last global model
    (:class:`~clients.site.last_global.LastGlobal`) advanced by the compressed
    step, or the dense snapshot, verified by its checksum and saved for the next
    round; the reply acknowledges its version (``downlink-version``).
    """
    header = DownlinkHeader.from_config(instruction)
    if header is None:
        return unpack_arrays(msg.content[keys.ARRAYS]), {}
    store = LastGlobal(site.state_dir, _federation(instruction, context))
    saved = store.load()
    try:
        held = None if saved is None else Reference.from_packed(saved)
    except PackedModelError:  # an unreadable model: the step is refused, a snapshot follows
        held = None
    reference = receive(msg.content[keys.ARRAYS], header, held)
    store.save(reference.packed())
    return reference.record(), {keys.DOWNLINK_VERSION: reference.version}


@app.train()
@sanitised
def train(msg: Message, context: Context) -> Message:
    """Train tau local steps and reply with the update and metrics."""
    config, site, policy = _admit(msg, context, check_train)
    task = _site_task(config, site)
    train_set = task.require_training()  # a test-only site: SiteDataError, an error reply
    instruction = msg.content[keys.CONFIG]
    server_round = int(instruction[keys.SERVER_ROUND])
    steps = int(instruction.get(keys.LOCAL_STEPS, config.local_steps))
    cap = int(context.node_config.get("max-local-steps", 0))
    if cap > 0:
        steps = min(steps, cap)
    budget = float(instruction.get(keys.TIME_BUDGET, config.time_budget))
    deadline = time.monotonic() + budget if budget > 0 else None
    received, downlink_metrics = _received_global(msg, instruction, site, context)
    global_state = received.to_torch_state_dict()
    privacy = DpSettings(config.dp_noise_multiplier, config.dp_max_grad_norm, config.dp_delta,
                         config.dp_accountant)
    model = task.build_model(private=privacy.enabled)
    model.load_state_dict(global_state)
    personal = SitePersonalisation.of(config, site.state_dir, _federation(instruction, context))
    personal.receive(model)  # FedBN: the site's own normalisation layers
    if privacy.enabled:  # refuse before training if the round would overspend the budget
        ledger = PrivacyLedger(SiteStateStore(site.state_dir), _federation(instruction, context),
                               privacy.accountant)
        spent = ledger.epsilon(privacy.delta)
        ledger.check((privacy.noise_multiplier, poisson_sample_rate(
            len(train_set), task.settings.batch_size), steps), privacy.delta,
            policy.dp.max_epsilon)
    seed = site_seed(config.seed, server_round, site.name)
    started = time.monotonic()
    result = personal.train(task, model, steps, seed, deadline, lr=config.lr,
                            momentum=config.momentum, compute=_compute(),
                            optimizer=config.optimizer, proximal_mu=config.proximal_mu,
                            label=f"{site.name} round {server_round}", privacy=privacy)
    dp_metrics = {}
    if privacy.enabled:
        ledger.record(result.privacy_steps)
        epsilon = ledger.epsilon(privacy.delta)
        dp_metrics = {keys.EPSILON: epsilon, keys.EPSILON_ROUND: epsilon - spent}
    local_state = model.state_dict()
    # delta = x_global - x_local, in the global model's order and dtypes (0-d kept 0-d).
    delta = [
        np.asarray(value.numpy() - local_state[name].detach().cpu().numpy(),
                   dtype=value.numpy().dtype)
        for name, value in global_state.items()
    ]
    delta = personal.keep_local(model, delta, list(global_state),  # FedBN: 0, kept at the site
                                save=server_round <= config.num_server_rounds)
    parameters = {name for name, _ in model.named_parameters()}
    buffers = frozenset(i for i, name in enumerate(global_state) if name not in parameters)
    arrays, residual_norm = _encode_update(delta, instruction, site, context, raw=buffers)
    metrics = MetricRecord({
        keys.RESIDUAL_NORM: residual_norm,
        keys.NUM_EXAMPLES: len(train_set),
        keys.STEPS: result.steps_done,
        keys.TRAIN_LOSS: result.mean_loss,
        keys.INITIAL_LOSS: result.initial_loss,
        keys.TRAIN_SECONDS: time.monotonic() - started,
        keys.STUDIES_SKIPPED: len(task.report.skipped),
        **dp_metrics, **downlink_metrics,
    })
    content = RecordDict({
        keys.DELTA: ArrayRecord({name: Array(a) for name, a in arrays.items()}),
        keys.METRICS: metrics,
        keys.SITE: _site_record(site, policy),
    })
    return Message(content, reply_to=msg)


def _eval_split(msg: Message) -> str:
    """The instruction's ``eval-split`` (default ``val``).

    Raises
    ------
    ConfigError
        On a value other than ``val`` or ``test`` (the request is refused).
    """
    instruction = _instruction(msg)
    split = str(instruction.get(keys.EVAL_SPLIT, "val"))
    if split not in keys.EVAL_SPLITS:
        raise ConfigError(f"evaluate instruction key {keys.EVAL_SPLIT!r} = {split!r}: expected one "
                          f"of {', '.join(keys.EVAL_SPLITS)}; request refused")
    return split


@app.evaluate()
@sanitised
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the site's ``val`` split, or ``test`` when asked.

    The instruction's ``eval-split`` picks the split (:func:`_eval_split`). With
    fewer studies in it than the policy's ``min-val-items`` (the rule covers both
    splits) only the counts leave the site, not the loss or the metrics; a split
    without items replies the counts 0.
    """
    config, site, policy = _admit(msg, context, check_evaluate)
    split = _eval_split(msg)
    task = _site_task(config, site)
    model = task.build_model(private=config.dp_noise_multiplier > 0)
    model.load_state_dict(unpack_arrays(msg.content[keys.ARRAYS]).to_torch_state_dict())
    result = task.evaluate(model, _compute(), split=split)
    loss_key, studies_key = _SPLIT_KEYS[split]
    metrics = MetricRecord({keys.NUM_EXAMPLES: result.num_examples,
                            studies_key: result.num_studies})
    if result.num_examples and releases_val_metrics(policy, result.num_studies):
        metrics[loss_key] = result.loss
        metrics.update({f"{split}-{name}": value for name, value in result.metrics.items()})
        instruction = _instruction(msg)
        personal = SitePersonalisation.of(config, site.state_dir, _federation(instruction, context))
        metrics.update(personal.metrics(task, model, _compute(), split, config, site.name,
                                        int(instruction.get(keys.SERVER_ROUND, 0))))
    else:
        log.info("site %s: %d %s studies (policy min-val-items %d): only counts leave",
                 site.name, result.num_studies, split, policy.min_val_items)
    content = RecordDict({keys.METRICS: metrics, keys.SITE: _site_record(site, policy)})
    return Message(content, reply_to=msg)


@app.query()
@sanitised
def query(msg: Message, context: Context) -> Message:
    """Loss of the received global model on the site's training data (Power-of-Choice).

    Forward passes only; ``loss-subset`` > 0 restricts it to a fixed subset of
    that many examples (cpow-d).
    """
    config, site, policy = _admit(msg, context, check_query)
    task = _site_task(config, site)
    train_set = task.require_training()  # a test-only site: SiteDataError, an error reply
    model = task.build_model(private=config.dp_noise_multiplier > 0)
    model.load_state_dict(unpack_arrays(msg.content[keys.ARRAYS]).to_torch_state_dict())
    subset = int(msg.content[keys.CONFIG].get(keys.LOSS_SUBSET, 0))
    loss = task.training_loss(model, _compute(), subset=subset)
    metrics = MetricRecord({keys.NUM_EXAMPLES: len(train_set), keys.QUERY_LOSS: loss})
    return Message(RecordDict({keys.METRICS: metrics, keys.SITE: _site_record(site, policy)}),
                   reply_to=msg)
