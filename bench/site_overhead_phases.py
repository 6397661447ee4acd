"""Where a site's seconds per message go, read from its SuperNode's log.

A hospital's node log (``supernodes/<site>/supernode.log``, timestamps on: the
node process of :mod:`app.site_runtime.site_node` sets them) holds, per message,
Flower's ``Receiving:`` / ``Received successfully`` lines (the SuperNode pulls the
message's objects from the SuperLink), its ``Sending:`` / ``Sent successfully``
lines (it pushes the reply's objects to the SuperLink) and, with the site
runner, the runner's ``pull X s (receipt R s), answer Y s, push Z s`` line. Per
message:

* ``receive_s``: Receiving -> Received (SuperLink to SuperNode, including waits
  for objects the ServerApp is still uploading; with the runner, up to the
  receipt it logs, see :func:`message_phases`);
* ``at_site_s``: Received -> Sending (the runner or the ``flwr-clientapp``
  process: its pull from the SuperNode, the work, its push, the SuperNode
  noticing the reply; with the runner, the SuperNode's confirmation to the
  SuperLink may take longer and then sets it);
* ``send_s``: Sending -> Sent (SuperNode to SuperLink);
* with the runner: ``runner_pull_after_receipt_s`` (pull - receipt),
  ``answer_s``, ``runner_push_s``;
* ``rest_s``: the ServerApp's reply seconds (MLflow) minus receive, at-site and
  send: the ServerApp's upload before the SuperNode's pull started, the
  SuperNode's poll of the SuperLink, the ServerApp's receipt of the reply.
"""

from __future__ import annotations

import re
import statistics
from datetime import datetime

__all__ = ["message_phases", "median_phases", "PHASES"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_FLOWER = re.compile(_STAMP + r":\s+(Receiving|Received successfully|Sending|Sent successfully)"
                     r"(?:: (\w+) message)?")
_RUNNER = re.compile(_STAMP + r" fedmed\.site_runner site \S+: (\w+) message: pull ([\d.]+) s"
                     r"(?: \(receipt ([\d.]+) s\))?, answer ([\d.]+) s, push ([\d.]+) s")

#: The phases, in the order of a message's path.
PHASES = ("receive_s", "runner_pull_after_receipt_s", "answer_s", "runner_push_s",
          "at_site_s", "send_s", "rest_s")


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def message_phases(log_text: str) -> list[dict]:
    """One dict per message the log shows (in order): its ``kind`` and the phases it has.

    A message counts from its ``Receiving:`` line; phases whose lines are
    missing (e.g. a log without timestamps) are left out. With the runner's
    receipt, the SuperNode's receipt is that moment: Flower logs ``Received
    successfully`` only after its confirmation request to the SuperLink, which
    the runner's work overlaps.
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
            pull, receipt, answer, push = (float(v) if v is not None else None
                                           for v in runner.group(3, 4, 5, 6))
            messages[-1].update({"answer_s": answer, "runner_push_s": push})
            if receipt is not None:
                messages[-1]["runner_pull_after_receipt_s"] = pull - receipt
                marks[-1]["receipt"] = _seconds(runner.group(1)) - pull - answer - push + receipt
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
    """
    if reply_seconds is not None:
        for message, total in zip(messages, reply_seconds):
            if all(k in message for k in ("receive_s", "at_site_s", "send_s")):
                message["rest_s"] = total - message["receive_s"] - message["at_site_s"] \
                    - message["send_s"]
    return {phase: statistics.median(values) for phase in PHASES
            if (values := [m[phase] for m in messages if phase in m])}
