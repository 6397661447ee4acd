"""One audit record per message a site receives, built by the site runtime from what it saw.

The site runner (:mod:`app.site_runtime.site_runner`) pulls every message and
pushes every reply itself, so it can say what the federation asked and what the
site sent without trusting the uploaded app: the record is built from the
message's ``config`` record and the run config (what was asked), the reply (the
decision, the refused rule, the serialised bytes that left), the runner's clock
and the epsilon the runtime itself charged to the site's privacy ledger
(:mod:`app.site_runtime.runtime_ledger`, never the app's metrics). It holds only
settings and numbers, never an image, a file path, an item or patient id, and
never an exception's text (a refusal's rule is a policy key):

>>> record = message_record(message, reply, context, fab_hash, seconds=1.5, epsilon=0.0)
>>> record["decision"], record["rule"], record["asked"]["local-steps"]
('refused', 'min-batch-size', 10)

:class:`app.site_runtime.audit_log.AuditLog` adds ``seq``, ``time`` and the
hash chain.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

from flwr.app import Context, Message

from app.site_runtime.app_approval import SIGNATURE_KEY
from strategies.rounds.reply_intake import wire_size
from strategies.wire import message_keys as keys

__all__ = ["ASKED_INSTRUCTION_KEYS", "ASKED_RUN_KEYS", "asked_of", "decision_of",
           "federation_label", "message_record", "signature_expiry"]


#: Keys of a message's ``config`` record that say what was asked (scalars only).
ASKED_INSTRUCTION_KEYS = (keys.SERVER_ROUND, keys.LOCAL_STEPS, keys.TIME_BUDGET, keys.CODEC,
                          keys.ERROR_FEEDBACK, keys.DOWNLINK_CODEC, keys.EVAL_SPLIT,
                          keys.LOSS_SUBSET, keys.SECAGG_STAGE, keys.VERTICAL_STAGE,
                          keys.PRUNING_VERSION, keys.PRUNING_MODE)
#: Run-config keys a site's computation reads that say what was asked (scalars only).
ASKED_RUN_KEYS = ("task", "local-steps", "batch-size", "image-size", "optimizer", "lr",
                  "privacy.noise-multiplier", "privacy.max-grad-norm", "privacy.delta",
                  "privacy.accountant", "personalisation.method", "strategy.pruning")
#: The longest text value kept in ``asked`` (a codec spec, a task name).
_MAX_TEXT = 64
#: A federation id the audit keeps as it is (:func:`federation_label`).
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.-]+")
#: Hex digits of the SHA-256 that stands for any other federation id.
_ID_HEX = 16
#: A policy rule as the site's refusals name it (``policy rule min-batch-size (refused)``).
_RULE = re.compile(re.escape(keys.POLICY_RULE_PREFIX) + r"([a-z][a-z0-9.\-]*) \(refused\)")
#: ``YYYY-MM-DD:`` at the start of an ``app-signature`` (:func:`~app.site_runtime.app_approval.sign_app`).
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}:")
#: Error codes of a refusal (the data policy's, the runner's app check's).
_REFUSALS = (keys.POLICY_REFUSAL_CODE, keys.APP_REFUSAL_CODE)


def _scalar(value: Any) -> bool | int | float | str | None:
    """``value`` if it is a JSON scalar worth keeping (short text without a path), else None."""
    if isinstance(value, bool) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str) and len(value) <= _MAX_TEXT and "/" not in value \
            and "\\" not in value:
        return value
    return None


def asked_of(message: Message, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """What ``message`` asked: its instruction's scalar settings over the run config's."""
    asked: dict[str, Any] = {}
    for key in ASKED_RUN_KEYS:
        if key in run_config and (value := _scalar(run_config[key])) is not None:
            asked[key] = value
    config = message.content.config_records.get(keys.CONFIG) if message.has_content() else None
    for key in ASKED_INSTRUCTION_KEYS:
        if config is not None and key in config and (value := _scalar(config[key])) is not None:
            asked[key] = value
    return asked


def decision_of(reply: Message) -> tuple[str, str | None, int | None]:
    """``(decision, rule, error code)``: answered, refused (with its policy rule) or failed."""
    if not reply.has_error():
        return "answered", None, None
    code = int(reply.error.code)
    found = _RULE.search(reply.error.reason or "")
    if code in _REFUSALS or found is not None:
        return "refused", found.group(1) if found else None, code
    return "failed", None, code


def federation_label(federation: Any) -> str:
    """How the audit records a federation id: itself when short and plain, else its hash.

    An id of at most 64 characters of ``A-Z a-z 0-9 _ . -`` is kept as it is; any
    other (longer, or holding ``/``, spaces, ...) is recorded as ``sha256:`` and the
    first 16 hex digits of the SHA-256 of its UTF-8 text, so the hospital can still
    match it (``printf %s "$ID" | sha256sum | cut -c1-16``); ``:`` is no plain
    character, so a label of that form is never a kept id. Missing or empty: ``""``.
    """
    if federation is None or federation == "":
        return ""
    text = str(federation)
    if len(text) <= _MAX_TEXT and _PLAIN_ID.fullmatch(text):
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:_ID_HEX]


def _federation(message: Message) -> str:
    config = message.content.config_records.get(keys.CONFIG) if message.has_content() else None
    return federation_label(config.get(keys.FEDERATION)) if config is not None else ""


def signature_expiry(run_config: Mapping[str, Any]) -> str | None:
    """The expiry date (``YYYY-MM-DD``) the run's ``app-signature`` was signed with, if any."""
    text = str(run_config.get(SIGNATURE_KEY, ""))
    return text[:10] if _DATE.fullmatch(text[:11]) else None


def message_record(message: Message, reply: Message, context: Context, fab_hash: str,
                   seconds: float, epsilon: float | None, approval: str | None = None
                   ) -> dict[str, Any]:
    """The audit record of one message and the reply the site sent to it.

    Parameters
    ----------
    message, reply : Message
        The message as pulled, the reply as pushed.
    context : Context
        The task's context (run config, node config).
    fab_hash : str
        The SHA-256 of the run's app bundle.
    seconds : float
        From the pull's end to the reply.
    epsilon : float or None
        The epsilon the runtime charged to the site's ledger for the message
        (:class:`~app.site_runtime.runtime_ledger.Reservation`; 0 when none).
    approval : str, optional
        How the site policy approved the bundle (``any``, ``sha256`` or ``key <12 hex>``,
        :func:`~app.site_runtime.app_approval.check_app`); None when it was not checked
        or refused. A key's approval holds through ``signature_expires``.
    """
    decision, rule, code = decision_of(reply)
    return {"kind": "message",
            "site": str(context.node_config.get("site-name", f"node-{context.node_id}")),
            "run": int(message.metadata.run_id), "federation": _federation(message),
            "app": fab_hash, "type": message.metadata.message_type,
            "asked": asked_of(message, context.run_config), "decision": decision, "rule": rule,
            "error_code": code, "bytes_sent": wire_size(reply.content) if reply.has_content()
            else 0, "epsilon": None if epsilon is None else round(float(epsilon), 9),
            "seconds": round(float(seconds), 4), "approval": approval,
            "signature_expires": signature_expiry(context.run_config)}
