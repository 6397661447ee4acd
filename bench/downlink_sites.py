r"""The downlink of an in-process benchmark federation, through the product's train instructions.

``bench/compression_loop.py`` runs FedAvg without Flower processes; with this
module the model a site trains from and the bytes it receives are those of
the product's own round:

* the server builds the round's train messages with
  :func:`strategies.rounds.instructions.train_messages` (the run's
  :class:`~strategies.rounds.instructions.Uplink`, a
  :class:`~strategies.rounds.instructions.TrainPlan` and the server's
  :class:`~strategies.downlink.ServerDownlink`, an empty run config), so a
  dense downlink is the packed global model and a compressed one the codec
  step (server error feedback, the book's chapter 3, eq. 3.9) or a dense
  snapshot, with its header;
* bytes down of a site = :func:`strategies.rounds.traffic.bytes_down` of its
  message (the whole content: arrays and config, as the product's
  ``bytes-down``);
* each site reads its message as the ClientApp does: the packed model
  (:func:`strategies.model_packing.unpack_arrays`), or
  :func:`strategies.downlink_receive.receive` onto the reference it held
  (checksum verified), then acknowledges the version as its reply would.

Node ids are ``site + 1`` (Flower's node ids are positive). Flower creates a
message only inside a task (it stamps the run id): the messages are built
under a ServerApp's identity (task 1, run 1, node 1), the process's own
restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.supercore.task_identity import TaskIdentity

from strategies import message_keys as keys
from strategies.downlink import ServerDownlink
from strategies.downlink_header import DownlinkHeader
from strategies.downlink_receive import receive
from strategies.downlink_reference import Reference
from strategies.model_packing import named_arrays, unpack_arrays
from strategies.rounds.instructions import TrainPlan, Uplink, train_messages
from strategies.rounds.traffic import bytes_down

__all__ = ["SiteDownlink"]


@contextmanager
def _server_identity() -> Iterator[None]:
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


class SiteDownlink:
    """The server's downlink and the reference each site holds.

    Parameters
    ----------
    uplink : Uplink
        The run's uplink settings (codec, error feedback, warm-up, seed): they
        go into every train instruction's config, as in the product.
    downlink : str
        Downlink codec spec (``none``: the dense packed model every round).
    num_sites : int
        Sites of the federation (all selected every round).
    local_steps : int
        The tau written into the instructions.
    """

    def __init__(self, uplink: Uplink, downlink: str, num_sites: int, local_steps: int) -> None:
        self.uplink = uplink
        self.server = ServerDownlink(downlink, uplink.seed)
        self.nodes = [site + 1 for site in range(num_sites)]
        self.local_steps = int(local_steps)
        self.held: list[Reference | None] = [None] * num_sites

    def send(self, server_round: int, names: Sequence[str],
             arrays: Sequence[np.ndarray]) -> tuple[list[list[np.ndarray]], list[int]]:
        """The round's instructions for the global model ``arrays``: what each site trains
        from (``state_dict`` order) and the bytes of each site's message."""
        record = ArrayRecord({name: Array(np.asarray(a)) for name, a in zip(names, arrays)})
        plan = TrainPlan.for_round(self.nodes, self.local_steps, self.uplink, server_round)
        with _server_identity():
            messages = train_messages(self.nodes, record, ConfigRecord(), server_round, plan,
                                      self.uplink, self.server)
        sizes = bytes_down(messages)
        models = []
        for site, message in enumerate(messages):
            content = message.content
            header = DownlinkHeader.from_config(content[keys.CONFIG])
            if header is None:
                models.append(unpack_arrays(content[keys.ARRAYS]).to_numpy_ndarrays())
                continue
            self.held[site] = receive(named_arrays(content[keys.ARRAYS]), header, self.held[site])
            self.server.acknowledge(self.nodes[site], self.held[site].version)
            models.append([np.array(a, copy=True) for a in self.held[site].arrays])
        return models, [sizes[node] for node in self.nodes]
