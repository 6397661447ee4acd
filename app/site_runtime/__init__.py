"""What runs at the hospital: the hospital's security boundary.

==========================  ===============================================================
``site_node.py``            the hospital's node process: SuperNode + site runner (CLI)
``supernode.py``            SuperNodeProcess: a hospital's ``flower-supernode`` (TLS, its key)
``site_runner.py``          SiteRunner: app check before install, the runtime's round, audit
``runtime_round.py``        one message: admitted, charged, run sandboxed, filtered, settled
``runtime_gate.py``         admit: every data rule, checked before the worker sees the message
``runtime_ledger.py``       the privacy ledger charged by the runtime for what a message asks
``dataset_census.py``       the runtime's own count of a dataset (examples, studies per split)
``worker_view.py``          the worker's own state folder, data-rules copy and node config
``sandbox.py``              the worker's bubblewrap sandbox, uid and resource limits
``egress_filter.py``        EgressFilter: every reply checked before it leaves (egress_*.py)
``worker_pool.py``          WorkerPool: the warm workers, one per (app bundle, task, site)
``audit_record.py``         the audit record of one message, built from what the runtime saw
``site_audit.py``           SiteAudit: node-start / policy-change / message records, node status
``site_worker.py``          the warm worker script (stdlib + flwr until the bundle loads)
``runtime_channel.py``      the site runner's HTTP channel to its SuperNode's Runtime API
``node_signals.py``         in-process wake-ups between the SuperNode and the site runner
``app_approval.py``         check_app: a run's FAB against the site policy's ``[apps]``;
                            signing keys, signatures, approvals (CLI)
``app_bundle.py``           the app bundle (FAB) of a project folder
``audit_log.py``            AuditLog: append-only JSON lines chained by SHA-256, rotated
``audit_chain.py``          verify_chain, ``make audit-verify``: the first bad record
``audit_format.py``         the audit log's files: names, canonical JSON, record hash
``audit_anchor.py``         the log's head anchored off the machine (a file or syslog)
``audit_follow.py``         AuditFollower: the log verified as it grows (the console)
``console.py``              the hospital's console (``make console``): pages, CLI, uvicorn
``console_access.py``       ConsoleSettings, bind rule, admin-token login, CSRF
``console_http.py``         what every page shares: request guard, rendering, forms
``console_pages.py``        what the Overview, Policy, Activity and Data pages show
``console_apps.py``         what the Apps page shows (approvals, keys, revocations, apps seen)
``console_privacy.py``      what the Privacy page shows (epsilon per dataset, its curve)
``policy_edit.py``          approve / revoke an app: the policy edited atomically, audited
==========================  ===============================================================

It uses the process primitives of :mod:`app.tooling` (daemons, environment, errors).
"""
