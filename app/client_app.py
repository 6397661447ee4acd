"""ClientApp: the Flower adapter of the site's round (:mod:`clients.site.site_round`).

For each train / evaluate / query message: the site's keys of the run config
(:meth:`~clients.site.instruction.SiteRunSettings.from_run_config`) and node_config become
the site's settings and the :class:`~clients.site.site.Site` (its policy read from
node_config ``policy-path``; both built once per process and node_config, as a
SuperNode's node_config is fixed for its process, the policy read again when its file's
path, mtime or size changed), the message's config record becomes a typed
:class:`~clients.site.instruction.Instruction`, its arrays plain numpy; the site's
round checks the request against the policy, does the work and returns numpy
arrays and python numbers, which go back as the reply's ``delta``, ``metrics`` and
``site`` records (:mod:`strategies.wire.message_keys`), and a SecAgg+ stage's protocol
entries as the ``secagg`` record (:mod:`clients.site.secure_round`). Every failure, a policy refusal
included, leaves as a sanitised error reply: each handler is wrapped by
:func:`sanitised`, whose reply :func:`app.site_errors.error_reply` builds (a fixed code,
the exception type, never its text; the site runtime builds its own the same way).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from app.config.site_config import SiteConfig
from app.site_errors import error_reply
from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.site import Site
from clients.site.site_round import SiteTasks, answer
from clients.vertical.stages import VerticalRequest, answer_vertical, vertical_site
from strategies.rounds.instructions import named_arrays, record_of
from strategies.wire import message_keys as keys
from strategies.wire.vertical_options import split_vertical

app = ClientApp()

# Progress lines of the site trainers (the root logger stays at Flower's level).
_progress = logging.getLogger("clients")
if not _progress.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    _progress.addHandler(_handler)
    _progress.setLevel(logging.INFO)

#: The tasks this process has loaded and its device (one SuperNode process, many messages).
_TASKS = SiteTasks()

Handler = Callable[[Message, Context], Message]


def sanitised(handler: Handler) -> Handler:
    """Wrap a ClientApp handler: any exception becomes :func:`~app.site_errors.error_reply`
    (an exception that reached Flower would put its text into the reply)."""

    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as exc:  # noqa: BLE001 - every failure leaves as a sanitised reply
            return error_reply(msg, context, exc)

    return wrapped


#: The sites this process has resolved: a SuperNode's node_config is fixed for the process
#: (the in-process engine runs several sites in one), and a policy file is read again only
#: when it changed.
_SITES = 64

#: The identity of a file as the memo sees it: its path, mtime (ns) and size.
FileIdentity = tuple[str, int, int]


def _identity(path: str | Path) -> FileIdentity | None:
    """``path``'s identity, or ``None`` when it cannot be stat'ed."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return str(path), stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=_SITES)
def _site_config(items: tuple[tuple[str, str, Any], ...], data_root: str, site_policy: str,
                 folder: FileIdentity | None) -> SiteConfig:
    """The :class:`SiteConfig` of the node_config ``items`` (``(key, type name, value)``,
    sorted), resolved once; ``folder`` (the run config's ``site-policy`` as stat'ed) keys it
    so that a per-site file added to a simulation's policy folder is found."""
    del folder  # a key only
    return SiteConfig.from_node_config({key: value for key, _, value in items}, data_root,
                                       site_policy)


@functools.lru_cache(maxsize=_SITES)
def _site_of(config: SiteConfig, policy: FileIdentity | None) -> Site:
    """``config``'s :class:`Site`, its policy file (as ``policy`` identifies it) read once."""
    del policy  # a key only
    return config.site()


def _resolved(node_config: Mapping[str, Any], run: SiteRunSettings) -> Site:
    """The :class:`Site` of ``node_config`` under ``run``: its :class:`SiteConfig` resolved
    and its policy read once per process and node_config, the policy again when its file's
    identity (path, mtime, size) changed. Nothing that raises is kept: a bad node_config or
    an unreadable policy is refused on every message that meets it."""
    try:
        # each value with its type: 1, 1.0 and True are equal keys, not the same entry
        items = tuple(sorted((key, type(value).__name__, value)
                             for key, value in node_config.items()))
        hash(items)
    except TypeError:  # a value that is not hashable: resolved every time
        return SiteConfig.from_node_config(node_config, run.data_root, run.site_policy).site()
    folder = _identity(run.site_policy) if run.site_policy else None
    config = _site_config(items, run.data_root, run.site_policy, folder)
    if config.policy_path is None:
        return _site_of(config, None)
    policy = _identity(config.policy_path)
    if policy is None:  # not there (or not stat'able): read, and refused, every time
        return config.site()
    return _site_of(config, policy)


def _site(context: Context) -> tuple[Site, SiteRunSettings]:
    """The site (node_config, its policy read) and the run settings it reads."""
    run = SiteRunSettings.from_run_config(context.run_config)
    return _resolved(context.node_config, run), run


def _round(kind: str, msg: Message, context: Context) -> Message:
    """Message -> instruction, the site's round, reply -> Message."""
    site, run = _site(context)
    record = msg.content[keys.CONFIG] if keys.CONFIG in msg.content else ConfigRecord()
    instruction = Instruction.parse(kind, record, run, f"run-{context.run_id}")
    arrays = named_arrays(msg.content[keys.ARRAYS]) if keys.ARRAYS in msg.content else {}
    reply = answer(instruction, arrays, site, run, _TASKS)
    content = RecordDict({keys.METRICS: MetricRecord(reply.metrics),
                          keys.SITE: ConfigRecord(reply.site)})
    if reply.update is not None:
        content[keys.DELTA] = record_of(reply.update)
    if reply.secagg is not None:
        content[keys.SECAGG] = ConfigRecord(reply.secagg)
    return Message(content, reply_to=msg)


@app.train()
@sanitised
def train(msg: Message, context: Context) -> Message:
    """Train tau local steps and reply with the update and metrics."""
    return _round("train", msg, context)


@app.evaluate()
@sanitised
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the site's ``val`` split, or ``test`` when asked."""
    return _round("evaluate", msg, context)


@app.query()
@sanitised
def query(msg: Message, context: Context) -> Message:
    """Loss of the received global model on the site's training data (Power-of-Choice)."""
    return _round("query", msg, context)


@app.train("vertical")
@sanitised
def vertical(msg: Message, context: Context) -> Message:
    """One stage of a vertical federation (:mod:`clients.vertical.stages`): PSI, pvFed, split."""
    site, run = _site(context)
    record = msg.content[keys.CONFIG] if keys.CONFIG in msg.content else ConfigRecord()
    entries = dict(record)
    stage = str(entries.pop(keys.VERTICAL_STAGE, ""))
    federation = str(entries.pop(keys.FEDERATION, ""))
    server_round = int(entries.pop(keys.SERVER_ROUND, 0))
    federation = federation or f"run-{context.run_id}"
    arrays = ({name: array.numpy() for name, array in msg.content[keys.ARRAYS].items()}
              if keys.ARRAYS in msg.content else {})
    reply = answer_vertical(VerticalRequest(
        stage, federation, server_round, entries, arrays,
        split_vertical(context.run_config)[0], vertical_site(site, run, federation, _TASKS)))
    return Message(RecordDict({keys.VERTICAL: ArrayRecord(
        {name: Array(np.ascontiguousarray(a)) for name, a in reply.arrays.items()}),
        keys.METRICS: MetricRecord(reply.metrics), keys.SITE: ConfigRecord(reply.info)}),
        reply_to=msg)
