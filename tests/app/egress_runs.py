"""Genuine replies for the egress filter's tests: small federations of the product itself.

Each run is a real federation through the in-process engine (the real ServerApp and
ClientApp on small synthetic hospitals) whose sites answer through a handler that
hands every reply to one :class:`~app.site_runtime.egress_filter.EgressFilter`, as the
site runtime does, and records the exchange: what the product's own sites send under
each option (codecs, downlink compression, Power-of-Choice queries, personalisation,
DP-SGD, pruning, SCAFFOLD with FedBN, SecAgg+, split learning, pvFed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context, Message

from app.config.site_config import SiteConfig
from app.engine import VirtualSite, partition_sites, run_federation
from app.engine.virtual_site import default_handler
from app.site_runtime.egress_filter import EgressFilter, EgressVerdict
from clients.cxr_cls.synthetic import generate_site, site_profiles
from strategies.wire import message_keys as keys
from tests.app.test_pvfed_federation import DEPARTMENTS, write_department
from tests.integration.conftest import write_small_hospitals

SMALL = {"num-server-rounds": 2, "local-steps": 2, "image-size": 32, "batch-size": 4,
         "node-wait-timeout": 5}

#: Each run's run-config overrides (beside SMALL and the paths) and its sites' data.
RUNS: dict[str, tuple[dict[str, Any], str, int]] = {
    "compressed": ({"num-server-rounds": 3, "strategy.codec": "qsgd:16:b64",
                    "strategy.downlink-codec": "fp16", "personalisation.method": "finetune",
                    "cross-site.finetune-steps": 1}, "pe-seg", 2),
    "query": ({"strategy.codec": "topk:0.1", "strategy.selector": "pow-d", "selection.m": 1,
               "privacy.noise-multiplier": 1.0, "final-evaluation": False}, "pe-seg", 2),
    "pruned": ({"strategy.codec": "fp16", "strategy.pruning": "prunefl",
                "pruning.initial-density": 0.2, "pruning.interval": 2,
                "pruning.time-constant": 0.0, "pruning.max-density": 0.25,
                "final-evaluation": False}, "pe-seg", 2),
    "scaffold": ({"task": "cxr-cls", "optimizer": "sgd", "lr": 0.05, "momentum": 0.0,
                  "strategy.control-variates": "scaffold", "personalisation.method": "fedbn",
                  "strategy.codec": "topk:0.2:layer", "final-evaluation": False}, "cxr-cls", 2),
    "secagg": ({"strategy.codec": "randk:0.5", "strategy.secure-aggregation": "secagg+",
                "strategy.defence": "none", "min-nodes": 4, "final-evaluation": False,
                "cross-site.finetune-steps": 0}, "pe-seg", 4),
    "split": ({"federation.kind": "vertical", "task": "cxr-cls", "model-size": "small",
               "vertical.method": "splitnn", "num-server-rounds": 1, "min-nodes": 2},
              "cxr-cls", 2),
    "split-u": ({"federation.kind": "vertical", "task": "cxr-cls", "model-size": "small",
                 "vertical.method": "splitnn-u", "num-server-rounds": 1, "min-nodes": 2},
                "cxr-cls", 2),
    "pvfed": ({"federation.kind": "vertical", "vertical.method": "pvfed", "task": "tabular-cls",
               "vertical.aggregation": "pca", "vertical.dim": 4, "vertical.local-epochs": 3,
               "vertical.encoder-epochs": 5, "vertical.global-epochs": 5,
               "vertical.head-epochs": 3, "batch-size": 16, "min-nodes": 3,
               "node-wait-timeout": 10}, "tabular-cls", 3),
}


@dataclass
class Exchange:
    """One message a site answered, its genuine reply and the filter's verdict on it."""

    message: Message
    reply: Message
    context: Context
    policy: str
    verdict: EgressVerdict

    @property
    def config(self) -> dict[str, Any]:
        """The instruction's config record."""
        record = self.message.content.config_records.get(keys.CONFIG)
        return dict(record) if record is not None else {}

    @property
    def stage(self) -> str:
        """Its SecAgg+ or vertical stage ("" for neither)."""
        return str(self.config.get(keys.SECAGG_STAGE, "")
                   or self.config.get(keys.VERTICAL_STAGE, ""))


@dataclass
class Capture:
    """A run's exchanges, in order, and the filter that judged them."""

    egress: EgressFilter = field(default_factory=EgressFilter)
    exchanges: list[Exchange] = field(default_factory=list)

    def handler(self) -> Callable[[Message, Context], Message]:
        """The product's ClientApp, its every reply judged and recorded."""
        def answer(message: Message, context: Context) -> Message:
            reply = default_handler()(message, context)
            node = SiteConfig.from_node_config(context.node_config,
                                               str(context.run_config.get("data-root", "")))
            policy = node.policy().fingerprint
            verdict = self.egress.check(message, reply, context, policy)
            self.exchanges.append(Exchange(message, reply, context, policy, verdict))
            return reply
        return answer

    def of(self, kind: str, stage: str = "", where: Callable[[Exchange], bool] | None = None
           ) -> list[Exchange]:
        """The exchanges of message type ``kind`` and ``stage`` that pass ``where``."""
        return [x for x in self.exchanges if x.message.metadata.message_type == kind
                and x.stage == stage and not x.reply.has_error() and (where is None or where(x))]


def _cxr_hospitals(root: Path, count: int) -> None:
    for profile in site_profiles(count, seed=5):
        generate_site(root / profile.name, dataclasses.replace(profile, num_images=16), seed=5,
                      image_size=32, val_fraction=0.25)


def run(name: str, folder: Path, tracking_uri: str) -> Capture:
    """Run federation ``name`` of :data:`RUNS` in ``folder`` and capture its exchanges (one
    torch thread: tiny tensors on a shared machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(name, folder, tracking_uri)
    finally:
        torch.set_num_threads(threads)


def _run(name: str, folder: Path, tracking_uri: str) -> Capture:
    overrides, data, count = RUNS[name]
    capture = Capture()
    paths = {"experiment": f"egress-{name}", "tracking-uri": tracking_uri,
             "artifact-root": str(folder / "artifacts"), "checkpoint-dir": str(folder / "ckpt")}
    if data == "tabular-cls":
        sites = [VirtualSite.folder(write_department(folder / part, part, patients, signal),
                                    site_name=f"hospital-{part}", state_dir=folder / f"s-{part}",
                                    handler=capture.handler())
                 for part, (patients, signal) in DEPARTMENTS.items()]
        run_federation({**SMALL, **overrides, **paths}, sites)
        return capture
    if data == "cxr-cls":
        _cxr_hospitals(folder / "data", count)
    else:
        write_small_hospitals(folder / "data", seed=5, num_sites=count)
    run_federation({**SMALL, **overrides, **paths, "data-root": str(folder / "data")},
                   partition_sites(count, handler=capture.handler()))
    return capture
