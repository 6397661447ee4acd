"""A vertical federation that succeeds over the TLS deployment (#47 item 7).

The session's TLS SuperLink (the ``deployment`` fixture, shared with test_deployment.py),
two authenticated SuperNodes started by the product's site runtime on chest X-ray site
folders (``images.csv``), each under a policy whose ``[vertical]`` section allows
vertical federations (configs/site-policy-permissive.toml), and U-shaped split learning
submitted with ``flwr run`` as docs/VERTICAL.md deploys it: every batch's activations
and gradients cross TLS between the coordinator and the sites. The run ends
``finished:completed``; MLflow holds the run (per-site metrics of each round) and its
registered model (the coordinator's part and the site part, ``<experiment>-final``).
Tiny sizes: 1 round of 2 batches of 4 images of 32 x 32 pixels per site.
"""

from __future__ import annotations

import dataclasses

import pytest
from mlflow.tracking import MlflowClient

from app.tooling.environment import free_port
from app.tooling.flwr_cli import wait_online
from app.tooling.registration import register_site
from app.tooling.run_submission import submit_run
from clients.cxr_cls.synthetic import generate_site, site_profiles
from tests.integration.deployment_helpers import (SITES, history, node_status, only_run,
                                                  start_node, tail, wait_for)

pytestmark = pytest.mark.integration


def test_a_split_learning_federation_completes_over_tls(deployment, tmp_path, mlflow_store):
    d = deployment
    folders = []
    for site, profile in zip(SITES, site_profiles(len(SITES), seed=5)):
        folders.append(tmp_path / "data" / site)
        generate_site(folders[-1], dataclasses.replace(profile, num_images=16), seed=5,
                      image_size=32, val_fraction=0.25)
    node_ids = {site: register_site(d.layout, d.flwr_home, site) for site in SITES}
    # An earlier test of the session's SuperLink stopped these sites' nodes: the SuperLink
    # refuses to activate a key it still counts online until its heartbeat runs out.
    wait_for(lambda: all(node_status(d.flwr_home, n) != "online" for n in node_ids.values()),
             timeout=300, what="the earlier tests' SuperNodes offline")
    tracking = mlflow_store(tmp_path)
    run_config = (
        'federation.kind="vertical" vertical.method="splitnn-u" task="cxr-cls" '
        'model-size="small" image-size=32 batch-size=4 local-steps=2 '
        "vertical.batches-per-message=2 num-server-rounds=1 min-nodes=2 "
        f'node-wait-timeout=300 round-timeout=600 tracking-uri="{tracking}" '
        f'artifact-root="{tmp_path / "art"}" checkpoint-dir="{tmp_path / "ckpt"}" '
        'experiment="deploy-vertical-split"')
    nodes, output = [], []
    try:
        for site, folder in zip(SITES, folders):
            nodes.append(start_node(d.layout, site, folder, d.link.address, tmp_path,
                                    port=free_port()))
        wait_online(d.flwr_home, node_ids.values(), timeout=300, watch=nodes)
        outcome = submit_run(d.flwr_home, run_config, timeout=900, on_line=output.append)
        assert outcome.status == "finished:completed", \
            "".join(output)[-4000:] + tail(d.link, *nodes)
    finally:
        for node in nodes:
            node.stop()
    client = MlflowClient(tracking_uri=tracking)
    run = only_run(client, "deploy-vertical-split")
    assert run.info.status == "FINISHED" and run.data.tags["federation.kind"] == "vertical"
    for site in SITES:
        assert sorted(history(client, run.info.run_id, f"site/{site}/test-auc")) == [1]
    versions = client.search_model_versions("name = 'deploy-vertical-split-final'")
    assert [v.tags["run-id"] for v in versions] == [run.info.run_id]
    assert versions[0].tags["flow"] == "splitnn-u" and versions[0].tags["rounds"] == "1"
