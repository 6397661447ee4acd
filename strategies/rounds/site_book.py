"""What the server has learnt of the sites: their names, data sizes and last losses.

A node id is Flower's handle for a SuperNode; a site name is what the site
declares in its replies (:func:`strategies.replies.site_name`). The book keeps
the mapping so that drops, traffic and selections are reported under the
site's name, and keeps what selectors use (data sizes, last train losses).
It is part of the strategy's checkpoint (:meth:`snapshot` / :meth:`restore`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SiteBook"]


@dataclass
class SiteBook:
    """Per node id: site name, number of examples, last train loss.

    Attributes
    ----------
    names : dict[int, str]
        Site name each node declared in its latest valid reply.
    sizes : dict[int, int]
        Examples each node declared (train or query reply).
    last_losses : dict[int, float]
        Train loss of each node's latest accepted train reply.
    """

    names: dict[int, str] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    last_losses: dict[int, float] = field(default_factory=dict)

    def label(self, node_id: int) -> str:
        """The site's name, or ``node-<id>`` for a node that never answered validly."""
        return self.names.get(node_id, f"node-{node_id}")

    def offline(self, connected: list[int]) -> list[str]:
        """Names of known sites whose node is not connected any more."""
        return [name for node, name in self.names.items() if node not in connected]

    def learn(self, node_id: int, site: str, num_examples: int | None = None,
              loss: float | None = None) -> None:
        """Record a valid reply's site name and, when given, its size and loss."""
        self.names[node_id] = site
        if num_examples is not None:
            self.sizes[node_id] = num_examples
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
