"""peerapp: a Flower ServerApp running Flower's own FedAvg, as the quickstart does."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from peerapp.task import Net

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg over every connected site; the final model saved to run config ``final-model``."""
    torch.manual_seed(int(context.run_config["seed"]))  # the product's initial model too
    arrays = ArrayRecord(Net().state_dict())
    strategy = FedAvg(fraction_train=1.0,
                      fraction_evaluate=float(context.run_config["fraction-evaluate"]),
                      min_available_nodes=int(context.run_config["min-nodes"]))
    result = strategy.start(
        grid=grid, initial_arrays=arrays,
        train_config=ConfigRecord({"lr": float(context.run_config["learning-rate"])}),
        num_rounds=int(context.run_config["num-server-rounds"]))
    final_model = str(context.run_config["final-model"])
    if final_model:
        torch.save(result.arrays.to_torch_state_dict(), final_model)
