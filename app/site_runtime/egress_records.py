"""A reply's metrics, its site record and its error, held to declared names and bounded values.

No free text leaves the site: every value of a reply's records is a number of a declared
metric or one of a few bounded, validated strings.

* **Metrics** (:func:`check_metrics`): each name is declared in the one table,
  :data:`strategies.rounds.reply_intake.DECLARED` (else ``egress.metric-name``), and is one of
  the metrics the message type sends (an evaluate reply names its own split only; a
  SecAgg+ collect reply never the error-feedback residual's norm, which would reveal
  the update); each value is one finite number within its declared range, the
  acknowledged ``downlink-version`` and ``pruning-version`` those the instruction set
  (else ``egress.metric-range``); a train reply's ``steps`` at most the tau asked
  (``egress.steps``).
* **The site record** (:func:`check_site_record`): ``name`` the node's own site name,
  ``policy`` the runtime's policy fingerprint and, in an evaluate reply only,
  ``withheld`` a comma-separated list of distinct policy rule names
  (:func:`policy_rules`), else ``egress.text``.
* **An error reply** (:func:`check_error`): one of the product's fixed codes
  (:data:`app.site_errors.ERROR_CODES`) and a reason of :func:`app.site_errors.error_reply`'s
  two sanitised forms for this site: ``site <name>: policy rule <rule> (refused)`` with
  the refusal code and a policy rule, or ``site <name>: <Type> (details in the site's
  log)`` with the name of an exception class the runtime knows (``egress.error``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from functools import lru_cache
from typing import Any

from flwr.app import ConfigRecord, Message, MetricRecord

from app.site_errors import ERROR_CODES
from app.site_runtime.egress_instruction import Asked
from app.site_runtime.egress_refusal import EgressRefusal
from clients.site.policy import SitePolicy
from strategies.rounds.reply_intake import SPLITS, declared
from strategies.wire import message_keys as keys

__all__ = ["check_error", "check_metrics", "check_site_record", "exception_names",
           "metric_families", "policy_rules"]

_SPLIT = "|".join(SPLITS)
_EPSILON = rf"{keys.EPSILON}|{keys.EPSILON_ROUND}|{keys.EPSILON_LEFT}"
_TRAIN = "|".join(re.escape(k) for k in (
    keys.NUM_EXAMPLES, keys.STEPS, keys.TRAIN_LOSS, keys.INITIAL_LOSS, keys.TRAIN_SECONDS,
    keys.STUDIES_SKIPPED, keys.DOWNLINK_VERSION, keys.PRUNING_VERSION))

#: The metrics each kind of reply sends (full matches); ``{split}`` is the evaluated split.
_FAMILIES: dict[str, str] = {
    "train": rf"{_TRAIN}|{keys.RESIDUAL_NORM}|{_EPSILON}",
    "collect": rf"{_TRAIN}|{_EPSILON}",  # never residual-norm: it would reveal the update
    "setup": keys.NUM_EXAMPLES,
    "share-keys": "(?!)",
    "consistency": "(?!)",
    "unmask": "(?!)",
    "evaluate": (rf"{keys.NUM_EXAMPLES}|{{split}}-studies|(?:personalised-)?{{split}}-[a-z]+"
                 rf"|{_EPSILON}"),
    "query": rf"{keys.NUM_EXAMPLES}|{keys.QUERY_LOSS}",
    keys.VERTICAL_MESSAGE_TYPE: (rf"psi-size|encoder-loss|patients|feature-width|head-inputs"
                                 rf"|{keys.NUM_EXAMPLES}|{keys.TRAIN_LOSS}"
                                 rf"|(?:local-|pvfed-)?(?:{_SPLIT})-[a-z]+"),
}


def metric_families(family: str, split: str = "val") -> re.Pattern[str]:
    """The metric names a reply of ``family`` sends (a message type, or a SecAgg+ stage)."""
    return re.compile(_FAMILIES[family].replace("{split}", re.escape(split)))


def _family(asked: Asked | None, kind: str) -> str:
    if asked is not None and asked.instruction.secagg_stage:
        return asked.instruction.secagg_stage
    return kind


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EgressRefusal("egress.metric-range", f"metric '{name}' is not one number")
    if not math.isfinite(float(value)):
        raise EgressRefusal("egress.metric-range", f"metric '{name}' is not finite")
    return float(value)


def _versions(asked: Asked | None) -> dict[str, int]:
    if asked is None:
        return {}
    instruction = asked.instruction
    versions = {keys.PRUNING_VERSION: instruction.pruning_version}
    if instruction.downlink is not None:
        versions[keys.DOWNLINK_VERSION] = instruction.downlink.version
    return versions


def check_metrics(record: MetricRecord, kind: str, asked: Asked | None) -> None:
    """Check a reply's metrics (the module docstring); ``asked``: the horizontal instruction
    the reply answers (``None`` for a vertical stage).

    Raises
    ------
    EgressRefusal
        ``egress.metric-name``, ``egress.metric-range`` or ``egress.steps``.
    """
    family = _family(asked, kind)
    split = asked.instruction.eval_split if asked is not None else "val"
    sent = metric_families(family, split)
    versions = _versions(asked)
    for name, value in record.items():
        allowed = declared(name)
        if allowed is None:
            raise EgressRefusal("egress.metric-name", f"a metric name the product does not "
                                f"declare ({len(name)} characters)")
        if not sent.fullmatch(name):
            raise EgressRefusal("egress.metric-name", f"metric '{name}' is not one a {family} "
                                "reply sends")
        number = _number(name, value)
        if not allowed.holds(number):
            raise EgressRefusal("egress.metric-range", f"metric '{name}' is out of range: "
                                f"{allowed.rule}")
        if name in versions and number != versions[name]:
            raise EgressRefusal("egress.metric-range", f"metric '{name}' is not the version "
                                f"the instruction set ({versions[name]})")
    steps = record.get(keys.STEPS)
    if asked is not None and steps is not None and steps > asked.instruction.local_steps:
        raise EgressRefusal("egress.steps", f"the reply reports more local steps than the tau "
                            f"asked ({asked.instruction.local_steps})")


def _key(name: str) -> str:
    return name.replace("_", "-")


@lru_cache(maxsize=1)
def policy_rules() -> frozenset[str]:
    """Every rule name of the site policy: its keys, ``table.key`` in its tables
    (:class:`clients.site.policy.SitePolicy`), and the tables themselves."""
    rules: set[str] = set()
    default = SitePolicy()
    for field in fields(SitePolicy):
        if field.name == "fingerprint":
            continue
        rules.add(_key(field.name))
        table = getattr(default, field.name)
        if is_dataclass(table):
            rules.update(f"{_key(field.name)}.{_key(inner.name)}" for inner in fields(table))
    return frozenset(rules)


def _text(record: ConfigRecord, key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise EgressRefusal("egress.text", f"site record '{key}' is not one string")
    return value


def check_site_record(record: ConfigRecord, site: str, fingerprint: str,
                      withheld: bool) -> None:
    """Check a train, evaluate or query reply's ``site`` record (``withheld``: the
    reply may name withheld rules, an evaluate reply).

    Raises
    ------
    EgressRefusal
        ``egress.text`` (a key not allowed counts as text too: it is a name of the reply's).
    """
    allowed = {keys.SITE_NAME, keys.SITE_POLICY} | ({keys.WITHHELD} if withheld else set())
    extra = [key for key in record.keys() if key not in allowed]
    if extra:
        raise EgressRefusal("egress.text", f"{len(extra)} site record key(s) the reply may "
                            "not send")
    if _text(record, keys.SITE_NAME) != site:
        raise EgressRefusal("egress.text", "the site record's name is not this node's")
    if _text(record, keys.SITE_POLICY) != fingerprint:
        raise EgressRefusal("egress.text", "the site record's policy is not the runtime's")
    if keys.WITHHELD in record:
        rules = _text(record, keys.WITHHELD).split(",")
        if len(set(rules)) != len(rules) or not set(rules) <= policy_rules():
            raise EgressRefusal("egress.text", "the site record's withheld rules are not "
                                "distinct policy rule names")


def _subclasses(root: type) -> Iterable[type]:
    for cls in root.__subclasses__():
        yield cls
        yield from _subclasses(cls)


#: The exception class names seen loaded in this process (grows on each rescan).
_KNOWN: set[str] = set()


def exception_names() -> set[str]:
    """The names of the exception classes this process has loaded, rescanned (a reply may
    name a class imported since the last scan)."""
    _KNOWN.update(cls.__name__ for cls in _subclasses(BaseException))
    return _KNOWN


_DETAILS = " (details in the site's log)"
_REFUSED = re.compile(re.escape(keys.POLICY_RULE_PREFIX) + r"([a-z][a-z0-9.\-]{0,63}) \(refused\)")
_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_error(reply: Message, site: str) -> None:
    """Check an error reply (the module docstring).

    Raises
    ------
    EgressRefusal
        ``egress.error``.
    """
    code, reason = int(reply.error.code), str(reply.error.reason or "")
    prefix = f"site {site}: "
    if code not in {value for _, value in ERROR_CODES} or not reason.startswith(prefix):
        raise EgressRefusal("egress.error", "an error code or a site the product does not send")
    text = reason[len(prefix):]
    refused = _REFUSED.fullmatch(text)
    if refused is not None:
        if code != keys.POLICY_REFUSAL_CODE or refused.group(1) not in policy_rules():
            raise EgressRefusal("egress.error", "a refusal naming no policy rule")
        return
    name = text[:-len(_DETAILS)] if text.endswith(_DETAILS) else ""
    if not _TYPE.fullmatch(name) or (name not in _KNOWN and name not in exception_names()):
        raise EgressRefusal("egress.error", "an error reason that is not a sanitised form")
