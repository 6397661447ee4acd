"""What the server has learnt of the sites: who they are, their data sizes, last losses.

A node id is Flower's handle for a SuperNode; a site name is what the site
declares in its replies (:func:`strategies.replies.site_name`). The book is the
server's trust boundary for both:

* **identity** -- a name is bound to the node that first declared it in a valid
  reply. A later reply from that node under another name, or a reply from
  another connected node under a bound name, is refused
  (:meth:`SiteBook.identity_problem`). A name whose node is no longer connected
  moves to the node that claims it next (a restarted SuperNode, or a resumed
  simulation, gets a new node id), with its size cap and last loss.
* **size** -- ``num-examples`` is self-reported, so the first value a node
  declares (train or query reply) is kept as its cap: later replies are
  weighted with ``min(reported, cap)`` and a change is logged
  (:meth:`SiteBook.capped`).

The book also keeps what selectors use (sizes, last train losses) and is part
of the strategy's checkpoint (:meth:`snapshot` / :meth:`restore`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import WARNING

from flwr.supercore import log

__all__ = ["SiteBook"]


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
    connected : set[int]
        Nodes connected at the start of the current round (not checkpointed).
    """

    names: dict[int, str] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    last_losses: dict[int, float] = field(default_factory=dict)
    connected: set[int] = field(default_factory=set, compare=False)

    def label(self, node_id: int) -> str:
        """The site's bound name, or ``node-<id>`` for a node that never answered validly."""
        return self.names.get(node_id, f"node-{node_id}")

    def label_reply(self, node_id: int, declared: str) -> str:
        """The name to record a reply under: bound name, else the declared one if free."""
        if node_id in self.names:
            return self.names[node_id]
        owner = self._owner(declared)
        return declared if owner is None or owner not in self.connected else f"node-{node_id}"

    def offline(self, connected: list[int]) -> list[str]:
        """Names of known sites whose node is not connected any more."""
        return [name for node, name in self.names.items() if node not in connected]

    def _owner(self, site: str) -> int | None:
        return next((node for node, name in self.names.items() if name == site), None)

    def identity_problem(self, node_id: int, site: str) -> str | None:
        """Why ``node_id`` may not reply as ``site`` (``None``: it may; the name is bound).

        Rule: one name per node and one node per name. A name bound to a node
        that is not connected is released to ``node_id`` (size cap and last loss
        move with it).
        """
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
            if owner in self.sizes:
                self.sizes[node_id] = self.sizes.pop(owner)
            if owner in self.last_losses:
                self.last_losses[node_id] = self.last_losses.pop(owner)
        self.names[node_id] = site
        return None

    def capped(self, node_id: int, num_examples: int) -> int:
        """``num_examples`` capped at what the node declared first; a change is logged."""
        cap = self.sizes.setdefault(node_id, num_examples)
        if num_examples != cap:
            log(WARNING, "site %s reports %d examples, declared %d when it joined: "
                "weighted as %d", self.label(node_id), num_examples, cap,
                min(num_examples, cap))
        return min(num_examples, cap)

    def learn(self, node_id: int, site: str, num_examples: int | None = None,
              loss: float | None = None) -> None:
        """Record a valid reply: bind the name, keep the first size, the latest loss."""
        self.names.setdefault(node_id, site)
        if num_examples is not None:
            self.sizes.setdefault(node_id, num_examples)
        if loss is not None:
            self.last_losses[node_id] = loss

    def snapshot(self) -> dict:
        """The checkpoint entries (keys kept from the first checkpoint format)."""
        return {"sizes": dict(self.sizes), "last_losses": dict(self.last_losses),
                "site_of": dict(self.names)}

    @classmethod
    def restore(cls, state: dict) -> SiteBook:
        """The book a :meth:`snapshot` describes."""
        return cls(names=dict(state["site_of"]), sizes=dict(state["sizes"]),
                   last_losses=dict(state["last_losses"]))
