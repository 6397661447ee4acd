"""Every error reply a site sends, built in one place: a fixed code and the exception type.

An exception's text can hold a path (``PermissionError: [Errno 13] ...
/data/study-0042/dicom``) or a patient detail; it stays in the site's own log.
The reply carries only the site's name, a fixed code per error class, the
exception's type name and, for a policy refusal, the rule's name (a policy
key such as ``min-batch-size``). Two answer a site's messages and build their error
replies here: the ClientApp (:func:`app.client_app.sanitised` wraps each handler so
that no exception, expected or not, reaches Flower, which would put its text into the
reply) and the hospital's site runtime (:mod:`app.site_runtime.runtime_round`: a
message it refuses or a worker that fails), whose egress filter lets an error reply
leave only with one of :data:`ERROR_CODES` and a reason of :func:`error_reply`'s forms
(:mod:`app.site_runtime.egress_records`). The runtime imports this module and not the
ClientApp's, which is the app it runs in its sandboxed worker.
"""

from __future__ import annotations

import logging
import re

from flwr.app import Context, Error, Message

from app.config.site_config import SiteConfig
from clients.site.policy import PolicyRefusal
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError, ItemError, SiteError

__all__ = ["ERROR_CODES", "error_code", "error_reply"]

log = logging.getLogger("clients.site")

#: Fixed code per error class, most specific first (a PolicyRefusal is a SiteError).
ERROR_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (PolicyRefusal, keys.POLICY_REFUSAL_CODE),
    (ConfigError, 4002),
    (SiteError, 4001),
    (ItemError, 4001),
    (Exception, 4000),
)
_RULE = re.compile(r"[a-z][a-z0-9.\-]*")


def error_code(exc: BaseException) -> int:
    """The fixed code of ``exc``'s class (4000 for an unexpected error)."""
    return next(code for cls, code in ERROR_CODES if isinstance(exc, cls))


def _site_name(context: Context) -> str:
    try:
        return SiteConfig.from_node_config(context.node_config, "/").name
    except ConfigError:
        return f"node-{context.node_id}"


def error_reply(msg: Message, context: Context, exc: Exception) -> Message:
    """The error reply to ``msg``: site name, code, exception type; never the exception text.

    The full exception is logged at the site.
    """
    code = error_code(exc)
    name = _site_name(context)
    if isinstance(exc, PolicyRefusal) and _RULE.fullmatch(exc.rule):
        log.warning("site %s refused a %s request: %s", name, msg.metadata.message_type, exc)
        reason = f"site {name}: {keys.POLICY_RULE_PREFIX}{exc.rule} (refused)"
    else:
        log.error("site %s cannot answer a %s request", name, msg.metadata.message_type,
                  exc_info=exc)
        reason = f"site {name}: {type(exc).__name__} (details in the site's log)"
    return Message(Error(code=code, reason=reason), reply_to=msg)

