"""Developer command lines: the Flower daemons and CLI calls behind the make targets.

``make simulate`` runs :mod:`app.tooling.simulate`; ``make certs`` / ``site-key``
run :mod:`app.tooling.certs`; ``make superlink`` / ``register`` / ``supernode`` /
``supernodes`` / ``federate`` run :mod:`app.tooling.deployment`. One room per
concept:

==========================  ===============================================================
``errors.py``               FlowerProcessError (a FederationError)
``environment.py``          the environment of every Flower process; free loopback ports
``process_tree.py``         a process's descendants and start time; bounded stops by PID
``daemon.py``               DaemonProcess (own process group, appended log), bounded polling
``superlink.py``            SuperLinkProcess: the one ``flower-superlink`` wrapper
                            (insecure simulation mode, or TLS with SuperNode authentication)
``layout.py``               DeployLayout: the paths of a deployment folder
``flwr_cli.py``             the ``flwr`` CLI: connections, run status, SuperNode list
``run_submission.py``       submit_run: ``flwr run --stream`` and its final status
``same_name.py``            check_same_name: a running federation of the same name, refused
``registration.py``         register_site: site keys at the SuperLink, ``sites.json``
``run_config_string.py``    the ``--run-config`` string (absolute paths, preset, overrides)
``federation_summary.py``   the summary printed after a run, read back from MLflow
``certs.py``                CA, SuperLink certificate, SuperNode key pairs (CLI)
``ray_cluster.py``          the RAY_ADDRESS check
``local_ray.py``            the local Ray of ``make simulate``, retried when its start times out
``simulate.py``             ``make simulate`` (CLI; ``--ray-address`` for an existing Ray cluster)
``deployment.py``           the deployment make targets (CLI)
==========================  ===============================================================

The hospital's own processes are :mod:`app.site_runtime`; the test fixtures
(a local ``mlflow server``, a loopback Ray cluster) are under ``tests/fixtures/``.
Every daemon runs in its own process group and is stopped by PID with bounded
waits, so nothing is left running.
"""
