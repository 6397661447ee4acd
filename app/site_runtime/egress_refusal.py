"""The egress filter's rules, its verdict and the refusal that replaces a reply breaking one.

Every rule of :class:`app.site_runtime.egress_filter.EgressFilter` has a name under
``egress.`` (:data:`RULES`). A reply that breaks one leaves the site as an error reply
with the fixed code :data:`~strategies.wire.message_keys.EGRESS_REFUSAL_CODE` and the reason
``site <name>: policy rule <rule> (refused): <detail>`` (:func:`refusal_reply`), which
the audit log records as a refusal naming the rule
(:func:`app.site_runtime.audit_record.decision_of`) and the server as a policy refusal
(:func:`strategies.rounds.withheld.refused_rule`).

A detail names only what the runtime itself knows (a rule, a declared key or metric, a
count the instruction set), never a text of the refused reply: the refusal leaves the
site too, and must not carry what the reply was refused for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flwr.app import Error, Message

from strategies.wire import message_keys as keys
from strategies.wire.errors import ReplyError

__all__ = ["RULES", "EgressRefusal", "EgressVerdict", "PASSED", "refusal_reply"]

#: Every rule of the egress filter, by name, and what breaks it.
RULES: dict[str, str] = {
    "egress.metadata": "the reply is not the reply to the message (type, group, nodes, run)",
    "egress.error": "an error reply whose code is not a fixed code of the product or whose "
                    "reason is not one of app.site_errors' sanitised forms",
    "egress.instruction": "the instruction the reply answers does not parse",
    "egress.model-unknown": "the model (or pruning mask) the reply must match is unknown to "
                            "the runtime (a compressed downlink step after a restart)",
    "egress.record-keys": "a record the message type does not allow, or of another kind",
    "egress.array-name": "an array the instruction does not allow, or a missing one",
    "egress.array-shape": "an array whose dtype or shape is not the one the instruction "
                          "allows, or whose bytes are not a plain numpy array of them",
    "egress.payload": "a codec payload that does not decode as the instruction's codec over "
                      "the model's entries (the codec's own decoder: exact length)",
    "egress.metric-name": "a metric name the product does not declare "
                          "(strategies.rounds.reply_intake)",
    "egress.metric-range": "a metric value out of its declared range, not one number, or not "
                           "the version the instruction set",
    "egress.steps": "a train reply reporting more local steps than the tau asked",
    "egress.text": "a ConfigRecord value that is not one of its key's bounded, validated "
                   "values (site name, policy fingerprint, rule names, protocol entries)",
    "egress.bytes": "the serialised reply is larger than the instruction's arrays and codec "
                    "allow plus the fixed allowance",
    "egress.unchecked": "the runtime could not check the reply (an error of the filter itself, "
                        "in the site's log): it is refused, never let through unchecked",
}

#: What a detail may hold: words, numbers and punctuation, no path separator, short.
_DETAIL = re.compile(r"[A-Za-z0-9 ,.:;=<>()'\[\]+_-]{1,200}")


class EgressRefusal(ReplyError):
    """A reply breaks the egress rule ``rule``; ``detail`` says how, in the runtime's words.

    Parameters
    ----------
    rule : str
        One of :data:`RULES`.
    detail : str
        A short text without paths or reply content (replaced by the rule's description
        when it does not fit :data:`_DETAIL`).
    """

    def __init__(self, rule: str, detail: str) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown egress rule {rule!r}")
        self.rule = rule
        self.detail = detail if _DETAIL.fullmatch(detail) else RULES[rule]
        super().__init__(f"{keys.POLICY_RULE_PREFIX}{rule}: {self.detail}")


@dataclass(frozen=True)
class EgressVerdict:
    """The filter's verdict on one reply: passed (``rule`` None) or the rule it broke."""

    rule: str | None = None
    detail: str = ""

    @property
    def passed(self) -> bool:
        """Whether the reply may leave the site."""
        return self.rule is None


#: The verdict on a reply that breaks no rule.
PASSED = EgressVerdict()


def refusal_reply(message: Message, site: str, verdict: EgressVerdict) -> Message:
    """The error reply to ``message`` that leaves instead of a reply ``verdict`` refused.

    Raises
    ------
    ValueError
        For a verdict that passed (nothing to refuse).
    """
    if verdict.passed:
        raise ValueError("a passed verdict has no refusal")
    reason = f"site {site}: {keys.POLICY_RULE_PREFIX}{verdict.rule} (refused): {verdict.detail}"
    return Message(Error(code=keys.EGRESS_REFUSAL_CODE, reason=reason), reply_to=message)
