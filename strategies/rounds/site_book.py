"""What the server has learnt of the sites: who they are, their data sizes, last losses.

A node id is Flower's handle for a SuperNode; a site name is what the site
declares in its replies (:func:`strategies.rounds.reply_intake.site_name`). The book is the
server's trust boundary for both:

* **name rule** -- a declared name is at most :data:`SITE_NAME_MAX_LENGTH`
  characters of letters, digits, ``_``, ``-`` and ``.`` (not dot-only): it
  becomes part of MLflow metric names (``site/<name>/...``) and of file names.
  A reply under another name is refused and recorded under ``node-<id>``
  (:func:`site_name_problem`).
* **identity** -- a name is bound to the node that first declared it in a valid
  reply. A later reply from that node under another name, or a reply from
  another connected node under a bound name, is refused
  (:meth:`SiteBook.identity_problem`). A name whose node is no longer connected
  moves to the node that claims it next (a restarted SuperNode, or a resumed
  simulation, gets a new node id), with its size cap and last loss.
* **size** -- ``num-examples`` is self-reported, so the first value a node
  declares (train or query reply) is kept as its cap: later replies are
  weighted with ``min(reported, cap)`` and a change is logged
  (:meth:`SiteBook.capped`). Evaluate replies (a validation split, of another
  size) are capped the same way at the node's first evaluate declaration.
* **roster** -- when the coordinator registers the sites (run config
  ``federation.roster``, parsed by :mod:`app.config.roster`), only names on
  the roster may reply, and every cap is also at most the roster's
  ``max-examples`` for that name, from the first reply on.
* **relative cap** -- without a roster, a site that lies from its first reply
  would keep that weight, so each declaration is also at most
  ``max_size_ratio`` (run config ``federation.max-size-ratio``, default
  :data:`DEFAULT_MAX_SIZE_RATIO`; 0 = off) x the median of the *other* nodes'
  first declarations and, when there are two others or more, at most their
  sum (:meth:`SiteBook.relative_cap`; zero declarations, of a site without
  validation items, are not counted). With no other declaration (a single
  site) there is nothing to compare: no cap. The median is a robust reference
  (a minority of liars cannot move it above an honest size); the sum is the
  majority rule: from 3 sites up no site outweighs all the others together.
  **Bound**, for one liar among ``N`` sites whose others declare sizes of
  median ``m`` and sum ``S``: its FedAvg weight is at most
  ``min(r m, S) / (min(r m, S) + S) <= 1/2`` for ``N >= 3`` (``r`` the ratio;
  equal honest sizes: ``min(r, N - 1) / (min(r, N - 1) + N - 1)``, 1/2 at 3
  sites, 3/7 at 5 with ``r = 3``; before the sum bound 3 sites gave 3/5), and
  ``r / (r + 1)`` at 2 sites, where one of two cannot be told from the other
  (the sum bound would weigh every honest pair of unequal sizes equally). ``f``
  liars together take at most ``f r m / (f r m + S_honest)``: a majority only
  when more than ``N / (r + 1)`` sites lie. An honest site more than
  ``max_size_ratio`` times the median, or more than all the others together,
  is weighted at that cap: set a roster, or a larger ratio, for such a
  federation. The cap is exact only once every site of the round has declared
  (:meth:`SiteBook.sizes_pending`): the update stream holds such a round and
  caps when it closes (:mod:`strategies.rounds.update_stream`); evaluate
  replies are capped when their exchange closes
  (:meth:`strategies.rounds.reply_intake.ReplyIntake.close`).

The book also keeps what selectors use (sizes held to the relative cap,
:meth:`SiteBook.capped_sizes`, and last train losses) and is part
of the strategy's checkpoint (:meth:`snapshot` / :meth:`restore`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from logging import WARNING
from typing import TypeVar

from flwr.supercore import log

from strategies.rounds.reply_intake import MetricsReply, TrainReply
from strategies.wire import message_keys as keys

__all__ = ["DEFAULT_MAX_SIZE_RATIO", "MAX_SIZE_RATIO_KEY", "SITE_NAME_MAX_LENGTH", "SiteBook",
           "site_name_problem"]

Reply = TypeVar("Reply", TrainReply, MetricsReply)

#: The run-config key of the relative size cap, and its default.
MAX_SIZE_RATIO_KEY = "federation.max-size-ratio"
DEFAULT_MAX_SIZE_RATIO = 3.0

#: The longest site name a reply may declare.
SITE_NAME_MAX_LENGTH = 64
_SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def site_name_problem(site: str) -> str | None:
    """Why ``site`` is not a valid declared site name (``None``: it is).

    Rule: 1 to :data:`SITE_NAME_MAX_LENGTH` characters, each an ASCII letter,
    digit, ``_``, ``-`` or ``.``, the first a letter or digit. The product's one
    site-name rule: the server's reply intake, the site's node config
    (:class:`app.config.site_config.SiteConfig`) and the deployment's keys and
    folders (:func:`app.tooling.certs.check_site_name`) all apply it. The name is
    quoted cut to the limit.
    """
    shown = repr(site[:SITE_NAME_MAX_LENGTH]) + ("..." if len(site) > SITE_NAME_MAX_LENGTH else "")
    if len(site) > SITE_NAME_MAX_LENGTH:
        return (f"site name rule: the declared name {shown} has {len(site)} characters, "
                f"at most {SITE_NAME_MAX_LENGTH} are allowed")
    if not _SITE_NAME.fullmatch(site):
        return (f"site name rule: the declared name {shown} may hold only letters, digits, "
                "'_', '-' and '.', and starts with a letter or digit")
    return None


def _counted(reply: Reply, count: int) -> Reply:
    """``reply`` weighted as ``count`` examples (its ``num-examples`` metric too)."""
    if count == reply.num_examples:
        return reply
    return replace(reply, num_examples=count,
                   metrics={**reply.metrics, keys.NUM_EXAMPLES: float(count)})


@dataclass
class SiteBook:
    """Per node id: bound site name, size cap, last train loss.

    Attributes
    ----------
    names : dict[int, str]
        Site name bound to each node (the name of its first valid reply).
    sizes : dict[int, int]
        Examples each node declared the first time it replied: its cap.
    last_losses : dict[int, float]
        Train loss of each node's latest accepted train reply.
    evaluate_sizes : dict[int, int]
        Validation examples each node declared in its first evaluate reply: its cap.
    connected : set[int]
        Nodes connected at the start of the current round (not checkpointed).
    roster : dict[str, int] or None
        The coordinator's roster, ``{site name: max-examples}``; ``None``: any
        name may join, capped at its first declaration only (not checkpointed:
        it comes from the run config).
    max_size_ratio : float
        Without a roster, a declaration is at most this times the median of the
        other nodes' first declarations (0: no relative cap; not checkpointed).
    """

    names: dict[int, str] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    last_losses: dict[int, float] = field(default_factory=dict)
    evaluate_sizes: dict[int, int] = field(default_factory=dict)
    connected: set[int] = field(default_factory=set, compare=False)
    roster: dict[str, int] | None = field(default=None, compare=False)
    max_size_ratio: float = field(default=DEFAULT_MAX_SIZE_RATIO, compare=False)

    def label(self, node_id: int) -> str:
        """The site's bound name, or ``node-<id>`` for a node that never answered validly."""
        return self.names.get(node_id, f"node-{node_id}")

    def label_reply(self, node_id: int, declared: str) -> str:
        """The name to record a reply under: bound name, else the declared one if free."""
        if node_id in self.names:
            return self.names[node_id]
        if site_name_problem(declared) is not None:
            return f"node-{node_id}"
        if self.roster is not None and declared not in self.roster:
            return f"node-{node_id}"
        owner = self._owner(declared)
        return declared if owner is None or owner not in self.connected else f"node-{node_id}"

    def offline(self, connected: list[int]) -> list[str]:
        """Names of known sites whose node is not connected any more."""
        return [name for node, name in self.names.items() if node not in connected]

    def _owner(self, site: str) -> int | None:
        return next((node for node, name in self.names.items() if name == site), None)

    def identity_problem(self, node_id: int, site: str) -> str | None:
        """Why ``node_id`` may not reply as ``site`` (``None``: it may; the name is bound).

        Rules: the name rule (:func:`site_name_problem`); with a roster, only
        its names; one name per node and one node per name. A name bound to a
        node that is not connected is released to ``node_id`` (size caps and
        last loss move with it).
        """
        problem = site_name_problem(site)
        if problem is not None:
            return f"{problem} (node {node_id})"
        if self.roster is not None and site not in self.roster:
            return (f"site roster: site '{site}' (node {node_id}) is not on the "
                    "coordinator's roster (run config 'federation.roster')")
        bound = self.names.get(node_id)
        if bound is not None and bound != site:
            return (f"site identity: node {node_id} is bound to site '{bound}' but this "
                    f"reply declares '{site}'")
        owner = self._owner(site)
        if owner is not None and owner != node_id:
            if owner in self.connected:
                return (f"site identity: site '{site}' is bound to node {owner}, "
                        f"node {node_id} cannot reply under that name")
            log(WARNING, "site %s moved from node %d (gone) to node %d", site, owner,
                node_id)
            del self.names[owner]
            for book in (self.sizes, self.evaluate_sizes, self.last_losses):
                if owner in book:
                    book[node_id] = book.pop(owner)
        self.names[node_id] = site
        return None

    def _limit(self, node_id: int) -> int | None:
        """The roster's ``max-examples`` for the node's bound name (``None``: no roster)."""
        if self.roster is None:
            return None
        return self.roster.get(self.names.get(node_id, ""), 0)

    def _first(self, declared: dict[int, int], node_id: int, num_examples: int) -> int:
        """The node's cap in ``declared``: its first declaration, within the roster."""
        limit = self._limit(node_id)
        first = declared.setdefault(node_id, num_examples if limit is None
                                    else min(num_examples, limit))
        return first if limit is None else min(first, limit)

    def capped(self, node_id: int, num_examples: int, evaluate: bool = False) -> int:
        """``num_examples`` capped at the node's first declaration and the roster.

        The first train (or query) declaration caps train replies, the first
        evaluate declaration caps evaluate replies (``evaluate=True``); a
        change is logged.
        """
        cap = self._first(self.evaluate_sizes if evaluate else self.sizes, node_id,
                          num_examples)
        if num_examples != cap:
            log(WARNING, "site %s reports %d %s examples, capped at %d (first "
                "declaration%s): weighted as %d", self.label(node_id), num_examples,
                "validation" if evaluate else "training", cap,
                "" if self.roster is None else " and roster", min(num_examples, cap))
        return min(num_examples, cap)

    def capped_reply(self, reply: Reply, evaluate: bool = False) -> Reply:
        """``reply`` with its ``num-examples`` capped (:meth:`capped`), in its metrics too."""
        return _counted(reply, self.capped(reply.node_id, reply.num_examples, evaluate))

    def relative_cap(self, node_id: int, evaluate: bool = False) -> int | None:
        """``max_size_ratio`` x the median of the other nodes' first declarations, and
        at most their sum when there are two or more (module docstring: the bound).

        ``None`` when there is a roster (it caps instead), the ratio is 0, or no
        other node declared a positive size (train or query; ``evaluate=True``:
        evaluate declarations).
        """
        if self.roster is not None or self.max_size_ratio <= 0:
            return None
        declared = self.evaluate_sizes if evaluate else self.sizes
        others = [size for node, size in declared.items() if node != node_id and size > 0]
        if not others:
            return None
        cap = max(1, int(self.max_size_ratio * statistics.median(others)))
        return cap if len(others) < 2 else min(cap, sum(others))

    def sizes_pending(self, node_ids: Iterable[int]) -> bool:
        """Whether the relative cap of a round of ``node_ids`` waits for a first declaration.

        True when the cap is on (no roster, ratio > 0), the round has two sites or
        more, and one of them has not declared a train size yet.
        """
        node_ids = list(node_ids)
        return (self.roster is None and self.max_size_ratio > 0 and len(node_ids) > 1
                and any(node not in self.sizes for node in node_ids))

    def capped_sizes(self) -> dict[int, int]:
        """Each node's first train (or query) declaration held to its :meth:`relative_cap`:
        the sizes a selector weighs (Power-of-Choice draws its candidates in proportion),
        so a size buys a site no more in the selection than in the aggregate."""
        capped = {}
        for node, size in self.sizes.items():
            cap = self.relative_cap(node)
            capped[node] = size if cap is None else min(size, cap)
        return capped

    def relatively_capped(self, reply: Reply, evaluate: bool = False) -> Reply:
        """``reply`` with its ``num-examples`` at most :meth:`relative_cap` (logged)."""
        cap = self.relative_cap(reply.node_id, evaluate)
        if cap is None or reply.num_examples <= cap:
            return reply
        log(WARNING, "site %s reports %d %s examples, capped at %d (%s = %g x the median "
            "of the other sites' first declarations, at most their sum): weighted as %d",
            self.label(reply.node_id), reply.num_examples,
            "validation" if evaluate else "training", cap, MAX_SIZE_RATIO_KEY,
            self.max_size_ratio, cap)
        return _counted(reply, cap)

    def learn(self, node_id: int, site: str, num_examples: int | None = None,
              loss: float | None = None) -> None:
        """Record a valid reply: bind the name, keep the first size, the latest loss."""
        self.names.setdefault(node_id, site)
        if num_examples is not None:
            self._first(self.sizes, node_id, num_examples)
        if loss is not None:
            self.last_losses[node_id] = loss

    def snapshot(self) -> dict:
        """The checkpoint entries: the first format's keys plus ``evaluate_sizes``."""
        return {"sizes": dict(self.sizes), "last_losses": dict(self.last_losses),
                "site_of": dict(self.names), "evaluate_sizes": dict(self.evaluate_sizes)}

    @classmethod
    def restore(cls, state: dict, roster: dict[str, int] | None = None,
                max_size_ratio: float = DEFAULT_MAX_SIZE_RATIO) -> SiteBook:
        """The book a :meth:`snapshot` describes, under ``roster`` and ``max_size_ratio``.

        A checkpoint made before evaluate sizes were kept has none.
        """
        return cls(names=dict(state["site_of"]), sizes=dict(state["sizes"]),
                   last_losses=dict(state["last_losses"]),
                   evaluate_sizes=dict(state.get("evaluate_sizes", {})), roster=roster,
                   max_size_ratio=max_size_ratio)
