"""Local-process tooling: the Flower daemons and CLI calls behind the make targets.

``make simulate`` runs :mod:`app.processes.simulate`; ``make certs`` / ``site-key``
run :mod:`app.processes.certs`; ``make superlink`` / ``register`` / ``supernode`` /
``supernodes`` / ``federate`` run :mod:`app.processes.deployment`. One room per
concept:

==========================  ===============================================================
``errors.py``               FlowerProcessError (a FederationError)
``environment.py``          the environment of every Flower process; free loopback ports
``process_tree.py``         a process's descendants and start time; bounded stops by PID
``daemon.py``               DaemonProcess (own process group, appended log), bounded polling
``mlflow_server.py``        MlflowServerProcess: a local ``mlflow server`` (kill, restart)
``superlink.py``            SuperLinkProcess: the one ``flower-superlink`` wrapper
                            (insecure simulation mode, or TLS with SuperNode authentication)
``supernode.py``            SuperNodeProcess: a hospital's ``flower-supernode``
``site_node.py``            the hospital's node process: SuperNode + site runner (CLI)
``site_runner.py``          SiteRunner: app check before install, WorkerPool of warm workers
``site_worker.py``          the warm worker script (stdlib + flwr until the bundle loads)
``grid_waits.py``           cap_grid_waits: the ServerApp's short backoff for a reply's arrays
``layout.py``               DeployLayout: the paths of a deployment folder
``flwr_cli.py``             the ``flwr`` CLI: connections, run status, SuperNode list
``run_submission.py``       submit_run: ``flwr run --stream`` and its final status
``registration.py``         register_site: site keys at the SuperLink, ``sites.json``
``run_config_string.py``    the ``--run-config`` string (absolute paths, preset, overrides)
``federation_summary.py``   the summary printed after a run, read back from MLflow
``certs.py``                CA, SuperLink certificate, SuperNode key pairs (CLI)
``ray_cluster.py``          the RAY_ADDRESS check; LocalRayCluster (loopback head + workers)
``simulate.py``             ``make simulate`` (CLI; ``--ray-address`` for an existing Ray cluster)
``deployment.py``           the deployment make targets (CLI)
``app_approval.py``         check_app: a run's FAB against the site policy's ``[apps]``;
                            signing keys, signatures, approvals (CLI)
==========================  ===============================================================

Every daemon runs in its own process group and is stopped by PID with bounded
waits, so nothing is left running.
"""
