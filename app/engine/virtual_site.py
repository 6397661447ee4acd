"""One virtual site of the in-process engine: a node id, its node_config, one Context.

A :class:`VirtualSite` plays what a SuperNode process holds for a hospital: the
node_config it was started with (what :class:`app.config.site_config.SiteConfig`
reads), ONE :class:`flwr.app.Context` whose ``state`` survives from message to
message, and the ClientApp that answers. The handler is the product's real
ClientApp by default (``app.client_app.app``, called as ``app(message, context)``
like Flower's simulation does); a test may give any callable
``(Message, Context) -> Message`` (a scripted or a malicious site). With
``egress_filter`` the site's replies pass the hospital site runtime's egress filter
(:class:`app.site_runtime.egress_filter.EgressFilter`) before they leave, as a site
runtime holds them; every check is kept in ``egress_checks``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import Context, Message, RecordDict

from app.engine.grid import EgressCheck, SiteFaults

__all__ = ["Handler", "VirtualSite", "default_handler", "partition_sites"]

#: A site's answer to one instruction, as a ClientApp computes it.
Handler = Callable[[Message, Context], Message]

NodeConfigValue = bool | float | int | str


def default_handler() -> Handler:
    """The product's ClientApp (imported on use: the engine itself needs no torch)."""
    from app.client_app import app  # noqa: PLC0415 - torch and MONAI load on first use

    return app


@dataclass
class VirtualSite:
    """A site of the in-process federation.

    Attributes
    ----------
    node_config : Mapping
        The SuperNode's node_config: ``partition-id`` / ``num-partitions`` (the
        run config's ``data-root`` decides the folder), or ``data-path`` with
        optionally ``state-dir``, ``site-name``, ``policy-path``, ``cache-decoded``,
        ``local-steps-cap``.
    handler : Handler or None
        What answers each instruction; ``None``: the product's ClientApp.
    faults : SiteFaults
        Latency, failure and drop-out of this site (none by default).
    node_id : int
        Set by the grid (distinct, never the SuperLink's id 1) unless given.
    context : Context or None
        The site's one Context in the run, made by the grid that runs it
        (:meth:`join`); its ``state`` is what the site kept across messages.
    egress_filter : bool
        Whether each reply the handler returns passes the site runtime's egress filter
        (a refused one leaves as the runtime's refusal, an error reply).
    egress_checks : list of EgressCheck
        With ``egress_filter``: every check, in order (instruction, reply, verdict, seconds).
    """

    node_config: Mapping[str, NodeConfigValue]
    handler: Handler | None = None
    faults: SiteFaults = field(default_factory=SiteFaults)
    node_id: int = 0
    context: Context | None = field(default=None, repr=False)
    egress_filter: bool = False
    egress_checks: list[EgressCheck] = field(default_factory=list, repr=False)

    @classmethod
    def folder(cls, data_path: Path, *, site_name: str = "", state_dir: Path | None = None,
               policy_path: Path | None = None, faults: SiteFaults | None = None,
               handler: Handler | None = None, egress_filter: bool = False) -> VirtualSite:
        """A site started like a hospital's SuperNode: on its own folder (``data-path``)."""
        config: dict[str, NodeConfigValue] = {"data-path": str(Path(data_path).resolve())}
        if site_name:
            config["site-name"] = site_name
        if state_dir is not None:
            config["state-dir"] = str(Path(state_dir).resolve())
        if policy_path is not None:
            config["policy-path"] = str(Path(policy_path).resolve())
        return cls(config, handler, faults or SiteFaults(), egress_filter=egress_filter)

    def join(self, run_id: int, run_config: Mapping[str, NodeConfigValue]) -> Context:
        """Start the site's Context for run ``run_id`` (empty state, as Flower gives a new run)."""
        self.context = Context(run_id=run_id, node_id=self.node_id,
                               node_config=dict(self.node_config), state=RecordDict(),
                               run_config=dict(run_config))
        return self.context


def partition_sites(count: int, faults: Mapping[int, SiteFaults] | None = None,
                    handler: Handler | None = None) -> list[VirtualSite]:
    """``count`` simulation sites, ``partition-id`` 0..count-1 (``<data-root>/hospital-NN``).

    ``faults`` maps a partition id to its faults; the others have none.
    """
    faults = faults or {}
    return [VirtualSite({"partition-id": i, "num-partitions": count}, handler,
                        faults.get(i, SiteFaults())) for i in range(count)]
