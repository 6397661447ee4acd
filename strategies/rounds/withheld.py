"""Metrics a site withheld under its policy, and the words the server reports them with.

A site's policy may keep metrics back from the coordinator: ``min-val-items`` (too
few studies in the split for their mean to stay anonymous), ``evaluate-trains``
(personalised metrics that would need training at evaluate time). Such a site still
answers the evaluate message with its counts and names the rules, comma-separated,
in its reply's ``site`` record (``keys.WITHHELD``, read once by the reply intake:
:func:`strategies.rounds.reply_intake.withheld_rules`). A reply with examples but
only counts that names no rule (a site older than the key) is withheld with
:data:`NO_METRICS`. A cross-site fine-tune the site refused by a policy rule
(``share-finetuned-model``) arrives as a policy refusal (:func:`refused_rule`).

The server never turns a withheld metric into a NaN: the round line, the end-of-run
test line, the cross-site matrix and MLflow say ``withheld by site policy (<rule>)``
(:func:`withheld_text`), and an aggregate no site released is reported with every
site's rules (:func:`withheld_summary`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from strategies.wire import message_keys as keys

__all__ = ["NO_METRICS", "refused_rule", "withheld_summary", "withheld_text"]

#: The rule reported for a reply that carries counts only and names no rule.
NO_METRICS = "no metrics"
_REFUSAL = re.compile(re.escape(keys.POLICY_RULE_PREFIX) + r"(\S+) \(refused\)")


def withheld_text(rules: str) -> str:
    """``withheld by site policy (<rules>)``: what the server reports instead of a metric."""
    return f"withheld by site policy ({rules})"


def withheld_summary(withheld: Mapping[str, str]) -> str:
    """``<site>: <rules>; ...`` in site order (the sites behind a withheld aggregate)."""
    return "; ".join(f"{site}: {rules}" for site, rules in sorted(withheld.items()))


def refused_rule(reason: str) -> str | None:
    """The policy rule a drop reason names (a site's error reply ``policy rule <r> (refused)``),
    else ``None``."""
    match = _REFUSAL.search(reason)
    return match.group(1) if match else None
