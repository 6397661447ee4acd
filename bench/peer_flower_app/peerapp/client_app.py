"""peerapp: a Flower ClientApp as Flower's quickstart-pytorch writes it (train, evaluate)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn
from torch.utils.data import DataLoader

from peerapp.task import Net, load_data
from peerapp.task import test as test_fn
from peerapp.task import train as train_fn

# Flower ClientApp
app = ClientApp()


def _received_model(msg: Message) -> tuple[nn.Module, torch.device]:
    """The model with the received weights, and the device to run it on."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model, torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def _site_data(context: Context) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders of ``<data-root>/hospital-NN`` (this node's partition)."""
    site = Path(str(context.run_config["data-root"])) / \
        f"hospital-{int(context.node_config['partition-id']):02d}"
    return load_data(site, int(context.run_config["image-size"]),
                     int(context.run_config["batch-size"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data."""
    model, device = _received_model(msg)
    trainloader, _ = _site_data(context)
    started = time.monotonic()
    train_loss = train_fn(model, trainloader, int(context.run_config["local-steps"]),
                          float(msg.content["config"]["lr"]),
                          float(context.run_config["momentum"]), device)
    metrics = {"train_loss": train_loss, "train-seconds": time.monotonic() - started,
               "num-examples": len(trainloader.dataset)}
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local validation data."""
    model, device = _received_model(msg)
    _, valloader = _site_data(context)
    eval_loss, eval_acc = test_fn(model, valloader, device)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc,
               "num-examples": len(valloader.dataset)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
