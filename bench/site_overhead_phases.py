"""Where a site's seconds per message go, read from its SuperNode's log.

A hospital's node log (``supernodes/<site>/supernode.log``, timestamps on: the
node process of :mod:`app.site_runtime.site_node` sets them) holds, per message,
Flower's ``Receiving:`` / ``Received successfully`` lines (the SuperNode pulls the
message's objects from the SuperLink), its ``Sending:`` / ``Sent successfully``
lines (it pushes the reply's objects to the SuperLink) and, with the site
runner, one runner line::

    site <name>: <kind> message: pull 0.22 s (receipt 0.18 s), answer 0.05 s (worker 0.04 s),
    push 0.05 s, audit 0.01 s

Its **parts** (``pull``, ``answer``, ``push``, ``audit``, ...) are the runner's
consecutive spans, from the start of its pull to the line, in that order; a
part's parenthesised **sub-parts** lie inside it (``receipt``: when the
SuperNode had every object, counted from the pull's start; ``worker``: the warm
worker's round trip inside the answer). Older lines have ``pull``, ``answer``
and ``push`` only. Per message:

* ``receive_s``: Receiving -> Received (SuperLink to SuperNode, including waits
  for objects the ServerApp is still uploading; with the runner, up to the
  receipt it logs, see :func:`message_phases`);
* with the runner, one phase ``<name>_s`` per part and sub-part, except that
  ``answer_s`` is the runner's **own** part of the answer (its checks: policy,
  app, install, state expiry): the answer less its sub-parts; and
  ``runner_pull_after_receipt_s`` (pull - receipt) instead of the receipt;
* ``at_site_s``: Received -> Sending (the runner or the ``flwr-clientapp``
  process: its pull from the SuperNode, the work, its push, the SuperNode
  noticing the reply; with the runner, the SuperNode's confirmation to the
  SuperLink may take longer and then sets it);
* ``send_s``: Sending -> Sent (SuperNode to SuperLink);
* ``rest_s``: the ServerApp's reply seconds (MLflow) minus receive, at-site and
  send: the ServerApp's upload before the SuperNode's pull started, the
  SuperNode's poll of the SuperLink, the ServerApp's receipt of the reply.

A part or sub-part the runner starts logging (e.g. the worker's sandbox or the
reply's egress filter) is a phase of its own without a change here: it is
reported after :data:`PHASES`, and taken out of ``answer_s`` when it lies inside
the answer.
"""

from __future__ import annotations

import re
import statistics
from datetime import datetime

__all__ = ["message_phases", "median_phases", "runner_parts", "PHASES"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_FLOWER = re.compile(_STAMP + r":\s+(Receiving|Received successfully|Sending|Sent successfully)"
                     r"(?:: (\w+) message)?")
_RUNNER = re.compile(_STAMP + r" fedmed\.site_runner site \S+: (\w+) message: (pull .*)$")
_PART = re.compile(r"(\w+) ([\d.]+) s(?: \(([^)]*)\))?")
_SUB_PART = re.compile(r"(\w+) ([\d.]+) s")

#: The phases, in the order of a message's path (others the log has come after them).
PHASES = ("receive_s", "pull_s", "runner_pull_after_receipt_s", "answer_s", "worker_s",
          "push_s", "audit_s", "at_site_s", "send_s", "rest_s")


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def runner_parts(text: str) -> dict[str, tuple[float, dict[str, float]]]:
    """``part -> (seconds, {sub-part: seconds})`` of a runner line's text after ``message: ``."""
    return {part.group(1): (float(part.group(2)),
                            {sub.group(1): float(sub.group(2))
                             for sub in _SUB_PART.finditer(part.group(3) or "")})
            for part in _PART.finditer(text)}


def _runner_phases(parts: dict[str, tuple[float, dict[str, float]]]) -> dict[str, float]:
    """The phases of a runner line's parts (see the module docstring)."""
    phases: dict[str, float] = {}
    for name, (seconds, subs) in parts.items():
        if name == "pull" and "receipt" in subs:
            phases["runner_pull_after_receipt_s"] = seconds - subs["receipt"]
        inside = {f"{sub}_s": value for sub, value in subs.items() if sub != "receipt"}
        phases[f"{name}_s"] = seconds - sum(inside.values()) if name == "answer" else seconds
        phases.update(inside)
    return phases


def message_phases(log_text: str) -> list[dict]:
    """One dict per message the log shows (in order): its ``kind`` and the phases it has.

    A message counts from its ``Receiving:`` line; phases whose lines are
    missing (e.g. a log without timestamps) are left out. With the runner's
    receipt, the SuperNode's receipt is that moment (the line's time less its
    parts, plus the receipt): Flower logs ``Received successfully`` only after
    its confirmation request to the SuperLink, which the runner's work overlaps.
    """
    marks: list[dict[str, float]] = []
    messages: list[dict] = []
    for line in _ANSI.sub("", log_text).splitlines():
        if flower := _FLOWER.search(line):
            if flower.group(2) == "Receiving":
                marks.append({})
                messages.append({"kind": flower.group(3)})
            if marks:
                marks[-1][flower.group(2)] = _seconds(flower.group(1))
        elif (runner := _RUNNER.search(line)) and marks:
            parts = runner_parts(runner.group(3))
            receipt = parts["pull"][1].get("receipt") if "pull" in parts else None
            messages[-1].update(_runner_phases(parts))
            if receipt is not None:
                marks[-1]["receipt"] = (_seconds(runner.group(1)) + receipt
                                        - sum(seconds for seconds, _ in parts.values()))
    for message, mark in zip(messages, marks):
        received = mark.get("receipt", mark.get("Received successfully"))
        spans = {"receive_s": (mark.get("Receiving"), received),
                 "at_site_s": (received, mark.get("Sending")),
                 "send_s": (mark.get("Sending"), mark.get("Sent successfully"))}
        message.update({phase: end - start for phase, (start, end) in spans.items()
                        if start is not None and end is not None})
    return messages


def median_phases(messages: list[dict], reply_seconds: list[float] | None = None) -> dict:
    """Median of every phase over ``messages``; ``rest_s`` when their reply seconds are given.

    ``reply_seconds[i]`` is the ServerApp's send-to-receipt time of ``messages[i]``.
    The phases come in the order of :data:`PHASES`, then any other in the order seen.
    """
    if reply_seconds is not None:
        for message, total in zip(messages, reply_seconds):
            if all(k in message for k in ("receive_s", "at_site_s", "send_s")):
                message["rest_s"] = total - message["receive_s"] - message["at_site_s"] \
                    - message["send_s"]
    others = [name for message in messages for name in message
              if name != "kind" and name not in PHASES]
    return {phase: statistics.median(values) for phase in (*PHASES, *dict.fromkeys(others))
            if (values := [m[phase] for m in messages if phase in m])}
